"""model.py against HF transformers (the oracle): logits, greedy continuations, KV cache, sampled log-probs."""
import pytest
import torch

from model import GPT, GPTConfig

torch.set_num_threads(1)
transformers = pytest.importorskip("transformers")


def hf_gpt2(tmp_path):
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    m.save_pretrained(tmp_path, safe_serialization=True)
    return m


def hf_qwen2(tmp_path, tie=False):
    cfg = transformers.Qwen2Config(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rope_theta=1000.0, rms_norm_eps=1e-6, tie_word_embeddings=tie)
    torch.manual_seed(0)
    m = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # random (non-zero) biases so the q/k/v bias path is really exercised
        for n, p in m.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.1)
    m.save_pretrained(tmp_path, safe_serialization=True)
    return m


@pytest.fixture(params=["gpt2", "qwen2", "qwen2_tied"])
def pair(request, tmp_path):
    if request.param == "gpt2":
        hf = hf_gpt2(tmp_path)
    else:
        hf = hf_qwen2(tmp_path, tie=request.param == "qwen2_tied")
    return hf, GPT.from_pretrained(tmp_path).eval()


def test_logits_match_hf(pair):
    hf, ours = pair
    idx = torch.randint(0, 90, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(idx).logits
        got, _ = ours(idx)
    assert got.shape == ref.shape
    assert torch.allclose(got, ref, atol=1e-4, rtol=0), (got - ref).abs().max()


def test_greedy_matches_hf(pair):
    hf, ours = pair
    prompt = [5, 17, 3, 44, 8]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)[0, len(prompt):]
    toks, _ = ours.generate([prompt], 12, temperature=0)
    assert toks[0].tolist() == ref.tolist()


def test_cached_greedy_equals_uncached(pair):
    _, ours = pair
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12, 13], [40]]
    toks, _ = ours.generate(prompts, 10, temperature=0)
    for b, p in enumerate(prompts):  # recompute each row token by token with full forward passes, no cache
        seq = list(p)
        for _ in range(10):
            logits, _ = ours(torch.tensor([seq]))
            seq.append(int(logits[0, -1].argmax()))
        assert toks[b].tolist() == seq[len(p):]


def test_sampled_logprobs_equal_fresh_forward(pair):
    _, ours = pair
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12, 13]]
    g = torch.Generator().manual_seed(0)
    toks, lps = ours.generate(prompts, 9, temperature=1.0, generator=g)
    for b, p in enumerate(prompts):
        seq = torch.tensor([p + toks[b].tolist()])
        targets = torch.cat([seq[:, 1:], torch.tensor([[-1]])], 1)
        fresh = ours.token_logprobs(seq, targets)[0, len(p) - 1:-1]
        assert torch.allclose(fresh, lps[b], atol=1e-5), (fresh, lps[b])


def test_shared_prompt_samples_equal_fresh_forward(pair):
    _, ours = pair  # G samples of a prompt share its prefill (generate) and its one prompt pass (forward(prompts=))
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12, 13]]
    toks, lps = ours.generate(prompts, 6, temperature=1.0, generator=torch.Generator().manual_seed(0), num_samples=3)
    toks = toks.clone()  # out of inference mode
    assert toks.shape == (6, 6)
    L = max(map(len, prompts))
    prompt_idx = torch.tensor([p + [0] * (L - len(p)) for p in prompts])
    rows = torch.tensor([0, 0, 0, 1, 1, 1])
    shared, _ = ours(toks, prompts=(prompt_idx, torch.tensor([3, 7]), rows))
    for n in range(6):
        p = prompts[n // 3]
        full, _ = ours(torch.tensor([p + toks[n].tolist()]))
        assert torch.allclose(shared[n], full[0, len(p):], atol=1e-5)
        fresh = torch.log_softmax(full[0, len(p) - 1:-1], -1).gather(-1, toks[n, :, None]).squeeze(-1)
        assert torch.allclose(fresh, lps[n], atol=1e-5)


def test_dropping_finished_rows_changes_no_row():
    torch.manual_seed(0)  # 8 tokens, eos 0: most rows finish early, so finished rows leave the batch several times
    m = GPT(GPTConfig.llama(vocab_size=8, block_size=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=16)).eval()
    prompts = [[1, 2], [3], [4, 5, 6], [7, 1, 2, 3]]
    toks, lps = m.generate(prompts, 24, temperature=1.0, eos_id=0, generator=torch.Generator().manual_seed(1),
                           num_samples=4)
    lengths = (toks >= 0).sum(1)
    assert lengths.min() < lengths.max()  # rows did finish at different steps
    for n in range(len(toks)):  # every row's log-probs equal a fresh forward pass of its own sequence
        p, c = prompts[n // 4], toks[n, :lengths[n]].tolist()
        logits, _ = m(torch.tensor([p + c]))
        fresh = torch.log_softmax(logits[0, len(p) - 1:-1], -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
        assert torch.allclose(fresh, lps[n, :len(c)], atol=1e-5)
        assert all(t == -1 for t in toks[n, lengths[n]:].tolist()) and (c[-1] == 0 or len(c) == toks.size(1))
    greedy = m.generate(prompts, 24, temperature=0, eos_id=0, num_samples=2)[0]
    for n in range(len(greedy)):  # and greedy rows equal the same prompt decoded alone
        alone = m.generate([prompts[n // 2]], 24, temperature=0, eos_id=0)[0][0]
        assert greedy[n, :len(alone)].tolist() == alone.tolist() and (greedy[n, len(alone):] == -1).all()


def test_generate_eos_padding_and_seeding():
    torch.manual_seed(0)
    m = GPT(GPTConfig.llama(vocab_size=8, block_size=64, n_layer=1, n_head=2, n_kv_head=1, n_embd=16)).eval()
    prompts = [[1, 2], [3], [4, 5, 6]]
    a = m.generate(prompts, 20, eos_id=0, generator=torch.Generator().manual_seed(3))
    b = m.generate(prompts, 20, eos_id=0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    toks, lps = a
    for row, lrow in zip(toks.tolist(), lps.tolist()):
        if 0 in row:  # after the first eos: -1 tokens and zero log-probs, the eos itself kept
            e = row.index(0)
            assert all(t == -1 for t in row[e + 1:]) and all(x == 0.0 for x in lrow[e + 1:])
        assert all(x <= 0 for x in lrow)


def test_top_k_top_p_restrict_support():
    torch.manual_seed(0)
    m = GPT(GPTConfig.gpt2(vocab_size=50, block_size=32, n_layer=1, n_head=2, n_embd=16)).eval()
    logits, _ = m(torch.tensor([[1, 2, 3]]))
    top2 = set(torch.topk(logits[0, -1], 2).indices.tolist())
    toks, _ = m.generate([[1, 2, 3]] * 64, 1, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(toks[:, 0].tolist()) <= top2
    toks, lps = m.generate([[1, 2, 3]] * 8, 1, top_p=1e-6, generator=torch.Generator().manual_seed(0))
    assert toks[:, 0].eq(logits[0, -1].argmax()).all() and torch.allclose(lps, torch.zeros_like(lps))


def test_training_loss_and_counts():
    m = GPT(GPTConfig.llama(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=32))
    idx, targets = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    logits, loss = m(idx, targets)
    assert logits.shape == (2, 16, 64) and abs(loss.item() - torch.log(torch.tensor(64.0)).item()) < 0.5
    assert m.num_params(non_embedding=False) == sum(p.numel() for p in m.parameters())
    assert m.flops_per_token(16) > 6 * m.num_params()


def test_missing_tensor_is_a_clear_error(tmp_path):
    from safetensors.torch import load_file, save_file
    hf_qwen2(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    sd.pop("model.layers.1.mlp.up_proj.weight")
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="up_proj"):
        GPT.from_pretrained(tmp_path)


def test_truncated_weights_name_the_file(tmp_path):
    hf_gpt2(tmp_path)
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(ValueError, match="model.safetensors"):
        GPT.from_pretrained(tmp_path)


def test_sharded_checkpoint_loads(tmp_path):
    hf = hf_qwen2(tmp_path / "src")
    hf.save_pretrained(tmp_path / "sharded", safe_serialization=True, max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ours = GPT.from_pretrained(tmp_path / "sharded").eval()
    idx = torch.randint(0, 90, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(ours(idx)[0], hf(idx).logits, atol=1e-4, rtol=0)
