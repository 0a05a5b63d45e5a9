"""engine.py (sampling) against HF transformers' generate and against model.py's full forward pass: greedy
continuations, sampled log-probs, both cache layouts (own prompt per row, shared prompt), dropping finished rows."""
import os
import shutil

import pytest
import torch

import engine
from model import GPT, GPTConfig

transformers = pytest.importorskip("transformers")




def fresh_logprobs(model, prompt, completion):
    """Log-probs (len(completion),) of a completion under one full forward pass of prompt + completion, no cache."""
    with torch.no_grad():
        logits, _ = model(torch.tensor([prompt + completion]))
    lp = torch.log_softmax(logits[0, len(prompt) - 1:-1], -1)
    return lp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_greedy_matches_hf(pair):
    hf, ours = pair
    prompt = [5, 17, 3, 44, 8]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)[0, len(prompt):]
    toks, _ = engine.generate(ours, [prompt], 12, temperature=0)
    assert toks[0].tolist() == ref.tolist()


def test_batched_greedy_matches_hf_with_left_padding(pair):
    hf, ours = pair  # prompts of different lengths in one batch: HF left-pads with an attention mask, as we do inside
    prompts = [[5, 17, 3, 44, 8], [9], [60, 2, 2]]
    toks, _ = engine.generate(ours, prompts, 8, temperature=0)
    for b, p in enumerate(prompts):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0, len(p):]
        assert toks[b].tolist() == ref.tolist()


def test_cached_greedy_equals_uncached(pair):
    _, ours = pair
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12, 13], [40]]
    for S in (1, 2):  # each row with its own prompt in its cache, and prompts shared by S rows
        toks, _ = engine.generate(ours, prompts, 10, temperature=0, num_samples=S)
        for n in range(len(toks)):  # recompute each row token by token with full forward passes, no cache
            seq = list(prompts[n // S])
            for _ in range(10):
                logits, _ = ours(torch.tensor([seq]))
                seq.append(int(logits[0, -1].argmax()))
            assert toks[n].tolist() == seq[len(prompts[n // S]):]


@pytest.mark.parametrize("samples", [1, 3])
def test_sampled_logprobs_equal_fresh_forward(pair, samples):
    _, ours = pair
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12, 13]]
    toks, lps = engine.generate(ours, prompts, 9, temperature=1.0, generator=torch.Generator().manual_seed(0),
                                num_samples=samples)
    assert toks.shape == (2 * samples, 9)
    for n in range(len(toks)):
        fresh = fresh_logprobs(ours, prompts[n // samples], toks[n].tolist())
        assert torch.allclose(fresh, lps[n], atol=1e-5), (fresh, lps[n])


def test_shared_prompt_equals_repeated_prompts(pair):
    _, ours = pair  # S samples sharing a prompt's keys draw the same tokens as the prompt repeated S times
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12, 13], [4]]
    shared = engine.generate(ours, prompts, 12, generator=torch.Generator().manual_seed(5), num_samples=4)
    repeated = engine.generate(ours, [p for p in prompts for _ in range(4)], 12,
                               generator=torch.Generator().manual_seed(5))
    assert torch.equal(shared[0], repeated[0])
    assert torch.allclose(shared[1], repeated[1], atol=1e-5)


def test_dropping_finished_rows_changes_no_row():
    torch.manual_seed(0)  # 8 tokens, eos 0: most rows finish early, so finished rows leave the batch several times
    m = GPT(GPTConfig.llama(vocab_size=8, block_size=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=16)).eval()
    prompts = [[1, 2], [3], [4, 5, 6], [7, 1, 2, 3]]
    for S in (4, 1):  # shared prompts, and one row per prompt (the prompts repeated)
        batch = prompts if S > 1 else [p for p in prompts for _ in range(4)]
        toks, lps = engine.generate(m, batch, 24, temperature=1.0, eos_id=0, num_samples=S,
                                    generator=torch.Generator().manual_seed(1))
        lengths = (toks >= 0).sum(1)
        assert lengths.min() < lengths.max()  # rows did finish at different steps
        for n in range(len(toks)):  # every row's log-probs equal a fresh forward pass of its own sequence
            c = toks[n, :lengths[n]].tolist()
            assert torch.allclose(fresh_logprobs(m, prompts[n // 4], c), lps[n, :len(c)], atol=1e-5)
            assert all(t == -1 for t in toks[n, lengths[n]:].tolist()) and (c[-1] == 0 or len(c) == toks.size(1))
    greedy = engine.generate(m, prompts, 24, temperature=0, eos_id=0, num_samples=2)[0]
    for n in range(len(greedy)):  # and greedy rows equal the same prompt decoded alone
        alone = engine.generate(m, [prompts[n // 2]], 24, temperature=0, eos_id=0)[0][0]
        assert greedy[n, :len(alone)].tolist() == alone.tolist() and (greedy[n, len(alone):] == -1).all()


def test_generate_eos_padding_and_seeding():
    torch.manual_seed(0)
    m = GPT(GPTConfig.llama(vocab_size=8, block_size=64, n_layer=1, n_head=2, n_kv_head=1, n_embd=16)).eval()
    prompts = [[1, 2], [3], [4, 5, 6]]
    a = engine.generate(m, prompts, 20, eos_id=0, generator=torch.Generator().manual_seed(3))
    b = engine.generate(m, prompts, 20, eos_id=0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    toks, lps = a
    for row, lrow in zip(toks.tolist(), lps.tolist()):
        if 0 in row:  # after the first eos: -1 tokens and zero log-probs, the eos itself kept
            e = row.index(0)
            assert all(t == -1 for t in row[e + 1:]) and all(x == 0.0 for x in lrow[e + 1:])
        assert all(x <= 0 for x in lrow)


def test_sampler_draws_the_softmax_distribution():
    # sample_next on fixed logits: token frequencies over 20,000 draws match softmax(logits / T) (3 sigma)
    logits = torch.tensor([[2.0, 0.0, -1.0, 1.0, -30.0]]).expand(20000, 5)
    for T in (1.0, 0.5):
        tok, lp = engine.sample_next(logits, T, None, None, torch.Generator().manual_seed(0))
        probs = torch.softmax(logits[0] / T, -1)
        freq = torch.bincount(tok, minlength=5) / len(tok)
        assert (freq - probs).abs().max() < 3 * (probs * (1 - probs) / len(tok)).sqrt().max() + 1e-4
        assert torch.allclose(lp, probs.log()[tok], atol=1e-5)


def test_top_k_top_p_restrict_support():
    torch.manual_seed(0)
    m = GPT(GPTConfig.gpt2(vocab_size=50, block_size=32, n_layer=1, n_head=2, n_embd=16)).eval()
    logits, _ = m(torch.tensor([[1, 2, 3]]))
    top2 = set(torch.topk(logits[0, -1], 2).indices.tolist())
    toks, _ = engine.generate(m, [[1, 2, 3]] * 64, 1, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(toks[:, 0].tolist()) <= top2
    toks, lps = engine.generate(m, [[1, 2, 3]] * 8, 1, top_p=1e-6, generator=torch.Generator().manual_seed(0))
    assert toks[:, 0].eq(logits[0, -1].argmax()).all() and torch.allclose(lps, torch.zeros_like(lps))


def test_bad_prompts_are_clear_errors():
    m = GPT(GPTConfig.llama(vocab_size=8, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    with pytest.raises(AssertionError, match="at least one token"):
        engine.generate(m, [[1], []], 4)
    with pytest.raises(AssertionError, match="block_size"):
        engine.generate(m, [[1] * 10], 8)


def test_one_prompt_many_samples_matches_a_fresh_forward():
    """One prompt shared by 4 samples (the shared-prompt grid with B = 1) once raised on a non-contiguous view."""
    torch.manual_seed(0)
    m = GPT(GPTConfig.llama(vocab_size=16, block_size=32, n_layer=1, n_head=2, n_embd=16)).eval()
    tokens, logp = engine.generate(m, [[1, 2]], 4, temperature=1.0, generator=torch.Generator().manual_seed(0),
                                   num_samples=4)
    tokens, logp = tokens.clone(), logp.clone()   # out of inference mode
    with torch.no_grad():
        for row, lp in zip(tokens, logp):
            n = int((row >= 0).sum())
            seq = torch.tensor([[1, 2] + row[:n].tolist()])
            fresh = torch.log_softmax(m(seq[:, :-1])[0][0, 1:], -1).gather(-1, row[:n].unsqueeze(-1)).squeeze(-1)
            assert torch.allclose(fresh, lp[:n], atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(not torch._dynamo.is_dynamo_supported() or not (shutil.which("g++") or shutil.which("c++")),
                    reason="torch.compile (inductor on CPU) needs dynamo support and a C++ compiler")
@pytest.mark.skipif(bool(os.environ.get("CI")), reason="CI is set: the first compile takes minutes on a shared 2-core "
                    "machine (docs/performance.md); run it with CI unset")
def test_compiled_decode_step_matches_eager():
    """generate(compile=True): the static-shape decode step compiled once (all calls below share its shapes) gives the
    eager path's tokens and log-probs; with EOS (no rows dropped) its log-probs equal a fresh forward pass."""
    torch.manual_seed(0)
    m = GPT(GPTConfig.llama(vocab_size=8, block_size=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=16)).eval()
    prompts = [[1, 2], [3], [4, 5, 6]]
    for kw in (dict(temperature=0), dict(temperature=1.0)):   # no EOS: the eager path drops no row either
        eager = engine.generate(m, prompts, 12, num_samples=2, generator=torch.Generator().manual_seed(1), **kw)
        compiled = engine.generate(m, prompts, 12, num_samples=2, generator=torch.Generator().manual_seed(1),
                                   compile=True, **kw)
        assert torch.equal(eager[0], compiled[0])
        assert torch.allclose(eager[1], compiled[1], atol=1e-5)
    toks, lps = engine.generate(m, prompts, 12, eos_id=0, num_samples=2, generator=torch.Generator().manual_seed(2),
                                compile=True)
    lengths = (toks >= 0).sum(1)
    assert lengths.min() < lengths.max()  # rows finished at different steps
    for n in range(len(toks)):
        c = toks[n, :lengths[n]].tolist()
        assert torch.allclose(fresh_logprobs(m, prompts[n // 2], c), lps[n, :len(c)], atol=1e-5)
        assert (toks[n, lengths[n]:] == -1).all() and (lps[n, lengths[n]:] == 0).all()
    with pytest.raises(ValueError, match="compile="):
        engine.generate(m, prompts, 4, compile="yes")
