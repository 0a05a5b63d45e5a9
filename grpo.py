"""
GRPO (Group Relative Policy Optimization) by hand, the README's "GRPO in seven steps", one `grpo_step` for every task:
sample G completions per prompt, score them with the task's reward, drop groups without reward spread and sample
more prompts in their place (DAPO dynamic sampling), give each sample its group-normalised advantage, then take
`ppo_epochs x minibatches` optimizer steps on PPO-clip + beta * k3 KL to a frozen reference - an entropy bonus, over
completion tokens (EOS in, padding out), in micro-batches whose gradients add up. Log-probs use logits / temperature
(the sampler's distribution). `shuffle_rewards` is the placebo: rewards permuted over each round's batch (the log
keeps the true ones). In bf16 / fp16 the old log-probs are recomputed on the update's path (as verl does), so the
first ratio is exactly 1. Under DDP each rank samples its own prompts; all take the same number of optimizer steps.
"""
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from engine import generate


@dataclass
class GRPOConfig:
    group_size: int = 8          # G completions per prompt
    prompts_per_step: int = 0    # groups with reward spread a step collects (0: as many as the prompts it is given)
    max_rounds: int = 4          # sampling rounds a step may take to collect them (then it updates on what it has)
    max_new_tokens: int = 128
    temperature: float = 1.0
    clip_eps: float = 0.2        # PPO clip range
    beta: float = 0.001          # KL coefficient (the official recipe's; 0 = no reference model)
    entropy_coef: float = 0.0    # entropy bonus (official: 0.001 for the language world models)
    loss_agg: str = "token-mean"  # "token-mean" | "seq-mean"
    std_norm: bool = True        # divide advantages by the group std
    adv_eps: float = 1e-6
    ppo_epochs: int = 1          # passes over each rollout batch
    minibatches: int = 1         # optimizer steps per pass
    micro_batch: int = 64        # sequences per forward/backward (gradient accumulation inside a minibatch)
    grad_clip: float = 1.0
    skip_zero_std: bool = True   # drop groups with no reward spread (and sample more prompts in their place)
    shuffle_rewards: bool = False  # placebo: permute the rewards across the rollout batch

    def __post_init__(self):
        assert self.loss_agg in ("token-mean", "seq-mean"), f"loss_agg: token-mean|seq-mean, got {self.loss_agg!r}"


# -----------------------------------------------------------------------------
# the math, on plain tensors (tested against hand-computed values)

def group_advantages(rewards, std_norm=True, eps=1e-6):
    """rewards (P, G) -> advantages (P, G): reward minus its group's mean, over the group's std (unbiased=False)."""
    adv = rewards - rewards.mean(dim=1, keepdim=True)  # better or worse than the group's average answer
    if std_norm:  # one scale for every group; eps keeps a group without spread at 0 instead of 0 / 0
        adv = adv / (rewards.std(dim=1, keepdim=True, unbiased=False) + eps)
    return adv


def k3_kl(logp, ref_logp):
    """Per-token k3 estimate of KL(policy || ref) from samples of the policy: exp(d) - d - 1 with d = ref - logp."""
    d = ref_logp - logp          # log(ref / pi) of the sampled token
    return torch.exp(d) - d - 1  # >= 0 per sample; its mean under pi is exactly KL(pi || ref), with a low variance


def clipped_objective(logp, old_logp, adv, clip_eps):
    """Per-token PPO-clip loss (N, T) (to minimise), the ratio (N, T) and the per-token 'was clipped' indicator."""
    ratio = torch.exp(logp - old_logp)                          # pi / pi_old, per token
    a = adv.unsqueeze(1)                                        # (N, 1): one advantage per sequence
    unclipped, clipped = ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a
    return -torch.min(unclipped, clipped), ratio, (clipped < unclipped).float()  # pessimistic bound


def aggregate(per_token, mask, how, n_tokens=None, n_seqs=None):
    """Masked mean of per-token values (n, T): "token-mean" = masked sum / n_tokens (default: their count); "seq-mean"
    = sum of each row's masked mean / n_seqs (default: n). Given a minibatch's counts: a micro-batch's share of it."""
    mask = mask.to(per_token.dtype)
    if how == "token-mean":
        return (per_token * mask).sum() / (mask.sum().clamp(min=1) if n_tokens is None else max(n_tokens, 1))
    per_seq = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)  # (n,) each row's mean over its tokens
    return per_seq.sum() / max(len(per_seq) if n_seqs is None else n_seqs, 1)


def grpo_loss(logp, old_logp, ref_logp, entropy, adv, mask, cfg, n_tokens=None, n_seqs=None):
    """The GRPO loss of n rows (every input (n, T) but adv (n,)), aggregated by `aggregate` (given a minibatch's
    n_tokens / n_seqs: a micro-batch's share of it), and the per-token ratio, clip indicator and KL, for the log."""
    pg, ratio, was_clipped = clipped_objective(logp, old_logp, adv, cfg.clip_eps)
    kl = k3_kl(logp, ref_logp)                                       # 0 where the policy equals the reference
    per_token = pg + cfg.beta * kl - cfg.entropy_coef * entropy      # maximise reward and entropy, stay near the ref
    return aggregate(per_token, mask, cfg.loss_agg, n_tokens, n_seqs), dict(ratio=ratio, clip=was_clipped, kl=kl)


# -----------------------------------------------------------------------------
# rollouts, and the update's inputs

@torch.no_grad()
def rollout(model, prompts, items, reward_fn, cfg, eos_id, generator, sampler=None):
    """Sample G completions per prompt and score them -> per sample (N = P * G rows, grouped by prompt): tokens (N, T)
    (-1 after EOS), old_logp (N, T), mask (N, T) (True on sampled tokens), rewards (N,) and completions (id lists).
    sampler: None (engine.generate), or (model, prompts, items, cfg, generator) -> tokens, logprobs, sampled (N, T)
    for completions with tokens the task injects (video's true actions); where `sampled` is False: not in the loss."""
    G = cfg.group_size
    model.eval()
    if sampler is None:  # each prompt is prefilled once; its G samples share its KV cache
        tokens, old_lp = generate(model, prompts, cfg.max_new_tokens, temperature=cfg.temperature,
                                  eos_id=eos_id, generator=generator, num_samples=G)
        sampled = None
    else:
        reps = [(p, it) for p, it in zip(prompts, items) for _ in range(G)]
        tokens, old_lp, sampled = sampler(model, [p for p, _ in reps], [it for _, it in reps], cfg, generator)
    model.train()
    tokens, old_lp = tokens.cpu().clone(), old_lp.float().cpu().clone()  # normal tensors (generate's: inference mode)
    mask = tokens >= 0 if sampled is None else sampled.cpu() & (tokens >= 0)
    completions = [row[:n] for row, n in zip(tokens.tolist(), (tokens >= 0).sum(1).tolist())]
    rewards = torch.tensor(reward_fn([it for it in items for _ in range(G)], completions), dtype=torch.float32)
    if not torch.isfinite(rewards).all():
        raise FloatingPointError("reward_fn returned a non-finite reward")
    return dict(tokens=tokens, old_logp=old_lp, mask=mask, rewards=rewards, completions=completions)


def pack(prompts, tokens, mask=None):
    """P token-id prompts and completions tokens (N = P * G, T) (-1 after EOS; mask False: injected, not scored) ->
    prompt_idx (P, L) right-padded prompts less their last token, prompt_len (P,), idx (N, T) the prompt's last token
    then the completion less its last, targets (N, T) the completion (-1: no loss): prompt + idx[n, :t+1] predicts
    targets[n, t]. Each prompt is stored once, not once per sample."""
    P, G = len(prompts), len(tokens) // len(prompts)
    L = max(len(p) for p in prompts) - 1
    prompt_idx = torch.tensor([p[:-1] + [0] * (L + 1 - len(p)) for p in prompts], dtype=torch.long).view(P, L)
    prompt_len = torch.tensor([len(p) - 1 for p in prompts])
    last = torch.tensor([p[-1] for p in prompts]).repeat_interleave(G)              # (N,) each row's prompt's last
    idx = torch.cat([last.unsqueeze(1), tokens[:, :-1].clamp(min=0)], dim=1)        # (N, T) inputs
    targets = tokens if mask is None else tokens.masked_fill(~mask, -1)             # (N, T) injected: input only
    return prompt_idx, prompt_len, idx, targets


def token_logprobs_and_entropy(model, prompt_idx, prompt_len, rows, idx, targets, temperature):
    """Log-probs (n, T) of targets and entropies (n, T) of n rows continuing prompts `rows` (see `pack`); each prompt
    the rows use runs once (`GPT.forward(prompts=)`), not once per row."""
    used, rows = torch.unique(rows, return_inverse=True)
    prompts = (prompt_idx[used], prompt_len[used], rows) if prompt_idx.size(1) else None  # None: 1-token prompts
    logits, _ = model(idx, prompts=prompts)
    logp_all = F.log_softmax(logits.float() / temperature, dim=-1)  # (n, T, vocab) the sampler's distribution
    logp = logp_all.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # (n, T) H = -sum_v p(v) log p(v), over the whole vocabulary
    return logp, entropy


def low_precision(model, device):
    """True when the forward pass runs in a dtype other than float32 (autocast on, or weights not float32)."""
    autocast = torch.is_autocast_enabled(device.type) and torch.get_autocast_dtype(device.type) != torch.float32
    return autocast or next(model.parameters()).dtype != torch.float32


# -----------------------------------------------------------------------------
# one GRPO step

def grpo_step(policy, ref_model, optimizer, prompts, items, reward_fn, cfg, eos_id, generator, step=0, sampler=None,
              next_prompts=None):
    """Rollouts until `cfg.prompts_per_step` groups have reward spread, then `ppo_epochs x minibatches` optimizer steps
    -> a dict of stats. policy: the GPT, maybe DDP-wrapped; ref_model: frozen (None if beta == 0); prompts, items: the
    first round's P token-id lists and task objects, scored by reward_fn(items, completions); next_prompts(n) -> a
    further round's (None: one round); sampler: see `rollout`. A non-finite weight, reward, loss or gradient norm
    raises FloatingPointError before the optimizer step it would corrupt."""
    t0 = time.time()
    raw = getattr(policy, "module", policy)
    device = raw.wte.weight.device
    if not torch.stack([torch.isfinite(p).all() for p in raw.parameters()]).all():
        raise FloatingPointError(f"non-finite weights in the policy at step {step}")
    G, want = cfg.group_size, cfg.prompts_per_step or len(prompts)

    # 1-3. sample rounds, keeping the groups with reward spread (DAPO dynamic sampling)
    kept, sampled = [], []  # kept: (prompt, its round's rollout, the slice of its G rows there, its G rewards as used)
    while True:
        out = rollout(raw, prompts, items, reward_fn, cfg, eos_id, generator, sampler)
        sampled.append(out)
        r = out["rewards"]                                      # (P * G,) the true rewards, logged
        if cfg.shuffle_rewards:                                 # placebo: any reward may land on any completion
            r = r[torch.randperm(len(r), generator=generator)]
        r = r.view(-1, G)                                       # (P, G) one row per group
        spread = r.std(1, unbiased=False) > 0 if cfg.skip_zero_std else torch.ones(len(r), dtype=torch.bool)
        kept += [(prompts[g], out, slice(g * G, (g + 1) * G), r[g]) for g in spread.nonzero().flatten().tolist()]
        n_sampled = sum(len(s["rewards"]) for s in sampled) // G
        if len(kept) >= want or len(sampled) >= cfg.max_rounds or next_prompts is None:
            break
        # ask for enough prompts to fill the gap at the spread rate seen so far, at most the first round's number
        n_first = len(sampled[0]["rewards"]) // G
        prompts, items = next_prompts(min(n_first, math.ceil((want - len(kept)) * n_sampled / max(len(kept), 1))))
    kept = kept[:want]                                          # a fixed-size update, as DAPO's
    t_rollout = time.time() - t0

    # 4. the update batch: kept groups of every round, right-padded to one length, each prompt stored once
    N = len(kept) * G
    if kept:
        tokens, old_logp, mask = (pad_sequence([row for _, out, sl, _ in kept for row in out[key][sl]],  # (N, T) each
                                               batch_first=True, padding_value=pad)
                                  for key, pad in (("tokens", -1), ("old_logp", 0.0), ("mask", False)))
        prompt_idx, prompt_len, idx, targets = pack([p for p, *_ in kept], tokens, mask)
        adv = group_advantages(torch.stack([rk for *_, rk in kept]), cfg.std_norm, cfg.adv_eps).view(-1)  # (N,)
        prompt_idx, prompt_len, idx, targets, old_logp, adv = (t.to(device) for t in (prompt_idx, prompt_len, idx,
                                                                                      targets, old_logp, adv))
        rows = torch.arange(len(kept), device=device).repeat_interleave(G)  # (N,) the group (prompt) of each row
        mask = targets >= 0                                                # (N, T) the loss mask, EOS included

    def logprobs(model, sel):  # log-probs and entropies (n, T) of the kept rows `sel`
        return token_logprobs_and_entropy(model, prompt_idx, prompt_len, rows[sel], idx[sel], targets[sel],
                                          cfg.temperature)

    # the plan: each epoch a fresh order of the rows, cut into minibatches, each cut into micro-batches ("chunks");
    # every rank runs the same number of minibatches (DDP all-reduces in each); an empty one adds no gradient
    per_mb = math.ceil(N / cfg.minibatches)
    orders = [torch.randperm(N, generator=generator).tolist() for _ in range(cfg.ppo_epochs)]   # one per epoch
    plan = [order[m * per_mb:(m + 1) * per_mb] for order in orders for m in range(cfg.minibatches)]
    chunks = [[mb[s:s + cfg.micro_batch] for s in range(0, len(mb), cfg.micro_batch)] for mb in plan]
    recompute = N > 0 and low_precision(raw, device)
    with torch.no_grad():  # reference log-probs, and in low precision the old ones, on exactly the update's chunks
        ref_logp = old_logp.clone() if N else None  # without a reference model (beta 0) the logged KL is to the sampler
        for chunk in (c for mb in chunks[:cfg.minibatches] for c in mb):  # the first epoch covers every row once
            if cfg.beta > 0:
                ref_logp[chunk] = logprobs(ref_model, chunk)[0]
            if recompute:  # the weights have not moved yet: the first minibatch's ratio is exactly 1
                old_logp[chunk] = logprobs(raw, chunk)[0]

    # 5. the optimizer steps
    sums = dict(loss=0.0, kl=0.0, entropy=0.0, clip=0.0, grad_norm=0.0)
    ratio_sum, n_mb = 0.0, 0  # the first minibatch's summed token ratios (their mean is 1 when on-policy)
    ratio_tokens = int(mask[plan[0]].sum()) if N else 0
    for m, mb in enumerate(plan):
        optimizer.zero_grad(set_to_none=True)
        n_tok = int(mask[mb].sum()) if mb else 0  # the minibatch's loss tokens: its chunks' shares divide by these
        if not mb:  # nothing to learn from here; under DDP join the others' all-reduce and take the same step
            if not hasattr(policy, "no_sync"):
                continue
            (policy(torch.zeros(1, 1, dtype=torch.long, device=device))[0].sum() * 0.0).backward()
        for c, chunk in enumerate(chunks[m]):
            last = c == len(chunks[m]) - 1                      # DDP all-reduces the gradients on the last chunk only
            with policy.no_sync() if (not last and hasattr(policy, "no_sync")) else nullcontext():
                logp, ent = logprobs(policy, chunk)             # (n, T) each
                # this chunk's share of the minibatch's loss, so the chunks' gradients add up to the minibatch's
                loss, parts = grpo_loss(logp, old_logp[chunk], ref_logp[chunk], ent, adv[chunk], mask[chunk], cfg,
                                        n_tok, len(mb))
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"non-finite GRPO loss at step {step}")
                loss.backward()
                sums["loss"] += loss.item()
                for name, x in (("kl", parts["kl"]), ("entropy", ent), ("clip", parts["clip"])):  # token-means, logged
                    sums[name] += aggregate(x.detach(), mask[chunk], "token-mean", n_tok).item()
                if m == 0:
                    ratio_sum += parts["ratio"].detach()[mask[chunk]].sum().item()
        gn = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        if not torch.isfinite(gn):
            raise FloatingPointError(f"non-finite gradient norm at step {step}")
        sums["grad_norm"] += gn.item()
        n_mb += bool(mb)
        optimizer.step()

    # stats over every sampled group (reward, lengths, EOS), and the update's means over its minibatches (NaN if none)
    rewards = torch.cat([s["rewards"] for s in sampled]).view(-1, G)  # (all groups, G) the true rewards
    lengths = torch.tensor([len(c) for s in sampled for c in s["completions"]], dtype=torch.float32)
    eos = [bool(c) and c[-1] == eos_id for s in sampled for c in s["completions"]]
    mean = {k: v / n_mb if n_mb else float("nan") for k, v in sums.items()}
    return dict(step=step, reward_mean=rewards.mean().item(), reward_max=rewards.max().item(),
                zero_std_frac=(rewards.std(1, unbiased=False) == 0).float().mean().item(),
                rounds=len(sampled), groups=len(rewards), groups_kept=len(kept), kl=mean["kl"],
                entropy=mean["entropy"], clip_frac=mean["clip"], loss=mean["loss"], grad_norm=mean["grad_norm"],
                ratio_first=ratio_sum / ratio_tokens if ratio_tokens else float("nan"),
                response_len=lengths.mean().item(), eos_frac=sum(eos) / len(eos), t_rollout=t_rollout,
                t_step=time.time() - t0)
