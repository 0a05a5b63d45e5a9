"""
Train a video world model: a VQ tokenizer, an action-conditioned GPT by MLE, then RLVR (GRPO whose reward is a
metric of the decoded frames against the true ones), and compare MLE and RLVR on held-out episodes.

CPU, the default job (embedded robot-pushing data; RLVR from the shipped checkpoints/video_{vq,mle}.safetensors):
    python train_video.py                                   # single-step, 100 GRPO steps; ~9.5 min on 2 busy cores
    python train_video.py --mode=multi --rl_steps=30 --prompts_per_step=4 --rl_lr=5e-5 --out_dir=out/video_multi
The shipped checkpoints, from scratch (the tokenizer stops on its 6-minute cap, so numbers vary a little):
    python train_video.py --stage=tokenizer --init=scratch --vq_minutes=6 --out_dir=out/video_scratch    # ~7 min
    python train_video.py --stage=mle --mode=multi --eval_every=100 --out_dir=out/video_scratch          # ~37 min
    (then copy video_vq/video_mle.safetensors from out/video_scratch to checkpoints/)
Everything in one go (tokenizer, MLE, RLVR, eval): python train_video.py --init=scratch --mode=multi
Continued-MLE baseline for the same wall-clock as RLVR, then its evaluation:
    python train_video.py --stage=mle --init=checkpoints/video_mle.safetensors --mode=multi --mle_minutes=6 \
        --mle_lr=2e-4 --warmup=0 --out_dir=out/video_mle_more
    python video_eval.py --ckpt=out/video_mle_more/video_mle.safetensors --mode=single
Converted RT-1 episodes (.npz with image (T, 256, 320, 3) and action (T, 13)), on GPUs:
    torchrun --nproc_per_node=8 train_video.py --data=/path/rt1 --init=scratch --device=cuda --dtype=bfloat16

Stages (--stage): tokenizer | mle | rlvr | all. Outputs in --out_dir: video_vq.safetensors (tokenizer),
video_mle.safetensors, video_rlvr.safetensors (+ .json sidecars), codes_<split>.safetensors (the frames' codes,
cached per tokenizer), log.jsonl and eval.json = {"mle": <video_eval JSON>, "rlvr": <video_eval JSON>}.
Every stage (tokenizer, MLE, RLVR) checkpoints every --ckpt_every steps with optimizer and RNG state (the tokenizer's
in video_vq_train.safetensors, removed once video_vq.safetensors is written), and a re-run of the same command resumes
where it stopped, ending with the weights of an uninterrupted run (a finished stage keeps its weights only, and is
reused). A NaN/inf loss, reward or gradient stops the run naming the step (--on_nan=skip skips the step instead).

Design: the tokenizer is trained once and frozen; the frames of every split are tokenized once and cached, so MLE
trains on code sequences only (cheap). MLE trains on windows of context + horizon frames (multi) or context + 1
(single), loss on the predicted frames' codes only; a model trained in multi mode also serves single-step prediction.
RLVR samples G predictions per prompt, decodes them with the frozen tokenizer and scores them against the true
frames (`--reward`, default mae+ssim, or mae+lpips with --lpips weights); `grpo.grpo_step` does the rest, with a
multi-step sampler that injects the true actions between predicted frames.
"""
import argparse
import copy
import json
import os
import shutil
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from checkpoint import atomic_write_text
from data.robot.prepare import DATA_DIR, ensure_splits
from data.robot.task import Layout, clips, load_split, read_action_stats
from grpo import GRPOConfig, grpo_step
from model import GPT, GPTConfig
from runtime import Run, lr_at
from tokenizer_vq import VQConfig, VQVAE, codebook_stats, load_vq, save_vq
from video_eval import episode_tokens, eval_video, frame_codes, load_video_model, print_video_table, rollout, to_float
from rewards import load_lpips, pick_reward, psnr, video_reward

ROOT = Path(__file__).resolve().parent
SHIPPED_VQ, SHIPPED_MLE = ROOT / "checkpoints" / "video_vq.safetensors", ROOT / "checkpoints" / "video_mle.safetensors"

# -----------------------------------------------------------------------------
# flags
p = argparse.ArgumentParser(description="tokenizer, MLE then RLVR for a video world model",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
p.add_argument("--data", default=str(DATA_DIR), help="episode .npz directory (the embedded data is made if missing)")
p.add_argument("--out_dir", default="out/video")
p.add_argument("--stage", default="all", choices=["all", "tokenizer", "mle", "rlvr"])
p.add_argument("--mode", default="single", choices=["single", "multi"])
p.add_argument("--init", default="auto", help="auto (shipped MLE checkpoint if present, else scratch) | scratch | "
                                              "a video_mle/video_rlvr .safetensors")
p.add_argument("--vq", default="auto", help="tokenizer file for --stage=mle from scratch (auto: out_dir's or shipped)")
p.add_argument("--resume", type=int, default=1)
# tokenizer
p.add_argument("--size", type=int, default=64, help="frame side (frames are resized to it)")
p.add_argument("--clip_len", type=int, default=16, help="episodes are cut into clips of this many frames")
p.add_argument("--quantizer", default="vq", choices=["vq", "fsq"])
p.add_argument("--n_codes", type=int, default=512)
p.add_argument("--vq_steps", type=int, default=2500)
p.add_argument("--vq_minutes", type=float, default=0, help="stop tokenizer training after this wall-clock (0 = off)")
p.add_argument("--vq_batch", type=int, default=32)
p.add_argument("--vq_crop", type=int, default=32, help="train on random crops of this side (multiple of 8)")
p.add_argument("--vq_lr", type=float, default=1e-3)
# world model
p.add_argument("--context", type=int, default=1, help="true frames before the first predicted one")
p.add_argument("--horizon", type=int, default=7, help="predicted frames in multi mode (paper: 7)")
p.add_argument("--n_layer", type=int, default=4)
p.add_argument("--n_head", type=int, default=4)
p.add_argument("--n_embd", type=int, default=128)
# MLE
p.add_argument("--mle_steps", type=int, default=1150)
p.add_argument("--mle_minutes", type=float, default=0)
p.add_argument("--batch_size", type=int, default=16)
p.add_argument("--mle_lr", type=float, default=2e-3)
p.add_argument("--warmup", type=int, default=100)
p.add_argument("--weight_decay", type=float, default=0.1)
# RLVR
p.add_argument("--rl_steps", type=int, default=100)
p.add_argument("--prompts_per_step", type=int, default=8)
p.add_argument("--group_size", type=int, default=8)
p.add_argument("--rl_lr", type=float, default=1e-4)
p.add_argument("--beta", type=float, default=0.02, help="KL coefficient")
p.add_argument("--clip_eps", type=float, default=0.2)
p.add_argument("--minibatches", type=int, default=2)
p.add_argument("--micro_batch", type=int, default=32)
p.add_argument("--temperature", type=float, default=1.0)
p.add_argument("--reward", default="auto", help="auto | mae+ssim | mae+lpips")
p.add_argument("--lpips", default=None, help="LPIPS-VGG weights (bench/convert_lpips.py) for the reward and eval")
p.add_argument("--moving_only", type=int, default=1, help="RL prompts only from windows where the scene moves")
# evaluation
p.add_argument("--eval_every", type=int, default=500, help="MLE steps between validation losses (RLVR: every 20)")
p.add_argument("--test_limit", type=int, default=0, help="test episodes in the final eval (0 = all)")
p.add_argument("--train_limit", type=int, default=0, help="train episodes to use (0 = all)")
# system
p.add_argument("--device", default="cpu")
p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
p.add_argument("--threads", type=int, default=1, help="torch CPU threads; 1 is fastest for tiny models on 2 cores")
p.add_argument("--seed", type=int, default=1337)
p.add_argument("--ckpt_every", type=int, default=200)
p.add_argument("--on_nan", default="stop", choices=["stop", "skip"],
               help="on a NaN/inf loss, reward or gradient: stop the run, or skip that step (single process only)")
args = p.parse_args()
for name in ("size", "n_codes", "vq_steps", "vq_batch", "vq_crop", "context", "horizon", "n_layer", "n_head", "n_embd",
             "mle_steps", "batch_size", "rl_steps", "prompts_per_step", "group_size", "minibatches", "micro_batch",
             "eval_every", "threads", "ckpt_every"):
    if getattr(args, name) < 1:
        p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
for name in ("vq_minutes", "vq_lr", "mle_minutes", "mle_lr", "warmup", "weight_decay", "rl_lr", "beta", "clip_eps",
             "test_limit", "train_limit"):
    if not getattr(args, name) >= 0:
        p.error(f"--{name} must be >= 0, got {getattr(args, name)}")
if args.clip_len < 2 or args.vq_crop > args.size or not args.temperature > 0:
    p.error(f"need --clip_len >= 2 (got {args.clip_len}), --vq_crop <= --size (got {args.vq_crop} > {args.size}) "
            f"and --temperature > 0 (got {args.temperature})")

# -----------------------------------------------------------------------------
# setup: distributed, devices, precision (runtime.py)
out_dir = Path(args.out_dir)
run = Run(args, out_dir)
ddp, master, rank, world, autocast = run.ddp, run.master, run.rank, run.world, run.autocast
print0, fail, log, barrier = run.print0, run.fail, run.log, run.barrier
VQ_FILE, VQ_TRAIN = out_dir / "video_vq.safetensors", out_dir / "video_vq_train.safetensors"
MLE_FILE, RL_FILE = out_dir / "video_mle.safetensors", out_dir / "video_rlvr.safetensors"

if args.init == "auto":
    args.init = str(SHIPPED_MLE) if SHIPPED_MLE.is_file() and args.stage in ("all", "rlvr") else "scratch"
if args.init != "scratch" and not Path(args.init).is_file():
    fail(f"--init {args.init}: no such checkpoint file")
if args.stage == "rlvr" and args.init == "scratch":
    fail("--stage=rlvr needs --init=<video_mle checkpoint> (RLVR post-trains a trained model)")
if args.vq_crop % 8 or args.size % 8:
    fail("--vq_crop and --size must be multiples of 8")
if master:
    out_dir.mkdir(parents=True, exist_ok=True)
if master and Path(args.data).resolve() == DATA_DIR.resolve():
    ensure_splits(DATA_DIR)
barrier()
try:
    if master:
        read_action_stats(args.data)   # writes action_stats.json on first use
    barrier()
    lo, hi = read_action_stats(args.data)
    train_eps, val_eps, test_eps = (clips(load_split(args.data, s, args.size, limit), args.clip_len)
                                    for s, limit in (("train", args.train_limit), ("val", 0), ("test", args.test_limit)))
except ValueError as e:
    fail(str(e))
if not (train_eps and val_eps and test_eps):
    fail(f"{args.data}: some split has no episode of >= --clip_len={args.clip_len} frames")
D, T = train_eps[0]["action"].shape[1], args.clip_len
args.action_lo, args.action_hi = lo.tolist(), hi.tolist()
print0(f"data: {len(train_eps)} train / {len(val_eps)} val / {len(test_eps)} test clips of {T} frames, "
       f"{D}-dim actions, frames resized to {args.size}x{args.size}")


# -----------------------------------------------------------------------------
# stage 1: the tokenizer, on random crops of train frames; reports held-out PSNR and codebook usage
def train_tokenizer():
    if args.resume and VQ_FILE.is_file() and read_vq_header(VQ_FILE).get("done"):
        print0(f"tokenizer: {VQ_FILE} is complete, reusing it")
        return VQ_FILE
    frames = torch.from_numpy(np.concatenate([ep["image"] for ep in train_eps])).permute(0, 3, 1, 2)   # uint8
    vq = VQVAE(VQConfig(size=args.size, quantizer=args.quantizer, n_codes=args.n_codes)).to(args.device)
    g = torch.Generator().manual_seed(args.seed + rank)
    C = args.vq_crop

    def batch():
        i = torch.randint(len(frames), (args.vq_batch,), generator=g)
        oy, ox = (8 * torch.randint((args.size - C) // 8 + 1, (2,), generator=g)).tolist()
        return frames[i, :, oy:oy + C, ox:ox + C].float().div(255).to(args.device)

    if args.quantizer == "vq":   # codebook from encoder outputs; DDP's constructor then copies rank 0's everywhere
        with torch.no_grad():
            z = vq.encoder(batch() * 2 - 1)
            vq.quantizer.restart(z.permute(0, 2, 3, 1).flatten(0, 2), torch.ones(args.n_codes, dtype=torch.bool))
            vq.quantizer.initialised.fill_(True)
    _, trained = run.wrap(vq)
    opt = torch.optim.Adam(vq.parameters(), lr=args.vq_lr)
    step, _ = run.resume_stage(VQ_TRAIN, vq, opt, g, "tokenizer")
    t0 = time.time()
    bar = tqdm(total=args.vq_steps, initial=step, desc="tokenizer", disable=not master)
    while step < args.vq_steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.vq_steps, args.vq_lr, 50)
        x = batch()
        with autocast:
            rec, qloss, _ = trained(x)
            loss = F.mse_loss(rec.float(), x) + qloss
        run.update("tokenizer", step, vq, opt, loss)   # a NaN/inf stops the run, or skips the step
        step += 1
        if args.quantizer == "vq" and step % 50 == 0 and step < 0.8 * args.vq_steps:
            with torch.no_grad():
                z = vq.encoder(x * 2 - 1).permute(0, 2, 3, 1).flatten(0, 2)
            n_dead = vq.quantizer.restart_dead(z)
            if ddp:
                dist.broadcast(vq.quantizer.codebook.data, 0)
                dist.broadcast(vq.quantizer.usage, 0)
            bar.set_postfix(loss=f"{loss.item():.5f}", restarted=n_dead)
        bar.update(1)
        run.save_stage(VQ_TRAIN, vq, opt, step, {}, g, done=False)
        if args.vq_minutes and time.time() - t0 > 60 * args.vq_minutes:
            print0(f"tokenizer: stopping after {args.vq_minutes} minutes at step {step}")
            break
    bar.close()
    vq.eval()
    held = np.concatenate([ep["image"] for ep in val_eps + test_eps])
    with torch.no_grad():
        codes = vq.tokenize(held)
        rec = torch.cat([vq.detokenize(codes[i:i + 256]).cpu() for i in range(0, len(codes), 256)])
    stats = dict(psnr_heldout=float(psnr(rec, to_float(held)).mean()), **codebook_stats(codes, vq.config.n_codes),
                 n_codes=vq.config.n_codes, steps=step, minutes=(time.time() - t0) / 60, done=True)
    print0(f"tokenizer: held-out PSNR {stats['psnr_heldout']:.2f} dB on {len(held)} frames, "
           f"{stats['used']}/{stats['n_codes']} codes used, perplexity {stats['perplexity']:.1f}")
    log({"stage": "tokenizer", **stats})
    if master:
        save_vq(VQ_FILE, vq, {**stats, "args": vars(args)})
        for f in (VQ_TRAIN, VQ_TRAIN.with_suffix(".json")):   # nothing left to resume
            f.unlink(missing_ok=True)
    barrier()
    return VQ_FILE


def read_vq_header(path):
    try:
        with safe_open(str(path), framework="pt") as f:
            return json.loads((f.metadata() or {}).get("nanorlvr", "{}"))
    except Exception as e:   # safetensors raises its own error types
        fail(f"{path}: not a readable tokenizer checkpoint ({e}); pass --resume=0 or another --out_dir")


def codes_of(vq_path, vq, split, episodes):
    """The true frames' codes (E, T, L) under this tokenizer, cached in out_dir per tokenizer file and split."""
    key = f"{zlib.crc32(Path(vq_path).read_bytes())}-{Path(args.data).resolve()}-{args.size}-{len(episodes)}"
    cache = out_dir / f"codes_{split}.safetensors"
    try:
        with safe_open(str(cache), framework="pt") as f:
            if (f.metadata() or {}).get("key") == key:
                return f.get_tensor("codes")
    except Exception:   # missing or unreadable: computed again and rewritten below
        pass
    t0 = time.time()
    codes = torch.stack([vq.tokenize(ep["image"]) for ep in episodes]).cpu()
    if master:
        tmp = cache.with_name(cache.name + ".tmp")
        save_file({"codes": codes}, str(tmp), metadata={"key": key})
        os.replace(tmp, cache)
    print0(f"tokenized {split}: {tuple(codes.shape)} codes in {time.time() - t0:.0f}s")
    return codes


def window_batch(tokens, ids, starts, n, layout):
    """Windows of n frames from episode token rows -> idx, targets (loss on frames after the context only)."""
    FL = layout.frame_len
    length = n * FL - layout.D
    pos = torch.as_tensor(starts)[:, None] * FL + torch.arange(length)[None]
    seq = tokens[torch.as_tensor(ids)[:, None], pos]
    rel = torch.full((length,), False)
    rel[torch.as_tensor(layout.code_positions(n, args.context))] = True
    targets = seq[:, 1:].masked_fill(~rel[1:], -1)
    return seq[:, :-1].to(args.device), targets.to(args.device)


# -----------------------------------------------------------------------------
# stage 2: MLE on code windows
def run_mle(vq, layout, start_model):
    n = args.context + (args.horizon if args.mode == "multi" else 1)
    if n > T:
        fail(f"a window of {n} frames does not fit episodes of {T}")
    model = start_model or GPT(GPTConfig.llama(vocab_size=layout.vocab_size, block_size=n * layout.frame_len,
                                               n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd))
    model, trained = run.wrap(model)
    train_tok, val_tok = tokens["train"], tokens["val"]
    print0(f"mle: {model.num_params() / 1e6:.2f}M non-embedding parameters, windows of {n} frames "
           f"({n * layout.frame_len - layout.D} tokens), batch {args.batch_size} x {world} ranks")
    vs = [(e, t) for e in range(len(val_tok)) for t in range(0, T - n + 1, n)]
    opt = torch.optim.AdamW(model.parameters(), lr=args.mle_lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    g = torch.Generator().manual_seed(args.seed + rank)
    step, done = run.resume_stage(MLE_FILE, model, opt, g, "mle")
    if done:
        return model
    t0, metrics = time.time(), {}
    bar = tqdm(total=args.mle_steps, initial=step, desc="mle", disable=not master)
    while step < args.mle_steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.mle_steps, args.mle_lr, args.warmup)
        ids = torch.randint(len(train_tok), (args.batch_size,), generator=g)
        starts = torch.randint(T - n + 1, (args.batch_size,), generator=g)
        idx, tgt = window_batch(train_tok, ids, starts, n, layout)
        with autocast:
            _, loss = trained(idx, tgt)
        run.update("mle", step, model, opt, loss, grad_clip=1.0)   # a NaN/inf stops the run, or skips the step
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        timed_out = bool(args.mle_minutes and time.time() - t0 > 60 * args.mle_minutes)
        if step % args.eval_every == 0 or step == args.mle_steps or timed_out:
            model.eval()
            with torch.no_grad(), autocast:
                vl = np.mean([model(*window_batch(val_tok, [e for e, _ in vs[i:i + 64]], [t for _, t in vs[i:i + 64]],
                                                  n, layout))[1].item() for i in range(0, len(vs), 64)])
            model.train()
            metrics = dict(stage="mle", step=step, loss=loss.item(), val_loss=float(vl),
                           minutes=(time.time() - t0) / 60)
            print0(f"\nmle step {step}: train loss {loss.item():.4f} val loss {vl:.4f}")
            log(metrics)
        run.save_stage(MLE_FILE, model, opt, step, metrics, g, done=step == args.mle_steps or bool(timed_out))
        if timed_out:
            print0(f"mle: stopping after {args.mle_minutes} minutes at step {step}")
            break
    bar.close()
    barrier()
    return model


# -----------------------------------------------------------------------------
# stage 3: RLVR with GRPO; the reward is a metric of the decoded frames against the true frames
def run_rlvr(model, vq, layout, lpips_net, reward_name):
    K = args.horizon if args.mode == "multi" else 1
    n, FL, L = args.context + K, layout.frame_len, layout.L
    ref = copy.deepcopy(model).eval().requires_grad_(False) if args.beta > 0 else None
    model, trained = run.wrap(model)
    cfg = GRPOConfig(group_size=args.group_size, max_new_tokens=K * L + (K - 1) * layout.D,
                     temperature=args.temperature, clip_eps=args.clip_eps, beta=args.beta,
                     minibatches=args.minibatches, micro_batch=args.micro_batch)
    opt = torch.optim.AdamW(model.parameters(), lr=args.rl_lr, betas=(0.9, 0.99), weight_decay=0.0)
    tok = tokens["train"]
    pool = [(e, t) for e in range(len(train_eps)) for t in range(T - n + 1)]
    if args.moving_only:   # windows where some predicted frame differs from the last context frame
        img = [ep["image"] for ep in train_eps]
        pool = [(e, t) for e, t in pool if np.abs(img[e][t + args.context:t + n].astype(np.int16)
                                                  - img[e][t + args.context - 1]).max() > 25]
    print0(f"rlvr: {len(pool)} train windows; per step {args.prompts_per_step} prompts x {args.group_size} samples "
           f"x {world} ranks, {K} predicted frame(s) each; reward {reward_name}")
    g = torch.Generator().manual_seed(args.seed + 1000 + rank)
    step, done = run.resume_stage(RL_FILE, model, opt, g, "rlvr")
    if done:
        return model

    def item(e, t):
        return dict(truth=to_float(train_eps[e]["image"][t + args.context:t + n]),
                    actions=tok[e, (t + args.context) * FL:(t + n - 1) * FL].view(K - 1, FL)[:, L:])

    def reward_fn(items, completions):
        codes = frame_codes([c[:K * FL - layout.D] for c in completions], layout, K)
        with torch.no_grad():
            pred = vq.detokenize(codes.flatten(0, 1).to(args.device)).cpu()
        truth = torch.cat([it["truth"] for it in items])
        return video_reward(reward_name, pred, truth, lpips_net).view(-1, K).mean(1).tolist()

    def sampler(m, prompts, items, cfg, gen):
        return rollout(m, prompts, torch.stack([it["actions"] for it in items]), K, L, cfg.temperature, gen)

    bar = tqdm(total=args.rl_steps, initial=step, desc="rlvr", disable=not master)
    stats = {}
    while step < args.rl_steps:
        picks = [pool[i] for i in torch.randint(len(pool), (args.prompts_per_step,), generator=g)]
        prompts = [tok[e, t * FL:(t + args.context) * FL].tolist() for e, t in picks]
        try:
            with autocast:
                stats = grpo_step(trained, ref, opt, prompts, [item(e, t) for e, t in picks], reward_fn, cfg, None, g,
                                  step, sampler if K > 1 else None)
        except FloatingPointError as e:   # grpo.py checks rewards, loss, gradient norm and weights
            run.nonfinite("rlvr", step, model, str(e))   # stops, or logs a skipped step
            stats = {}
        step += 1
        bar.update(1)
        if stats:
            bar.set_postfix(reward=f"{stats['reward_mean']:.4f}", kl=f"{stats['kl']:.4f}")
        if stats and (step % 20 == 0 or step == args.rl_steps) and master:
            r = eval_video(model, vq, val_eps, split_codes["val"], lo, hi, args.context, K, desc=None)
            stats.update(val_mae=r["mae"], val_ssim=r["ssim"], val_mae_moving=r["mae_moving"])
            print0(f"\nrlvr step {step}: reward {stats['reward_mean']:.4f} kl {stats['kl']:.4f} val mae {r['mae']:.4f} "
                   f"ssim {r['ssim']:.4f} mae_moving {r['mae_moving']:.4f}")
        if stats:
            log({"stage": "rlvr", **stats})
        run.save_stage(RL_FILE, model, opt, step, stats, g, done=step == args.rl_steps)
    bar.close()
    run.check_ranks_in_sync(model, "rlvr")
    barrier()
    return model


# -----------------------------------------------------------------------------
# run the stages
t_start = time.time()
start_model = None
if args.init != "scratch":
    try:
        start_model, _, init_meta = load_video_model(args.init, args.device)
    except ValueError as e:
        fail(str(e))
    vq_path = Path(args.init).parent / init_meta["args"]["vq"]
elif args.stage in ("all", "tokenizer"):
    vq_path = train_tokenizer()
elif args.vq != "auto":
    vq_path = Path(args.vq)
else:
    vq_path = VQ_FILE if VQ_FILE.is_file() else SHIPPED_VQ
if args.stage == "tokenizer":
    sys.exit(0)
if not Path(vq_path).is_file():
    fail(f"tokenizer {vq_path} not found (run --stage=tokenizer first or pass --vq)")
try:
    vq, vq_meta = load_vq(vq_path, args.device)
except ValueError as e:
    fail(str(e))
layout = Layout(vq.config.n_codes, vq.config.codes_per_frame, D)
if start_model is not None and start_model.config.vocab_size != layout.vocab_size:
    fail(f"--init {args.init}: vocabulary {start_model.config.vocab_size} does not fit this data ({layout.vocab_size})")
if master and Path(vq_path).resolve() != VQ_FILE.resolve():   # checkpoints name their tokenizer in their own folder
    shutil.copyfile(vq_path, VQ_FILE.with_name(VQ_FILE.name + ".tmp"))   # copy, then rename: never half a file
    os.replace(VQ_FILE.with_name(VQ_FILE.name + ".tmp"), VQ_FILE)
barrier()
args.vq = VQ_FILE.name
splits = {"train": train_eps, "val": val_eps, "test": test_eps}
split_codes = {s: codes_of(VQ_FILE, vq, s, eps) for s, eps in splits.items()}           # (E, T, L) per split
tokens = {s: episode_tokens(layout, split_codes[s], eps, lo, hi) for s, eps in splits.items()}   # (E, T * frame_len)

if args.stage == "mle" or (args.stage == "all" and start_model is None):
    start_model = run_mle(vq, layout, start_model)
    mle_path = MLE_FILE
else:
    mle_path = Path(args.init)
if args.stage in ("all", "rlvr"):
    try:
        lpips_net = load_lpips(args.lpips, args.device)
        reward_name = pick_reward(args.reward, lpips_net)
    except ValueError as e:
        fail(str(e))
    print0(f"reward: {reward_name}" + ("" if lpips_net else " (no LPIPS weights: --lpips=FILE enables mae+lpips)"))
    mle_model = copy.deepcopy(start_model)
    rl_model = run_rlvr(start_model, vq, layout, lpips_net, reward_name)
    if master:
        K = args.horizon if args.mode == "multi" else 1
        rows = {}
        for name, m in (("mle", mle_model), ("rlvr", rl_model)):
            with autocast:
                rows[name] = eval_video(m, vq, test_eps, split_codes["test"], lo, hi, args.context, K, lpips_net,
                                        grid_path=out_dir / f"grid_{name}.{'gif' if K > 1 else 'png'}",
                                        desc=f"test {name}")
                sampled = eval_video(m, vq, test_eps, split_codes["test"], lo, hi, args.context, K, lpips_net,
                                     temperature=1.0, seed=args.seed, desc=f"test {name} T=1")
            rows[name]["sampled"] = {k: sampled[k] for k in ("mae", "mse", "psnr", "ssim", "lpips", "mae_moving",
                                                              "repetition_rate", "temperature")}
            rows[name]["checkpoint"] = str(mle_path if name == "mle" else RL_FILE)
        atomic_write_text(out_dir / "eval.json", json.dumps(rows, indent=2) + "\n")
        print0(f"\nheld-out test episodes ({rows['mle']['n']} predicted frames, {args.mode}-step):")
        print_video_table(rows)
        print0("sampled at T=1: " + "; ".join(f"{k} mae {r['sampled']['mae']:.4f} ssim {r['sampled']['ssim']:.4f} "
                                               f"mae_moving {r['sampled']['mae_moving']:.4f}" for k, r in rows.items()))
        print0(f"wrote {out_dir / 'eval.json'}; total {(time.time() - t_start) / 60:.1f} min")
run.finish()
