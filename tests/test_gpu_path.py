"""The scale path's bugs that a CPU run hides, each shown on the CPU: a sampler given a generator on another
device than its logits (a CPU generator with CUDA logits crashed at the first sampled token), optimizer steps inside
an autocast region (the forwards after them saw the weights from before), ids past the tokenizer that a padded
embedding (Qwen2's) lets the sampler draw, float16 without a gradient scaler, activation checkpointing, and the
GRPO update's micro-batches keeping a prompt's samples together. bench/gpu_check.py runs them on a GPU."""
import argparse
import copy

import pytest
import torch

import grpo
from engine import generate
from grpo import Env, GRPOConfig, grpo_step
from model import GPT, GPTConfig, sample_next
from runtime import Run
from torch.optim.optimizer import register_optimizer_step_pre_hook
from tokenizer_text import Tokenizer

torch.set_num_threads(1)


def tiny(vocab=40, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig.llama(vocab_size=vocab, block_size=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=32))


def test_sampler_draws_on_the_generators_device(monkeypatch):
    """CUDA refuses a CPU generator for a CUDA tensor; torch.rand here refuses any generator on another device than
    the tensor it draws, as CUDA does, and the logits live on the meta device (no GPU needed)."""
    rand = torch.rand

    def strict_rand(*size, generator=None, device=None, **kw):
        if generator is not None and torch.device(device or "cpu") != generator.device:
            raise RuntimeError(f"Expected a '{torch.device(device).type}' device type for generator")
        return rand(*size, generator=generator, device=device, **kw)

    monkeypatch.setattr(torch, "rand", strict_rand)
    logits = torch.zeros(3, 7, device="meta")
    tok, logp = sample_next(logits, 1.0, None, None, torch.Generator())
    assert tok.device.type == "meta" and tok.shape == (3,) and logp.shape == (3,)
    # and on the CPU the stream is the one it always was: the same draws as before the fix
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    x = torch.randn(4, 9, generator=torch.Generator().manual_seed(0))
    u = rand(4, 1, generator=g2, dtype=torch.float64)
    cdf = torch.softmax(x, -1).cumsum(-1, dtype=torch.float64)
    expect = torch.searchsorted(cdf, u * cdf[:, -1:] * (1 - 1e-9), right=True).squeeze(-1)
    assert torch.equal(sample_next(x, 1.0, None, None, g1)[0], expect)


def optimizer_steps_under_autocast():
    """A global optimizer-step hook -> the list it fills: per optimizer step, whether autocast was on."""
    seen = []
    handle = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: seen.append(torch.is_autocast_enabled("cpu")))
    return seen, handle


def test_autocast_region_keeps_the_weights_it_cast_first():
    """Why no optimizer step may run inside an autocast region: autocast caches its bf16 copy of each weight for the
    region, so a forward after an in-region step sees the old weights."""
    model, x = torch.nn.Linear(8, 8), torch.randn(2, 8)
    opt = torch.optim.SGD(model.parameters(), lr=10.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = model(x)
        before.float().sum().backward()
        opt.step()
        inside = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fresh = model(x)
    assert torch.equal(inside, before) and not torch.equal(fresh, before)


def test_bf16_grpo_step_takes_no_optimizer_step_inside_autocast():
    model = tiny()
    cfg = GRPOConfig(prompts_per_step=0, group_size=4, max_new_tokens=6, minibatches=2, micro_batch=3)
    seen, handle = optimizer_steps_under_autocast()
    try:
        stats = grpo_step(model, copy.deepcopy(model).eval(), torch.optim.AdamW(model.parameters(), lr=1e-2),
                          [[1, 2], [4], [5, 6, 7]], [None] * 3,
                          Env(lambda items, c: [float(sum(x) % 2) for x in c], eos_id=0), cfg,
                          torch.Generator().manual_seed(0), autocast=torch.autocast("cpu", dtype=torch.bfloat16))
    finally:
        handle.remove()
    assert stats["groups_kept"] > 0 and seen and not any(seen), seen
    # called inside an autocast region, it refuses rather than train on stale weights
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match="autocast"):
        grpo_step(model, None, torch.optim.SGD(model.parameters(), lr=0.1), [[1]], [None],
                  Env(lambda i, c: [0.0] * 4), GRPOConfig(prompts_per_step=0, group_size=4, max_new_tokens=2,
                                                             beta=0.0), torch.Generator())


def padded_model():
    """A model whose embedding has 10 ids past a 30-id tokenizer, and whose logits favour them (as an untrained
    padded row may)."""
    model = tiny(vocab=40)
    with torch.no_grad():
        model.lm_head.weight[30:] = model.ln_f.weight.sign() * 0.5   # large logits for ids 30-39
    return model


def test_padded_ids_are_never_sampled_and_the_update_agrees():
    model = padded_model()
    free, _ = generate(model, [[1, 2, 3]], 16, generator=torch.Generator().manual_seed(0), num_samples=4)
    assert (free >= 30).any()                        # without the mask the padded ids are drawn
    tokens, logp = generate(model, [[1, 2, 3]], 16, generator=torch.Generator().manual_seed(0), num_samples=4,
                            vocab=30)
    assert (tokens < 30).all() and torch.isfinite(logp).all()
    # the GRPO step samples and scores only the 30 ids: its first ratio is 1 (the update's distribution is the
    # sampler's), and every completion is decodable
    cfg = GRPOConfig(prompts_per_step=0, group_size=4, max_new_tokens=8, minibatches=1, vocab=30)
    drawn = []

    def reward(items, comps):
        drawn.extend(t for c in comps for t in c)
        return [float(sum(c) % 2) for c in comps]

    stats = grpo_step(model, copy.deepcopy(model).eval(), torch.optim.SGD(model.parameters(), lr=0.0),
                      [[1, 2], [3, 4, 5]], [None, None], Env(reward, eos_id=0), cfg,
                      torch.Generator().manual_seed(1))
    assert drawn and max(drawn) < 30 and stats["ratio_first"] == pytest.approx(1.0, abs=1e-6)


def test_decoding_drops_ids_past_the_tokenizer():
    tok = Tokenizer.train(["hello world, hello there"] * 4, 260)
    assert tok.decode([104, 105, tok.n_vocab, tok.n_vocab + 200, 33]) == tok.decode([104, 105, 33])


def test_float16_is_refused_in_one_line(tmp_path, capsys):
    args = argparse.Namespace(device="cpu", dtype="float16", threads=1, seed=0)
    with pytest.raises(SystemExit):
        Run(args, tmp_path)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --dtype=float16") and "bfloat16" in err[0]


def test_activation_checkpointing_gives_the_same_gradients():
    """--grad_ckpt: the blocks' activations recomputed in the backward pass, on the plain forward and on the
    shared-prompt path of the GRPO update (whose prompt pass fills a cache the rows then read)."""
    prompts = (torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]]), torch.tensor([4, 2]), torch.tensor([0, 0, 1]))
    idx, tgt = torch.randint(1, 40, (3, 5)), torch.randint(1, 40, (3, 5))
    grads = []
    for ckpt in (False, True):
        model = tiny()
        model.grad_ckpt = ckpt
        (model(idx, tgt)[1] + model(idx, tgt, prompts=prompts)[1]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6) and grads[0].abs().sum() > 0


def test_update_chunks_keep_a_prompts_samples_together():
    """A minibatch cut into several micro-batches is cut in row order (rows are grouped by prompt), so a chunk of
    G rows holds one prompt; a minibatch that fits one micro-batch keeps its drawn order."""
    from types import SimpleNamespace
    from runtime import plan_update
    b, policy = SimpleNamespace(idx=torch.zeros(64, 1), mask=torch.ones(64, 1, dtype=torch.bool)), torch.nn.Linear(1, 1)
    plan = plan_update(policy, b, GRPOConfig(group_size=8, minibatches=2, micro_batch=8), torch.Generator().manual_seed(0))
    whole = plan_update(policy, b, GRPOConfig(minibatches=2, micro_batch=64), torch.Generator().manual_seed(0))
    for mb, drawn in zip(plan, whole):   # the same draw, cut in row order
        assert sorted(r for c in mb.micro for r in c) == sorted(drawn.micro[0])
        assert sum(len({r // 8 for r in c}) for c in mb.micro) <= len({r // 8 for r in drawn.micro[0]}) + len(mb.micro)
    assert [len(mb.micro) for mb in plan] == [4, 4] and all(mb.tokens == 32 and mb.pad == 0 for mb in plan)
    assert sorted(whole[0].micro[0]) != whole[0].micro[0]   # one micro-batch: the drawn order
