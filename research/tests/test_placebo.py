"""research/placebo.py: each group's rewards permuted among its samples keeps RLVR's groups and reward statistics,
loses which sample was right, and on a tiny task the reward does not rise under it (as it does under RLVR:
tests/test_grpo.py)."""
import copy

import torch

from grpo import Env, GRPOConfig, grpo_step
from model import GPT, GPTConfig
from research.placebo import permuted


def count_threes(items, completions):
    return [sum(t == 3 for t in c) / 6 for c in completions]


def test_permuted_rewards_are_each_groups_own_rewards_in_another_order():
    def score(items, completions):
        return [float(x) for x in completions]
    placebo = permuted(score, 4, torch.Generator().manual_seed(0))
    rows = list(range(12))   # three groups of four
    out = placebo([None] * 12, rows)
    assert [sorted(out[g * 4:(g + 1) * 4]) for g in range(3)] == [rows[g * 4:(g + 1) * 4] for g in range(3)]
    assert out != [float(x) for x in rows]


def test_reward_does_not_rise_under_the_placebo():
    torch.manual_seed(1)
    model = GPT(GPTConfig.llama(vocab_size=8, block_size=32, n_layer=1, n_head=2, n_embd=16))
    ref = copy.deepcopy(model).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    cfg = GRPOConfig(group_size=8, max_new_tokens=6, beta=0.01, minibatches=2, prompts_per_step=4,
                     entropy_coef=0.0)
    g = torch.Generator().manual_seed(0)
    score = permuted(count_threes, cfg.group_size, torch.Generator().manual_seed(7919))
    source = Env(score, draw=lambda n: ([[1 + i % 5] for i in range(n)], [None] * n))
    stats = [grpo_step(model, ref, opt, [[1], [2], [4], [5]], [None] * 4, source, cfg, g, step=s)
             for s in range(40)]
    rewards = [s["reward_mean"] for s in stats]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert first < 0.3 and last < 0.3, (first, last)
    assert all(s["groups_kept"] == 4 for s in stats[:5])   # the same refill to the target as RLVR's
