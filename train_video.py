"""
Train a video world model: a VQ tokenizer (train_vq.py), an action-conditioned GPT by MLE (mle.py),
then RLVR (GRPO whose reward is a metric of the decoded frames against the true ones), and compare
on held-out episodes the MLE start, RLVR, and the control: the MLE start trained further by MLE for
RLVR's compute ("mle_more"), so a gain is not just more compute.

CPU, the default jobs (embedded robot-pushing data; docs/video.md): RLVR from the shipped
per-frame world model trained on 4000 episodes (7-frame windows), which follows the gripper's
action, checkpoints/video_mle_4000.safetensors (its tokenizer checkpoints/video_vq.safetensors,
decoded with the copy gate):
    python train_video.py                      # single-step, 100 GRPO steps (~10 min on 2 cores)
    python train_video.py --mode=multi --out_dir=out/video_multi   # 7 frames, true actions injected
The commands that made the shipped tokenizers and MLE models (--stage=tokenizer, then --stage=mle
legs) are in docs/video.md. Everything in one go (tokenizers, MLE, RLVR, eval):
    python train_video.py --init=scratch --mode=multi
The per-frame tokenizer instead of the context-conditioned one: --tokenizer=frame (with
--init=scratch). The context-conditioned models, which ignore the action, are shipped too; their
runs in docs/video.md: --init=checkpoints/video_cond_mle.safetensors --object_weight=0
--push_weight=0 (single-step), --init=checkpoints/video_cond_multi_mle.safetensors (multi-step).
Converted RT-1 episodes (.npz with image (T, 256, 320, 3) and action (T, 13)), on GPUs:
    torchrun --nproc_per_node=8 train_video.py --data=/path/rt1 --init=scratch --device=cuda \\
        --dtype=bfloat16

Stages (--stage): tokenizer | mle | rlvr | all, and control: the control alone from --init for
--control_compute (an RLVR run's rl_compute; the same weights as that run's control), evaluated
beside its start, to choose --control_lr on validation. The tokenizer stage is train_vq.py's (its
flags are accepted here and passed on). Outputs in --out_dir: video_vq.safetensors (per-frame
tokenizer), video_cvq.safetensors (context-conditioned tokenizer, --tokenizer=cond),
video_mle.safetensors, video_rlvr.safetensors, video_mle_more.safetensors (the control; --control=0
skips it) (+ .json sidecars), tokens_<split>.safetensors (the clips' tokens, cached per
tokenizer), config.json, log.jsonl and eval.json = {"mle": M, "rlvr": M, "mle_more": M}, each M the
eval.py --task=video JSON of the test split (--final_eval=val: the validation split, to choose
flags on): greedy summaries, copy-last-frame and the tokenizer ceiling, "per_record" (mae, ssim,
repetition per test window, in a fixed order, for paired comparisons) and "sampled" (the paper's
protocol: T=1, top-k 100). The run ends by printing RLVR - MLE, RLVR - mle_more, RLVR - copy,
MLE - copy and mle_more - MLE with paired bootstrap 95% intervals over the test windows.
Every stage checkpoints every --ckpt_every steps with optimizer and RNG state (a tokenizer's in
video_vq_train / video_cvq_train.safetensors, removed once the tokenizer is written), and a re-run
of the same command resumes where it stopped, ending with the weights of an uninterrupted run (a
finished stage keeps its weights only, and is reused). out_dir/config.json records the flags: a
re-run with other flags stops, naming them (runtime.Run.check_config: use another --out_dir, or
--resume=0 to start over). A NaN/inf loss, reward or gradient stops the run naming the step
(--on_nan=skip skips the step); bad input is one "error:" line, before anything is written.

Design: the tokenizers are trained once and frozen; the clips of every split are tokenized once and
cached, so MLE trains on token windows only (cheap). The context-conditioned tokenizer
(tokenizer_vq.CondVQVAE) gives the context frame its 64 per-frame codes and each predicted frame 64
codes of its own codebook, coded against that context frame, so the codes describe what changed and
a static pixel is copied, not re-drawn. MLE trains on windows of context + horizon frames (multi) or
context + 1 (single), loss on the predicted frames' codes only; a model trained in multi mode also
serves single-step prediction. RLVR samples G predictions per prompt, decodes them (with the true
context frame) and scores them against the true frames (`--reward`, default mae+ssim, or mae+lpips
with --lpips weights, minus the optional terms of rewards_video.video_reward: moving pixels,
erased objects, --action_weight's gripper drawn away from the true one and --push_weight's pushed
blocks drawn away from the true ones); `grpo.grpo_step` does the rest, with the multi-step sampler
of data/robot/task.py that injects the true actions between frames.
--counterfactual_frac adds prompts at visited train states with a random action, whose true outcome
the simulator renders (docs/video.md, "Paying RLVR for the action's effect").
--placebo=1 permutes each kept group's rewards among its samples: the optimiser's check.
"""
import argparse
import copy
import itertools
import json
import shutil
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

import mle
import train_vq
from checkpoint import atomic_write, atomic_write_text, read_meta, recorded_path
from data.robot import sim
from data.robot.detect import blocks_moved, locate_blocks, locate_gripper
from data.robot.prepare import DATA_DIR, split_episodes
from data.robot.task import (N_BINS, Layout, action_bins, frame_codes, read_action_stats, rollout,
                             tokenize_split, windows)
from evaluate_video import (OFFICIAL, eval_video, load_video_model, paired_effects, paired_video,
                            print_video_paired, print_video_table, to_float)
from grpo import GRPOConfig, grpo_step, make_optimizer
from model import GPT, GPTConfig
from rewards_video import load_lpips, pick_reward, video_reward
from runtime import (ComputeBudget, Run, add_flags, check_ranges, fork_alongside, fork_map,
                     lr_at, memory_estimate, print_memory, prompts_per_chunk, rank_map)
from tokenizer_vq import CondVQVAE, load_vq

ROOT = Path(__file__).resolve().parent
# the shipped world model both modes start from: the per-frame one trained on 4000 episodes, on
# 7-frame windows (it follows the gripper)
SHIPPED_MLE = ROOT / "checkpoints" / "video_mle_4000.safetensors"
# the shipped tokenizers, per tokenizer kind, for --stage=mle
SHIPPED_VQ = dict(frame=ROOT / "checkpoints" / "video_vq.safetensors",
                  cond=ROOT / "checkpoints" / "video_cvq.safetensors")

# -----------------------------------------------------------------------------
# flags
# allow_abbrev=False: a prefix of a flag is an error, not that flag
p = argparse.ArgumentParser(description="tokenizer, MLE then RLVR for a video world model",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            allow_abbrev=False)
p.add_argument("--data", default=str(DATA_DIR),
               help="episode .npz directory (the embedded data is generated when its folder holds "
                    "no split)")
p.add_argument("--out_dir", default=train_vq.OUT_DIR,
               help="checkpoints, token caches, log.jsonl and eval.json go here")
p.add_argument("--stage", default="all", choices=["all", "tokenizer", "mle", "rlvr", "control"],
               help="which stages to run (control: the control alone from --init for "
                    "--control_compute, evaluated beside its start: the lr sweep)")
p.add_argument("--mode", default="single", choices=["single", "multi"],
               help="predict 1 frame, or --horizon frames with the true actions injected "
                    "between them")
p.add_argument("--init", default="auto",
               help="auto (the shipped MLE checkpoint if it fits the data, else scratch) | "
                    "scratch | a video_mle/video_rlvr .safetensors")
p.add_argument("--vq", default="auto",
               help="tokenizer file for --stage=mle from scratch (auto: out_dir's, else the "
                    "shipped per-frame one); also the per-frame VQ a new cond tokenizer uses")
p.add_argument("--resume", type=int, default=train_vq.RESUME,
               help="1: continue from out_dir's checkpoints (with the same flags); 0: start over")
# tokenizers: train_vq.py's flags, passed on to it
train_vq.add_flags(p)
# world model
p.add_argument("--context", type=int, default=1, help="true frames before the first predicted one")
p.add_argument("--horizon", type=int, default=train_vq.HORIZON,
               help="predicted frames in multi mode (paper: 7)")
p.add_argument("--n_layer", type=int, default=4, help="GPT layers")
p.add_argument("--n_head", type=int, default=4, help="GPT attention heads")
p.add_argument("--n_embd", type=int, default=128, help="GPT width")
# MLE
p.add_argument("--mle_steps", type=int, default=1150, help="MLE optimizer steps")
p.add_argument("--mle_minutes", type=float, default=0,
               help="stop MLE after this wall-clock (0 = off)")
p.add_argument("--batch_size", type=int, default=16, help="MLE windows per step (per rank)")
p.add_argument("--mle_lr", type=float, default=2e-3, help="MLE peak learning rate (cosine decay)")
p.add_argument("--warmup", type=int, default=100, help="MLE warmup steps")
p.add_argument("--weight_decay", type=float, default=0.1, help="AdamW weight decay for MLE")
p.add_argument("--still_code", type=int, default=-1,
               help="-1: off; N (context-conditioned tokenizer): the token windows give every cell "
                    "that does not change the one code N, not the many its encoder leaves there; N "
                    "is the tokenizer's 'unchanged', data/robot/task.find_still_code (9 for "
                    "checkpoints/video_cvq; docs/video.md)")
p.add_argument("--copy_gate", type=int, default=-1, choices=[-1, 0, 1],
               help="1 (per-frame tokenizer): a predicted cell whose code is the context frame's "
                    "code there is decoded as the context's pixels, in the reward and the "
                    "evaluation (tokenizer_vq.VQVAE.detokenize; docs/video.md); -1: 1 with the "
                    "per-frame tokenizer (0 for --stage=mle, which decodes nothing), 0 with the "
                    "context-conditioned one (it gates itself)")
p.add_argument("--action_embed", type=int, default=0,
               help="1: before MLE, the action tokens' embeddings are set to Fourier features of "
                    "their bin's value (init_action_embeddings), so neighbouring bins start alike "
                    "and the GPT reads a value, not 256 unrelated tokens per dimension")
p.add_argument("--change_weight", type=float, default=1.0,
               help="MLE (per-frame tokenizer): the weight in the loss of a predicted code that "
                    "differs from the last context frame's code there (a cell that changes; the "
                    "others weigh 1). 1: plain MLE. Above 1 the model learns more change than the "
                    "data holds (docs/video.md, the push)")
p.add_argument("--control", type=int, default=1,
               help="1: also train the control, the MLE start trained further by MLE for RLVR's "
                    "compute (counted in tokens)")
p.add_argument("--control_alongside", type=int, default=1,
               help="1: on a CPU, train the control in a second process while RLVR runs (0: after "
                    "RLVR; the same steps either way)")
p.add_argument("--control_lr", type=float, default=0,
               help="constant learning rate of the control; 0: --control_scale x the start's own "
                    "final MLE rate")
p.add_argument("--control_scale", type=float, default=None,
               help="the control's rate over the start's final MLE rate, when --control_lr is 0 "
                    "(default per mode: single 0.3, multi 1)")
p.add_argument("--control_compute", type=float, default=0,
               help="--stage=control: the control's compute in forward-token units (an RLVR "
                    "run's rl_compute, in its log.jsonl)")
# RLVR
p.add_argument("--rl_steps", type=int, default=None,
               help="GRPO steps (default: 100 single-step, 40 multi-step)")
p.add_argument("--prompts_per_step", type=int, default=None,
               help="prompts (windows) per GRPO step and rank (default: 8 single-step, "
                    "4 multi-step)")
p.add_argument("--group_size", type=int, default=8, help="samples per prompt (G)")
p.add_argument("--rl_lr", type=float, default=1e-4, help="GRPO learning rate")
p.add_argument("--beta", type=float, default=0.02, help="KL coefficient")
p.add_argument("--clip_eps", type=float, default=0.2, help="PPO ratio clip")
p.add_argument("--minibatches", type=int, default=2, help="optimizer steps per GRPO batch")
p.add_argument("--micro_batch", type=int, default=32,
               help="sequences per forward/backward (the GRPO update and MLE)")
p.add_argument("--grad_ckpt", type=int, default=0,
               help="1: activation checkpointing, each block's activations recomputed in the "
                    "backward pass (memory for about a third more compute)")
p.add_argument("--temperature", type=float, default=1.0,
               help="sampling temperature of the rollouts")
p.add_argument("--reward", default="auto", help="auto | mae+ssim | mae+lpips")
p.add_argument("--lpips", default=None,
               help="LPIPS-VGG weights (tools/convert_lpips.py) for the reward and eval")
p.add_argument("--moving_weight", type=float, default=1.0,
               help="the reward also loses this x the MAE on the pixels that move "
                    "(rewards_video.moving_mae): copying the last frame, or drawing a still scene, "
                    "is not paid")
p.add_argument("--object_weight", type=float, default=None,
               help="the reward also loses this x the share of the true objects' pixels left "
                    "empty (rewards_video.object_miss; needs episodes with a background image): "
                    "erasing an object is not paid (default 0.5; 0 on data without backgrounds)")
p.add_argument("--action_weight", type=float, default=0.0,
               help="the reward also loses this x the distance between the gripper drawn and the "
                    "true one, over 6 px, capped at 1; 1 where none is drawn "
                    "(rewards_video.gripper_error with data/robot/detect.locate_gripper; the "
                    "embedded robot data): a gripper that does not follow the action is not paid")
p.add_argument("--push_weight", type=float, default=None,
               help="the reward also loses this x the distance between the blocks drawn and the "
                    "true ones, over the blocks the true step pushed, over 3 px, capped at 1 "
                    "(rewards_video.push_error with data/robot/detect.locate_blocks; the embedded "
                    "robot data): a block that does not move as the push moved it is not paid "
                    "(default: 0.1 single-step, 0 multi-step; 0 on other data)")
p.add_argument("--counterfactual_frac", type=float, default=0.0,
               help="share (rounded down, at most 0.5) of each GRPO step's prompts that repeat "
                    "another prompt's context with a random action in place of the true one, their "
                    "truth rendered by the simulator (data/robot/sim.py; the embedded robot data): "
                    "one scene under two actions, paid only where the prediction follows each")
p.add_argument("--push_frac", type=float, default=0.0,
               help="share (rounded down) of each GRPO step's prompts drawn from the windows whose "
                    "true step(s) move a block (data/robot/detect.blocks_moved; the embedded robot "
                    "data), where a push is decided: more prompts for --push_weight to score")
p.add_argument("--moving_only", type=int, default=1,
               help="RL prompts only from windows where the scene moves")
add_flags(p, GRPOConfig, research=True)   # --placebo: the optimiser's check (rewards permuted)
# evaluation
p.add_argument("--eval_every", type=int, default=500,
               help="MLE steps between validation losses (RLVR: every 20)")
p.add_argument("--test_limit", type=int, default=0,
               help="test episodes in the final eval (0 = all)")
p.add_argument("--final_eval", default="test", choices=["val", "test"],
               help="the split of the final comparison (eval.json): val to choose flags on, test "
                    "once for the result")
p.add_argument("--eval_workers", type=int, default=2,
               help="CPU: forked processes sharing the final evaluations (model x greedy/sampled)")
# train_limit and the system flags: one home, train_vq.add_run_flags
train_vq.add_run_flags(p)
args = p.parse_args()
# defaults per mode, chosen on the validation split (docs/video.md): a multi-step completion is 7
# frames, so fewer prompts and steps fit the time box; RLVR erased objects unless the reward's
# object term said otherwise; the single-step start follows the gripper, and the push term beside
# the object term kept that best; the single-step control damaged the context-conditioned start at
# its final rate, and least at 0.3 of it, where it is level with video_mle_4000 (as at 0.1 to 3);
# the multi-step control is level with its start at 1 (at 0.3: level on val, above it on test)
MODE_DEFAULTS = dict(single=dict(rl_steps=100, prompts_per_step=8, object_weight=0.5,
                                 push_weight=0.1, control_scale=0.3),
                     multi=dict(rl_steps=40, prompts_per_step=4, object_weight=0.5,
                                push_weight=0.0, control_scale=1.0))
# the ones set on the command line
given = {name for name in MODE_DEFAULTS[args.mode] if getattr(args, name) is not None}
for name, value in MODE_DEFAULTS[args.mode].items():
    if name not in given:
        setattr(args, name, value)
# every bad value stops here with one line naming its flag, before any data is read or file written
train_vq.check_flags(p, args)
check_ranges(p, args, at_least_1=("context", "horizon", "n_layer", "n_head", "n_embd", "mle_steps",
                                  "batch_size", "rl_steps", "prompts_per_step", "group_size",
                                  "minibatches", "micro_batch", "eval_every", "eval_workers",
                                  "threads", "ckpt_every"),
             at_least_0=("mle_minutes", "mle_lr", "warmup", "weight_decay", "control_lr",
                         "control_scale", "control_compute", "rl_lr",
                         "moving_weight", "object_weight", "action_weight", "push_weight",
                         "beta", "clip_eps",
                         "test_limit", "train_limit"))
if not args.temperature > 0:
    p.error(f"--temperature must be > 0, got {args.temperature}")
if not 0 <= args.push_frac <= 1:
    p.error(f"--push_frac must be in [0, 1], got {args.push_frac}")
if args.counterfactual_frac + args.push_frac > 1:
    p.error("--counterfactual_frac + --push_frac must be at most 1")
if not 0 <= args.counterfactual_frac <= 0.5:
    p.error(f"--counterfactual_frac must be in [0, 0.5], got {args.counterfactual_frac}")

# -----------------------------------------------------------------------------
# setup: distributed, devices, precision (runtime.py), then the data; every input is checked before
# anything is written to out_dir
out_dir = Path(args.out_dir)
# torchrun ranks, --device checked, threads, seeds, autocast, log.jsonl
run = Run(args, out_dir, path_flags=("data", "init", "out_dir", "vq", "lpips"))
master, world = run.master, run.world
# print / stop on rank 0; sync ranks
print0, fail, barrier = run.print0, run.fail, run.barrier
# every file a run writes besides the tokenizers' resumable state (train_vq.train_file)
FILES = dict(vq=out_dir / train_vq.VQ_FILE, cvq=out_dir / train_vq.CVQ_FILE,
             mle=out_dir / "video_mle.safetensors", rlvr=out_dir / "video_rlvr.safetensors",
             mle_more=out_dir / "video_mle_more.safetensors")
if args.init != "auto" and args.init != "scratch" and not Path(args.init).is_file():
    fail(f"--init {args.init}: no such checkpoint file")
if args.stage in ("rlvr", "control") and args.init == "scratch":
    fail(f"--stage={args.stage} needs --init=<video_mle checkpoint> (it post-trains a trained "
         f"model)")
if args.stage == "control" and not args.control_compute:
    fail("--stage=control needs --control_compute (an RLVR run's rl_compute, in its log.jsonl)")
train_vq.ensure_data(run)                       # the embedded robot data, generated on first use
try:
    if master:
        read_action_stats(args.data)            # writes action_stats.json on first use
    barrier()
    lo, hi = read_action_stats(args.data)       # per-dimension action range: 256 bins each
except ValueError as e:                         # a bad action_stats.json: one line naming it
    fail(str(e))

# --init=auto: the shipped MLE model, when this run post-trains and its action dimensions fit
if args.init == "auto":
    args.init = "scratch"                       # unless the shipped model fits, below
    if SHIPPED_MLE.is_file() and args.stage in ("all", "rlvr", "control"):
        shipped_args = read_meta(SHIPPED_MLE)["args"]   # its flags
        if len(shipped_args["action_lo"]) == len(lo):   # its vocabulary has these actions' tokens
            args.init = str(SHIPPED_MLE)
        else:
            print0(f"--init=auto: the shipped model's vocabulary is for "
                   f"{len(shipped_args['action_lo'])}-dim actions, {args.data} has {len(lo)}-dim "
                   f"ones; training from scratch (tokenizer, MLE, RLVR)")
    if args.init == "scratch" and args.stage in ("rlvr", "control"):
        fail(f"--stage={args.stage} needs --init=<video_mle checkpoint> (it post-trains a trained "
             f"model)")
# with --resume=1, out_dir must hold no run with other flags (out_dir/config.json, runtime.py)
record = run.check_config([FILES["mle"].name, FILES["rlvr"].name, FILES["mle_more"].name])

# each split's clips of --clip_len frames: dicts of image (T, H, W, 3) uint8, action (T, D) float
# and background (H, W, 3) or None
limits = {"train": args.train_limit, "val": 0, "test": args.test_limit}   # episodes (0 = all)
train_eps, val_eps, test_eps = train_vq.load_clips(run, limits)
D, T = train_eps[0]["action"].shape[1], args.clip_len   # action dimensions, frames per clip
if D != len(lo):
    fail(f"{Path(args.data) / 'action_stats.json'}: {len(lo)}-dim actions, the episodes have {D}; "
         f"delete it to recompute")
args.action_lo, args.action_hi = lo.tolist(), hi.tolist()     # saved in every checkpoint's args
print0(f"data: {len(train_eps)} train / {len(val_eps)} val / {len(test_eps)} test clips of {T} "
       f"frames, {D}-dim actions, frames resized to {args.size}x{args.size}"
       + (f" (train: rank 0's share; each of {world} ranks reads its own)" if world > 1 else ""))


# -----------------------------------------------------------------------------
# stage 1: the tokenizers (train_vq.py), then every split's clips as tokens, cached

def cached_tokens(run, vq_path, vq, layout, splits, horizon, lo, hi, still_code=None):
    """{split: tokenize_split(...)} of every split (name -> clips), each cached in out_dir per
    tokenizer file, data, horizon, split and still code (--still_code). Under torchrun each rank
    caches its own share of the train clips in a file of its own; the held-out splits, whole on
    every rank, are written by rank 0."""
    args, tokens = run.args, {}
    for split, episodes in splits.items():
        own = run.ddp and split == "train"   # this rank's share (train_vq.load_clips)
        # the cache is valid only for the same tokenizer bytes, data folder, frame size, clip
        # count and horizon
        key = (f"{zlib.crc32(Path(vq_path).read_bytes())}-{Path(args.data).resolve()}-"
               f"{args.size}-{len(episodes)}-{horizon}")
        if still_code is not None:
            key += f"-still{still_code}"
        cache = run.out_dir / (f"tokens_{split}_rank{run.rank}of{run.world}.safetensors" if own
                               else f"tokens_{split}.safetensors")
        try:
            with safe_open(str(cache), framework="pt") as f:
                if (f.metadata() or {}).get("key") == key:   # a hit: the tensors as saved
                    tokens[split] = {k: f.get_tensor(k) for k in f.keys()}
                    continue
        except Exception:   # missing or unreadable: computed again and rewritten below
            pass
        t0 = time.time()
        # context, future and action tokens per clip
        tokens[split] = tokenize_split(vq, episodes, horizon, layout, lo, hi, still_code)
        if run.master or own:
            atomic_write(cache, lambda tmp: save_file(tokens[split], str(tmp),
                                                      metadata={"key": key}))
        run.print0(f"tokenized {split}: {len(episodes)} clips in {time.time() - t0:.0f}s")
    return tokens


# -----------------------------------------------------------------------------
# stage 2: MLE on token windows (loss on the predicted frames' codes only)

@torch.no_grad()
def init_action_embeddings(model, layout, n_freq=8):
    """--action_embed=1: the embedding of action token (dimension d, bin b) becomes Fourier features
    of the bin's value v in [-1, 1], cos and sin of k * pi * v / 2 for k = 1 .. n_freq, in channels
    of its own per dimension, scaled to the mean norm of the code embeddings. Learnt per bin, 256
    unrelated tokens per dimension: the shipped GPTs left them nearly alike (docs/video.md)."""
    w = model.wte.weight
    v = torch.linspace(-1, 1, N_BINS)[:, None] * torch.arange(1, n_freq + 1) * torch.pi / 2
    feats = torch.cat([v.cos(), v.sin()], 1)                                   # (256, 2 * n_freq)
    feats = feats * w[:layout.A].norm(dim=1).mean() / feats.norm(dim=1, keepdim=True)
    for d in range(layout.D):
        rows = w[layout.A + N_BINS * d:layout.A + N_BINS * (d + 1)]
        rows.zero_()
        rows[:, 2 * n_freq * d:2 * n_freq * (d + 1)] = feats.to(w.dtype)

def run_mle(run, model, name, ckpt, layout, tokens, horizon, steps, minutes, lr_of_step,
            budget=None):
    """mle.train on windows of --context + horizon frames, for `steps` steps, `minutes` of
    wall-clock (0: no limit) or RLVR's compute (`budget`, runtime.ComputeBudget), at
    lr_of_step(step), checkpointing to `ckpt` -> the trained model. "mle" is the MLE stage;
    "mle_more" the equal-compute control."""
    args = run.args
    C, T = args.context, args.clip_len   # context frames, frames per clip
    n = C + horizon                      # frames per window
    train_tok, val_tok = tokens["train"], tokens["val"]
    until = (f", at most {minutes:.2f} min" if minutes   # MLE's wall-clock, or RLVR's compute
             else " (until RLVR's compute)" if budget is not None else "")
    run.print0(f"{name}: {model.num_params() / 1e6:.2f}M non-embedding parameters, windows of "
               f"{n} frames ({layout.window_len(C, horizon)} tokens), batch {args.batch_size} x "
               f"{run.world} ranks{until}")
    # the fixed validation set: consecutive windows of every val clip
    val_windows = [(e, t) for e in range(len(val_tok["actions"])) for t in range(0, T - n + 1, n)]

    def next_batch(gen):
        """Random windows; idx/tgt (B, n_tokens - 1): inputs, and targets that are -1 except
        where the next token is a predicted frame's code (context codes and actions are given,
        never predicted)."""
        ids = torch.randint(len(train_tok["actions"]), (args.batch_size,), generator=gen)   # clips
        starts = torch.randint(T - n + 1, (args.batch_size,), generator=gen)   # first frames
        idx, tgt = layout.training_pair(windows(train_tok, layout, ids, starts, C, horizon), C)
        if args.change_weight == 1:
            return idx.to(args.device), tgt.to(args.device)
        # --change_weight: each predicted code that differs from the last context frame's code in
        # its cell weighs change_weight, every other scored token 1
        last = train_tok["context"][ids, starts + C - 1]                              # (B, L)
        future = train_tok["future"][ids, starts + C - 1, :horizon]                   # (B, h, L)
        changed = (future != last[:, None]).flatten(1).float()                        # (B, h * L)
        weight = torch.ones(tgt.shape)
        weight[:, layout.code_positions(C, horizon) - 1] = 1 + (args.change_weight - 1) * changed
        return idx.to(args.device), tgt.to(args.device), weight.to(args.device)

    def val_loss(model):
        """The mean cross-entropy of the chunks of 64 validation windows."""
        losses = []
        for i in range(0, len(val_windows), 64):
            chunk = val_windows[i:i + 64]
            seq = windows(val_tok, layout, [e for e, _ in chunk], [t for _, t in chunk], C, horizon)
            idx, tgt = layout.training_pair(seq, C)
            losses.append(model(idx.to(args.device), tgt.to(args.device))[1].item())
        return float(np.mean(losses))

    return mle.train(run, model, name, ckpt, steps, next_batch, val_loss, lr_of_step, minutes,
                     budget)


# -----------------------------------------------------------------------------
# stage 3: RLVR with GRPO; the reward is a metric of the decoded frames against the true frames

def run_rlvr(run, model, ckpt, vq, layout, tokens, splits, lo, hi, horizon, lpips_net,
             reward_name, budget, scenes):
    """GRPO from `model` on train windows where the scene moves, watched on the val split,
    checkpointing to `ckpt` -> the post-trained model. splits: name -> clips. Each step's compute
    is added to `budget` (the control's, runtime.ComputeBudget), closed at the end. scenes:
    replay_scenes' simulator states of the train clips for --counterfactual_frac, else None."""
    args, autocast = run.args, run.autocast
    train_eps, val_eps = splits["train"], splits["val"]
    n = args.context + horizon          # frames per window
    P = layout.prompt_len(args.context)  # prompt tokens: the context frames and their actions
    FL, L = layout.frame_len, layout.L   # tokens per predicted frame + its action; codes per frame
    # the KL anchor
    ref = copy.deepcopy(model).eval().requires_grad_(False) if args.beta > 0 else None
    model, trained = run.wrap(model, grad_ckpt=args.grad_ckpt)
    # a completion is every predicted frame's codes, with the injected true actions between frames
    # grpo.GRPOConfig holds the RL defaults; video differs from the language tasks where set here:
    # every kept group is used (prompts_per_step 0), no entropy bonus, and AdamW with betas
    # (0.9, 0.99), no weight decay and a constant rate (no warm-up)
    cfg = GRPOConfig(group_size=args.group_size,
                     max_new_tokens=horizon * L + (horizon - 1) * layout.D,
                     temperature=args.temperature, clip_eps=args.clip_eps, beta=args.beta,
                     minibatches=args.minibatches, micro_batch=args.micro_batch,
                     prompts_per_step=0, entropy_coef=0.0, lr=args.rl_lr, warmup=0,
                     betas=(0.9, 0.99), weight_decay=0.0, shuffle_rewards=bool(args.placebo))
    opt = make_optimizer(model, cfg)
    # the step's memory, per rank
    chunk_prompts = prompts_per_chunk(args.prompts_per_step, args.group_size, args.minibatches,
                                      args.micro_batch)
    print_memory("rlvr", memory_estimate(model.config, args.dtype != "float32", args.beta > 0,
                                         args.grad_ckpt, P, cfg.max_new_tokens,
                                         args.prompts_per_step, args.group_size, args.micro_batch,
                                         chunk_prompts), run.print0)
    tok = tokens["train"]
    # every window of the train clips
    pool = [(e, t) for e in range(len(train_eps)) for t in range(args.clip_len - n + 1)]
    # a static window gives every sample the same reward (copying is exact), so no advantage and
    # no gradient: with --moving_only the pool keeps windows where some predicted frame differs
    # from the last context frame
    if args.moving_only:
        img = [ep["image"] for ep in train_eps]
        pool = [(e, t) for e, t in pool if np.abs(img[e][t + args.context:t + n].astype(np.int16)
                                                  - img[e][t + args.context - 1]).max() > 25]
    run.print0(f"rlvr: {len(pool)} train windows; per step {args.prompts_per_step} prompts x "
               f"{args.group_size} samples x {run.world} ranks, {horizon} predicted frame(s) each")
    # --push_frac: the count of the step's prompts drawn from the windows of the pool where a block
    # moves in a predicted frame
    n_push, pushes = int(args.push_frac * args.prompts_per_step), []
    if n_push:
        moved = [blocks_moved(ep["image"]) for ep in train_eps]   # (T,) per clip
        pushes = [(e, t) for e, t in pool if moved[e][t + args.context:t + n].any()]
        run.print0(f"rlvr: {n_push} of each step's prompts from the {len(pushes)} windows where a "
                   f"block moves")
        if not pushes:
            run.fail("--push_frac: no train window moves a block")
    g = torch.Generator().manual_seed(args.seed + 1000 + run.rank)   # prompts and samples
    # --counterfactual_frac: the count of the step's prompts that repeat another's context with
    # another action
    n_cf = int(args.counterfactual_frac * args.prompts_per_step)
    step, done = run.resume_stage(ckpt, model, opt, g, "rlvr")
    if done:
        return model
    # wall-clock of the GRPO steps so far (rollouts + updates, not the validation evals), and
    # their compute in forward-token units (grpo.compute_used): the control's budget
    prev = read_meta(ckpt)["metrics"] if step else {}
    rl_seconds, rl_compute = prev.get("rl_seconds", 0.0), prev.get("rl_compute", 0)
    budget.add(rl_compute)

    def reward_fn(items, completions):
        """Decode each completion's frames against its context frame; mean reward over the
        predicted frames."""
        # completions hold horizon frames of L codes with D action tokens between them
        # (horizon * FL - D tokens)
        codes = frame_codes([c[:horizon * FL - layout.D] for c in completions], layout,
                            horizon)   # (N, K, L)

        def per_frame(key):
            """items' (3, H, W) image under `key`, repeated for each predicted frame
            -> (N*K, 3, H, W)"""
            images = torch.stack([it[key] for it in items])[:, None]
            return images.expand(-1, horizon, -1, -1, -1).flatten(0, 1)

        ctx = per_frame("context")                  # the last context frame
        # every frame decoded against the true last context frame (N*K frames at once)
        with torch.no_grad():
            pred = vq.detokenize(codes.flatten(0, 1).to(args.device), ctx.to(args.device)).cpu()
        truth = torch.cat([it["truth"] for it in items])                   # (N*K, 3, H, W)
        # rewards_video.video_reward: one value per frame, e.g. -(MAE + 1 - SSIM) - moving_weight *
        # MAE on moving pixels; a completion gets its frames' mean
        bg = per_frame("background") if args.object_weight else None       # the bare scenes
        r = video_reward(reward_name, pred, truth, lpips_net, ctx, args.moving_weight, bg,
                         args.object_weight, args.action_weight, locate_gripper,
                         args.push_weight, locate_blocks)
        return r.view(-1, horizon).mean(1).tolist()

    def sampler(m, prompts, items, cfg, gen):
        """Multi-step: sample frame by frame, injecting each window's true actions."""
        actions = torch.stack([it["actions"] for it in items])
        return rollout(m, prompts, actions, horizon, L, cfg.temperature, gen)

    bar = tqdm(total=args.rl_steps, initial=step, desc="rlvr", disable=not run.master)
    stats = {}
    while step < args.rl_steps:
        # this step's prompts: random windows of the pool, as token sequences (B, n_tokens) cut
        # from the cache
        picks = [pool[i] for i in torch.randint(len(pool), (args.prompts_per_step - n_cf - n_push,),
                                                generator=g)]
        if n_push:                                # windows where a block moves
            picks += [pushes[i] for i in torch.randint(len(pushes), (n_push,), generator=g)]
        picks += picks[:n_cf]                     # the windows whose action is changed below
        seq = windows(tok, layout, [e for e, _ in picks], [t for _, t in picks], args.context,
                      horizon)
        # the true frames of each window, (K, H, W, 3) uint8
        truths = [train_eps[e]["image"][t + args.context:t + n] for e, t in picks]
        if n_cf:                                  # the last n_cf: a random action, its outcome
            counterfactual(seq, truths, picks, n_cf, scenes, layout, lo, hi, args.context, g)
        prompts = seq[:, :P].tolist()             # the context frames and their actions
        # the true later actions
        acts = seq[:, P:P + (horizon - 1) * FL].view(len(picks), horizon - 1, FL)[:, :, L:]
        items = [dict(truth=to_float(truths[i]),  # (K, 3, H, W)
                      context=to_float(train_eps[e]["image"][t + args.context - 1]),  # (3, H, W)
                      actions=acts[i],
                      background=to_float(train_eps[e]["background"]) if args.object_weight
                      else None) for i, (e, t) in enumerate(picks)]
        # one GRPO step (grpo.py): G samples per prompt, rewards, group advantages, PPO-clip + KL
        # update(s)
        try:
            stats = grpo_step(trained, ref, opt, prompts, items, reward_fn, cfg, None, g, step,
                              sampler if horizon > 1 else None, autocast=autocast)
        except FloatingPointError as e:   # grpo.py checks rewards, loss, gradient norm and weights
            run.nonfinite("rlvr", step, model, str(e))   # stops, or logs a skipped step
            stats = {}
        step += 1
        bar.update(1)
        if stats:                                 # a finished (not skipped) step: its time counts
            rl_seconds += stats["t_step"]
            rl_compute += stats["compute"]
            budget.add(stats["compute"])
            stats.update(rl_seconds=rl_seconds, rl_compute=rl_compute)
            bar.set_postfix(reward=f"{stats['reward_mean']:.4f}", kl=f"{stats['kl']:.4f}")
        # greedy on the val split, to watch
        if stats and (step % 20 == 0 or step == args.rl_steps) and run.master:
            r = eval_video(model, vq, val_eps, tokens["val"], lo, hi, args.context, horizon,
                           desc=None)
            stats.update(val_mae=r["mae"], val_ssim=r["ssim"], val_mae_moving=r["mae_moving"])
            run.print0(f"\nrlvr step {step}: reward {stats['reward_mean']:.4f} kl "
                       f"{stats['kl']:.4f} val mae {r['mae']:.4f} ssim {r['ssim']:.4f} "
                       f"mae_moving {r['mae_moving']:.4f}")
        if stats:
            run.log({"stage": "rlvr", **stats})
        # rl_seconds and rl_compute are saved with every checkpoint, so a resumed run and the
        # control read the whole run's
        run.save_stage(ckpt, model, opt, step,
                       {**stats, "rl_seconds": rl_seconds, "rl_compute": rl_compute}, g,
                       done=step == args.rl_steps)
    bar.close()
    budget.close()   # RLVR's compute is final: the control may stop once it has used as much
    run.check_ranks_in_sync(model, "rlvr")   # under torchrun every rank ends with equal weights
    run.barrier()
    return model


def replay_scenes(run, episodes):
    """--counterfactual_frac: the simulator's scene behind each train clip, replaying the random
    stream data/robot/prepare.py drew the train split from (seed 0; a clip is a whole episode)
    -> [(background float (H, W, 3), the state of each frame, the actions)]. A replayed frame
    that differs from the stored one stops the run (other data, --size or --clip_len)."""
    scenes = []
    # each episode again, as prepare.generate_split drew it, with the stream where it begins; under
    # torchrun only this rank's share (train_vq.load_clips: every world-th from its rank's)
    drawn = itertools.islice(split_episodes("train", length=len(episodes[0]["image"])), run.rank,
                             None, run.world)
    for i, (ep, (start, again)) in enumerate(zip(episodes, drawn)):
        if again["image"].shape != ep["image"].shape or (again["image"] != ep["image"]).any():
            run.fail(f"--counterfactual_frac needs the embedded robot data as "
                     f"data/robot/prepare.py writes it (--size={sim.W}, --clip_len: its episodes' "
                     f"length); train clip {run.rank + i * run.world} of {run.args.data} is not "
                     f"the simulator's")
        scenes.append((*sim.replay(start, again["action"]), again["action"]))
    return scenes


def counterfactual(seq, truths, picks, n_cf, scenes, layout, lo, hi, context, g):
    """The last n_cf windows of a step get a random action, uniform in [lo, hi] per dimension, in
    place of the true one after their last context frame, and the frames it truly leads to: the
    simulator steps that frame's state by it (then by the window's later true actions) and renders
    each predicted frame. seq (B, n_tokens) token windows and truths (per window (K, H, W, 3)
    uint8) are changed in place; picks: (clip, first frame) per window; scenes: replay_scenes'."""
    P, D = layout.prompt_len(context), layout.D
    actions = lo + (hi - lo) * torch.rand(n_cf, D, generator=g).numpy()
    for i, a in zip(range(len(picks) - n_cf, len(picks)), actions):
        e, t = picks[i]
        background, states, true_actions = scenes[e]
        # the prompt's last D tokens: the action after the last context frame
        seq[i, P - D:P] = torch.as_tensor(layout.action_tokens(action_bins(a, lo, hi)))
        state, frames = states[t + context - 1], []
        for k in range(len(truths[i])):           # frame k follows a, then k true actions
            state = sim.step(state, a if k == 0 else true_actions[t + context - 1 + k])
            frames.append(sim.render(background, state))
        truths[i] = np.stack(frames)


# -----------------------------------------------------------------------------
# stage 4: the held-out comparison, greedy and with the paper's sampling protocol, paired over the
# same test windows

def evaluate_models(run, models, vq, episodes, ep_tokens, lo, hi, horizon, lpips_net):
    """Evaluate every model of `models` (name -> (GPT, checkpoint path)) on the windows of
    `episodes` (the --final_eval split's clips; ep_tokens: their tokens), greedy (the table) and
    sampled at T=1 with top-k 100 (OFFICIAL, the paper's protocol; one seed for all models, so
    their samples pair up), write eval.json = {name: eval_video result +
    "sampled" + "checkpoint"} and print the paired differences. Called on every rank: under
    torchrun the ranks share the work (rank 0 writes), and eval.json is one process's."""
    args, print0 = run.args, run.print0

    def evaluate(job, share=None):
        """One model under one protocol: greedy (with a grid of predictions; share: who scores
        its batches, eval_video's) or the paper's sampling."""
        name, official = job
        m, desc = models[name][0], f"{args.final_eval} {name}"
        with run.autocast:
            if official:
                return eval_video(m, vq, episodes, ep_tokens, lo, hi, args.context, horizon,
                                  lpips_net, **OFFICIAL, seed=args.seed,
                                  desc=None if workers > 1 or run.ddp else f"{desc} T=1 top-k")
            grid = run.out_dir / f"grid_{name}.{'gif' if horizon > 1 else 'png'}"
            return eval_video(m, vq, episodes, ep_tokens, lo, hi, args.context, horizon,
                              lpips_net, grid_path=grid if run.master else None,
                              desc=None if workers > 1 or run.ddp else desc, share=share)

    # one process on a CPU: the jobs shared by forked processes. Under torchrun the ranks share
    # each greedy job's batches (runtime.rank_map), and the sampled jobs go to the ranks whole
    # (each draws one random stream through its batches in order: split, its numbers would change)
    workers = args.eval_workers if args.device == "cpu" and run.world == 1 else 1
    jobs = [(name, official) for name in models for official in (False, True)]
    print0(f"evaluating {len(models)} models greedy and sampled on the {args.final_eval} windows "
           f"({run.world if run.ddp else workers} processes)")
    if run.ddp:
        outs = {job: evaluate(job, rank_map) for job in jobs if not job[1]}
        whole = [job for job in jobs if job[1]]
        outs |= dict(zip(whole, rank_map(evaluate, whole)))
    else:
        outs = dict(zip(jobs, fork_map(evaluate, jobs, workers)))
    if not run.master:                            # every rank holds the results; rank 0 reports
        return
    rows = {}                                     # name -> eval_video dict, written as eval.json
    for name, (m, path) in models.items():
        rows[name], sampled = outs[name, False], outs[name, True]
        # the sampled run's summaries and per-window values; its baselines are the greedy run's
        rows[name]["sampled"] = {k: sampled[k] for k in (
            "mae", "mse", "psnr", "ssim", "lpips", "mae_moving", "repetition_rate", "temperature",
            "top_k", "per_record")}
        if "action_effect" in sampled:            # the embedded robot data: objects and gripper
            rows[name]["sampled"]["action_effect"] = sampled["action_effect"]
        rows[name]["checkpoint"] = str(path)
    atomic_write_text(run.out_dir / "eval.json", json.dumps(rows, indent=2) + "\n")
    print0(f"\nheld-out {args.final_eval} episodes ({rows['mle']['n']} predicted frames, "
           f"{args.mode}-step), greedy:")
    print_video_table(rows)
    # RLVR against its start, the equal-compute control and copying; the MLE start against copying
    pairs = [(a, b) for a, b in (("rlvr", "mle"), ("rlvr", "mle_more"), ("rlvr", "copy"),
                                 ("mle", "copy"), ("mle_more", "mle"))
             if a in rows and (b in rows or b == "copy")]
    print_video_paired(paired_video(rows, pairs))
    # did the model keep the objects and follow the action? (copy-last-frame has no such values)
    model_pairs = [(a, b) for a, b in pairs if b != "copy"]
    effects = paired_effects(rows, model_pairs)
    if effects:
        print_video_paired(effects)
    print0(f"\nsampled at T={OFFICIAL['temperature']:g}, top-k {OFFICIAL['top_k']}: " + "; ".join(
        f"{k} mae {r['sampled']['mae']:.4f} ssim {r['sampled']['ssim']:.4f} "
        f"mae_moving {r['sampled']['mae_moving']:.4f}" for k, r in rows.items()))
    # the same pairs on the sampled predictions (copy-last-frame does not sample: its pairs are
    # above)
    sampled = {k: dict(r["sampled"], copy_last_frame=r["copy_last_frame"]) for k, r in rows.items()}
    print_video_paired(paired_video(sampled, [(a, b) for a, b in pairs if b != "copy"]))
    if effects:
        print_video_paired(paired_effects(sampled, model_pairs))
    print0(f"wrote {run.out_dir / 'eval.json'}")


# -----------------------------------------------------------------------------
# run the stages
t_start = time.time()
horizon = args.horizon if args.mode == "multi" else 1   # predicted frames per window
start_model = None                                      # the GPT to train or post-train (None: new)
if args.init != "scratch":      # a trained world model, loaded before anything is written
    try:
        start_model, _, init_meta = load_video_model(args.init, args.device)
    except ValueError as e:
        fail(str(e))
scenes = None                   # --counterfactual_frac: the simulator's scene of each train clip
if args.counterfactual_frac and args.stage in ("all", "rlvr"):
    scenes = replay_scenes(run, train_eps)   # stops on data the simulator did not draw
run.save_config(record)         # out_dir/config.json: the inputs are good; from here on it writes
if args.init != "scratch":      # the world model's own tokenizer, named in its metadata
    # relative to the checkpoint's folder, e.g. checkpoints/video_cvq.safetensors
    vq_path = recorded_path(init_meta["args"]["vq"], Path(args.init).parent)
elif args.stage in ("all", "tokenizer"):   # from scratch: the per-frame VQ, then (cond) the other
    vq_path = train_vq.train_tokenizers(run, train_eps, val_eps, test_eps)
elif args.vq != "auto":                    # --stage=mle from scratch with a given tokenizer
    vq_path = Path(args.vq)
else:                                      # --stage=mle from scratch: out_dir's, else shipped
    vq_path = next((f for f in (FILES["cvq"], FILES["vq"]) if f.is_file()),
                   SHIPPED_VQ[args.tokenizer])
if args.stage == "tokenizer":              # the tokenizer files are written: nothing else to do
    sys.exit(0)
if not Path(vq_path).is_file():
    fail(f"tokenizer {vq_path} not found (run --stage=tokenizer first or pass --vq)")
try:
    vq, vq_meta = load_vq(vq_path, args.device)  # VQVAE or CondVQVAE, frozen from here on
except ValueError as e:
    fail(str(e))
layout = Layout.of(vq, D)   # token ids: context codes, predicted-frame codes, action bins
# a checkpoint must fit this tokenizer and data: the same vocabulary, and room for a whole window
if start_model is not None and start_model.config.vocab_size != layout.vocab_size:
    fail(f"--init {args.init}: vocabulary {start_model.config.vocab_size} does not fit this data "
         f"({layout.vocab_size})")
if start_model is not None and start_model.config.block_size < layout.window_len(args.context,
                                                                                 horizon):
    fail(f"--init {args.init}: block size {start_model.config.block_size} is shorter than a "
         f"window of {args.context} + {horizon} frames "
         f"({layout.window_len(args.context, horizon)} tokens)")
vq_file = FILES["cvq"] if isinstance(vq, CondVQVAE) else FILES["vq"]
# checkpoints name their tokenizer in their own folder
if master and Path(vq_path).resolve() != vq_file.resolve():
    atomic_write(vq_file, lambda tmp: shutil.copyfile(vq_path, tmp))
barrier()
args.vq = str(vq_file)            # in the world model's args (relative): its tokenizer, beside it
splits = {"train": train_eps, "val": val_eps, "test": test_eps}
# every split tokenized once (cached): per clip the context codes, future codes and action tokens
if args.change_weight != 1 and (isinstance(vq, CondVQVAE) or args.change_weight <= 0):
    fail(f"--change_weight {args.change_weight}: needs the per-frame tokenizer and a weight > 0")
still_code = None                 # --still_code: one code for every unchanged cell
if args.still_code != -1:
    if not isinstance(vq, CondVQVAE) or not 0 <= args.still_code < vq.config.n_codes:
        fail(f"--still_code {args.still_code}: needs the context-conditioned tokenizer and one of "
             f"its codes (its 'unchanged': data/robot/task.find_still_code)")
    still_code = args.still_code
if args.copy_gate == -1:          # --copy_gate: decoded cells that keep their code copy the context
    # on for the per-frame tokenizer where this run decodes (an MLE stage alone does not)
    args.copy_gate = int(not isinstance(vq, CondVQVAE) and args.stage != "mle")
if args.copy_gate:
    if isinstance(vq, CondVQVAE):
        fail("--copy_gate: needs the per-frame tokenizer (the context-conditioned one gates its "
             "own decoding)")
    vq.copy_gate = True
tokens = cached_tokens(run, vq_file, vq, layout, splits, horizon, lo, hi, still_code)

# MLE: on its own (--stage=mle, from scratch or continuing --init), or as the first stage of a run
# from scratch
if args.stage == "mle" or (args.stage == "all" and start_model is None):
    if args.context + horizon > T:
        fail(f"a window of {args.context + horizon} frames does not fit clips of {T}")
    # a new GPT whose block fits a multi-step window
    start_model = start_model or GPT(GPTConfig.llama(
        vocab_size=layout.vocab_size, block_size=layout.window_len(args.context, args.horizon),
        n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd))
    if args.action_embed:
        if layout.D * 2 * 8 > start_model.config.n_embd:
            fail(f"--action_embed: {layout.D} action dimensions need {layout.D * 16} channels")
        init_action_embeddings(start_model, layout)
    start_model = run_mle(run, start_model, "mle", FILES["mle"], layout, tokens, horizon,
                          args.mle_steps, args.mle_minutes,
                          lambda s: lr_at(s, args.mle_steps, args.mle_lr, args.warmup))   # cosine
    mle_path = FILES["mle"]
else:                                            # RLVR starts from --init as it is
    mle_path = Path(args.init)


def control(run, start, start_path, ckpt, layout, tokens, horizon, budget):
    """The control: MLE on a copy of `start` at a constant rate, --control_lr or --control_scale x
    the start's own final MLE rate (mle.final_lr of `start_path`; a start that records no MLE
    schedule: --rl_lr), until `budget` (RLVR's compute) is spent; saved to `ckpt`."""
    final = mle.final_lr(start_path)
    lr = run.args.control_lr or (run.args.rl_lr if final is None
                                 else run.args.control_scale * final)
    run.print0(f"control: MLE continued from the start at lr {lr:.3g} for RLVR's compute")
    return run_mle(run, copy.deepcopy(start), "mle_more", ckpt, layout, tokens, horizon, 10 ** 9, 0,
                   mle.control_lr(lr), budget)


if args.stage in ("all", "rlvr", "control"):   # the evaluation's LPIPS (and RLVR's reward's)
    try:
        lpips_net = load_lpips(args.lpips, args.device)
    except ValueError as e:
        fail(str(e))
if args.stage == "control":   # the control alone, for a given compute (the lr sweep)
    models = {"mle": (start_model, mle_path),
              "mle_more": (control(run, start_model, mle_path, FILES["mle_more"], layout, tokens,
                                   horizon, ComputeBudget(args.control_compute)),
                           FILES["mle_more"])}
    # every rank evaluates its share; rank 0 writes
    evaluate_models(run, models, vq, splits[args.final_eval], tokens[args.final_eval], lo, hi,
                    horizon, lpips_net)
# RLVR, then the equal-compute control, then the held-out comparison of the three
if args.stage in ("all", "rlvr"):
    try:
        reward_name = pick_reward(args.reward, lpips_net)
    except ValueError as e:
        fail(str(e))
    if args.object_weight and train_eps[0]["background"] is None:   # e.g. Meta-World or RT-1 data
        if "object_weight" in given:
            fail(f"--object_weight needs episodes with a background image; {args.data} has none")
        print0(f"reward: {args.data} has no background images, so no object term "
               f"(the default --object_weight)")
        args.object_weight = 0.0
    # the detectors know the embedded robot's gripper and blocks only (its data has backgrounds): the
    # default push term is dropped on other data, a flag asked for is refused
    robot = train_eps[0]["background"] is not None
    if args.push_weight and not robot and "push_weight" not in given:
        print0(f"reward: {args.data} is not the embedded robot's, so no push term "
               f"(the default --push_weight)")
        args.push_weight = 0.0
    for name in ("action_weight", "push_weight", "push_frac"):
        if getattr(args, name) and not robot:
            fail(f"--{name} needs the embedded robot's episodes (its detectors); "
                 f"{args.data} has other ones")
    print0(f"reward: {reward_name}"
           + (f" - {args.moving_weight:g} x moving MAE" if args.moving_weight else "")
           + (f" - {args.object_weight:g} x object miss" if args.object_weight else "")
           + (f" - {args.action_weight:g} x gripper error" if args.action_weight else "")
           + (f" - {args.push_weight:g} x push error" if args.push_weight else "")
           + ("" if lpips_net else " (no LPIPS weights: --lpips=FILE enables mae+lpips)")
           + ("; frames decoded with the copy gate" if args.copy_gate else "")
           + ("; PLACEBO: rewards permuted within each kept group" if args.placebo else ""))
    mle_model = copy.deepcopy(start_model)   # kept for the comparison; RLVR updates start_model
    models = {"mle": (mle_model, mle_path)}  # name -> (model, its checkpoint file), evaluated below
    rl_done = (args.resume and FILES["rlvr"].is_file()
               and read_meta(FILES["rlvr"])["metrics"].get("done"))
    # The control, the same start trained further by MLE, gets RLVR's compute (ComputeBudget:
    # counted in tokens, the same on any machine). On a CPU it runs in a forked process on the
    # second core *while* RLVR runs, waiting whenever it is ahead (runtime.fork_alongside): the
    # demo takes half as long. Otherwise (GPU, torchrun, a resumed run) it runs after RLVR, for the
    # compute RLVR's checkpoint records. Its steps are the same either way.
    alongside = (args.control and args.control_alongside and world == 1 and args.device == "cpu"
                 and not rl_done)

    budget = ComputeBudget()   # RLVR adds its compute step by step
    if alongside:
        child = fork_alongside(
            lambda: control(run, mle_model, mle_path, FILES["mle_more"], layout, tokens, horizon,
                            budget),
            out_dir / "control.log")
        print0(f"control: MLE continues from the start in process {child.pid} while RLVR runs "
               f"(progress: {out_dir / 'control.log'})")
    rlvr_model = run_rlvr(run, start_model, FILES["rlvr"], vq, layout, tokens, splits, lo, hi,
                          horizon, lpips_net, reward_name, budget, scenes)
    models["rlvr"] = (rlvr_model, FILES["rlvr"])
    if alongside:
        child.join()   # it stops at RLVR's compute, saves video_mle_more.safetensors and exits
        if child.exitcode:
            fail(f"the control process failed (exit code {child.exitcode}); "
                 f"see {out_dir / 'control.log'}")
        models["mle_more"] = (load_video_model(FILES["mle_more"], args.device)[0],
                              FILES["mle_more"])
    elif args.control:   # after RLVR, for the compute its checkpoint records
        rl_compute = read_meta(FILES["rlvr"])["metrics"].get("rl_compute", 0)
        models["mle_more"] = (control(run, mle_model, mle_path, FILES["mle_more"], layout, tokens,
                                      horizon, ComputeBudget(rl_compute)), FILES["mle_more"])
    # the final comparison: on the test split, or (--final_eval=val) the validation split; every
    # rank evaluates its share, rank 0 writes
    evaluate_models(run, models, vq, splits[args.final_eval], tokens[args.final_eval], lo, hi,
                    horizon, lpips_net)
    print0(f"total {(time.time() - t_start) / 60:.1f} min")
run.finish()
