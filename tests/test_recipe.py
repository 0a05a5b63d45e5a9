"""--recipe=paper against the official verl code (thuml/RLVR-World, lang_wm/verl), each quantity computed here from
its definition there on a fixed batch (issue 57): the advantages of core_algos.compute_grpo_outcome_advantage
(torch.std, N - 1), the loss of dp_actor.update_policy (a token-mean per micro-batch, over the gradient-accumulation
count), the epoch schedule of rl_dataset_text_game (every changed record and N unchanged slots, a RandomSampler with
drop_last), the max_prompt_length filter; and a rollout sampled in chunks of prompts equals one sampled at once."""
import math

import torch

from grpo import (PAPER_RECIPE, GRPOConfig, Group, group_advantages, logprobs_shared_prompts, rollout, update,
                  update_batch, Env)
from model import GPT, GPTConfig
from tasks import EpochSampler, PromptPool

torch.set_num_threads(1)


def official_advantages(rewards, eps=1e-6):
    """compute_grpo_outcome_advantage: (score - mean) / (std + eps), std = sqrt(sum of squares / (n - 1))."""
    out = []
    for group in rewards.tolist():
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
        out.append([(r - mean) / (std + eps) for r in group])
    return torch.tensor(out)


def test_advantages_equal_the_official_unbiased_std():
    rewards = torch.tensor([[1.0, 0, 0, 0, 0], [0.5, 1, 0, 0.25, 1], [0.3, 0.3, 0.3, 0.3, 0.3]])
    cfg = GRPOConfig(**PAPER_RECIPE["textgame"])
    assert cfg.std_unbiased and not GRPOConfig().std_unbiased and cfg.group_size == 5
    got = group_advantages(rewards, cfg.std_norm, cfg.adv_eps, cfg.std_unbiased)
    torch.testing.assert_close(got, official_advantages(rewards), atol=1e-6, rtol=0)
    # ours by default: the population std, sqrt(4 / 5) of the official scale
    ratio = official_advantages(rewards)[0, 0] / group_advantages(rewards)[0, 0]
    assert abs(ratio - math.sqrt(4 / 5)) < 1e-5


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig.llama(vocab_size=8, block_size=32, n_layer=1, n_head=2, n_embd=16))


def test_loss_equals_the_official_micro_batch_aggregation():
    """One minibatch of 6 rows of unequal lengths in 3 micro-batches of 2 (the text game's ppo_micro_batch_size_per_gpu):
    loss = sum over micro-batches of masked_mean(pg + 0.001 kl - 0.001 entropy) / 3, its value and its gradient."""
    cfg = GRPOConfig(**PAPER_RECIPE["textgame"], vocab=8)
    assert cfg.loss_agg == "micro-token-mean" and cfg.micro_batch == 2
    g = torch.Generator().manual_seed(0)
    lengths = [[1, 5, 2], [4, 3, 6]]   # two groups of 3 rows; -1 after each row's length
    kept = []
    for p, lens in zip([[1, 2], [4]], lengths):
        tokens = torch.full((3, 6), -1)
        for i, n in enumerate(lens):
            tokens[i, :n] = torch.randint(1, 8, (n,), generator=g)
        out = dict(tokens=tokens, old_logp=torch.zeros(3, 6), mask=tokens >= 0)
        kept.append(Group(p, out, slice(0, 3), torch.tensor([1.0, 0.0, 0.5])))
    cfg3 = GRPOConfig(**{**PAPER_RECIPE["textgame"], "group_size": 3, "vocab": 8, "grad_clip": 1e9})
    b = update_batch(kept, cfg3, "cpu")
    model = tiny_model()
    with torch.no_grad():
        logp, _ = logprobs_shared_prompts(model, b, list(range(6)), cfg3)
    noise = torch.randn(logp.shape, generator=g)
    b = b._replace(old_logp=(logp + 0.3 * noise) * b.mask, ref_logp=(logp - 0.5 * noise.abs()) * b.mask)
    chunks = [[0, 1], [2, 3], [4, 5]]

    def official():   # dp_actor.update_policy, core_algos.compute_policy_loss / kl_penalty(low_var_kl)
        total = 0.0
        for c in chunks:
            lp, ent = logprobs_shared_prompts(model, b, c, cfg3)
            m = b.mask[c].float()
            ratio = torch.exp(lp - b.old_logp[c])
            a = b.adv[c][:, None]
            pg = torch.max(-a * ratio, -a * ratio.clamp(0.8, 1.2))
            kl = (torch.exp(b.ref_logp[c] - lp) - (b.ref_logp[c] - lp) - 1).clamp(-10, 10)
            mean = lambda x: (x * m).sum() / m.sum()
            total = total + (mean(pg) - 0.001 * mean(ent) + 0.001 * mean(kl)) / len(chunks)
        return total
    want = official()
    want.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sums, _ = update(model, opt, b, [sum(chunks, [])], [chunks], cfg3, 0, torch.autocast("cpu", enabled=False))
    assert abs(sums["loss"] - want.item()) < 1e-6, (sums["loss"], want.item())
    for p, p0, gr in zip(model.parameters(), before, grads):
        torch.testing.assert_close(p0 - p.detach(), gr, atol=1e-6, rtol=0)


class Tok:   # one token per character of the prompt text
    def prompt(self, text):
        return [ord(ch) % 7 + 1 for ch in text]


def test_epoch_sampler_is_the_official_schedule():
    """Every changed record once an epoch, and 5 unchanged slots each drawn from the unchanged records, in a fresh
    order each epoch; a batch is never cut (drop_last); prompts over max_prompt (6 tokens) are left out, counted."""
    items = [f"c{i}" for i in range(9)] + ["u0", "u1", "long change", "long same"]
    pool = PromptPool(items, lambda x: x, lambda x: x[0] == "c" or x.startswith("long c"), Tok(), 6, 0.3,
                      torch.Generator())
    assert pool.dropped == 2 and len(pool.changed) == 9 and len(pool.unchanged) == 2
    ranks = [EpochSampler(pool, 5, seed=3, rank=r, world=2) for r in range(2)]
    assert len(ranks[0]) == 14 and ranks[0].steps_per_epoch(4) == 1   # 14 // (2 ranks x 2 prompts) = 3 steps
    assert ranks[0].steps_per_epoch(2) == 3
    epochs = []
    for epoch in range(2):
        seen = []
        for _ in range(3):   # three steps of 2 prompts a rank: 12 of the 14 slots, the last 2 dropped
            for s in ranks:
                prompts, picked = s(2)
                assert prompts == [Tok().prompt(x) for x in picked]
                seen += picked
        assert sum(x.startswith("c") for x in seen) >= 9 - 2 and set(seen) <= set(items[:11])
        assert len([x for x in seen if x.startswith("c")]) == len({x for x in seen if x.startswith("c")})
        epochs.append(seen)
    assert epochs[0] != epochs[1]


def test_chunked_rollout_equals_one_call_greedy():
    model = tiny_model()
    prompts = [[1, 2], [4], [5, 6, 7], [3]]
    source = Env(lambda items, comps: [float(len(c)) for c in comps], eos_id=0)
    outs = []
    for n in (0, 1, 3):
        cfg = GRPOConfig(group_size=2, max_new_tokens=6, temperature=0.0, rollout_prompts=n)
        outs.append(rollout(model, prompts, [None] * 4, source, cfg, torch.Generator().manual_seed(0)))
    for out in outs[1:]:
        assert torch.equal(out["tokens"], outs[0]["tokens"]) and out["completions"] == outs[0]["completions"]
        torch.testing.assert_close(out["old_logp"], outs[0]["old_logp"], atol=1e-6, rtol=0)
