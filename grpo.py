"""
GRPO (Group Relative Policy Optimization) by hand, the README's "GRPO in seven steps".

Read `plain_grpo_step` first: the algorithm and nothing else, in one function on the math below
(one process, float32, the plain sampler). `grpo_step` is the same step made fast and ready for
scale; tests/test_grpo.py holds the two equal. Its parts, one per step:
1-2. rollout, reward   `rollout`: G completions per prompt, the sampler's log-probs, the rewards
3. dynamic sampling    `sample_groups`: keep groups with reward spread, sample more prompts
4. advantages          `group_advantages`; `update_batch` lays the kept groups out as rows
5-6. PPO-clip, KL      `clipped_objective`, `k3_kl` and an entropy bonus, in `grpo_loss`
7. token-mean, step    `aggregate`; `update`: ppo_epochs x minibatches AdamW steps
Log-probs use logits / temperature, the sampler's distribution. The scripts (train_lang.py,
train_video.py) run the loop: a learning rate, prompts, `grpo_step`, a log line, a checkpoint;
before it and after it `headroom`, what the groups can teach.
"""
import math
import time
from collections import namedtuple
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from tqdm import tqdm

from engine import cast_copy, generate
from runtime import (check_step, join_passes, join_rows, no_sync_unless_last, over_ranks,
                     plan_update, unsharded)


@dataclass
class GRPOConfig:
    # per step: prompts_per_step groups with reward spread (0: as many as the prompts given)
    prompts_per_step: int = 16   # groups WITH reward spread per step (DAPO refill)
    max_rounds: int = 4          # sampling rounds a step may take to collect them
    group_size: int = 8          # samples per prompt (G)
    # AdamW, a linear warm-up to a constant rate (`lr_at`: the scripts' RL loop sets it each step)
    lr: float = 1e-4             # after `warmup` steps of a linear warm-up
    warmup: int = 10
    warmup_from_zero: bool = False   # verl's schedule: it counts the updates done (first at lr 0)
    weight_decay: float = 0.01   # official: 0.01
    betas: tuple = (0.9, 0.999)
    # the loss (official: beta 0.001, entropy 0.001); beta 0: no reference model
    beta: float = 0.001          # the KL's coefficient, to the frozen start
    kl_clamp: float = 0.0        # 0: none; verl's low_var_kl clamps the k3 to [-10, 10]
    entropy_coef: float = 0.001
    clip_eps: float = 0.2        # PPO's clip range
    dual_clip: float = 0.0       # c > 1: a negative advantage's loss at most c |A| (0: off)
    loss_agg: str = "token-mean"   # or "seq-mean"; "micro-token-mean": verl's (--recipe=paper)
    std_norm: bool = True        # divide advantages by the group's std
    std_unbiased: bool = False   # its N - 1 form (torch.std's, verl's)
    adv_eps: float = 1e-6
    # the update: ppo_epochs x minibatches optimizer steps, in micro-batches
    ppo_epochs: int = 1
    minibatches: int = 2
    micro_batch: int = 64        # sequences per forward/backward
    grad_clip: float = 1.0
    # sampling; skip_zero_std: drop groups without reward spread
    temperature: float = 1.0
    max_new_tokens: int = 200    # the longest answer sampled
    graphs: bool = False         # sample on static shapes, a decode step one CUDA graph (GPU)
    # the ids below it are the tokenizer's (0: all); the rest (Qwen2's padding) is never drawn
    vocab: int = 0
    skip_zero_std: bool = True
    max_prompt: int = 0          # longest prompt trained on (0: block_size - max_new_tokens)
    rollout_prompts: int = 0     # prompts sampled at once (0: all; on a GPU: as memory allows)

    def lr_at(self, step):
        """Update `step`'s rate (0-based: the updates done): a linear warm-up over `warmup` updates
        to lr / warmup (verl's get_constant_schedule_with_warmup, warmup_from_zero: to 0) first."""
        n = step if self.warmup_from_zero else step + 1   # verl's counts from 0, ours from 1
        return self.lr * min(1.0, n / max(self.warmup, 1))


# The paper's recipes (--recipe=paper) from thuml/RLVR-World: lang_wm/verl's examples/grpo_trainer/
# run_{text_game,web_agent}_rl.sh, vid_wm/verl's run_ctx_msp_vgpt.sh: train_batch_size x rollout.n,
# optim.lr, max_response_length, ppo_mini_batch_size (2, 4, 4 optimizer steps a batch) and
# _micro_batch_size_per_gpu, kl_loss_coef with low_var_kl (clamped at 10), entropy_coeff; the rest
# verl's defaults: clip_ratio_c 3 (the video's dual-clip), AdamW (0.9, 0.999) decay 0.01, a constant
# rate from 0, torch.std (N - 1), a token-mean per micro-batch over their count, every group kept
# (no refill). max_prompt: the web run's filter; the text game has none (data.need_filter=False: a
# longer prompt stops the run), here such prompts are dropped.
PAPER_COMMON = dict(group_size=5, lr=1e-6, warmup=0, warmup_from_zero=True, beta=0.001,
                    kl_clamp=10.0, entropy_coef=0.001, clip_eps=0.2, temperature=1.0, ppo_epochs=1,
                    skip_zero_std=False, max_rounds=1, std_unbiased=True,
                    loss_agg="micro-token-mean")
PAPER_RECIPE = {
    "textgame": dict(PAPER_COMMON, prompts_per_step=128, minibatches=2, max_new_tokens=4096,
                     micro_batch=2, max_prompt=7192),
    "webpage": dict(PAPER_COMMON, prompts_per_step=64, minibatches=4, max_new_tokens=7288,
                    micro_batch=5, max_prompt=5000),
    "video": dict(PAPER_COMMON, prompts_per_step=128, lr=5e-5, minibatches=4, micro_batch=8,
                  entropy_coef=0.0, dual_clip=3.0)}


# -----------------------------------------------------------------------------
# the math, on plain tensors (tested against hand-computed values)

def group_advantages(rewards, std_norm=True, eps=1e-6, unbiased=False):
    """Step 4. rewards (P, G) -> advantages (P, G): minus the group's mean, over its std."""
    adv = rewards - rewards.mean(dim=1, keepdim=True)  # better or worse than the group's average
    if std_norm:  # one scale for every group; eps keeps a group without spread at 0, not 0 / 0
        adv = adv / (rewards.std(dim=1, keepdim=True, unbiased=unbiased) + eps)
    return adv


def k3_kl(logp, ref_logp, clamp=0.0):
    """Step 6. Per-token k3 estimate of KL(policy || ref) from the policy's samples; `clamp`:
    verl's low_var_kl clamps it at 10 (--recipe=paper), a bias cutting far-off tokens' gradient."""
    d = ref_logp - logp          # log(ref / pi) of the sampled token
    kl = torch.exp(d) - d - 1    # >= 0 per sample; its mean under pi is exactly KL(pi || ref)
    return kl.clamp(-clamp, clamp) if clamp else kl


def clipped_objective(logp, old_logp, adv, clip_eps, dual_clip=0.0):
    """Step 5. Per-token PPO-clip loss (N, T) to minimise, the ratio and a 'was clipped' 0/1."""
    ratio = torch.exp(logp - old_logp)                   # pi / pi_old, per token
    a = adv.unsqueeze(1)                                 # (N, 1): one advantage per sequence
    unclipped, clipped = ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a
    loss = -torch.min(unclipped, clipped)                # pessimistic
    if dual_clip:   # verl's dual-clip c: a negative advantage's loss at most c |A| (no gradient)
        loss = torch.where(a < 0, torch.minimum(loss, -dual_clip * a), loss)
    return loss, ratio, (clipped < unclipped).float()


def aggregate(per_token, mask, how, n_tokens=None, n_parts=None):
    """Step 7. Masked mean of per-token values (n, T), the share of a minibatch these n rows are:
    "token-mean" = masked sum / n_tokens (default: their count); "seq-mean" = sum of the rows'
    masked means / n_parts, the minibatch's rows (default: n); "micro-token-mean" (verl's) = these
    rows' own token-mean / n_parts, the minibatch's micro-batches (default: 1)."""
    mask = mask.to(per_token.dtype)
    if how == "micro-token-mean":
        return aggregate(per_token, mask, "token-mean") / max(n_parts or 1, 1)
    if how == "token-mean":
        n = mask.sum().clamp(min=1) if n_tokens is None else n_tokens or 1
        return (per_token * mask).sum() / n
    assert how == "seq-mean", f"loss_agg: {how!r}"
    per_seq = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)  # (n,) each row's mean
    return per_seq.sum() / ((len(per_seq) if n_parts is None else n_parts) or 1)


def grpo_loss(logp, old_logp, ref_logp, entropy, adv, mask, cfg, n_tokens=None, n_parts=None):
    """Steps 5-7: the loss of n rows (`aggregate`), and per token ratio, clip and KL for the log."""
    pg, ratio, was_clipped = clipped_objective(logp, old_logp, adv, cfg.clip_eps, cfg.dual_clip)
    kl = k3_kl(logp, ref_logp, cfg.kl_clamp)         # 0 where the policy equals the reference
    per_token = pg + cfg.beta * kl - cfg.entropy_coef * entropy  # reward, entropy up; stay near
    loss = aggregate(per_token, mask, cfg.loss_agg, n_tokens, n_parts)
    return loss, dict(ratio=ratio, clip=was_clipped, kl=kl)


# -----------------------------------------------------------------------------
# the algorithm, plain: one process, float32, no chunks, ranks or refill

def plain_grpo_step(model, ref_model, optimizer, prompts, records, reward_fn, cfg, generator,
                    eos_id=None):
    """One GRPO step, plainly: G completions of each prompt (token-id lists) by the plain sampler,
    scored by reward_fn(records, completions); groups without reward spread dropped; one forward
    of prompt + completion for the log-probs; `grpo_loss` on every kept token; one AdamW step.
    -> rewards (P, G). `grpo_step` computes the same (tests/test_grpo.py), fast and at scale."""
    G, rows = cfg.group_size, []   # rows: (prompt, completion up to and with its EOS)
    model.eval()
    for p in prompts:   # 1. rollout: the prompt G times, one full forward per new token (model.py)
        out = model.generate(torch.tensor([p] * G), cfg.max_new_tokens, cfg.temperature,
                             eos_id=eos_id, generator=generator)[:, len(p):].tolist()
        rows += [(p, c[:c.index(eos_id) + 1] if eos_id in c else c) for c in out]
    model.train()
    # 2. reward: the task's metric of each decoded completion -> (P, G)
    reps = [r for r in records for _ in range(G)]
    rewards = torch.tensor(reward_fn(reps, [c for _, c in rows]), dtype=torch.float32).view(-1, G)
    # 3. keep the groups whose rewards differ; 4. their advantages, one per completion
    keep = rewards.std(1) > 0 if cfg.skip_zero_std else torch.ones(len(rewards), dtype=bool)
    adv = group_advantages(rewards[keep], cfg.std_norm, cfg.adv_eps, cfg.std_unbiased).view(-1)
    rows = [row for g in keep.nonzero().flatten().tolist() for row in rows[g * G:(g + 1) * G]]
    # 5-6. one forward of prompt + completion: log-probs, entropies, the reference's log-probs
    logp, entropy, ref_logp = [], [], []
    for p, c in rows:   # position i of prompt + completion predicts token i + 1
        x, y = torch.tensor([p + c[:-1]]), torch.tensor(c)[:, None]
        lp, ref = [F.log_softmax(m(x)[0][0, len(p) - 1:].float() / cfg.temperature, -1)
                   for m in (model, ref_model or model)]   # (len(c), vocab) each
        logp.append(lp.gather(-1, y).squeeze(-1))
        entropy.append(-(lp.exp() * lp).sum(-1))
        ref_logp.append(ref.gather(-1, y).squeeze(-1).detach())   # (no reference: unused, beta 0)
    if rows:   # no group with spread: no update
        logp, entropy, ref_logp = (pad_sequence(x, batch_first=True)
                                   for x in (logp, entropy, ref_logp))
        mask = pad_sequence([torch.ones(len(c), dtype=bool) for _, c in rows], batch_first=True)
        # PPO-clip to the sampling policy (this forward's own log-probs), KL to the reference
        loss, _ = grpo_loss(logp, logp.detach(), ref_logp, entropy, adv, mask, cfg)
        optimizer.zero_grad(set_to_none=True)   # 7. backward, clip the gradient, one step
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
    return rewards


# -----------------------------------------------------------------------------
# the fast step: what `grpo_step` adds to the plain one

# a kept group (step 3): its prompt, the rollout holding its G rows, their span there, rewards
Group = namedtuple("Group", "prompt rollout span rewards")
# the update's N rows (step 4): `pack`'s four tensors, each row's group, its log-probs, advantage
Batch = namedtuple("Batch", "prompt_idx prompt_len idx targets group old_logp adv mask ref_logp")


@dataclass
class Env:
    """What the task gives a step (grpo_step's hooks): its rewards, and more prompts."""
    reward_fn: Callable          # reward_fn(records, completions) -> a float per completion
    eos_id: int = None
    draw: Callable = None        # draw(n) -> (n token-id prompts, their records); None: one round
    sampler: Callable = None     # see `rollout`; None: engine.generate


# -----------------------------------------------------------------------------
# steps 1-3: rollouts, rewards, dynamic sampling

@torch.no_grad()
def rollout(model, prompts, records, env, cfg, generator, autocast=nullcontext()):
    """Steps 1-2. G samples a prompt, scored -> N = P * G rows by prompt: tokens (N, T) (-1 after
    EOS), old_logp, mask (the sampled tokens), rewards (N,), completions. env.sampler: None, or
    (model, prompts, records, cfg, generator) -> tokens, logprobs, sampled (False: injected)."""
    G, parts = cfg.group_size, []
    reps = [r for r in records for _ in range(G)]   # each prompt's record for each of its G rows
    model.eval()
    n = cfg.rollout_prompts or len(prompts)   # prompts a sampler call (GPU: tools/memory.py)
    for s in range(0, len(prompts), n):
        chunk = prompts[s:s + n]
        with autocast:
            if env.sampler is None:   # each prompt prefilled once; its G samples share its cache
                tokens, logp = generate(model, chunk, cfg.max_new_tokens, cfg.temperature,
                                        eos_id=env.eos_id, generator=generator, num_samples=G,
                                        vocab=cfg.vocab or None, graphs=cfg.graphs)
                parts.append((tokens, logp, None))
            else:
                parts.append(env.sampler(model, [p for p in chunk for _ in range(G)],
                                         reps[s * G:(s + n) * G], cfg, generator))
    tokens, old_lp, sampled = join_rows(parts)
    model.train()
    # plain CPU tensors (generate's are inference-mode tensors)
    tokens, old_lp = tokens.cpu().clone(), old_lp.float().cpu().clone()
    mask = tokens >= 0 if sampled is None else sampled.cpu() & (tokens >= 0)
    completions = [row[:n] for row, n in zip(tokens.tolist(), (tokens >= 0).sum(1).tolist())]
    rewards = torch.tensor(env.reward_fn(reps, completions), dtype=torch.float32)
    if not torch.isfinite(rewards).all():
        raise FloatingPointError("reward_fn returned a non-finite reward")
    return dict(tokens=tokens, old_logp=old_lp, mask=mask, rewards=rewards, completions=completions,
                prompt_tokens=sum(len(p) for p in prompts))


def sample_groups(model, prompts, records, env, cfg, generator, autocast=nullcontext()):
    """Steps 1-3: rounds of rollouts until cfg.prompts_per_step groups have reward spread (DAPO's
    dynamic sampling), at most cfg.max_rounds -> (at most that many kept Groups, every rollout)."""
    G, want = cfg.group_size, cfg.prompts_per_step or len(prompts)
    kept, rounds = [], []
    with autocast:   # engine.generate's weights, cast once for every round (a sampler gets model's)
        model = cast_copy(model) if env.sampler is None else model
    while True:
        out = rollout(model, prompts, records, env, cfg, generator, autocast)
        rounds.append(out)
        r = out["rewards"].view(-1, G)   # (P, G) one row per group
        spread = (r.std(1, unbiased=False) > 0 if cfg.skip_zero_std
                  else torch.ones(len(r), dtype=torch.bool))   # step 3: the groups to keep
        kept += [Group(prompts[g], out, slice(g * G, (g + 1) * G), r[g])
                 for g in spread.nonzero().flatten().tolist()]
        if len(kept) >= want or len(rounds) >= cfg.max_rounds or env.draw is None:
            return kept[:want], rounds              # a fixed-size update, as DAPO's
        # enough prompts to fill the gap at the spread rate so far, at most the first round's number
        n_sampled = sum(len(s["rewards"]) for s in rounds) // G
        n = math.ceil((want - len(kept)) * n_sampled / max(len(kept), 1))
        prompts, records = env.draw(min(len(rounds[0]["rewards"]) // G, n))


# -----------------------------------------------------------------------------
# step 4: the update's rows and their log-probs

def update_batch(kept, cfg, device):
    """Step 4: the kept Groups as N = groups x G rows right-padded to T -> a Batch: `pack`'s
    tensors, group (N,) each row's, old_logp (N, T), adv (N,), mask (N, T), ref_logp None."""
    tokens, old_logp, mask = (pad_sequence([row for k in kept for row in k.rollout[key][k.span]],
                                           batch_first=True, padding_value=pad)
                              for key, pad in (("tokens", -1), ("old_logp", 0.0), ("mask", False)))
    adv = group_advantages(torch.stack([k.rewards for k in kept]), cfg.std_norm, cfg.adv_eps,
                           cfg.std_unbiased)
    *packed, targets = [t.to(device) for t in pack([k.prompt for k in kept], tokens, mask)]
    group = torch.arange(len(kept), device=device).repeat_interleave(cfg.group_size)
    return Batch(*packed, targets, group, old_logp.to(device), adv.view(-1).to(device),
                 targets >= 0, None)   # mask: EOS in; padding and injected tokens out


def pack(prompts, tokens, mask=None):
    """P token-id prompts, completions tokens (N = P * G, T) (-1 after EOS; mask False: injected)
    -> prompt_idx (P, L) the right-padded prompts less their last token, prompt_len (P,), idx (N, T)
    the prompt's last token then the completion less its last, targets (N, T) the completion (-1:
    no loss): prompt + idx[n, :t+1] predicts targets[n, t]. Each prompt is stored once."""
    P, G = len(prompts), len(tokens) // len(prompts)
    L = max(len(p) for p in prompts) - 1
    prompt_idx = torch.tensor([p[:-1] + [0] * (L + 1 - len(p)) for p in prompts], dtype=torch.long)
    prompt_len = torch.tensor([len(p) - 1 for p in prompts])
    last = torch.tensor([p[-1] for p in prompts]).repeat_interleave(G)  # (N,) the prompt's last
    idx = torch.cat([last.unsqueeze(1), tokens[:, :-1].clamp(min=0)], dim=1)  # (N, T) inputs
    targets = tokens if mask is None else tokens.masked_fill(~mask, -1)  # injected: input only
    return prompt_idx, prompt_len, idx, targets


def logprobs_shared_prompts(model, b, sel, cfg):
    """Log-probs (n, T) of the targets and entropies (n, T) of the rows `sel` of `update_batch`,
    0 where a row has no target. Each prompt runs once for its rows; logits only at the targets."""
    used, group = torch.unique(b.group[sel], return_inverse=True)
    # the chunk's prompts, their padding cut to the longest of them
    L = int(b.prompt_len[used].max()) if len(used) else 0
    prompts = (b.prompt_idx[used, :L], b.prompt_len[used], group)
    targets = b.targets[sel]
    at = targets >= 0                                # (n, T) the positions with a target
    # (1-token prompts: an empty prompt pass, which FSDP's gathers need on every rank)
    logits, _ = model(b.idx[sel], prompts=prompts, at=at)   # (k, vocab)
    logits = logits[:, :cfg.vocab or None]           # the ids the tokenizer decodes
    logp_all = F.log_softmax(logits.float() / cfg.temperature, dim=-1)   # the sampler's
    zeros = torch.zeros(at.shape, device=logits.device)
    logp = zeros.masked_scatter(at, logp_all.gather(-1, targets[at].unsqueeze(-1)).squeeze(-1))
    # H = -sum_v p(v) log p(v), over the whole vocabulary
    entropy = zeros.masked_scatter(at, -(logp_all.exp() * logp_all).sum(-1))
    return logp, entropy


def fixed_logprobs(model, b, chunks, cfg, autocast):
    """Log-probs (N, T) of b's rows under `model`, no gradient (FSDP: gathered; every rank)."""
    out = torch.zeros_like(b.old_logp) if b is not None else None
    with unsharded(model), torch.no_grad():
        for rows in chunks:
            with autocast:
                out[rows] = logprobs_shared_prompts(model, b, rows, cfg)[0]
    return out


# -----------------------------------------------------------------------------
# steps 5-7: the optimizer steps

def update(policy, optimizer, b, plan, cfg, step, autocast):
    """Steps 5-7: for each minibatch (runtime.plan_update), for each micro-batch: log-probs -> loss
    -> backward; clip, step -> the stats' sums. Only the forwards run under `autocast`."""
    sums = dict(loss=0.0, kl=0.0, entropy=0.0, clip=0.0, grad_norm=0.0, ratio=0.0,
                ratio_tokens=0, steps=0)
    for m, mb in enumerate(plan):
        optimizer.zero_grad(set_to_none=True)
        if not mb.micro and not mb.pad:   # no rows on any rank: no step (AdamW would move)
            continue
        for i, rows in enumerate(mb.micro):   # DDP: the gradients all-reduced after the last
            with no_sync_unless_last(policy, i == len(mb.micro) - 1):
                with autocast:
                    logp, entropy = logprobs_shared_prompts(policy, b, rows, cfg)   # (n, T)
                mask = b.mask[rows]
                loss, parts = grpo_loss(logp, b.old_logp[rows], b.ref_logp[rows], entropy,
                                        b.adv[rows], mask, cfg, mb.tokens, mb.parts)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"non-finite GRPO loss at step {step}")
                loss.backward()
            sums["loss"] += loss.item()   # the stats: this micro-batch's share of the minibatch's
            for name, x in (("kl", parts["kl"]), ("entropy", entropy), ("clip", parts["clip"])):
                sums[name] += aggregate(x.detach(), mask, "token-mean", mb.tokens).item()
            if m == 0:   # the first minibatch's token ratios: 1 on average when on-policy
                sums["ratio"] += parts["ratio"].detach()[mask].sum().item()
                sums["ratio_tokens"] += int(mask.sum())
        if mb.pad:   # passes without rows, as many as the rank with the most micro-batches
            join_passes(policy, mb.pad, autocast)
        gn = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        if not torch.isfinite(gn):
            raise FloatingPointError(f"non-finite gradient norm at step {step}")
        sums["grad_norm"] += gn.item()
        sums["steps"] += 1
        optimizer.step()
    return sums


# -----------------------------------------------------------------------------
# one GRPO step

def step_stats(policy, step, rounds, kept, sums, cfg, eos_id, recomputed, t0, t_rollout):
    """The log over every rank: the sampled groups' rewards, lengths, EOS; the update's means per
    minibatch; the compute (forward 1, with backward 3: the rollout, per kept token the passes)."""
    r = torch.cat([s["rewards"] for s in rounds]).view(-1, cfg.group_size)  # (groups, G)
    done = [c for s in rounds for c in s["completions"]]
    sampled = sum(s["prompt_tokens"] + int((s["tokens"] >= 0).sum()) for s in rounds)
    updated = sum(len(k.prompt) + int((k.rollout["tokens"][k.span] >= 0).sum()) for k in kept)
    passes = 3 * cfg.ppo_epochs + (cfg.beta > 0) + recomputed
    t, most = over_ranks(policy, dict(   # summed over the ranks (the update's sums: shares)
        reward=r.sum().item(), n=r.numel(), groups=len(r), groups_kept=len(kept),
        zero_std=int((r.std(1, unbiased=False) == 0).sum()), length=sum(map(len, done)),
        eos=sum(bool(c) and c[-1] == eos_id for c in done), tokens_sampled=sampled,
        tokens_updated=updated, compute=sampled + passes * updated, **sums),
        dict(reward_max=r.max().item(), rounds=len(rounds), t_rollout=t_rollout))
    mean = {k: t[k] / t["steps"] if t["steps"] else float("nan")
            for k in ("kl", "entropy", "clip", "loss", "grad_norm")}
    return dict(step=step, reward_mean=t["reward"] / t["n"], reward_max=most["reward_max"],
                zero_std_frac=t["zero_std"] / t["groups"], rounds=int(most["rounds"]),
                kl=mean["kl"], entropy=mean["entropy"], clip_frac=mean["clip"], loss=mean["loss"],
                grad_norm=mean["grad_norm"], response_len=t["length"] / t["n"],
                ratio_first=t["ratio"] / t["ratio_tokens"] if t["ratio_tokens"] else float("nan"),
                eos_frac=t["eos"] / t["n"], t_rollout=most["t_rollout"], t_step=time.time() - t0,
                **{k: int(t[k]) for k in ("groups", "groups_kept", "tokens_sampled",
                                          "tokens_updated", "compute")})


def grpo_step(policy, ref_model, optimizer, prompts, records, env, cfg, generator, step=0,
              autocast=nullcontext()):
    """`plain_grpo_step` made fast and scale-ready -> the stats over every rank. It adds: dynamic
    sampling (DAPO: more prompts from env.draw until cfg.prompts_per_step groups teach); the KV-
    cache sampler (engine.py); `update`'s epochs x minibatches of micro-batches that fit memory,
    a prompt run once for its rows, logits only where scored; autocast, the old log-probs then
    recomputed on the update's path (as verl: first ratio 1); DDP / FSDP (policy wrapped,
    ref_model sharded), N ranks taking the one-process step. NaN/inf: FloatingPointError."""
    t0 = time.time()
    raw_model = getattr(policy, "module", policy)   # the GPT itself
    low_precision = check_step(raw_model, step, autocast)   # finite weights, no outer autocast
    with unsharded(raw_model):   # FSDP: the full weights, gathered for the rollouts
        # 1-3. rollouts, rewards, and more prompts until enough groups have reward spread
        kept, rounds = sample_groups(raw_model, prompts, records, env, cfg, generator, autocast)
    t_rollout = time.time() - t0
    # 4. advantages, and the rows of the update (none if no group had spread)
    b = update_batch(kept, cfg, raw_model.wte.weight.device) if kept else None
    # minibatches of micro-batches, shuffled each epoch, evened out over the ranks (runtime.py)
    plan = plan_update(policy, b, cfg, generator)
    every_row = [rows for mb in plan[:cfg.minibatches] for rows in mb.micro]   # the first epoch
    # the log-probs the update holds fixed: the reference's (beta 0: the sampler's, the KL's log),
    # bf16 / fp16's old ones recomputed on the update's path
    if b is not None:
        b = b._replace(ref_logp=b.old_logp.clone())
    if low_precision:
        old = fixed_logprobs(raw_model, b, every_row, cfg, autocast)
        b = b._replace(old_logp=old) if b is not None else None
    if cfg.beta > 0 and ref_model is not None:
        ref = fixed_logprobs(ref_model, b, every_row, cfg, autocast)
        b = b._replace(ref_logp=ref) if b is not None else None
    # 5-7. PPO-clip + KL - entropy, token-mean, an optimizer step per minibatch
    sums = update(policy, optimizer, b, plan, cfg, step, autocast)
    return step_stats(policy, step, rounds, kept, sums, cfg, env.eos_id, low_precision, t0,
                      t_rollout)


# -----------------------------------------------------------------------------
# before the loop and after it: what the groups can teach

HEADROOM_N = 64   # the validation prompts of a run's headroom line: the first that fit


def headroom(model, prompts, records, env, cfg, autocast=nullcontext(), name="the start",
             what="reward x 100", scale=100):
    """What GRPO can learn from on `prompts`: the greedy answer's env.reward_fn against the best
    of cfg.group_size samples at cfg.temperature (a fixed seed) -> dict: their means, fixed (the
    share of prompts where a sample beats greedy), spread (of groups whose rewards differ: the
    only ones with a gradient). Printed as one line, the rewards x `scale` (video: -1000)."""
    g = torch.Generator().manual_seed(0)
    one = replace(cfg, group_size=1, temperature=0.0)   # greedy
    print(f"headroom of {name} on {len(prompts)} val prompts ({what}): ", end="", flush=True)
    greedy = rollout(model, prompts, records, env, one, g, autocast)["rewards"]   # (P,)
    r = rollout(model, prompts, records, env, cfg, g, autocast)["rewards"].view(len(prompts), -1)
    best = r.max(1).values
    h = dict(n=len(prompts), G=cfg.group_size, temperature=cfg.temperature,
             greedy=greedy.mean().item(), best=best.mean().item(),
             fixed=(best > greedy).float().mean().item(),
             spread=(r.std(1, unbiased=False) > 0).float().mean().item())
    print(f"greedy {h['greedy'] * scale:.2f}, best of {h['G']} samples at T={h['temperature']:g} "
          f"{h['best'] * scale:.2f}; a sample beats greedy on {h['fixed']:.1%} of prompts, "
          f"{h['spread']:.1%} of groups have reward spread", flush=True)
    return h
