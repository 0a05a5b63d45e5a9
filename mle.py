"""
The MLE stage both training scripts share: next-token cross-entropy on the tokens a world model
must predict (train_lang.py: each (prompt, answer) pair's answer, `pair_batches`; train_video.py:
the predicted frames' codes), and the control (the MLE start trained further for RLVR's compute).

    model = train(run, model, "mle", ckpt, steps, next_batch, val_loss, lr_of_step)

next_batch(gen) -> (idx, tgt) on the device (tgt -1 where no token is scored), val_loss(model) ->
float, and optionally val_metrics(model) -> (dict, words) for the log. The stage ends after `steps`
steps or once its compute (forward-token units, as grpo.step_stats counts RLVR's) reaches `budget`.
"""
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from checkpoint import read_meta, resume_stage, save_stage
from runtime import NanPolicy, lr_at, no_sync_unless_last, unsharded

WARMUP = 100   # warm-up steps of the MLE schedule (runtime.lr_at) of train_lang.py


def cosine_lr(steps, lr):
    """train_lang.py's MLE schedule: WARMUP steps of warm-up to lr, then cosine to lr / 10."""
    return lambda s: lr_at(s, steps, lr, WARMUP)


def control_lr(lr, warmup=10):
    """The control's schedule: a linear warm-up over `warmup` steps, then `lr` (constant)."""
    return lambda step: lr * min(1.0, (step + 1) / warmup)


def final_lr(ckpt):
    """The rate the MLE schedule of `ckpt` ended at (the control's default); None: none (HF)."""
    if not Path(ckpt).is_file():
        return None
    meta = read_meta(ckpt)
    schedule = [meta["args"].get(k, d) for k, d in (("mle_steps", None), ("mle_lr", None),
                                                    ("warmup", WARMUP))]
    return None if None in schedule else lr_at(meta["step"] - 1, *schedule)


def batch_compute(tgt):
    """Forward-token units of a step on targets tgt (B, T): 3 x positions to rows' last target."""
    scored = tgt >= 0
    length = torch.where(scored.any(1), tgt.shape[1] - scored.flip(1).int().argmax(1), 0)   # (B,)
    return 3 * int(length.sum())


def train(run, model, name, ckpt, steps, next_batch, val_loss, lr_of_step, budget=None,
          val_metrics=None, desc=None, weight_decay=None, eval_every=None):
    """Train `model` by MLE as the stage `name`, checkpointing to `ckpt` -> the trained model (the
    same object, on the device). Reads --seed; --weight_decay, --eval_every unless given."""
    args = run.args
    weight_decay = args.weight_decay if weight_decay is None else weight_decay
    eval_every = eval_every or args.eval_every
    model, trained = run.wrap(model, grad_ckpt=args.grad_ckpt)   # on the device, DDP
    opt = torch.optim.AdamW(model.parameters(), lr=lr_of_step(0), betas=(0.9, 0.95),
                            weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(args.seed + run.rank)   # each rank its own batches
    # weights, optimizer and generators of an unfinished run; a finished stage is reused as it is
    step, done = resume_stage(run, ckpt, model, opt, gen, name)
    if done:
        return model
    t_start = time.time()
    metrics = {}   # the last validation check, saved in each checkpoint
    # the compute of the steps so far (forward-token units), continued by a resumed run
    compute = read_meta(ckpt)["metrics"].get("compute", 0) if step else 0
    # a compute budget: the number of steps is known at the end only
    bar = tqdm(total=None if budget else steps, initial=step, desc=desc or name,
               disable=not run.master)
    nan = NanPolicy(run, name)   # --on_nan: a NaN/inf stops the run, or skips the step
    while step < steps:
        for group in opt.param_groups:
            group["lr"] = lr_of_step(step)   # MLE: warm-up then cosine; the control: constant
        idx, tgt, *weight = next_batch(gen)  # (B, T) inputs and targets, and maybe weights
        opt.zero_grad(set_to_none=True)
        loss = micro_steps(run, trained, idx, tgt, weight[0] if weight else None)
        # the optimizer step, guarded: a NaN/inf loss or gradient never reaches the weights
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # rescale to norm <= 1
        if nan.finite(step, model, loss, norm):   # else: stop, or skip the step (--on_nan)
            opt.step()                            # AdamW: the weights change here
        step += 1
        compute += run.sum_ranks(batch_compute(tgt))   # every rank's, as RLVR's budget counts
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        # the compute budget (the control's); the ranks agree, so all leave at the same step
        spent = run.any_rank(budget is not None and budget.reached(compute))
        if step % eval_every == 0 or step == steps or spent:
            metrics = validate(run, model, name, step, loss, t_start, val_loss, val_metrics,
                               compute)
        # every --ckpt_every steps the resumable state; at the end the weights alone, marked done
        save_stage(run, ckpt, model, opt, step, {**metrics, "compute": compute}, gen,
                   done=step == steps or spent)
        if spent:
            run.print0(f"{name}: stopping after {(time.time() - t_start) / 60:.2f} minutes "
                       f"at step {step}, compute {compute:.3g}")
            break
    bar.close()
    run.barrier()
    return model


def micro_steps(run, trained, idx, tgt, weight=None):
    """Forward and backward the batch idx, tgt (B, T) in micro-batches of --micro_batch rows, each
    its share of the batch's mean loss -> that mean loss. weight (B, T): a weighted mean instead."""
    scored = tgt >= 0
    w = scored.float() if weight is None else weight * scored   # each scored token's weight
    total, loss = w.sum(), 0.0
    chunks = torch.arange(len(idx)).split(run.args.micro_batch)
    for c, rows in enumerate(chunks):
        # DDP all-reduces the gradients on the last micro-batch only
        with no_sync_unless_last(trained, c == len(chunks) - 1):
            with run.autocast:   # the forward only: the backward runs in the weights' dtype
                logits, mean = trained(idx[rows], tgt[rows], at=scored[rows])   # (k, vocab)
            if weight is None:   # the chunk's mean cross-entropy, weighed by its share of tokens
                part = mean if len(chunks) == 1 else mean * (w[rows].sum() / total)
            else:
                ce = F.cross_entropy(logits.float(), tgt[rows][scored[rows]], reduction="none")
                part = (ce * w[rows][scored[rows]]).sum() / total
            part.backward()
        loss = loss + part.detach()
    return loss


def validate(run, model, name, step, loss, t_start, val_loss, val_metrics, compute):
    """The validation check after `step` steps: print one line, log one -> the logged metrics."""
    model.eval()
    with torch.no_grad(), run.autocast:
        vl = val_loss(model)
    metrics = dict(stage=name, step=step, loss=loss.item(), val_loss=vl,
                   minutes=(time.time() - t_start) / 60, compute=compute)
    with unsharded(model):   # FSDP: every rank gathers the full weights for rank 0's decoding
        more, words = val_metrics(model) if val_metrics else ({}, "")   # e.g. a greedy headline
    metrics.update(more)
    model.train()
    run.print0(f"\n{name} step {step}: train loss {loss.item():.4f} val loss {vl:.4f}{words}")
    run.log(metrics)   # one JSON line in out_dir/log.jsonl
    return metrics


# -----------------------------------------------------------------------------
# (prompt, answer) pairs: train_lang.py's batches

def batch_from(pairs, device):
    """(prompt, answer) id lists -> right-padded idx, targets (B, T) on the device (-1: no loss)."""
    T = max(len(a) + len(b) for a, b in pairs) - 1          # the longest sequence, but its last
    idx = torch.zeros(len(pairs), T, dtype=torch.long)       # padding 0 is never a target
    tgt = torch.full((len(pairs), T), -1, dtype=torch.long)  # -1 = ignored by the cross-entropy
    for i, (a, b) in enumerate(pairs):
        s = a + b                                            # prompt, answer (+ EOS): one sequence
        idx[i, :len(s) - 1] = torch.tensor(s[:-1])           # input: all but the last token
        tgt[i, len(a) - 1:len(s) - 1] = torch.tensor(b)      # target: the answer, shifted by one
    return idx.to(device), tgt.to(device)


def pair_batches(run, pairs, val_pairs, batch_size):
    """mle.train's next_batch (`batch_size` pairs, with replacement) and val_loss on id pairs."""
    device, mb = run.device, run.args.micro_batch

    def next_batch(gen):
        ids = torch.randint(len(pairs), (batch_size,), generator=gen).tolist()
        return batch_from([pairs[i] for i in ids], device)

    def val_loss(model):
        batches = (batch_from(val_pairs[i:i + mb], device) for i in range(0, len(val_pairs), mb))
        vl = [model(idx, tgt, at=tgt >= 0)[1].item() for idx, tgt in batches]   # answers' logits
        return sum(vl) / len(vl)
    return next_batch, val_loss
