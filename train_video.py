"""
Train a video world model: a VQ tokenizer, an action-conditioned GPT by MLE, then RLVR (GRPO whose reward is a
metric of the decoded frames against the true ones), and compare on held-out episodes the MLE start, RLVR, and the
control: the MLE start trained further by MLE for RLVR's wall-clock ("mle_more"), so a gain is not just more compute.

CPU, the default jobs (embedded robot-pushing data; RLVR from the shipped context-conditioned world model
checkpoints/video_cond_mle.safetensors and its tokenizer checkpoints/video_cvq.safetensors; docs/video.md):
    python train_video.py                                   # single-step, 100 GRPO steps (~10 min on 2 cores)
    python train_video.py --mode=multi --out_dir=out/video_multi   # 7 frames with the true actions injected, 40 steps
The commands that made the shipped tokenizers and MLE models (--stage=tokenizer, then --stage=mle legs) are in
docs/video.md. Everything in one go (tokenizers, MLE, RLVR, eval): python train_video.py --init=scratch --mode=multi
The per-frame tokenizer instead of the context-conditioned one: --tokenizer=frame (with --init=scratch); its MLE
model is shipped too (--init=checkpoints/video_mle.safetensors).
Converted RT-1 episodes (.npz with image (T, 256, 320, 3) and action (T, 13)), on GPUs:
    torchrun --nproc_per_node=8 train_video.py --data=/path/rt1 --init=scratch --device=cuda --dtype=bfloat16

Stages (--stage): tokenizer | mle | rlvr | all. Outputs in --out_dir: video_vq.safetensors (per-frame tokenizer),
video_cvq.safetensors (context-conditioned tokenizer, --tokenizer=cond), video_mle.safetensors,
video_rlvr.safetensors, video_mle_more.safetensors (the control; --control=0 skips it) (+ .json sidecars),
tokens_<split>.safetensors (the clips' tokens, cached per tokenizer), log.jsonl and eval.json = {"mle": M, "rlvr": M,
"mle_more": M}, each M the eval.py --task=video JSON of the test split: greedy summaries, copy-last-frame and the
tokenizer ceiling, "per_record" (mae, ssim, repetition per test window, in a fixed order, for paired comparisons) and
"sampled" (the paper's protocol: T=1, top-k 100). The run ends by printing RLVR - MLE, RLVR - mle_more, RLVR - copy
and MLE - copy with paired bootstrap 95% intervals over the test windows.
Every stage checkpoints every --ckpt_every steps with optimizer and RNG state (a tokenizer's in
video_vq_train / video_cvq_train.safetensors, removed once the tokenizer is written), and a re-run of the same command
resumes where it stopped, ending with the weights of an uninterrupted run (a finished stage keeps its weights only,
and is reused). A NaN/inf loss, reward or gradient stops the run naming the step (--on_nan=skip skips the step).

Design: the tokenizers are trained once and frozen; the clips of every split are tokenized once and cached, so MLE
trains on token windows only (cheap). The context-conditioned tokenizer (tokenizer_vq.CondVQVAE) gives the context
frame its 64 per-frame codes and each predicted frame 64 codes of its own codebook, coded against that context
frame, so the codes describe what changed and a static pixel is copied, not re-drawn. MLE trains on windows of
context + horizon frames (multi) or context + 1 (single), loss on the predicted frames' codes only; a model trained
in multi mode also serves single-step prediction. RLVR samples G predictions per prompt, decodes them (with the true
context frame) and scores them against the true frames (`--reward`, default mae+ssim, or mae+lpips with --lpips
weights); `grpo.grpo_step` does the rest, with the multi-step sampler of data/robot/task.py that injects the true
actions between frames.
"""
import argparse
import copy
import json
import shutil
import sys
import time
import zlib
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from checkpoint import atomic_write, atomic_write_text, read_checkpoint
from data.robot.prepare import DATA_DIR, ensure_splits
from data.robot.task import (Layout, clips, frame_codes, load_split, read_action_stats, rollout, tokenize_split,
                             windows)
from evaluate_video import (OFFICIAL, eval_video, load_video_model, paired_video, print_video_paired,
                            print_video_table, to_float)
from grpo import GRPOConfig, grpo_step
from model import GPT, GPTConfig
from rewards import load_lpips, mae, pick_reward, psnr, ssim, video_reward
from runtime import Run, fork_alongside, fork_map, lr_at
from tokenizer_vq import CondVQConfig, CondVQVAE, VQConfig, VQVAE, codebook_stats, load_vq, save_vq

ROOT = Path(__file__).resolve().parent
SHIPPED_MLE = dict(single=ROOT / "checkpoints" / "video_cond_mle.safetensors",   # on the context-conditioned
                   multi=ROOT / "checkpoints" / "video_cond_multi_mle.safetensors")   # tokenizer, per --mode
SHIPPED_VQ = dict(frame=ROOT / "checkpoints" / "video_vq.safetensors",      # per tokenizer kind, for --stage=mle
                  cond=ROOT / "checkpoints" / "video_cvq.safetensors")

# -----------------------------------------------------------------------------
# flags
p = argparse.ArgumentParser(description="tokenizer, MLE then RLVR for a video world model",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
p.add_argument("--data", default=str(DATA_DIR), help="episode .npz directory (the embedded data is made if missing)")
p.add_argument("--out_dir", default="out/video", help="checkpoints, token caches, log.jsonl and eval.json go here")
p.add_argument("--stage", default="all", choices=["all", "tokenizer", "mle", "rlvr"], help="which stages to run")
p.add_argument("--mode", default="single", choices=["single", "multi"],
               help="predict 1 frame, or --horizon frames with the true actions injected between them")
p.add_argument("--init", default="auto", help="auto (the shipped MLE checkpoint if it fits the data, else scratch) | "
                                              "scratch | a video_mle/video_rlvr .safetensors")
p.add_argument("--vq", default="auto", help="tokenizer file for --stage=mle from scratch (auto: out_dir's, else the "
                                            "shipped per-frame one); also the per-frame VQ a new cond tokenizer uses")
p.add_argument("--resume", type=int, default=1, help="1: continue from out_dir's checkpoints; 0: start over")
# tokenizers
p.add_argument("--tokenizer", default="cond", choices=["cond", "frame"],
               help="for a model trained from scratch: context-conditioned (predicted frames coded against the "
                    "context frame) or per-frame tokenizer")
p.add_argument("--size", type=int, default=64, help="frame side (frames are resized to it)")
p.add_argument("--clip_len", type=int, default=16, help="episodes are cut into clips of this many frames")
p.add_argument("--quantizer", default="vq", choices=["vq", "fsq"], help="codebook (vq) or finite scalar (fsq)")
p.add_argument("--n_codes", type=int, default=512, help="codebook size of each tokenizer")
p.add_argument("--vq_steps", type=int, default=2500, help="per-frame tokenizer training steps")
p.add_argument("--vq_minutes", type=float, default=0, help="stop per-frame tokenizer training after this (0 = off)")
p.add_argument("--vq_batch", type=int, default=32, help="per-frame tokenizer batch (crops)")
p.add_argument("--vq_crop", type=int, default=32, help="train on random crops of this side (multiple of 8)")
p.add_argument("--vq_lr", type=float, default=1e-3, help="tokenizer learning rate (both tokenizers)")
p.add_argument("--cvq_steps", type=int, default=2000, help="context-conditioned tokenizer training steps")
p.add_argument("--cvq_minutes", type=float, default=0, help="stop cond tokenizer training after this (0 = off)")
p.add_argument("--cvq_batch", type=int, default=32, help="cond tokenizer batch (pairs of crops)")
p.add_argument("--cvq_crop", type=int, default=32, help="cond tokenizer crop side (multiple of 8)")
p.add_argument("--move_weight", type=float, default=10.0,
               help="cond tokenizer loss weight on pixels that changed from the context (static pixels weigh 1)")
# world model
p.add_argument("--context", type=int, default=1, help="true frames before the first predicted one")
p.add_argument("--horizon", type=int, default=7, help="predicted frames in multi mode (paper: 7)")
p.add_argument("--n_layer", type=int, default=4, help="GPT layers")
p.add_argument("--n_head", type=int, default=4, help="GPT attention heads")
p.add_argument("--n_embd", type=int, default=128, help="GPT width")
# MLE
p.add_argument("--mle_steps", type=int, default=1150, help="MLE optimizer steps")
p.add_argument("--mle_minutes", type=float, default=0, help="stop MLE after this wall-clock (0 = off)")
p.add_argument("--batch_size", type=int, default=16, help="MLE windows per step (per rank)")
p.add_argument("--mle_lr", type=float, default=2e-3, help="MLE peak learning rate (cosine decay)")
p.add_argument("--warmup", type=int, default=100, help="MLE warmup steps")
p.add_argument("--weight_decay", type=float, default=0.1, help="AdamW weight decay for MLE")
p.add_argument("--control", type=int, default=1,
               help="1: also train the control, the MLE start trained further by MLE for RLVR's wall-clock")
p.add_argument("--control_alongside", type=int, default=1,
               help="1: on a CPU, train the control in a second process while RLVR runs (0: after RLVR, for its time)")
p.add_argument("--control_steps", type=int, default=0,
               help="0: the control runs for RLVR's wall-clock; N: exactly N steps instead (reproducible, for a "
                    "machine whose load changed between the RLVR run and the control)")
p.add_argument("--control_lr", type=float, default=2e-4,
               help="constant learning rate of the control (the default MLE schedule's final rate, 0.1 x 2e-3)")
# RLVR
p.add_argument("--rl_steps", type=int, default=None, help="GRPO steps (default: 100 single-step, 40 multi-step)")
p.add_argument("--prompts_per_step", type=int, default=None,
               help="prompts (windows) per GRPO step and rank (default: 8 single-step, 4 multi-step)")
p.add_argument("--group_size", type=int, default=8, help="samples per prompt (G)")
p.add_argument("--rl_lr", type=float, default=1e-4, help="GRPO learning rate")
p.add_argument("--beta", type=float, default=0.02, help="KL coefficient")
p.add_argument("--clip_eps", type=float, default=0.2, help="PPO ratio clip")
p.add_argument("--minibatches", type=int, default=2, help="optimizer steps per GRPO batch")
p.add_argument("--micro_batch", type=int, default=32, help="sequences per forward pass")
p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the rollouts")
p.add_argument("--reward", default="auto", help="auto | mae+ssim | mae+lpips")
p.add_argument("--lpips", default=None, help="LPIPS-VGG weights (tools/convert_lpips.py) for the reward and eval")
p.add_argument("--moving_weight", type=float, default=1.0,
               help="the reward also loses this x the MAE on the pixels that move (rewards.moving_mae): copying the "
                    "last frame, or drawing a still scene, is not paid")
p.add_argument("--object_weight", type=float, default=None,
               help="the reward also loses this x the share of the true objects' pixels left empty "
                    "(rewards.object_miss; needs episodes with a background image): erasing an object is not paid "
                    "(default: 0 single-step, 0.5 multi-step; 0 on data without backgrounds)")
p.add_argument("--moving_only", type=int, default=1, help="RL prompts only from windows where the scene moves")
# evaluation
p.add_argument("--eval_every", type=int, default=500, help="MLE steps between validation losses (RLVR: every 20)")
p.add_argument("--test_limit", type=int, default=0, help="test episodes in the final eval (0 = all)")
p.add_argument("--eval_workers", type=int, default=2,
               help="CPU: forked processes sharing the final evaluations (model x greedy/sampled)")
p.add_argument("--train_limit", type=int, default=0, help="train episodes to use (0 = all)")
# system
p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="autocast precision")
p.add_argument("--threads", type=int, default=1, help="torch CPU threads; 1 is fastest for tiny models on 2 cores")
p.add_argument("--seed", type=int, default=1337, help="seed of every random stream")
p.add_argument("--ckpt_every", type=int, default=200, help="steps between resumable checkpoints")
p.add_argument("--on_nan", default="stop", choices=["stop", "skip"],
               help="on a NaN/inf loss, reward or gradient: stop the run, or skip that step (single process only)")
args = p.parse_args()
# defaults per mode, chosen on the validation split (docs/video.md): a multi-step completion is 7 frames, so fewer
# prompts and steps fit the time box; multi-step RLVR erased objects unless the reward's object term said otherwise
MODE_DEFAULTS = dict(single=dict(rl_steps=100, prompts_per_step=8, object_weight=0.0),
                     multi=dict(rl_steps=40, prompts_per_step=4, object_weight=0.5))
given = {name for name in MODE_DEFAULTS[args.mode] if getattr(args, name) is not None}   # set on the command line
for name, value in MODE_DEFAULTS[args.mode].items():
    if name not in given:
        setattr(args, name, value)
# every bad value stops here with one line naming its flag, before any data is read or file written
for name in ("size", "n_codes", "vq_steps", "vq_batch", "vq_crop", "cvq_steps", "cvq_batch", "cvq_crop", "context",
             "horizon", "n_layer", "n_head", "n_embd", "mle_steps", "batch_size", "rl_steps", "prompts_per_step",
             "group_size", "minibatches", "micro_batch", "eval_every", "eval_workers", "threads", "ckpt_every"):
    if getattr(args, name) < 1:
        p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
for name in ("vq_minutes", "vq_lr", "cvq_minutes", "move_weight", "mle_minutes", "mle_lr", "warmup", "weight_decay",
             "control_steps", "control_lr", "rl_lr", "moving_weight", "object_weight", "beta", "clip_eps", "test_limit",
             "train_limit"):
    if not getattr(args, name) >= 0:
        p.error(f"--{name} must be >= 0, got {getattr(args, name)}")
if args.clip_len < 2 or args.vq_crop > args.size or args.cvq_crop > args.size or not args.temperature > 0:
    p.error(f"need --clip_len >= 2 (got {args.clip_len}), --vq_crop and --cvq_crop <= --size (got {args.vq_crop}, "
            f"{args.cvq_crop} > {args.size}) and --temperature > 0 (got {args.temperature})")
if args.vq_crop % 8 or args.size % 8 or args.cvq_crop % 8:   # crops must start and end on the 8x8-pixel code grid
    p.error("--vq_crop, --cvq_crop and --size must be multiples of 8 (the tokenizers' 8x downsampling)")

# -----------------------------------------------------------------------------
# setup: distributed, devices, precision (runtime.py), then the data
out_dir = Path(args.out_dir)
run = Run(args, out_dir)                        # torchrun ranks, threads, seeds, autocast, log.jsonl
master, rank, world, autocast = run.master, run.rank, run.world, run.autocast
print0, fail, log, barrier = run.print0, run.fail, run.log, run.barrier   # print / stop / log on rank 0; sync ranks
# every file a run writes; a *_train file is a tokenizer's resumable state, removed once the tokenizer is done
FILES = dict(vq=out_dir / "video_vq.safetensors", vq_train=out_dir / "video_vq_train.safetensors",
             cvq=out_dir / "video_cvq.safetensors", cvq_train=out_dir / "video_cvq_train.safetensors",
             mle=out_dir / "video_mle.safetensors", rlvr=out_dir / "video_rlvr.safetensors",
             mle_more=out_dir / "video_mle_more.safetensors")
if args.init != "auto" and args.init != "scratch" and not Path(args.init).is_file():
    fail(f"--init {args.init}: no such checkpoint file")
if args.stage == "rlvr" and args.init == "scratch":
    fail("--stage=rlvr needs --init=<video_mle checkpoint> (RLVR post-trains a trained model)")
if master:                                      # rank 0 creates files; the others wait at the barrier below
    out_dir.mkdir(parents=True, exist_ok=True)
if master and Path(args.data).resolve() == DATA_DIR.resolve():
    ensure_splits(DATA_DIR)                     # the embedded robot data, generated on first use (~15 s)
barrier()
try:
    if master:
        read_action_stats(args.data)            # writes action_stats.json on first use
    barrier()
    lo, hi = read_action_stats(args.data)       # per-dimension action range: the 256 bins of each dimension
    limits = {"train": args.train_limit, "val": 0, "test": args.test_limit}   # episodes per split (0 = all)
    # each split's episodes, resized to --size and cut into clips of --clip_len frames: dicts of image (T, H, W, 3)
    # uint8, action (T, D) float and background (H, W, 3) or None
    train_eps, val_eps, test_eps = (clips(load_split(args.data, s, args.size, n), args.clip_len)
                                    for s, n in limits.items())
except ValueError as e:                         # a bad episode file or action_stats.json: one line naming it
    fail(str(e))
if not (train_eps and val_eps and test_eps):
    fail(f"{args.data}: some split has no episode of >= --clip_len={args.clip_len} frames")
D, T = train_eps[0]["action"].shape[1], args.clip_len   # action dimensions, frames per clip
args.action_lo, args.action_hi = lo.tolist(), hi.tolist()     # saved in every checkpoint's args
print0(f"data: {len(train_eps)} train / {len(val_eps)} val / {len(test_eps)} test clips of {T} frames, "
       f"{D}-dim actions, frames resized to {args.size}x{args.size}")

# --init=auto: the shipped MLE model, when this run post-trains and the checkpoint's action dimensions fit the data
if args.init == "auto":
    args.init = "scratch"                       # unless the shipped model fits, below
    shipped = SHIPPED_MLE[args.mode]
    if shipped.is_file() and args.stage in ("all", "rlvr"):
        shipped_args = json.loads(shipped.with_suffix(".json").read_text())["args"]   # its sidecar's flags
        if len(shipped_args["action_lo"]) == D:   # its vocabulary has action tokens for D dimensions
            args.init = str(shipped)
        else:
            print0(f"--init=auto: the shipped model's vocabulary is for {len(shipped_args['action_lo'])}-dim actions, "
                   f"{args.data} has {D}-dim ones; training from scratch (tokenizer, MLE, RLVR)")
    if args.init == "scratch" and args.stage == "rlvr":
        fail("--stage=rlvr needs --init=<video_mle checkpoint> (RLVR post-trains a trained model)")


# -----------------------------------------------------------------------------
# stage 1: the tokenizers, trained on random crops of train frames, then frozen

def read_header(path):
    """The JSON header of a tokenizer file, or a one-line failure naming it."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return json.loads((f.metadata() or {}).get("nanorlvr", "{}"))
    except Exception as e:   # safetensors raises its own error types
        fail(f"{path}: not a readable tokenizer checkpoint ({e}); pass --resume=0 or another --out_dir")


def crop_batch(frames, g, batch, crop, grid, max_gap):
    """Random (frame, context) pairs of train clips, cropped alike. frames: (E, T, 3, H, W) uint8.
    max_gap = 0: the context is unused (the frame itself); else frame t + k against context t, k in 1..max_gap.
    -> x, ctx (batch, 3, crop, crop) float in [0, 1]; crops start on the code grid (multiples of `grid` pixels)."""
    E, T = frames.shape[:2]
    e = torch.randint(E, (batch,), generator=g)                            # a random clip per pair
    # the gap k between context and target: 1..max_gap frames (the cond tokenizer codes frames up to the horizon
    # ahead), or 0 for the per-frame tokenizer, which reconstructs the frame itself
    k = torch.randint(1, max_gap + 1, (batch,), generator=g) if max_gap else torch.zeros(batch, dtype=torch.long)
    t = (torch.rand(batch, generator=g) * (T - k)).long()                  # context frame t, target frame t + k
    oy, ox = (grid * torch.randint((args.size - crop) // grid + 1, (2,), generator=g)).tolist()   # one offset for all
    x = frames[e, t + k, :, oy:oy + crop, ox:ox + crop].float().div(255)   # (batch, 3, crop, crop) targets
    ctx = frames[e, t, :, oy:oy + crop, ox:ox + crop].float().div(255)     # the same crop of the context frames
    return x.to(args.device), ctx.to(args.device)


def train_tokenizer(vq, final, train_file, steps, minutes, batch):
    """Fit a tokenizer (VQVAE or CondVQVAE) on batch() -> (x, ctx) pairs; resumable; returns its step count.
    Loss: reconstruction MSE + quantiser loss; the cond tokenizer adds L1 and weighs changed pixels by --move_weight,
    so the few pixels that move (which its codes are for) are not drowned by the static background."""
    cond = isinstance(vq, CondVQVAE)
    g = torch.Generator().manual_seed(args.seed + rank + (100 if cond else 0))   # each rank, each tokenizer its own
    # crops
    if args.quantizer == "vq":   # codebook from encoder outputs; DDP's constructor then copies rank 0's everywhere
        with torch.no_grad():
            z = vq.encode(*batch(g))                                    # (B, code_dim, h, w) latents
            vq.quantizer.restart(z.permute(0, 2, 3, 1).flatten(0, 2), torch.ones(args.n_codes, dtype=torch.bool))
            vq.quantizer.initialised.fill_(True)                        # so the forward pass does not re-seed it
    _, trained = run.wrap(vq)                                           # DDP under torchrun, else vq itself
    params = [p for p in vq.parameters() if p.requires_grad]        # the cond tokenizer's frame VQ stays frozen
    opt = torch.optim.Adam(params, lr=args.vq_lr)
    name = "cond_tokenizer" if cond else "tokenizer"   # the stage's name in logs and messages
    step, _ = run.resume_stage(train_file, vq, opt, g, name)           # 0, or where an interrupted run stopped
    t0 = time.time()
    bar = tqdm(total=steps, initial=step, desc=name, disable=not master)
    while step < steps:
        for group in opt.param_groups:                                  # 50 warm-up steps, then cosine decay
            group["lr"] = lr_at(step, steps, args.vq_lr, 50)
        x, ctx = batch(g)                                               # (B, 3, crop, crop) each
        with autocast:
            rec, qloss, _ = trained(x, ctx)                             # reconstruction, quantiser loss, codes
        err = rec.float() - x                                           # (B, 3, crop, crop)
        if cond:     # weight 1 on static pixels, 1 + move_weight where the frame differs from its context
            w = 1 + args.move_weight * ((x - ctx).abs().amax(1, keepdim=True) > 0.05).float()
            loss = (w * (err.square() + err.abs())).mean() + qloss
        else:
            loss = err.square().mean() + qloss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if run.finite(name, step, vq, loss):   # a NaN/inf stops the run, or skips the step (--on_nan)
            opt.step()
        step += 1
        # dead-code restart: codes unused lately are re-seeded with this batch's latents (not in the last 20%, so
        # the final codebook settles)
        if args.quantizer == "vq" and step % 50 == 0 and step < 0.8 * steps:
            with torch.no_grad():
                z = vq.encode(x, ctx).permute(0, 2, 3, 1).flatten(0, 2)   # (B*h*w, code_dim)
            n_dead = vq.quantizer.restart_dead(z)
            if run.ddp:                                                  # every rank keeps rank 0's codebook
                dist.broadcast(vq.quantizer.codebook.data, 0)
                dist.broadcast(vq.quantizer.usage, 0)
            bar.set_postfix(loss=f"{loss.item():.5f}", restarted=n_dead)
        bar.update(1)
        run.save_stage(train_file, vq, opt, step, {}, g, done=False)   # resumable state every --ckpt_every
        if run.any_rank(bool(minutes and time.time() - t0 > 60 * minutes)):   # every rank stops at the same step
            print0(f"{name}: stopping after {minutes} minutes at step {step}")
            break
    bar.close()
    return step, (time.time() - t0) / 60


def finish_tokenizer(vq, final, train_file, stats):
    """Log the held-out stats, write the final file, drop the resumable one."""
    log({"stage": "cond_tokenizer" if isinstance(vq, CondVQVAE) else "tokenizer", **stats})
    if master:
        save_vq(final, vq, {**stats, "done": True, "args": vars(args)})
        for f in (train_file, train_file.with_suffix(".json")):   # nothing left to resume
            f.unlink(missing_ok=True)
    barrier()


def frame_tokenizer():
    """The per-frame VQ (out_dir's if complete, else trained) -> its path."""
    final, train_file = FILES["vq"], FILES["vq_train"]
    if args.resume and final.is_file() and read_header(final).get("done"):
        print0(f"tokenizer: {final} is complete, reusing it")
        return final
    frames = torch.from_numpy(np.stack([ep["image"] for ep in train_eps])).permute(0, 1, 4, 2, 3)   # (E, T, 3, H, W)
    vq = VQVAE(VQConfig(size=args.size, quantizer=args.quantizer, n_codes=args.n_codes)).to(args.device)
    step, minutes = train_tokenizer(vq, final, train_file, args.vq_steps, args.vq_minutes,
                                    lambda g: crop_batch(frames, g, args.vq_batch, args.vq_crop, 8, 0))
    vq.eval()
    # held-out check: every val and test frame encoded and decoded whole (the model trained on crops)
    held = np.concatenate([ep["image"] for ep in val_eps + test_eps])        # held-out frames (N, H, W, 3)
    with torch.no_grad():
        codes = vq.tokenize(held)                                            # (N, 64)
        rec = vq.detokenize(codes).cpu()                                     # (N, 3, H, W)
    stats = dict(psnr_heldout=float(psnr(rec, to_float(held)).mean()), **codebook_stats(codes, vq.config.n_codes),
                 n_codes=vq.config.n_codes, steps=step, minutes=minutes)
    print0(f"tokenizer: held-out PSNR {stats['psnr_heldout']:.2f} dB on {len(held)} frames, "
           f"{stats['used']}/{stats['n_codes']} codes used, perplexity {stats['perplexity']:.1f}")
    finish_tokenizer(vq, final, train_file, stats)
    return final


def cond_tokenizer(frame_vq_path):
    """The context-conditioned tokenizer on top of a per-frame VQ (its context codes) -> its path."""
    final, train_file = FILES["cvq"], FILES["cvq_train"]
    if args.resume and final.is_file() and read_header(final).get("done"):
        print0(f"tokenizer: {final} is complete, reusing it")
        return final
    frame_vq, _ = load_vq(frame_vq_path)
    if isinstance(frame_vq, CondVQVAE):
        fail(f"{frame_vq_path}: a cond tokenizer; --vq must name a per-frame one")
    vq = CondVQVAE(CondVQConfig(size=args.size, quantizer=args.quantizer, n_codes=args.n_codes,
                                frame=asdict(frame_vq.config)))
    vq.frame.load_state_dict(frame_vq.state_dict())     # the context codes are the per-frame VQ's, frozen
    vq.frame.requires_grad_(False)
    vq = vq.to(args.device)
    frames = torch.from_numpy(np.stack([ep["image"] for ep in train_eps])).permute(0, 1, 4, 2, 3)   # (E, T, 3, H, W)
    gap = min(args.horizon, T - 1)                        # future frames up to the rollout's horizon ahead
    step, minutes = train_tokenizer(vq, final, train_file, args.cvq_steps, args.cvq_minutes,
                                    lambda g: crop_batch(frames, g, args.cvq_batch, args.cvq_crop, 8, gap))
    vq.eval()
    # held-out check: every next val frame coded against its previous frame and decoded, against copying that frame
    held = torch.from_numpy(np.stack([ep["image"] for ep in val_eps])).permute(0, 1, 4, 2, 3).float() / 255
    ctx, x = held[:, :-1].flatten(0, 1), held[:, 1:].flatten(0, 1)          # every next frame against its context
    with torch.no_grad():
        codes = vq.tokenize(x, ctx)                                          # (N, L) the future frames' codes
        rec = vq.detokenize(codes, ctx).cpu()                                # (N, 3, H, W)
    stats = dict(psnr_heldout=float(psnr(rec, x).mean()), mae_heldout=float(mae(rec, x).mean()),
                 ssim_heldout=float(ssim(rec, x).mean()), copy_mae=float(mae(ctx, x).mean()),
                 copy_ssim=float(ssim(ctx, x).mean()), **codebook_stats(codes, vq.config.n_codes),
                 n_codes=vq.config.n_codes, steps=step, minutes=minutes)
    print0(f"cond tokenizer: next val frame reconstructed MAE {stats['mae_heldout']:.4f} SSIM "
           f"{stats['ssim_heldout']:.4f} PSNR {stats['psnr_heldout']:.2f} (copy-last-frame MAE {stats['copy_mae']:.4f}"
           f" SSIM {stats['copy_ssim']:.4f}); {stats['used']}/{stats['n_codes']} codes used")
    finish_tokenizer(vq, final, train_file, stats)
    return final


def split_tokens(vq_path, vq, layout, split, episodes, horizon):
    """tokenize_split(...) of one split, cached in out_dir per tokenizer file, data, horizon and split."""
    # the cache is valid only for the same tokenizer bytes, data folder, frame size, clip count and horizon
    key = f"{zlib.crc32(Path(vq_path).read_bytes())}-{Path(args.data).resolve()}-{args.size}-{len(episodes)}-{horizon}"
    cache = out_dir / f"tokens_{split}.safetensors"
    try:
        with safe_open(str(cache), framework="pt") as f:
            if (f.metadata() or {}).get("key") == key:              # a hit: the tensors as they were saved
                return {k: f.get_tensor(k) for k in f.keys()}
    except Exception:   # missing or unreadable: computed again and rewritten below
        pass
    t0 = time.time()
    tokens = tokenize_split(vq, episodes, horizon, layout, lo, hi)   # context, future and action tokens per clip
    if master:
        atomic_write(cache, lambda tmp: save_file(tokens, str(tmp), metadata={"key": key}))
    print0(f"tokenized {split}: {len(episodes)} clips in {time.time() - t0:.0f}s")
    return tokens


# -----------------------------------------------------------------------------
# stage 2: MLE on token windows (loss on the predicted frames' codes only)

def run_mle(model, layout, tokens, horizon, name, steps, minutes, lr_of_step, stop=None):
    """Train `model` (a new GPT, the --init one, or a copy of the MLE start for the control) on windows of context +
    horizon frames for `steps` steps, `minutes` of wall-clock (0: no limit) or until `stop` (an Event) is set, at
    lr_of_step(step), checkpointing to FILES[name] -> the trained model. "mle" is the MLE stage; "mle_more" the
    equal-time control."""
    model, trained = run.wrap(model)                  # trained: the DDP-wrapped module under torchrun
    train_tok, val_tok = tokens["train"], tokens["val"]
    n = args.context + horizon                        # frames per window
    budget = (f", at most {minutes:.2f} min" if minutes    # the control stops on RLVR's wall-clock, or its end
              else " (until RLVR's last step)" if stop is not None else "")
    print0(f"{name}: {model.num_params() / 1e6:.2f}M non-embedding parameters, windows of {n} frames "
           f"({layout.window_len(args.context, horizon)} tokens), batch {args.batch_size} x {world} ranks{budget}")
    val_windows = [(e, t) for e in range(len(val_eps)) for t in range(0, T - n + 1, n)]   # fixed validation set
    opt = torch.optim.AdamW(model.parameters(), lr=lr_of_step(0), betas=(0.9, 0.95), weight_decay=args.weight_decay)
    g = torch.Generator().manual_seed(args.seed + rank)                  # each rank draws its own windows
    step, done = run.resume_stage(FILES[name], model, opt, g, name)     # weights, optimizer, RNG of a stopped run
    if done:
        return model                                                     # a finished stage is reused as it is
    t0, metrics = time.time(), {}
    bar = tqdm(total=steps, initial=step, desc=name, disable=not master)
    while step < steps:
        for group in opt.param_groups:
            group["lr"] = lr_of_step(step)
        # a batch of random windows; idx/tgt (B, n_tokens - 1): inputs, and targets that are -1 except where the
        # next token is a predicted frame's code (context codes and actions are given, never predicted)
        ids = torch.randint(len(train_tok["actions"]), (args.batch_size,), generator=g)   # random clips
        starts = torch.randint(T - n + 1, (args.batch_size,), generator=g)                # random first frames
        idx, tgt = layout.training_pair(windows(train_tok, layout, ids, starts, args.context, horizon), args.context)
        with autocast:
            _, loss = trained(idx.to(args.device), tgt.to(args.device))   # cross-entropy on predicted codes only
        # the optimizer step, guarded: a NaN/inf loss or gradient never reaches the weights (runtime.finite)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # rescale to norm <= 1
        if run.finite(name, step, model, loss, norm):   # a NaN/inf stops the run, or skips the step (--on_nan)
            opt.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        timed_out = run.any_rank(bool(minutes and time.time() - t0 > 60 * minutes)   # every rank agrees
                                 or (stop is not None and stop.is_set()))               # set when RLVR is done
        if step % args.eval_every == 0 or step == steps or timed_out:
            model.eval()
            losses = []                                  # mean cross-entropy of each chunk of 64 validation windows
            with torch.no_grad(), autocast:
                for i in range(0, len(val_windows), 64):
                    chunk = val_windows[i:i + 64]
                    seq = windows(val_tok, layout, [e for e, _ in chunk], [t for _, t in chunk], args.context, horizon)
                    idx, tgt = layout.training_pair(seq, args.context)
                    losses.append(model(idx.to(args.device), tgt.to(args.device))[1].item())
            vl = np.mean(losses)
            model.train()
            metrics = dict(stage=name, step=step, loss=loss.item(), val_loss=float(vl),
                           minutes=(time.time() - t0) / 60)
            print0(f"\n{name} step {step}: train loss {loss.item():.4f} val loss {vl:.4f}")
            log(metrics)                                 # one JSON line in out_dir/log.jsonl
        # every --ckpt_every steps the resumable state; at the end the weights alone, marked done
        run.save_stage(FILES[name], model, opt, step, metrics, g, done=step == steps or timed_out)
        if timed_out:
            print0(f"{name}: stopping after {(time.time() - t0) / 60:.2f} minutes at step {step}")
            break
    bar.close()
    barrier()
    return model


# -----------------------------------------------------------------------------
# stage 3: RLVR with GRPO; the reward is a metric of the decoded frames against the true frames

def run_rlvr(model, vq, layout, tokens, horizon, lpips_net, reward_name):
    """GRPO from `model` on train windows where the scene moves -> the post-trained model."""
    # frames per window, prompt tokens (context frames + actions), tokens per predicted frame + action, codes per frame
    n, P, FL, L = args.context + horizon, layout.prompt_len(args.context), layout.frame_len, layout.L
    ref = copy.deepcopy(model).eval().requires_grad_(False) if args.beta > 0 else None   # KL anchor
    model, trained = run.wrap(model)
    # a completion is every predicted frame's codes, with the injected true actions between frames
    cfg = GRPOConfig(group_size=args.group_size, max_new_tokens=horizon * L + (horizon - 1) * layout.D,
                     temperature=args.temperature, clip_eps=args.clip_eps, beta=args.beta,
                     minibatches=args.minibatches, micro_batch=args.micro_batch)
    opt = torch.optim.AdamW(model.parameters(), lr=args.rl_lr, betas=(0.9, 0.99), weight_decay=0.0)   # constant rate
    tok = tokens["train"]
    pool = [(e, t) for e in range(len(train_eps)) for t in range(T - n + 1)]   # every window of the train clips
    # a static window gives every sample the same reward (copying is exact), so no advantage and no gradient: with
    # --moving_only the pool keeps windows where some predicted frame differs from the last context frame
    if args.moving_only:
        img = [ep["image"] for ep in train_eps]
        pool = [(e, t) for e, t in pool if np.abs(img[e][t + args.context:t + n].astype(np.int16)
                                                  - img[e][t + args.context - 1]).max() > 25]
    print0(f"rlvr: {len(pool)} train windows; per step {args.prompts_per_step} prompts x {args.group_size} samples "
           f"x {world} ranks, {horizon} predicted frame(s) each")
    g = torch.Generator().manual_seed(args.seed + 1000 + rank)          # prompts and samples, per rank
    step, done = run.resume_stage(FILES["rlvr"], model, opt, g, "rlvr")
    if done:
        return model
    # wall-clock of the GRPO steps so far (rollouts + updates, not the validation evals): the control's budget
    rl_seconds = read_checkpoint(FILES["rlvr"])[1]["metrics"].get("rl_seconds", 0.0) if step else 0.0

    def reward_fn(items, completions):
        """Decode each completion's frames against its context frame; mean reward over the predicted frames."""
        # completions hold horizon frames of L codes with D action tokens between them (horizon * FL - D tokens)
        codes = frame_codes([c[:horizon * FL - layout.D] for c in completions], layout, horizon)   # (N, K, L)

        def per_frame(key):
            """items' (3, H, W) image under `key`, repeated for each predicted frame -> (N*K, 3, H, W)"""
            return torch.stack([it[key] for it in items])[:, None].expand(-1, horizon, -1, -1, -1).flatten(0, 1)

        ctx = per_frame("context")                                                          # the last context frame
        with torch.no_grad():   # every frame decoded against the true last context frame (N*K frames at once)
            pred = vq.detokenize(codes.flatten(0, 1).to(args.device), ctx.to(args.device)).cpu()
        truth = torch.cat([it["truth"] for it in items])                                   # (N*K, 3, H, W)
        # rewards.video_reward: one value per frame, e.g. -(MAE + 1 - SSIM) - moving_weight * MAE on moving pixels;
        # a completion gets its frames' mean
        bg = per_frame("background") if args.object_weight else None                       # the bare scenes
        r = video_reward(reward_name, pred, truth, lpips_net, ctx, args.moving_weight, bg, args.object_weight)
        return r.view(-1, horizon).mean(1).tolist()

    def sampler(m, prompts, items, cfg, gen):
        """Multi-step: sample frame by frame, injecting each window's true actions."""
        return rollout(m, prompts, torch.stack([it["actions"] for it in items]), horizon, L, cfg.temperature, gen)

    bar = tqdm(total=args.rl_steps, initial=step, desc="rlvr", disable=not master)
    stats = {}
    while step < args.rl_steps:
        # this step's prompts: random windows of the pool, as token sequences (B, n_tokens) cut from the cache
        picks = [pool[i] for i in torch.randint(len(pool), (args.prompts_per_step,), generator=g)]
        seq = windows(tok, layout, [e for e, _ in picks], [t for _, t in picks], args.context, horizon)
        prompts = seq[:, :P].tolist()                                         # the context frames and their actions
        acts = seq[:, P:P + (horizon - 1) * FL].view(len(picks), horizon - 1, FL)[:, :, L:]   # true later actions
        items = [dict(truth=to_float(train_eps[e]["image"][t + args.context:t + n]),        # (K, 3, H, W)
                      context=to_float(train_eps[e]["image"][t + args.context - 1]),         # (3, H, W)
                      actions=acts[i], background=to_float(train_eps[e]["background"]) if args.object_weight
                      else None) for i, (e, t) in enumerate(picks)]
        # one GRPO step (grpo.py): G samples per prompt, rewards, group advantages, PPO-clip + KL update(s)
        try:
            with autocast:
                stats = grpo_step(trained, ref, opt, prompts, items, reward_fn, cfg, None, g, step,
                                  sampler if horizon > 1 else None)
        except FloatingPointError as e:   # grpo.py checks rewards, loss, gradient norm and weights
            run.nonfinite("rlvr", step, model, str(e))   # stops, or logs a skipped step
            stats = {}
        step += 1
        bar.update(1)
        if stats:                                 # a finished (not skipped) step: its wall-clock counts
            rl_seconds += stats["t_step"]
            stats["rl_seconds"] = rl_seconds
            bar.set_postfix(reward=f"{stats['reward_mean']:.4f}", kl=f"{stats['kl']:.4f}")
        if stats and (step % 20 == 0 or step == args.rl_steps) and master:   # greedy on the val split, to watch
            r = eval_video(model, vq, val_eps, tokens["val"], lo, hi, args.context, horizon, desc=None)
            stats.update(val_mae=r["mae"], val_ssim=r["ssim"], val_mae_moving=r["mae_moving"])
            print0(f"\nrlvr step {step}: reward {stats['reward_mean']:.4f} kl {stats['kl']:.4f} val mae {r['mae']:.4f} "
                   f"ssim {r['ssim']:.4f} mae_moving {r['mae_moving']:.4f}")
        if stats:
            log({"stage": "rlvr", **stats})
        # rl_seconds is saved with every checkpoint, so a resumed run and the control read the whole wall-clock
        run.save_stage(FILES["rlvr"], model, opt, step, {**stats, "rl_seconds": rl_seconds}, g,
                       done=step == args.rl_steps)
    bar.close()
    run.check_ranks_in_sync(model, "rlvr")            # under torchrun every rank must hold the same weights
    barrier()
    return model


# -----------------------------------------------------------------------------
# stage 4: the held-out comparison, greedy and with the paper's sampling protocol, paired over the same test windows

def evaluate_models(models, vq, test_tokens, horizon, lpips_net):
    """Evaluate every model of `models` (name -> (GPT, checkpoint path)) on the test windows, greedy (the table) and
    sampled at T=1 with top-k 100 (OFFICIAL, the paper's protocol; one seed for all models, so their samples pair up),
    write eval.json = {name: eval_video result + "sampled" + "checkpoint"} and print the paired differences."""
    def evaluate(job):
        """One model under one protocol: greedy (with a grid of predictions) or the paper's sampling."""
        name, official = job
        m = models[name][0]
        with autocast:
            if official:
                return eval_video(m, vq, test_eps, test_tokens, lo, hi, args.context, horizon, lpips_net, **OFFICIAL,
                                  seed=args.seed, desc=None if workers > 1 else f"test {name} T=1 top-k")
            return eval_video(m, vq, test_eps, test_tokens, lo, hi, args.context, horizon, lpips_net,
                              grid_path=out_dir / f"grid_{name}.{'gif' if horizon > 1 else 'png'}",
                              desc=None if workers > 1 else f"test {name}")

    workers = args.eval_workers if args.device == "cpu" else 1   # CPU: the jobs shared by forked processes
    jobs = [(name, official) for name in models for official in (False, True)]
    print0(f"evaluating {len(models)} models greedy and sampled on the test windows ({workers} processes)")
    outs = dict(zip(jobs, fork_map(evaluate, jobs, workers)))
    rows = {}                                     # name -> eval_video dict, written as eval.json
    for name, (m, path) in models.items():
        rows[name], sampled = outs[name, False], outs[name, True]
        # the sampled run's summaries and per-window values; its baselines are the greedy run's
        rows[name]["sampled"] = {k: sampled[k] for k in ("mae", "mse", "psnr", "ssim", "lpips", "mae_moving",
                                                          "repetition_rate", "temperature", "top_k", "per_record")}
        rows[name]["checkpoint"] = str(path)
    atomic_write_text(out_dir / "eval.json", json.dumps(rows, indent=2) + "\n")
    print0(f"\nheld-out test episodes ({rows['mle']['n']} predicted frames, {args.mode}-step), greedy:")
    print_video_table(rows)
    # RLVR against its start, the equal-time control and copying; the MLE start against copying
    pairs = [(a, b) for a, b in (("rlvr", "mle"), ("rlvr", "mle_more"), ("rlvr", "copy"), ("mle", "copy"))
             if a in rows and (b in rows or b == "copy")]
    print_video_paired(paired_video(rows, pairs))
    print0(f"\nsampled at T={OFFICIAL['temperature']:g}, top-k {OFFICIAL['top_k']}: " + "; ".join(
        f"{k} mae {r['sampled']['mae']:.4f} ssim {r['sampled']['ssim']:.4f} mae_moving {r['sampled']['mae_moving']:.4f}"
        for k, r in rows.items()))
    # the same pairs on the sampled predictions (copy-last-frame does not sample: its pairs are above)
    sampled = {k: dict(r["sampled"], copy_last_frame=r["copy_last_frame"]) for k, r in rows.items()}
    print_video_paired(paired_video(sampled, [(a, b) for a, b in pairs if b != "copy"]))
    print0(f"wrote {out_dir / 'eval.json'}")


# -----------------------------------------------------------------------------
# run the stages
t_start = time.time()
horizon = args.horizon if args.mode == "multi" else 1   # predicted frames per window
start_model = None                                      # the GPT to train or post-train (None: a new one)
if args.init != "scratch":                       # a trained world model: its own tokenizer, named in its metadata
    try:
        start_model, _, init_meta = load_video_model(args.init, args.device)
    except ValueError as e:
        fail(str(e))
    vq_path = Path(args.init).parent / init_meta["args"]["vq"]   # e.g. checkpoints/video_cvq.safetensors
elif args.stage in ("all", "tokenizer"):         # from scratch: the per-frame VQ, then (cond) the one on top of it
    vq_path = frame_tokenizer() if args.vq == "auto" else Path(args.vq)
    if args.tokenizer == "cond":
        vq_path = cond_tokenizer(vq_path)
elif args.vq != "auto":                          # --stage=mle from scratch with a given tokenizer
    vq_path = Path(args.vq)
else:                                            # --stage=mle from scratch: this out_dir's tokenizer, else shipped
    vq_path = next((f for f in (FILES["cvq"], FILES["vq"]) if f.is_file()), SHIPPED_VQ[args.tokenizer])
if args.stage == "tokenizer":                    # the tokenizer files are written: nothing else to do
    sys.exit(0)
if not Path(vq_path).is_file():
    fail(f"tokenizer {vq_path} not found (run --stage=tokenizer first or pass --vq)")
try:
    vq, vq_meta = load_vq(vq_path, args.device)  # VQVAE or CondVQVAE, frozen from here on
except ValueError as e:
    fail(str(e))
layout = Layout.of(vq, D)                        # token ids: context codes, predicted-frame codes, action bins
# a checkpoint must fit this tokenizer and data: the same vocabulary, and room for a whole window
if start_model is not None and start_model.config.vocab_size != layout.vocab_size:
    fail(f"--init {args.init}: vocabulary {start_model.config.vocab_size} does not fit this data ({layout.vocab_size})")
if start_model is not None and start_model.config.block_size < layout.window_len(args.context, horizon):
    fail(f"--init {args.init}: block size {start_model.config.block_size} is shorter than a window of "
         f"{args.context} + {horizon} frames ({layout.window_len(args.context, horizon)} tokens)")
vq_file = FILES["cvq"] if isinstance(vq, CondVQVAE) else FILES["vq"]
if master and Path(vq_path).resolve() != vq_file.resolve():   # checkpoints name their tokenizer in their own folder
    atomic_write(vq_file, lambda tmp: shutil.copyfile(vq_path, tmp))
barrier()
args.vq = vq_file.name                           # saved in the world model's args: its tokenizer, beside it
splits = {"train": train_eps, "val": val_eps, "test": test_eps}
# every split tokenized once (cached): per clip the context codes, future codes and action tokens
tokens = {s: split_tokens(vq_file, vq, layout, s, eps, horizon) for s, eps in splits.items()}

# MLE: on its own (--stage=mle, from scratch or continuing --init), or as the first stage of a run from scratch
if args.stage == "mle" or (args.stage == "all" and start_model is None):
    if args.context + horizon > T:
        fail(f"a window of {args.context + horizon} frames does not fit clips of {T}")
    start_model = start_model or GPT(GPTConfig.llama(
        vocab_size=layout.vocab_size, block_size=layout.window_len(args.context, args.horizon),   # multi-step fits
        n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd))
    start_model = run_mle(start_model, layout, tokens, horizon, "mle", args.mle_steps, args.mle_minutes,
                          lambda s: lr_at(s, args.mle_steps, args.mle_lr, args.warmup))   # warmup, cosine decay
    mle_path = FILES["mle"]
else:                                            # RLVR starts from --init as it is
    mle_path = Path(args.init)
# RLVR, then the equal-time control, then the held-out comparison of the three
if args.stage in ("all", "rlvr"):
    try:
        lpips_net = load_lpips(args.lpips, args.device)
        reward_name = pick_reward(args.reward, lpips_net)
    except ValueError as e:
        fail(str(e))
    if args.object_weight and train_eps[0]["background"] is None:   # e.g. Meta-World or RT-1 episodes
        if "object_weight" in given:
            fail(f"--object_weight needs episodes with a background image; {args.data} has none")
        print0(f"reward: {args.data} has no background images, so no object term (the default --object_weight)")
        args.object_weight = 0.0
    print0(f"reward: {reward_name}" + (f" - {args.moving_weight:g} x moving MAE" if args.moving_weight else "")
           + (f" - {args.object_weight:g} x object miss" if args.object_weight else "")
           + ("" if lpips_net else " (no LPIPS weights: --lpips=FILE enables mae+lpips)"))
    mle_model = copy.deepcopy(start_model)      # kept for the comparison; RLVR updates start_model in place
    models = {"mle": (mle_model, mle_path)}      # name -> (model, its checkpoint file), evaluated below
    control_lr = lambda s: args.control_lr * min(1.0, (s + 1) / 10)   # noqa: E731  (10 warm-up steps, then flat)
    rl_done = args.resume and FILES["rlvr"].is_file() and read_checkpoint(FILES["rlvr"])[1]["metrics"].get("done")
    # The control, the same start trained further by MLE, gets RLVR's wall-clock. On a CPU it runs in a forked
    # process on the second core *while* RLVR runs and stops when RLVR's last step ends (runtime.fork_alongside): the
    # same time by construction, and the demo takes half as long. Otherwise (GPU, torchrun, a resumed run,
    # --control_steps) it runs after RLVR, for RLVR's recorded wall-clock or exactly --control_steps steps.
    alongside = (args.control and args.control_alongside and world == 1 and args.device == "cpu" and not rl_done
                 and not args.control_steps)
    if alongside:
        stop, child = fork_alongside(lambda stop: run_mle(copy.deepcopy(mle_model), layout, tokens, horizon,
                                                          "mle_more", 10 ** 6, 0, control_lr, stop),   # to the end
                                     out_dir / "control.log")
        print0(f"control: MLE continues from the start in process {child.pid} while RLVR runs "
               f"(progress: {out_dir / 'control.log'})")
    models["rlvr"] = (run_rlvr(start_model, vq, layout, tokens, horizon, lpips_net, reward_name), FILES["rlvr"])
    if alongside:
        stop.set()
        child.join()                             # it finishes its step, saves video_mle_more.safetensors and exits
        if child.exitcode:
            fail(f"the control process failed (exit code {child.exitcode}); see {out_dir / 'control.log'}")
        models["mle_more"] = (load_video_model(FILES["mle_more"], args.device)[0], FILES["mle_more"])
    elif args.control:
        minutes = 0 if args.control_steps else read_checkpoint(FILES["rlvr"])[1]["metrics"].get("rl_seconds", 0) / 60
        if minutes > 0 or args.control_steps:
            control = run_mle(copy.deepcopy(mle_model), layout, tokens, horizon, "mle_more",
                              args.control_steps or args.mle_steps, minutes, control_lr)
            models["mle_more"] = (control, FILES["mle_more"])
        else:                                    # an RLVR file written before rl_seconds was recorded
            print0(f"control skipped: {FILES['rlvr']} records no RLVR wall-clock (rl_seconds)")
    if master:                                   # rank 0 evaluates; the other ranks are done
        evaluate_models(models, vq, tokens["test"], horizon, lpips_net)
        print0(f"total {(time.time() - t_start) / 60:.1f} min")
run.finish()
