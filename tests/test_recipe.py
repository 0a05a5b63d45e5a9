"""--recipe=paper against the official verl code (thuml/RLVR-World, lang_wm/verl and vid_wm/verl), each quantity
computed here from its definition there on a fixed batch (issues 57, 66): the advantages of
core_algos.compute_grpo_outcome_advantage (torch.std, N - 1), the loss of dp_actor.update_policy (a token-mean per
micro-batch, over the gradient-accumulation count; video: compute_policy_loss's dual-clip, low_var_kl clamped at 10),
the learning rate of get_constant_schedule_with_warmup, the epoch schedule of rl_dataset_text_game (every gold record
and N others, a RandomSampler with drop_last) and process_jsonl_train.py's gold split, the max_prompt_length filter;
and a rollout sampled in chunks of prompts equals one sampled at once."""
import math

import torch

from data.textgame.task import is_changed, is_gold
from grpo import (PAPER_RECIPE, Env, GRPOConfig, Group, clipped_objective, group_advantages, grpo_loss,
                  logprobs_shared_prompts, rollout, update, update_batch)
from model import GPT, GPTConfig
from runtime import Minibatch
from tasks import PAPER_GOLD, EpochSampler, PromptPool

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
    plan = [Minibatch(chunks, 0, float(b.mask.sum()), len(chunks))]   # one minibatch, one process
    sums = update(model, opt, b, plan, cfg3, 0, torch.autocast("cpu", enabled=False))
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


# -----------------------------------------------------------------------------
# the video recipe (vid_wm/verl: examples/grpo_trainer/run_ctx_msp_vgpt.sh over vgpt_ppo_trainer.yaml) and the schedule

def test_video_recipe_is_the_official_script():
    """Every setting of the official video run, written out from the script and its trainer yaml."""
    cfg = GRPOConfig(**PAPER_RECIPE["video"])
    official = dict(prompts_per_step=128, group_size=5, lr=5e-5, warmup=0, warmup_from_zero=True,
                    minibatches=128 // 32, micro_batch=8, ppo_epochs=1, beta=0.001, kl_clamp=10.0, entropy_coef=0.0,
                    clip_eps=0.2, dual_clip=3.0, std_norm=True, std_unbiased=True, adv_eps=1e-6,
                    betas=(0.9, 0.999), weight_decay=0.01, grad_clip=1.0, temperature=1.0, skip_zero_std=False,
                    max_rounds=1, loss_agg="micro-token-mean")
    assert {k: getattr(cfg, k) for k in official} == official
    # the dual-clip is the video run's alone (lang_wm's compute_policy_loss has none), and off by default
    assert GRPOConfig().dual_clip == 0 and all(GRPOConfig(**PAPER_RECIPE[t]).dual_clip == 0
                                               for t in ("textgame", "webpage"))


def test_dual_clip_by_hand():
    """clip 0.2, c = 3: for A = -1 the loss is max(r, clip(r)) up to 3; for A = +1, -min(r, clip(r)) as without it."""
    r = torch.tensor([[0.5, 1.0, 2.0, 4.0, 10.0]])
    logp, old = r.log(), torch.zeros_like(r)
    neg, _, _ = clipped_objective(logp, old, torch.tensor([-1.0]), 0.2, 3.0)
    torch.testing.assert_close(neg, torch.tensor([[0.8, 1.0, 2.0, 3.0, 3.0]]))
    off, _, _ = clipped_objective(logp, old, torch.tensor([-1.0]), 0.2)
    torch.testing.assert_close(off, torch.tensor([[0.8, 1.0, 2.0, 4.0, 10.0]]))
    pos, _, _ = clipped_objective(logp, old, torch.tensor([2.0]), 0.2, 3.0)
    torch.testing.assert_close(pos, torch.tensor([[-1.0, -2.0, -2.4, -2.4, -2.4]]))
    # past c a negative advantage's token has no gradient; below it, -A d(ratio)/d(logp) = ratio
    x = logp.clone().requires_grad_()
    clipped_objective(x, old, torch.tensor([-1.0]), 0.2, 3.0)[0].sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([[0.0, 1.0, 2.0, 0.0, 0.0]]))


def official_video_loss(logp, old_logp, ref_logp, entropy, adv, mask, chunks):
    """dp_actor.update_policy over one minibatch: per micro-batch compute_policy_loss (PPO-clip 0.2, dual-clip 3),
    low_var_kl clamped to [-10, 10] x 0.001, entropy x 0, each a masked mean, over the gradient-accumulation count."""
    total = 0.0
    for c in chunks:
        m = mask[c].float()
        mean = lambda x: (x * m).sum() / m.sum()
        a = adv[c][:, None]
        ratio = torch.exp(logp[c] - old_logp[c])
        pg1, pg2 = -a * ratio, -a * torch.clamp(ratio, 1 - 0.2, 1 + 0.2)
        clip1 = torch.maximum(pg1, pg2)
        clip2 = torch.min(-a * 3.0, clip1)
        pg = torch.where(a < 0, clip2, clip1)
        d = ref_logp[c] - logp[c]
        kl = torch.clamp(torch.exp(d) - d - 1, min=-10, max=10)
        total = total + (mean(pg) - 0.0 * mean(entropy[c]) + 0.001 * mean(kl)) / len(chunks)
    return total


def test_video_advantages_and_loss_equal_the_official():
    """Random rewards of 4 groups of 5 (one all equal) and 20 rows of unequal lengths in 5 micro-batches of 4, with
    ratios past 3 on negative advantages and k3 values past 10: advantages, loss and its gradient within 1e-6."""
    cfg = GRPOConfig(**PAPER_RECIPE["video"])
    g = torch.Generator().manual_seed(0)
    rewards = -torch.rand(4, 5, generator=g)
    rewards[2] = -0.25                                       # a group without spread
    adv = group_advantages(rewards, cfg.std_norm, cfg.adv_eps, cfg.std_unbiased)
    torch.testing.assert_close(adv, official_advantages(rewards), atol=1e-6, rtol=0)
    assert torch.equal(adv[2], torch.zeros(5))
    adv = adv.flatten()
    N, T = 20, 9
    mask = torch.arange(T)[None, :] < torch.randint(2, T + 1, (N, 1), generator=g)
    logp = -3 * torch.rand(N, T, generator=g)
    old_logp = logp + 0.3 * torch.randn(N, T, generator=g)
    old_logp[:, ::3] -= 1.5                                  # ratios of e^1.5 x ~1 and more
    ref_logp = logp + torch.randn(N, T, generator=g)
    ref_logp[:, 1::4] += 4.0                                 # k3 = e^d - d - 1 past 10
    entropy = torch.rand(N, T, generator=g)
    ratio, neg = torch.exp(logp - old_logp), (adv < 0)[:, None] & mask
    k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    assert (ratio[neg] > 3).sum() >= 5 and (k3[mask] > 10).sum() >= 5    # the cases the recipe changes
    chunks = [list(range(s, s + 4)) for s in range(0, N, 4)]
    x = logp.clone().requires_grad_()
    want = official_video_loss(x, old_logp, ref_logp, entropy, adv, mask, chunks)
    want_grad, = torch.autograd.grad(want, x)
    x = logp.clone().requires_grad_()
    n_tok = int(mask.sum())
    got = sum(grpo_loss(x[c], old_logp[c], ref_logp[c], entropy[c], adv[c], mask[c], cfg, n_tok, len(chunks))[0]
              for c in chunks)
    got.backward()
    assert abs(got.item() - want.item()) < 1e-6, (got.item(), want.item())
    torch.testing.assert_close(x.grad, want_grad, atol=1e-6, rtol=0)
    # the video default (no dual-clip, no clamp, the population std) is another loss on these rows
    plain = GRPOConfig(beta=0.001, entropy_coef=0.0, loss_agg="micro-token-mean")
    other = sum(grpo_loss(logp[c], old_logp[c], ref_logp[c], entropy[c], adv[c], mask[c], plain, n_tok, len(chunks))[0]
                for c in chunks)
    assert abs(other.item() - want.item()) > 1e-3


def test_lr_at_is_verls_schedule_under_the_recipes_and_ours_by_default():
    """verl's get_constant_schedule_with_warmup, stepped after each update: lr x min(1, updates done / max(1, warmup)),
    so the first update runs at 0; ours (the default) reaches lr / warmup at the first update."""
    for task in PAPER_RECIPE:
        cfg = GRPOConfig(**PAPER_RECIPE[task])
        assert [cfg.lr_at(s) for s in range(3)] == [0.0, cfg.lr, cfg.lr]
    verl = GRPOConfig(lr=1.0, warmup=4, warmup_from_zero=True)
    assert [verl.lr_at(s) for s in range(6)] == [min(1, s / max(1, 4)) for s in range(6)]
    ours = GRPOConfig()   # the text default: 10 steps of warm-up, the values the scripts set before lr_at
    assert [ours.lr_at(s) for s in range(12)] == [ours.lr * min(1.0, (s + 1) / max(ours.warmup, 1))
                                                  for s in range(12)]
    video = GRPOConfig(lr=1e-4, warmup=0)   # train_video.py's default: constant, AdamW's lr as made
    assert all(video.lr_at(s) == 1e-4 for s in range(3))


# -----------------------------------------------------------------------------
# the text game's gold split (lang_wm/data_process/text_game/process_jsonl_train.py)

def official_gold(record):
    """get_state_diff_detail_v2's "modified" entries with a state code other than 1: for each object of the state
    still in the next one, a property added, removed or changed, or its contents changed in any order."""
    after = {o["uuid"]: o for o in record["next_state"]["objects"]}
    for o in record["state"]["objects"]:
        if o["uuid"] not in after:
            continue                                      # removed: not a "modified" entry
        p1, p2 = o["properties"], after[o["uuid"]]["properties"]
        if any(k not in p2 or p1[k] != p2[k] for k in p1) or any(k not in p1 for k in p2):
            return True
        if sorted(o.get("contains", [])) != sorted(after[o["uuid"]].get("contains", [])):
            return True
    return False


def test_gold_is_the_official_split():
    """Ours by default (is_changed) counts added and removed objects and score-only changes; the recipe's (PAPER_GOLD)
    is the official gold, records built by hand for each case."""
    def obj(uuid, contains=(), **props):
        return {"name": f"o (ID: {uuid})", "uuid": uuid, "type": "T", "properties": props, "contains": list(contains)}
    score = {"score": 0, "gameOver": False, "gameWon": False}
    state = [obj(1, ["a", "b"], on=False), obj(2)]
    cases = {   # name: (next objects, next score, changed, gold)
        "nothing": (state, score, False, False),
        "a property changes": ([obj(1, ["a", "b"], on=True), obj(2)], score, True, True),
        "a property is added": ([obj(1, ["a", "b"], on=False, hot=1), obj(2)], score, True, True),
        "contents change": ([obj(1, ["a"], on=False), obj(2)], score, True, True),
        "contents reorder": ([obj(1, ["b", "a"], on=False), obj(2)], score, False, False),
        "an object is added": (state + [obj(3)], score, True, False),
        "an object is removed": (state[:1], score, True, False),
        "the score alone": (state, {**score, "score": 1}, True, False),
    }
    assert PAPER_GOLD["textgame"] is is_gold
    for name, (objects, next_score, changed, gold) in cases.items():
        r = {"game": "g", "action": "act", "state": {"objects": state, "score": score},
             "next_state": {"objects": objects, "score": next_score}}
        assert (is_changed(r), is_gold(r), official_gold(r)) == (changed, gold, gold), name
