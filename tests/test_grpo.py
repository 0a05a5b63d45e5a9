"""GRPO math on hand-computed tensors, packing and masks, micro-batching, dynamic sampling, the entropy bonus, bf16
old log-probs, DDP minibatches empty on every rank, grpo_step against the plain step, a tiny task whose reward must
rise (the RL loop: the scripts' tests, and research/tests/test_rl_loop.py; research/tests/test_placebo.py: the
placebo)."""
import argparse
import copy
import gc
import json
import math
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import engine
import grpo
from grpo import (Env, GRPOConfig, aggregate, clipped_objective, group_advantages, grpo_loss, grpo_step, k3_kl,
                  logprobs_shared_prompts, pack)
from model import GPT, GPTConfig
from runtime import check_step

torch.set_num_threads(1)


def config(**kw):
    """The tests' GRPO settings: every given prompt's group, no entropy bonus, one minibatch, unless a test says."""
    return GRPOConfig(**{**dict(prompts_per_step=0, entropy_coef=0.0, minibatches=1), **kw})


def test_group_advantages_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    a = group_advantages(r, std_norm=True, eps=0.0 + 1e-12)
    assert torch.allclose(a[0], torch.tensor([1.0, -1.0, -1.0, 1.0]))  # mean 0.5, population std 0.5
    assert torch.equal(a[1], torch.zeros(4))                            # no spread, no signal
    assert torch.allclose(group_advantages(r, std_norm=False)[0], torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_k3_kl_by_hand():
    logp, ref = torch.tensor([math.log(0.5), math.log(0.3)]), torch.tensor([math.log(0.25), math.log(0.3)])
    kl = k3_kl(logp, ref)
    assert abs(kl[0].item() - (0.5 + math.log(2.0) - 1.0)) < 1e-6  # exp(d) - d - 1, d = log(0.25/0.5)
    assert kl[1].item() == 0.0


def test_clipped_objective_by_hand():
    logp = torch.log(torch.tensor([[1.5, 0.5, 0.5, 1.0]]))
    old = torch.zeros(1, 4)
    loss, ratio, clipped = clipped_objective(logp, old, torch.tensor([1.0]), 0.2)
    assert torch.allclose(ratio, torch.tensor([[1.5, 0.5, 0.5, 1.0]]))
    # A=+1: ratio 1.5 -> clipped to 1.2; ratio 0.5 -> min(0.5, 0.8) = 0.5, not clipped; ratio 1 -> 1
    assert torch.allclose(loss, torch.tensor([[-1.2, -0.5, -0.5, -1.0]]))
    assert clipped.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    loss, _, clipped = clipped_objective(logp, old, torch.tensor([-1.0]), 0.2)
    # A=-1: ratio 1.5 -> min(-1.5, -1.2) = -1.5; ratio 0.5 -> min(-0.5, -0.8) = -0.8 (clipped)
    assert torch.allclose(loss, torch.tensor([[1.5, 0.8, 0.8, 1.0]]))
    assert clipped.tolist() == [[0.0, 1.0, 1.0, 0.0]]


def test_aggregate_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    assert aggregate(x, m, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(x, m, "seq-mean").item() == pytest.approx((2 + 4) / 2)
    # a micro-batch's share of its minibatch's mean: the minibatch's token / row counts divide; shares add up
    assert aggregate(x[:1], m[:1], "token-mean", n_tokens=4).item() == pytest.approx(6 / 4)
    assert aggregate(x[1:], m[1:], "token-mean", n_tokens=4).item() == pytest.approx(4 / 4)
    assert aggregate(x[:1], m[:1], "seq-mean", n_parts=2).item() == pytest.approx(2 / 2)
    assert aggregate(x[1:], m[1:], "seq-mean", n_parts=2).item() == pytest.approx(4 / 2)
    empty = torch.zeros(2, 3, dtype=torch.bool)   # no tokens: 0, not NaN
    assert aggregate(x, empty, "token-mean").item() == 0.0 and aggregate(x, empty, "seq-mean").item() == 0.0


def test_grpo_loss_by_hand():
    # two rows, 2 tokens each, the second row's last token masked out; old = ref = 0 (prob 1), so ratio = exp(logp)
    logp = torch.log(torch.tensor([[1.5, 1.0], [0.5, 2.0]]))
    zeros = torch.zeros(2, 2)
    entropy = torch.tensor([[0.4, 0.2], [0.6, 9.0]])
    adv, mask = torch.tensor([1.0, -1.0]), torch.tensor([[True, True], [True, False]])
    cfg = config(clip_eps=0.2, beta=0.1, entropy_coef=0.5)
    # pg: row 0 (A=+1) ratio 1.5 -> clipped 1.2 -> -1.2; ratio 1 -> -1; row 1 (A=-1) ratio 0.5 -> max(0.5, 0.8) = 0.8
    # kl = exp(-logp) + logp - 1: 1/1.5 + log 1.5 - 1, 0, 2 + log 0.5 - 1
    kl = [1 / 1.5 + math.log(1.5) - 1, 0.0, 2 + math.log(0.5) - 1]
    per_token = [pg + 0.1 * k - 0.5 * e for pg, k, e in zip([-1.2, -1.0, 0.8], kl, [0.4, 0.2, 0.6])]
    loss, parts = grpo_loss(logp, zeros, zeros, entropy, adv, mask, cfg)
    assert loss.item() == pytest.approx(sum(per_token) / 3)                          # token-mean
    assert parts["clip"].tolist() == [[1.0, 0.0], [1.0, 0.0]]
    cfg.loss_agg = "seq-mean"
    loss, _ = grpo_loss(logp, zeros, zeros, entropy, adv, mask, cfg)
    assert loss.item() == pytest.approx(((per_token[0] + per_token[1]) / 2 + per_token[2]) / 2)


def test_pack_masks_completion_and_eos_only():
    tokens = torch.tensor([[3, 4, 0], [6, -1, -1]])  # 0 = eos, kept in the loss; -1 = nothing generated
    prompt_idx, prompt_len, idx, targets = pack([[1, 2], [5]], tokens)
    assert prompt_idx.tolist() == [[1], [0]] and prompt_len.tolist() == [1, 0]  # prompts less their last token
    assert idx.tolist() == [[2, 3, 4], [5, 6, 0]]  # the prompt's last token, then the completion shifted by one
    assert targets.tolist() == [[3, 4, 0], [6, -1, -1]]
    sampled = torch.tensor([[True, False, True], [True, True, True]])  # an injected token is input, not target
    assert pack([[1, 2], [5]], tokens, sampled)[3].tolist() == [[3, -1, 0], [6, -1, -1]]
    _, _, idx, targets = pack([[7, 8]], torch.tensor([[3, 0], [4, 5]]))  # G = 2 rows continue one prompt
    assert idx.tolist() == [[8, 3], [8, 4]] and targets.tolist() == [[3, 0], [4, 5]]


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig.llama(vocab_size=8, block_size=32, n_layer=1, n_head=2, n_embd=16))


def count_threes(items, completions):
    return [sum(t == 3 for t in c) / 6 for c in completions]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
def test_micro_batching_gives_the_same_update(agg):
    cfg_a = config(group_size=4, max_new_tokens=6, beta=0.1, loss_agg=agg, micro_batch=64)
    cfg_b = config(group_size=4, max_new_tokens=6, beta=0.1, loss_agg=agg, micro_batch=3)
    weights = []
    for cfg in (cfg_a, cfg_b):
        model = tiny_model()
        ref = copy.deepcopy(model).eval()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        grpo_step(model, ref, opt, [[1, 2], [4]], [None, None], Env(count_threes, eos_id=0), cfg,
                  torch.Generator().manual_seed(0))
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.allclose(weights[0], weights[1], atol=1e-6)


def test_on_policy_ratio_is_one_and_kl_zero_at_start():
    model = tiny_model()
    ref = copy.deepcopy(model).eval()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = grpo_step(model, ref, opt, [[1, 2], [4], [5, 6, 7]], [None] * 3, Env(count_threes, eos_id=0),
                      config(group_size=4, max_new_tokens=6, beta=0.1), torch.Generator().manual_seed(0))
    assert stats["clip_frac"] == 0.0 and abs(stats["kl"]) < 1e-6
    assert abs(stats["ratio_first"] - 1.0) < 1e-5          # float32: the sampler's log-probs are the update's


def test_reward_rises_on_a_tiny_task():
    model = tiny_model(1)
    ref = copy.deepcopy(model).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    cfg = config(group_size=8, max_new_tokens=6, beta=0.01, minibatches=2, prompts_per_step=4)
    g = torch.Generator().manual_seed(0)
    source = Env(count_threes, draw=lambda n: ([[1 + i % 5] for i in range(n)], [None] * n))
    stats = [grpo_step(model, ref, opt, [[1], [2], [4], [5]], [None] * 4, source, cfg, g, step=s)
             for s in range(40)]
    rewards = [s["reward_mean"] for s in stats]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert first < 0.3 and last > 0.8, (first, last)   # measured: 0.13 -> 0.97
    assert all(s["groups_kept"] == 4 for s in stats[:5])    # refilled to the target while groups still had spread


def test_groups_without_reward_spread_are_skipped():
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    stats = grpo_step(model, None, opt, [[1, 2], [4]], [None, None], Env(lambda items, comps: [1.0] * len(comps)),
                      config(group_size=4, max_new_tokens=4, beta=0.0), torch.Generator().manual_seed(0))
    assert stats["zero_std_frac"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_headroom_scores_greedy_against_the_best_sample(capsys):
    model, prompts = tiny_model(), [[1, 2], [4], [5, 6, 7]]
    cfg = config(group_size=6, max_new_tokens=5)
    greedy = engine.generate(model, prompts, 5, temperature=0)[0].tolist()   # (3, 5): EOS never drawn
    # reward 1 for any answer but the greedy one: greedy scores 0, a sample that differs fixes it
    source = Env(lambda items, comps: [float(c != greedy[i]) for i, c in zip(items, comps)])
    h = grpo.headroom(model, prompts, [0, 1, 2], source, cfg, name="the test")
    assert (h["n"], h["G"], h["greedy"], h["best"], h["fixed"]) == (3, 6, 0.0, 1.0, 1.0), h
    assert "headroom of the test on 3 val prompts" in capsys.readouterr().out
    flat = Env(lambda items, comps: [0.5] * len(comps))   # no sample can beat greedy
    assert grpo.headroom(model, prompts, [0, 1, 2], flat, cfg) | {"n": 0} == dict(
        n=0, G=6, temperature=1.0, greedy=0.5, best=0.5, fixed=0.0, spread=0.0)


# -----------------------------------------------------------------------------
# dynamic sampling, placebo, entropy bonus, low precision

def spread_only_after_token_5(items, completions):
    """Prompts [5, ...] (item "5") are scored by their completions (spread); all others score 1 (no spread)."""
    return [sum(t == 3 for t in c) / 6 if it == "5" else 1.0 for it, c in zip(items, completions)]


def weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_dynamic_sampling_refills_to_the_target():
    model = tiny_model()
    asked = []

    def next_prompts(n):  # every refill prompt has reward spread (with high probability at T=1 over 6 tokens)
        asked.append(n)
        return [[5, 1 + i % 3] for i in range(n)], ["5"] * n

    cfg = config(group_size=4, max_new_tokens=6, beta=0.0, prompts_per_step=3, max_rounds=5)
    # the first round: 2 prompts without spread, 1 with: 1 kept, 2 more wanted at a spread rate of 1/3 -> asks for
    # min(3 = the first round's size, ceil(2 * 3 / 1) = 6) = 3
    stats = grpo_step(model, None, torch.optim.SGD(model.parameters(), lr=0.1), [[1, 2], [4], [5, 6]],
                      ["1", "4", "5"], Env(spread_only_after_token_5, draw=next_prompts), cfg,
                      torch.Generator().manual_seed(0))
    assert asked == [3] and stats["rounds"] == 2 and stats["groups"] == 6
    assert stats["groups_kept"] == 3                        # 4 groups had spread; the update takes exactly 3
    assert stats["zero_std_frac"] == pytest.approx(2 / 6)  # of every sampled group


def test_dynamic_sampling_stops_after_max_rounds_without_an_update():
    model = tiny_model()
    before = weights(model)
    asked = []

    def next_prompts(n):
        asked.append(n)
        return [[1, 2]] * n, ["1"] * n    # never any spread

    cfg = config(group_size=4, max_new_tokens=4, beta=0.1, prompts_per_step=2, max_rounds=3)
    stats = grpo_step(model, copy.deepcopy(model).eval(), torch.optim.SGD(model.parameters(), lr=1.0),
                      [[1, 2], [4]], ["1", "4"], Env(spread_only_after_token_5, draw=next_prompts), cfg,
                      torch.Generator().manual_seed(0))
    assert asked == [2, 2] and stats["rounds"] == 3 and stats["groups"] == 6 and stats["groups_kept"] == 0
    assert stats["zero_std_frac"] == 1.0 and torch.equal(before, weights(model))   # nothing to learn from
    assert math.isnan(stats["kl"]) and math.isnan(stats["ratio_first"])            # no update: no update stats
    # without a prompt source a step is one round, as before dynamic sampling
    stats = grpo_step(model, None, torch.optim.SGD(model.parameters(), lr=1.0), [[1, 2], [4]], ["1", "4"],
                      Env(spread_only_after_token_5), cfg, torch.Generator().manual_seed(0))
    assert stats["rounds"] == 1 and stats["groups_kept"] == 0


def test_a_bf16_step_casts_the_sampler_weights_once_for_all_its_rounds(monkeypatch):
    """engine.cast_copy runs once per step (grpo.sample_groups), not once per round; each round samples bf16."""
    casts, sampled = [], []
    monkeypatch.setattr(grpo, "cast_copy", lambda m: casts.append(m) or engine.cast_copy(m))
    monkeypatch.setattr(grpo, "generate",
                        lambda m, *a, **k: sampled.append(m.wte.weight.dtype) or engine.generate(m, *a, **k))
    model = tiny_model()
    cfg = config(group_size=4, max_new_tokens=4, beta=0.0, prompts_per_step=2, max_rounds=3)
    stats = grpo_step(model, None, torch.optim.SGD(model.parameters(), lr=1.0), [[1, 2], [4]], ["1", "4"],
                      Env(spread_only_after_token_5, draw=lambda n: ([[1, 2]] * n, ["1"] * n)), cfg,
                      torch.Generator().manual_seed(0), autocast=torch.autocast("cpu", dtype=torch.bfloat16))
    assert stats["rounds"] == 3 and len(casts) == 1 and sampled == [torch.bfloat16] * 3


def packed(prompts, tokens):
    """`grpo.update_batch`'s layout of the rows `tokens` continuing `prompts` (G rows each), for the log-probs."""
    rows = torch.arange(len(prompts)).repeat_interleave(len(tokens) // len(prompts))
    return grpo.Batch(*pack(prompts, tokens), rows, None, None, None, None)


def mean_entropy(model, prompts, tokens):
    with torch.no_grad():
        _, ent = logprobs_shared_prompts(model, packed(prompts, tokens), list(range(len(tokens))), config())
    return ent.mean().item()


@pytest.mark.parametrize("coef", [1.0, -1.0])
def test_entropy_bonus_raises_entropy(coef):
    # constant rewards kept (skip_zero_std off): advantages 0, no KL, so the only gradient is the entropy term
    model = tiny_model()
    probe = torch.randint(1, 8, (8, 6), generator=torch.Generator().manual_seed(1))
    before = mean_entropy(model, [[1, 2], [4]], probe)
    cfg = config(group_size=4, max_new_tokens=6, beta=0.0, entropy_coef=coef, skip_zero_std=False)
    stats = grpo_step(model, None, torch.optim.SGD(model.parameters(), lr=0.5), [[1, 2], [4]], [None, None],
                      Env(lambda items, comps: [1.0] * len(comps)), cfg, torch.Generator().manual_seed(0))
    after = mean_entropy(model, [[1, 2], [4]], probe)
    assert stats["grad_norm"] > 0 and stats["loss"] == pytest.approx(-coef * stats["entropy"], rel=1e-5)
    assert (after - before) * coef > 0, (before, after)     # +coef raises the entropy, -coef lowers it


@pytest.mark.parametrize("minibatches", [1, 2])
def test_bf16_recomputes_old_logprobs_so_the_first_ratio_is_one(monkeypatch, minibatches):
    def step(model):
        cfg = config(group_size=4, max_new_tokens=6, beta=0.1, minibatches=minibatches, micro_batch=3,
                         entropy_coef=0.01)
        return grpo_step(model, copy.deepcopy(model).eval(), torch.optim.AdamW(model.parameters(), lr=1e-2),
                         [[1, 2], [4], [5, 6, 7]], [None] * 3, Env(count_threes, eos_id=0), cfg,
                         torch.Generator().manual_seed(0), autocast=torch.autocast("cpu", dtype=torch.bfloat16))

    assert check_step(tiny_model(), 0, nullcontext()) is False   # fp32, no autocast: the sampler's kept
    assert check_step(tiny_model().to(torch.bfloat16), 0, nullcontext()) is True
    assert check_step(tiny_model(), 0, torch.autocast("cpu", dtype=torch.bfloat16)) is True
    stats = step(tiny_model())
    assert stats["ratio_first"] == 1.0 and stats["groups_kept"] > 0   # exactly: the update's own path
    assert stats["clip_frac"] == 0.0 or minibatches > 1              # one minibatch: nothing moved before it
    # the sampler's bf16 log-probs are not the update's: trusting them gives a first ratio other than 1
    monkeypatch.setattr(grpo, "check_step", lambda model, step, autocast: False)
    assert step(tiny_model())["ratio_first"] != 1.0


def test_shared_prompt_logprobs_equal_the_plain_forward_of_prompt_and_completion():
    model = tiny_model()
    prompts, tokens = [[1, 2, 3], [4]], torch.tensor([[5, 6, 0], [7, -1, -1], [3, 3, 3], [2, 0, -1]])
    b = packed(prompts, tokens)
    logp, ent = logprobs_shared_prompts(model, b, [0, 1, 2, 3], config(temperature=0.7))
    for n, (p, row) in enumerate(zip([prompts[0]] * 2 + [prompts[1]] * 2, tokens.tolist())):
        done = [t for t in row if t >= 0]
        logits, _ = model(torch.tensor([p + done[:-1]]))   # the whole sequence, prompt and completion
        plain = torch.log_softmax(logits[0, len(p) - 1:].float() / 0.7, -1)   # (len(done), vocab)
        assert torch.allclose(logp[n, :len(done)], plain[torch.arange(len(done)), done], atol=1e-5)
        assert torch.allclose(ent[n, :len(done)], -(plain.exp() * plain).sum(-1), atol=1e-5)
    # the 1-token prompt's rows alone: an empty prompt pass (FSDP needs one in every chunk)
    alone, _ = logprobs_shared_prompts(model, b, [2, 3], config(temperature=0.7))
    assert torch.allclose(alone, logp[2:], atol=1e-6)


# -----------------------------------------------------------------------------
# DDP: a minibatch empty on every rank takes no optimizer step (AdamW would move the weights anyway)

def ddp_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    model = tiny_model()
    policy = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    # 8 minibatches: rank 0's one group of 4 rows fills 4 of them, rank 1 (no reward spread) none, so rank 1 joins
    # rank 0's 4 all-reduces and the other 4 minibatches are empty everywhere
    cfg = config(group_size=4, max_new_tokens=6, beta=0.0, minibatches=8)
    reward = count_threes if rank == 0 else (lambda items, comps: [1.0] * len(comps))
    gen = torch.Generator().manual_seed(0)
    first = grpo_step(policy, None, opt, [[1, 2]], [None], Env(reward), cfg, gen)
    after_first = weights(model)
    steps = [int(opt.state[p]["step"]) for p in model.parameters()]
    # no spread anywhere: every minibatch empty on every rank, nothing moves
    second = grpo_step(policy, None, opt, [[1, 2]], [None], Env(lambda items, comps: [1.0] * len(comps)), cfg,
                       gen)
    save_file(dict(after_first=after_first, end=weights(model)), f"{out_dir}/rank{rank}.safetensors")
    Path(f"{out_dir}/rank{rank}.json").write_text(json.dumps(dict(first=first, second=second, steps=steps)))
    # tear down in order: both ranks done, then free DDP (it holds the process group) before destroying the
    # group; a group freed at interpreter exit instead aborted a loaded CI machine now and then
    # ("terminate called without an active exception", about 1 run in 50)
    dist.barrier()
    del policy, model, opt
    gc.collect()
    dist.destroy_process_group()


def test_ddp_minibatches_empty_on_every_rank_take_no_optimizer_step(tmp_path):
    torch.multiprocessing.spawn(ddp_worker, args=(2, tmp_path / "init", tmp_path), nprocs=2)
    r0, r1 = ({**load_file(tmp_path / f"rank{r}.safetensors"),
               **json.loads((tmp_path / f"rank{r}.json").read_text())} for r in (0, 1))
    assert r0["first"]["groups_kept"] == r1["first"]["groups_kept"] == 1   # the ranks' sum, logged by both
    assert r0["steps"] == r1["steps"] == [4] * len(r0["steps"])   # one AdamW step per minibatch with rows
    assert torch.equal(r0["after_first"], r1["after_first"])        # the ranks stay in step
    assert torch.equal(r0["end"], r0["after_first"]) and torch.equal(r1["end"], r1["after_first"])


# -----------------------------------------------------------------------------
# the plain step and the fast one: the same GRPO (llm.c's pattern: a reference beside the fast code)

@pytest.mark.parametrize("kw", [dict(beta=0.1, entropy_coef=0.01, micro_batch=4),
                                dict(beta=0.0, loss_agg="seq-mean", std_unbiased=True, micro_batch=64),
                                dict(beta=0.05, kl_clamp=0.5, clip_eps=0.1, temperature=0.8, micro_batch=5)])
def test_grpo_step_equals_the_plain_step(kw):
    """One process, float32, one minibatch and epoch, no refill: grpo_step samples the same completions, gets the
    same rewards and advantages, and leaves the weights the plain step leaves (three steps in a row, AdamW)."""
    cfg = config(group_size=6, max_new_tokens=5, max_rounds=1, **kw)
    prompts = [[1, 2], [4], [5, 6, 7]]   # one a step: the plain sampler draws the uniforms of each prompt's G rows
    seen = {"plain": [], "fast": []}

    def scorer(name):   # count_threes, logging what it scored
        def score(records, completions):
            seen[name].append((completions, count_threes(records, completions)))
            return seen[name][-1][1]
        return score

    models = {}
    for name in ("plain", "fast"):
        model = tiny_model(3)
        ref = copy.deepcopy(model).eval() if cfg.beta > 0 else None
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for s, p in enumerate(prompts):
            g = torch.Generator().manual_seed(s)   # (grpo_step draws its minibatch order after sampling)
            if name == "plain":
                grpo.plain_grpo_step(model, ref, opt, [p], [None], scorer(name), cfg, g)
            else:
                grpo_step(model, ref, opt, [p], [None], Env(scorer(name)), cfg, g, step=s)
        models[name] = model
    for (c_plain, r_plain), (c_fast, r_fast) in zip(seen["plain"], seen["fast"]):
        assert [list(c) for c in c_fast] == c_plain and r_fast == r_plain   # the same samples and rewards
    assert any(len(set(r)) > 1 for _, r in seen["plain"])                   # some group taught something
    for a, b in zip(models["plain"].parameters(), models["fast"].parameters()):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
