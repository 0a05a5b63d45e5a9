"""GRPO math on hand-computed tensors, packing and masks, micro-batching, and a tiny task whose reward must rise."""
import copy
import math

import pytest
import torch

from grpo import GRPOConfig, aggregate, clipped_objective, group_advantages, grpo_step, k3_kl, pack
from model import GPT, GPTConfig

torch.set_num_threads(1)


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
    loss, clipped = clipped_objective(logp, old, torch.tensor([1.0]), 0.2)
    # A=+1: ratio 1.5 -> clipped to 1.2; ratio 0.5 -> min(0.5, 0.8) = 0.5, not clipped; ratio 1 -> 1
    assert torch.allclose(loss, torch.tensor([[-1.2, -0.5, -0.5, -1.0]]))
    assert clipped.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    loss, clipped = clipped_objective(logp, old, torch.tensor([-1.0]), 0.2)
    # A=-1: ratio 1.5 -> min(-1.5, -1.2) = -1.5; ratio 0.5 -> min(-0.5, -0.8) = -0.8 (clipped)
    assert torch.allclose(loss, torch.tensor([[1.5, 0.8, 0.8, 1.0]]))
    assert clipped.tolist() == [[0.0, 1.0, 1.0, 0.0]]


def test_aggregate_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    assert aggregate(x, m, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(x, m, "seq-mean").item() == pytest.approx((2 + 4) / 2)


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
    cfg_a = GRPOConfig(group_size=4, max_new_tokens=6, beta=0.1, loss_agg=agg, micro_batch=64)
    cfg_b = GRPOConfig(group_size=4, max_new_tokens=6, beta=0.1, loss_agg=agg, micro_batch=3)
    weights = []
    for cfg in (cfg_a, cfg_b):
        model = tiny_model()
        ref = copy.deepcopy(model).eval()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        grpo_step(model, ref, opt, [[1, 2], [4]], [None, None], count_threes, cfg, eos_id=0,
                  generator=torch.Generator().manual_seed(0))
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.allclose(weights[0], weights[1], atol=1e-6)


def test_on_policy_ratio_is_one_and_kl_zero_at_start():
    model = tiny_model()
    ref = copy.deepcopy(model).eval()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = grpo_step(model, ref, opt, [[1, 2], [4], [5, 6, 7]], [None] * 3, count_threes,
                      GRPOConfig(group_size=4, max_new_tokens=6, beta=0.1), eos_id=0,
                      generator=torch.Generator().manual_seed(0))
    assert stats["clip_frac"] == 0.0 and abs(stats["kl"]) < 1e-6


def test_reward_rises_on_a_tiny_task():
    model = tiny_model(1)
    ref = copy.deepcopy(model).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    cfg = GRPOConfig(group_size=8, max_new_tokens=6, beta=0.01, minibatches=2)
    g = torch.Generator().manual_seed(0)
    rewards = [grpo_step(model, ref, opt, [[1], [2], [4], [5]], [None] * 4, count_threes, cfg, eos_id=None,
                         generator=g, step=s)["reward_mean"] for s in range(40)]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert first < 0.3 and last > 0.8, (first, last)


def test_groups_without_reward_spread_are_skipped():
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    stats = grpo_step(model, None, opt, [[1, 2], [4]], [None, None], lambda items, comps: [1.0] * len(comps),
                      GRPOConfig(group_size=4, max_new_tokens=4, beta=0.0), eos_id=None,
                      generator=torch.Generator().manual_seed(0))
    assert stats["zero_std_frac"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
