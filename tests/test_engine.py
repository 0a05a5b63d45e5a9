"""engine.py (sampling) against HF transformers' generate, against model.py's full forward pass and
against model.py's plain GPT.generate: greedy continuations, seeded samples, sampled log-probs, both
cache layouts (own prompt per row, shared prompt), dropping finished rows."""
from pathlib import Path

import pytest
import torch

import engine
import engine_static
from model import GPT, GPTConfig, KVCache, sample_next

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]


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


@pytest.fixture
def nan_when_empty():
    """torch.empty gives NaN (deterministic mode fills new memory), not the stale values of an
    earlier run, so a cache position never written cannot pass for a written one."""
    torch.use_deterministic_algorithms(True)
    assert torch.utils.deterministic.fill_uninitialized_memory
    yield
    torch.use_deterministic_algorithms(False)


def test_rows_and_prompts_leaving_change_no_row(monkeypatch, nan_when_empty):
    """Rows that drew EOS leave the batch, and prompts with no row left leave the prompts' part
    (model.KVCache.keep): greedy rows with eos_id equal the same rows without it (where no row leaves)
    up to their EOS, log-probs within 1e-5 (fewer rows: other matmul kernels), prompts shared
    and not."""
    torch.manual_seed(0)
    m = GPT(GPTConfig.llama(vocab_size=16, block_size=128, n_layer=2, n_head=4, n_kv_head=2, n_embd=16)).eval()
    with torch.no_grad():   # large weights: greedy answers vary, each id ends rows at other steps
        for p in m.parameters():
            p.normal_(0, 0.5)
    prompts, kept, keep = [[1, 2], [3], [4, 5, 6], [7, 1, 2, 3], [5, 5]], [], KVCache.keep

    def recorded(self, rows):
        keep(self, rows)
        kept.append((self.length, len(self.prompts)))
    monkeypatch.setattr(KVCache, "keep", recorded)
    for S in (1, 3):
        b = engine.generate(m, prompts, 40, temperature=0, num_samples=S)
        for eos in range(16):
            a = engine.generate(m, prompts, 40, temperature=0, eos_id=eos, num_samples=S)
            for n in range(len(a[0])):
                k = int((a[0][n] >= 0).sum())
                assert torch.equal(a[0][n, :k], b[0][n, :k])
                assert torch.allclose(a[1][n, :k], b[1][n, :k], atol=1e-5, rtol=0)
    # rows left after some tokens were written, and whole prompts with them
    assert any(t >= 4 and n < len(prompts) for t, n in kept), kept


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
        tok, lp = sample_next(logits, T, None, None, torch.Generator().manual_seed(0))
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


def assert_generate_equals_plain(m, prompts, max_new, **kw):
    """engine.generate and the plain GPT.generate (no cache) draw the same tokens: each prompt alone
    with the same seed, then all the prompts of equal length as one batch."""
    for i, p in enumerate(prompts):
        seed = lambda: torch.Generator().manual_seed(i)
        fast, _ = engine.generate(m, [p], max_new, generator=seed(), **kw)
        plain = m.generate(torch.tensor([p]), max_new, generator=seed(), **kw)
        assert fast[0].tolist() == plain[0, len(p):].tolist()
    if "eos_id" not in kw:  # a batch: one uniform per row and step in both, rows in the same order
        batch = [p for p in prompts if len(p) == len(prompts[0])] * 2
        fast, _ = engine.generate(m, batch, max_new, generator=torch.Generator().manual_seed(9), **kw)
        plain = m.generate(torch.tensor(batch), max_new, generator=torch.Generator().manual_seed(9),
                           **kw)
        assert torch.equal(fast, plain[:, len(batch[0]):])
        # prompts shared by 3 samples each equal the prompts repeated 3 times
        fast, _ = engine.generate(m, batch, max_new, num_samples=3,
                                  generator=torch.Generator().manual_seed(9), **kw)
        plain = m.generate(torch.tensor(batch).repeat_interleave(3, 0), max_new,
                           generator=torch.Generator().manual_seed(9), **kw)
        assert torch.equal(fast, plain[:, len(batch[0]):])


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_generate_equals_plain_generate_tiny(family):
    torch.manual_seed(0)
    cfg = dict(vocab_size=8, block_size=64, n_layer=2, n_head=4, n_embd=16)
    m = GPT(GPTConfig.llama(n_kv_head=2, **cfg) if family == "llama" else GPTConfig.gpt2(**cfg))
    m = m.eval()
    prompts = [[1, 2, 3], [4, 5, 6], [7], [3, 1, 4, 1, 5, 2, 6]]
    lengths = []
    for kw in (dict(temperature=0), dict(temperature=1.0), dict(temperature=0.8, top_k=4),
               dict(temperature=1.0, top_p=0.9)):
        assert_generate_equals_plain(m, prompts, 20, **kw)
        for eos in (0, 5):  # rows stop at eos_id, at different steps
            assert_generate_equals_plain(m, prompts, 20, eos_id=eos, **kw)
            toks, _ = engine.generate(m, prompts, 20, eos_id=eos, **kw,
                                      generator=torch.Generator().manual_seed(0))
            lengths += (toks >= 0).sum(1).tolist()
    assert min(lengths) < 20 and max(lengths) == 20   # some rows did stop early, some did not


def test_generate_equals_plain_generate_shipped_checkpoint():
    """The shipped text-game model on real prompts: greedy and seeded T=1, stopping at EOS."""
    from checkpoint import load_model
    from data.textgame.simulator import generate_split
    from data.textgame.task import prompt_text
    from tokenizer_text import load_tokenizer
    m = load_model(ROOT / "checkpoints" / "textgame" / "mle.safetensors")[0].eval()
    tok = load_tokenizer(ROOT / "checkpoints" / "textgame" / "tokenizer.tiktoken")
    prompts = [tok.encode(prompt_text(r)) for r in generate_split("val", 3, 0)]
    assert len({len(p) for p in prompts}) > 1  # prompts of different lengths
    for kw in (dict(temperature=0), dict(temperature=1.0)):
        assert_generate_equals_plain(m, prompts, 48, eos_id=tok.eos_id, **kw)
        assert_generate_equals_plain(m, prompts, 16, **kw)
    toks, _ = engine.generate(m, prompts, 48, temperature=0, eos_id=tok.eos_id)
    assert (toks == tok.eos_id).any()  # the greedy answers end with EOS within 48 tokens


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_static_path_equals_eager(family):
    """generate(graphs=True), the static-shape path (run eagerly on a CPU), against the eager one:
    greedy tokens with and without EOS (rows finishing at different steps, the width trimmed as
    the eager path's), and seeded samples without EOS (the eager path then drops no row, so both
    draw one uniform per row and step)."""
    torch.manual_seed(0)
    cfg = dict(vocab_size=8, block_size=96, n_layer=2, n_head=4, n_embd=16)
    m = GPT(GPTConfig.llama(n_kv_head=2, **cfg) if family == "llama" else GPTConfig.gpt2(**cfg))
    m = m.eval()
    prompts = [[1, 2, 3], [4, 5, 6], [7], [3, 1, 4, 1, 5, 2, 6]]
    widths, mixed = [], False
    for kw in (dict(temperature=0), dict(temperature=0, eos_id=0), dict(temperature=0, eos_id=5),
               dict(temperature=1.0), dict(temperature=0.8, top_k=4), dict(top_p=0.9)):
        for S in (1, 3):
            # 70 new tokens: more than two of the static path's blocks of SYNC_EVERY
            a = engine.generate(m, prompts, 70, num_samples=S, **kw,
                                generator=torch.Generator().manual_seed(1))
            b = engine.generate(m, prompts, 70, num_samples=S, graphs=True, **kw,
                                generator=torch.Generator().manual_seed(1))
            assert torch.equal(a[0], b[0]), kw
            assert torch.allclose(a[1], b[1], atol=1e-5) and torch.equal(a[1] == 0, b[1] == 0)
            widths.append(a[0].size(1))
    # greedy with every id as EOS in turn: rows stop at different steps, or all early (trimmed)
    for eos in range(8):
        a = engine.generate(m, prompts, 40, temperature=0, eos_id=eos, num_samples=2)
        b = engine.generate(m, prompts, 40, temperature=0, eos_id=eos, num_samples=2, graphs=True)
        assert torch.equal(a[0], b[0]) and torch.allclose(a[1], b[1], atol=1e-5)
        widths.append(a[0].size(1))
        stopped = (a[0] == -1).any(1)
        mixed = mixed or bool(stopped.any() and not stopped.all())
    # one prompt whose EOS is its greedy token at column 3: stopped at 3 or before, trimmed there
    eos = int(engine.generate(m, prompts[:1], 4, temperature=0)[0][0, 3])
    a = engine.generate(m, prompts[:1], 40, temperature=0, eos_id=eos)
    b = engine.generate(m, prompts[:1], 40, temperature=0, eos_id=eos, graphs=True)
    assert torch.equal(a[0], b[0]) and a[0].size(1) <= 4
    assert mixed and max(widths) == 70


def test_static_uniforms_drawn_in_blocks_equal_per_step_draws():
    """The static path's uniforms: blocks of SYNC_EVERY columns from a CPU generator give the
    numbers of one draw per column, and the generator ends in the same state."""
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    draws = engine_static.uniforms(g1, 5, 70, torch.device("cpu"))
    for c in range(70):
        assert torch.equal(next(draws), torch.rand(5, 1, generator=g2, dtype=torch.float64))
    assert torch.equal(g1.get_state(), g2.get_state())


def test_cast_copy_casts_once_under_low_precision_autocast():
    """engine.cast_copy: under bf16 autocast, a bf16 copy (tied weights stay tied, the float32
    model untouched) sampling the same greedy tokens as the model under autocast; outside autocast
    (a float32 run) the model itself."""
    torch.manual_seed(0)
    m = GPT(GPTConfig.llama(vocab_size=16, block_size=32, n_layer=1, n_head=2, n_embd=16)).eval()
    assert engine.cast_copy(m) is m
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = engine.cast_copy(m)
        assert low is not m and low.lm_head.weight is low.wte.weight
        assert {p.dtype for p in low.parameters()} == {torch.bfloat16}
        assert {p.dtype for p in m.parameters()} == {torch.float32}
        a = engine.generate(m, [[1, 2, 3]], 8, temperature=0)[0]
        b = engine.generate(low, [[1, 2, 3]], 8, temperature=0)[0]
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_static_blocks_and_dropped_rows_equal_all_rows_all_positions(dtype, monkeypatch):
    """The static path reading the generated keys in blocks of WIDTH positions and dropping done
    rows by halves (engine_static.drop_done) against reading all max_new positions with every row kept:
    tokens equal, log-probs within 1e-5 (float32) or 1e-12 (float64 weights); greedy tokens and
    seeded samples without EOS equal to the eager path's. Equal-length prompts (a causal prefill,
    no mask) too."""
    torch.manual_seed(0)
    cfg = GPTConfig.llama(vocab_size=8, block_size=128, n_layer=2, n_head=4, n_kv_head=2, n_embd=16)
    m = GPT(cfg).to(dtype).eval()
    kept = []   # the rows each drop_done kept
    drop = engine_static.drop_done

    def recorded(rows, cache):
        drop(rows, cache)
        kept.append(len(cache.live))
    monkeypatch.setattr(engine_static, "drop_done", recorded)
    monkeypatch.setattr(engine_static, "SYNC_EVERY", 4)   # the host looks at EOS (and drops) often
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for prompts in ([[1, 2, 3], [4, 5, 6], [7], [3, 1, 4, 1, 5, 2, 6]], [[1, 2, 3], [4, 5, 6]]):
        for kw in (dict(temperature=0), dict(temperature=0, eos_id=0), dict(temperature=1.0),
                   dict(temperature=1.0, eos_id=0), dict(temperature=0.8, top_k=4, eos_id=5)):
            def run(width, min_rows, compact=True, graphs=True):
                monkeypatch.setattr(engine_static, "WIDTH", width)
                monkeypatch.setattr(engine_static, "MIN_ROWS", min_rows)
                g = torch.Generator().manual_seed(1)
                if not graphs:
                    return engine.generate(m, prompts, 60, num_samples=4, generator=g, **kw)
                return engine_static.static_generate(m, prompts, 60, kw.get("temperature", 1.0),
                                              kw.get("top_k"), None, kw.get("eos_id"), g, 4, None,
                                              compact=compact)
            full = run(60, 1, compact=False)
            for width, min_rows in ((8, 1), (7, 2), (128, 4)):
                fast = run(width, min_rows)
                assert torch.equal(fast[0], full[0]), (kw, width)
                assert torch.allclose(fast[1], full[1], atol=tol, rtol=0), (kw, width)
            if kw["temperature"] == 0 or "eos_id" not in kw:
                eager = run(8, 1, graphs=False)
                assert torch.equal(eager[0], full[0]), kw
                assert torch.allclose(eager[1], full[1], atol=tol, rtol=0), kw
    assert 1 in kept and 16 in kept and any(8 >= k > 1 for k in kept)   # rows dropped by halves


def static_case(monkeypatch, compile):
    """A tiny model's static path with EOS, blocks of 16 positions and rows dropped."""
    torch.manual_seed(0)
    cfg = GPTConfig.llama(vocab_size=8, block_size=96, n_layer=2, n_head=4, n_kv_head=2, n_embd=16)
    m = GPT(cfg).eval()
    monkeypatch.setattr(engine_static, "WIDTH", 16)
    monkeypatch.setattr(engine_static, "SYNC_EVERY", 8)
    monkeypatch.setattr(engine_static, "MIN_ROWS", 2)
    prompts = [[1, 2, 3], [4, 5, 6], [7], [3, 1, 4, 1, 5, 2, 6]]
    with torch.inference_mode():
        return engine_static.static_generate(m, prompts, 40, 1.0, None, None, 0,
                                      torch.Generator().manual_seed(0), 2, None, compile=compile)


@pytest.mark.slow
def test_static_compiled_step_equals_uncompiled(monkeypatch):
    """The static path's decode step compiled by torch.compile (engine.compiled_step, the default
    on a GPU; inductor on this CPU, ~1-2 min) against uncompiled: seeded samples equal, through
    blocks of WIDTH positions and dropped rows; log-probs within 1e-5."""
    plain = static_case(monkeypatch, False)
    assert (plain[0] == -1).any()   # rows finished (and were dropped)
    monkeypatch.setattr(engine_static, "STEP", {})
    got = static_case(monkeypatch, True)
    assert torch.equal(got[0], plain[0]) and torch.allclose(got[1], plain[1], atol=1e-5)


def test_static_compile_failure_falls_back_to_uncompiled(monkeypatch, capsys):
    """Where torch.compile fails: one message, then the uncompiled step's results."""
    plain = static_case(monkeypatch, False)

    def broken(fn, **kw):
        def fail(*a):
            raise RuntimeError("no compiler here")
        return fail
    monkeypatch.setattr(engine_static, "STEP", {})
    monkeypatch.setattr(torch, "compile", broken)
    got = static_case(monkeypatch, True)
    assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1])
    err = capsys.readouterr().err
    assert err.count("torch.compile failed (RuntimeError: no compiler here)") == 1, err
