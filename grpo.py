"""
GRPO (Group Relative Policy Optimization), written out by hand; every task plugs into the same loop.

One step:
1. rollout: for each of P prompts sample G completions with the KV cache (`GPT.generate(num_samples=G)`: each prompt
   is prefilled once for its G samples), keeping the sampler's log-probs as the "old" policy's log-probs (no extra
   forward pass recomputes them).
2. reward: the task's `reward_fn(items, completions)` scores the *decoded* completions (a verifiable metric).
3. advantages: A = (r - mean of its group) / (std of its group + eps); a group whose rewards are all equal carries no
   signal (A = 0) and is counted in the log as `zero_std_frac`.
4. update: PPO-clip on per-token ratios plus a KL penalty to a frozen reference model (its log-probs computed once
   per rollout), masked to completion tokens (the EOS token is in the loss; padding is not), gradient clipping,
   optionally several minibatches per rollout. Both models run each prompt once per micro-batch, however many of its
   samples are in it (`GPT.forward(prompts=)`; bench/bench_grpo.py times the step against TRL's).

Variant choices (each a flag of `GRPOConfig`):
- loss aggregation `loss_agg`: "token-mean" (default; every completion token weighs the same, as in DAPO and verl's
  default, so long answers, e.g. big state changes, are not down-weighted) or "seq-mean" (the GRPO paper: mean over
  tokens within a sequence, then over sequences).
- std normalisation `std_norm`: on by default (GRPO paper); off gives Dr. GRPO's r - mean.
- the KL term goes in the loss (GRPO paper, k3 "low_var_kl" estimator exp(q-p) - (q-p) - 1 with q the reference
  log-prob), not in the reward; `beta` = 0 turns it off and skips the reference model's forward pass.
- log-probs use logits / temperature, the distribution the sampler drew from, so old and new log-probs agree.
- `skip_zero_std` (on by default): groups whose rewards are all equal have zero advantage, so their only gradient is
  the KL term; they are dropped before the update (DAPO's "dynamic sampling" without the re-sampling), which saves
  most of the compute when a peaked MLE model answers most prompts identically G times. The token-mean is then over
  the informative groups' tokens. The share of such groups is logged as `zero_std_frac`.
Under DDP each rank samples its own prompts, so groups never split across ranks; the token-mean is per rank.
"""
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class GRPOConfig:
    group_size: int = 8          # G completions per prompt
    max_new_tokens: int = 128
    temperature: float = 1.0
    clip_eps: float = 0.2        # PPO clip range
    beta: float = 0.04           # KL coefficient (0 = no reference model)
    loss_agg: str = "token-mean"  # "token-mean" | "seq-mean"
    std_norm: bool = True        # divide advantages by the group std
    adv_eps: float = 1e-6
    minibatches: int = 1         # optimizer steps per rollout batch
    micro_batch: int = 64        # sequences per forward/backward (gradient accumulation inside a minibatch)
    grad_clip: float = 1.0
    skip_zero_std: bool = True   # drop groups with no reward spread before the update

    def __post_init__(self):
        assert self.loss_agg in ("token-mean", "seq-mean"), f"loss_agg must be token-mean|seq-mean, got {self.loss_agg!r}"


# -----------------------------------------------------------------------------
# the math, on plain tensors (tested against hand-computed values)

def group_advantages(rewards, std_norm=True, eps=1e-6):
    """rewards (P, G) -> advantages (P, G): reward minus its group's mean, divided by the group's std (unbiased=False)."""
    adv = rewards - rewards.mean(dim=1, keepdim=True)
    if std_norm:
        adv = adv / (rewards.std(dim=1, keepdim=True, unbiased=False) + eps)
    return adv


def k3_kl(logp, ref_logp):
    """Per-token k3 estimate of KL(policy || ref) from samples of the policy: exp(d) - d - 1 with d = ref - logp >= 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def aggregate(per_token, mask, how):
    """Masked mean of (N, T) per-token values: over all tokens ("token-mean") or per sequence then over sequences."""
    mask = mask.to(per_token.dtype)
    if how == "token-mean":
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    per_seq = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)
    return per_seq.mean()


def clipped_objective(logp, old_logp, adv, clip_eps):
    """Per-token PPO-clip loss (N, T) (to minimise) and the per-token 'was clipped' indicator; adv is (N,)."""
    ratio = torch.exp(logp - old_logp)
    a = adv.unsqueeze(1)
    unclipped, clipped = ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a
    return -torch.min(unclipped, clipped), (clipped < unclipped).float()


# -----------------------------------------------------------------------------
# rollouts

def pack(prompts, tokens, sampled=None):
    """The update's inputs, each prompt stored once (G = N / P rows continue each prompt, as GPT.generate orders them).

    prompts: P token-id lists; tokens (N, T): the completions, -1 after EOS; sampled (N, T) bool or None: False marks
    tokens the task injected (inputs, never targets). Returns prompt_idx (P, L) the right-padded prompts without their
    last token, prompt_len (P,) their lengths, and per row idx (N, T) = the prompt's last token then the completion
    without its last token, targets (N, T) = the completion (-1 where there is none or it was injected): the model fed
    prompt + idx[n, :t+1] predicts targets[n, t]. The loss mask is targets >= 0 (EOS included, padding not)."""
    P, G = len(prompts), len(tokens) // len(prompts)
    L = max(len(p) for p in prompts) - 1
    prompt_idx = torch.tensor([p[:-1] + [0] * (L + 1 - len(p)) for p in prompts], dtype=torch.long).view(P, L)
    prompt_len = torch.tensor([len(p) - 1 for p in prompts])
    last = torch.tensor([p[-1] for p in prompts]).repeat_interleave(G)
    tokens = tokens.cpu().clone()  # a normal tensor (GPT.generate returns inference-mode ones)
    idx = torch.cat([last.unsqueeze(1), tokens[:, :-1].clamp(min=0)], dim=1)
    targets = tokens if sampled is None else tokens.masked_fill(~sampled.cpu(), -1)
    return prompt_idx, prompt_len, idx, targets


def completion_lists(tokens):
    """(N, T) tokens from GPT.generate (-1 after EOS) -> list of N token lists."""
    return [row[:n] for row, n in zip(tokens.tolist(), (tokens >= 0).sum(1).tolist())]


@torch.no_grad()
def rollout(model, prompts, items, reward_fn, cfg, eos_id, generator, sampler=None):
    """Sample G completions per prompt and score them. Returns a dict of per-sample tensors/lists (N = P * G).

    sampler: None (GPT.generate) or a function (model, prompts, items, cfg, generator) -> (tokens, logprobs,
    sampled), all (N, T), for completions with tokens the task injects rather than samples (the true actions between
    predicted video frames): positions where `sampled` is False stay in the sequence but out of the loss."""
    G = cfg.group_size
    rep_prompts = [p for p in prompts for _ in range(G)]
    rep_items = [it for it in items for _ in range(G)]
    model.eval()
    sampled = None
    if sampler is None:  # each prompt is prefilled once; its G samples share its KV cache
        tokens, old_lp = model.generate(prompts, cfg.max_new_tokens, temperature=cfg.temperature,
                                        eos_id=eos_id, generator=generator, num_samples=G)
    else:
        tokens, old_lp, sampled = sampler(model, rep_prompts, rep_items, cfg, generator)
    model.train()
    completions = completion_lists(tokens)
    rewards = torch.tensor(reward_fn(rep_items, completions), dtype=torch.float32)
    if not torch.isfinite(rewards).all():
        raise FloatingPointError("reward_fn returned a non-finite reward")
    prompt_idx, prompt_len, idx, targets = pack(prompts, tokens, sampled)
    adv = group_advantages(rewards.view(-1, G), cfg.std_norm, cfg.adv_eps).view(-1)
    return dict(prompt_idx=prompt_idx, prompt_len=prompt_len, rows=torch.arange(len(prompts)).repeat_interleave(G),
                idx=idx, targets=targets, mask=targets >= 0, old_logp=old_lp.float().cpu(), adv=adv, rewards=rewards,
                completions=completions, eos=torch.tensor([bool(c) and c[-1] == eos_id for c in completions]))


def token_logprobs_and_entropy(model, prompt_idx, prompt_len, rows, idx, targets, temperature):
    """Log-probs (n, T) of targets and entropies (n, T) for n rows continuing prompts `rows` (see `pack`); each prompt
    the rows use is run once, not once per row."""
    used, rows = torch.unique(rows, return_inverse=True)
    prompts = (prompt_idx[used], prompt_len[used], rows) if prompt_idx.size(1) else None  # None: 1-token prompts
    logits, _ = model(idx, prompts=prompts)
    logp_all = F.log_softmax(logits.float() / temperature, dim=-1)  # (N, T, vocab)
    logp = logp_all.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


# -----------------------------------------------------------------------------
# one GRPO step

def grpo_step(policy, ref_model, optimizer, prompts, items, reward_fn, cfg, eos_id, generator, step=0, sampler=None):
    """Rollout P prompts x G samples, then `cfg.minibatches` optimizer steps on them. Returns a dict of stats.

    policy: the trained GPT, possibly wrapped in DDP; ref_model: frozen GPT (or None when beta == 0);
    prompts: P token-id lists; items: P task objects passed to reward_fn(items, completions) -> list of floats;
    sampler: see `rollout` (None = GPT.generate). A non-finite weight, reward, loss or gradient norm raises
    FloatingPointError before the optimizer step it would corrupt."""
    t0 = time.time()
    raw = getattr(policy, "module", policy)
    device = raw.wte.weight.device
    if not torch.stack([torch.isfinite(p).all() for p in raw.parameters()]).all():
        raise FloatingPointError(f"non-finite weights in the policy at step {step}")
    batch = rollout(raw, prompts, items, reward_fn, cfg, eos_id, generator, sampler)
    t_rollout = time.time() - t0
    r = batch["rewards"].view(-1, cfg.group_size)
    has_spread = r.std(1, unbiased=False) > 0  # (P,) the group's rewards differ: it carries a policy gradient
    spread = has_spread.repeat_interleave(cfg.group_size)  # (N,)
    keep = spread.nonzero().squeeze(1) if cfg.skip_zero_std else torch.arange(len(spread))
    idx, targets, mask, rows = (batch[k][keep].to(device) for k in ("idx", "targets", "mask", "rows"))
    old_logp, adv = batch["old_logp"][keep].to(device), batch["adv"][keep].to(device)
    prompt_idx, prompt_len = batch["prompt_idx"].to(device), batch["prompt_len"].to(device)

    def logprobs(model, sel):  # log-probs and entropies of the kept rows `sel`
        return token_logprobs_and_entropy(model, prompt_idx, prompt_len, rows[sel], idx[sel], targets[sel],
                                          cfg.temperature)

    ref_logp = torch.zeros_like(old_logp)
    if cfg.beta > 0:
        with torch.no_grad():
            for s in range(0, len(idx), cfg.micro_batch):
                sl = slice(s, s + cfg.micro_batch)
                ref_logp[sl] = logprobs(ref_model, sl)[0]
    N = len(idx)
    order = torch.randperm(N, generator=generator).tolist()
    per_mb = math.ceil(N / cfg.minibatches)
    sums = dict(loss=0.0, kl=0.0, entropy=0.0, clip=0.0, grad_norm=0.0)
    # every rank runs the same number of minibatches (DDP all-reduces in each); an empty one adds no gradient
    for m in range(cfg.minibatches):
        mb = order[m * per_mb:(m + 1) * per_mb]
        n_tok = mask[mb].sum().clamp(min=1)
        chunks = [mb[s:s + cfg.micro_batch] for s in range(0, len(mb), cfg.micro_batch)]
        optimizer.zero_grad(set_to_none=True)
        if not chunks:  # nothing to learn from here
            if not hasattr(policy, "no_sync"):
                continue
            # under DDP: join the other ranks' gradient all-reduce, then take the same step with the averaged gradient
            # (skipping it would leave this rank's weights behind theirs)
            (policy(batch["idx"][:1].to(device))[0].sum() * 0.0).backward()
        for c, chunk in enumerate(chunks):
            sync = c == len(chunks) - 1
            ctx = policy.no_sync() if (not sync and hasattr(policy, "no_sync")) else nullcontext()
            with ctx:
                mk = mask[chunk].float()
                logp, ent = logprobs(policy, chunk)
                pg, was_clipped = clipped_objective(logp, old_logp[chunk], adv[chunk], cfg.clip_eps)
                kl = k3_kl(logp, ref_logp[chunk])
                per_token = pg + cfg.beta * kl
                # a chunk's share of its minibatch's aggregate, so gradients add up to the whole minibatch's
                if cfg.loss_agg == "token-mean":
                    loss = (per_token * mk).sum() / n_tok
                else:
                    loss = aggregate(per_token, mk, "seq-mean") * len(chunk) / len(mb)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"non-finite GRPO loss at step {step}")
                loss.backward()
                sums["loss"] += loss.item() / cfg.minibatches
                sums["kl"] += ((kl * mk).sum() / n_tok).item() / cfg.minibatches
                sums["entropy"] += ((ent * mk).sum() / n_tok).item() / cfg.minibatches
                sums["clip"] += ((was_clipped * mk).sum() / n_tok).item() / cfg.minibatches
        gn = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        if not torch.isfinite(gn):
            raise FloatingPointError(f"non-finite gradient norm at step {step}")
        sums["grad_norm"] += gn.item() / cfg.minibatches
        optimizer.step()
    lengths = torch.tensor([len(c) for c in batch["completions"]], dtype=torch.float32)
    return dict(step=step, reward_mean=r.mean().item(), reward_max=r.max().item(),
                zero_std_frac=1.0 - has_spread.float().mean().item(),
                kl=sums["kl"], entropy=sums["entropy"], clip_frac=sums["clip"], loss=sums["loss"],
                grad_norm=sums["grad_norm"], response_len=lengths.mean().item(),
                eos_frac=batch["eos"].float().mean().item(),
                t_rollout=t_rollout, t_step=time.time() - t0)
