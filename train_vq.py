"""
Train the video tokenizers on random crops of train frames; MLE and RLVR then see only their
codes. The models are in tokenizer_vq.py: a per-frame VQ-VAE, and a context-conditioned one
(CondVQVAE) that codes each predicted frame against the context frame, built on top of a
trained per-frame VQ.

    python train_vq.py                      # the per-frame VQ, then the context-conditioned one
    python train_vq.py --tokenizer=frame    # the per-frame VQ only
    python train_vq.py --vq=checkpoints/video_vq.safetensors   # cond, on a given per-frame VQ

train_video.py calls train_tokenizers for --stage=tokenizer and for a run from scratch, with
the same flags (add_flags): `python train_video.py --init=scratch` trains these tokenizers,
then the world model.

Writes to --out_dir (default out/video, where `train_video.py --stage=mle` looks):
video_vq.safetensors and video_cvq.safetensors (--tokenizer=cond), each with its held-out
statistics and the run's flags in its header, and a line of those statistics in log.jsonl.
While a tokenizer trains, video_vq_train / video_cvq_train.safetensors hold its resumable state
(weights, optimizer and RNG, every --ckpt_every steps), removed once the tokenizer is written:
a re-run resumes where it stopped, and reuses a finished tokenizer. This script records no
config.json: a finished tokenizer is reused whatever the flags, so give a new --out_dir for new
ones (train_video.py --stage=tokenizer records and checks its flags).

Training: Adam, 50 warm-up steps then cosine decay; loss = reconstruction MSE + the quantiser's
loss; the cond tokenizer adds L1 and weighs the pixels that changed from the context by
1 + --move_weight. With the codebook quantiser (vq) the codebook starts from the encoder outputs
of a first batch, and codes unused lately are re-seeded every 50 steps (dead-code restart),
except in the last 20% of the steps.
"""
import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors import safe_open
from tqdm import tqdm

from evaluate_video import to_float
from data.robot.prepare import DATA_DIR, ensure_splits
from data.robot.task import clips, episode_files, load_split
from rewards_video import mae, psnr, ssim
from runtime import Run, check_ranges, lr_at
from tokenizer_vq import (CondVQConfig, CondVQVAE, VQConfig, VQVAE, codebook_stats, load_vq,
                          save_vq)

# the tokenizer files in --out_dir (while one trains, <stem>_train.safetensors: train_file)
VQ_FILE, CVQ_FILE = "video_vq.safetensors", "video_cvq.safetensors"


# -----------------------------------------------------------------------------
# flags: the tokenizer flags' one home, shared with train_video.py

# the defaults of three flags both scripts have (train_video.py's take them from here): the
# tokenizers go where `train_video.py --stage=mle` looks for them; the cond tokenizer codes frames
# up to the multi-step horizon ahead of their context (paper: 7); a re-run continues from
# out_dir's checkpoints
OUT_DIR, HORIZON, RESUME = "out/video", 7, 1

def add_flags(p):
    """Add the tokenizer flags to parser `p` (this script's and train_video.py's)."""
    p.add_argument("--tokenizer", default="cond", choices=["cond", "frame"],
                   help="for a model trained from scratch: context-conditioned (predicted "
                        "frames coded against the context frame) or per-frame tokenizer")
    p.add_argument("--size", type=int, default=64, help="frame side (frames are resized to it)")
    p.add_argument("--clip_len", type=int, default=16,
                   help="episodes are cut into clips of this many frames")
    p.add_argument("--quantizer", default="vq", choices=["vq", "fsq"],
                   help="codebook (vq) or finite scalar (fsq)")
    p.add_argument("--n_codes", type=int, default=512, help="codebook size of each tokenizer")
    p.add_argument("--vq_steps", type=int, default=2500, help="per-frame tokenizer training steps")
    p.add_argument("--vq_minutes", type=float, default=0,
                   help="stop per-frame tokenizer training after this (0 = off)")
    p.add_argument("--vq_batch", type=int, default=32, help="per-frame tokenizer batch (crops)")
    p.add_argument("--vq_crop", type=int, default=32,
                   help="train on random crops of this side (multiple of 8)")
    p.add_argument("--vq_lr", type=float, default=1e-3,
                   help="tokenizer learning rate (both tokenizers)")
    p.add_argument("--cvq_steps", type=int, default=2000,
                   help="context-conditioned tokenizer training steps")
    p.add_argument("--cvq_minutes", type=float, default=0,
                   help="stop cond tokenizer training after this (0 = off)")
    p.add_argument("--cvq_batch", type=int, default=32,
                   help="cond tokenizer batch (pairs of crops)")
    p.add_argument("--cvq_crop", type=int, default=32,
                   help="cond tokenizer crop side (multiple of 8)")
    p.add_argument("--move_weight", type=float, default=10.0,
                   help="cond tokenizer loss weight on pixels that changed from the context "
                        "(static pixels weigh 1)")


def add_run_flags(p):
    """Add --train_limit and the system flags to parser `p` (this script's and train_video.py's)."""
    p.add_argument("--train_limit", type=int, default=0, help="train episodes to use (0 = all)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="autocast precision")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads; 1 is fastest for tiny models on 2 cores")
    p.add_argument("--seed", type=int, default=1337, help="seed of every random stream")
    p.add_argument("--ckpt_every", type=int, default=200,
                   help="steps between resumable checkpoints")
    p.add_argument("--on_nan", default="stop", choices=["stop", "skip"],
                   help="on a NaN/inf loss, reward or gradient: stop the run, or skip that step "
                        "(single process only)")


def check_flags(p, args):
    """Stop with one line naming the first tokenizer flag out of range."""
    check_ranges(p, args, at_least_1=("size", "n_codes", "vq_steps", "vq_batch", "vq_crop",
                                      "cvq_steps", "cvq_batch", "cvq_crop"),
                 at_least_0=("vq_minutes", "vq_lr", "cvq_minutes", "move_weight"))
    if args.clip_len < 2 or args.vq_crop > args.size or args.cvq_crop > args.size:
        p.error(f"need --clip_len >= 2 (got {args.clip_len}), --vq_crop and --cvq_crop <= --size "
                f"(got {args.vq_crop}, {args.cvq_crop} > {args.size})")
    if args.vq_crop % 8 or args.size % 8 or args.cvq_crop % 8:   # crops on the 8x8 code grid
        p.error("--vq_crop, --cvq_crop and --size must be multiples of 8 "
                "(the tokenizers' 8x downsampling)")


# -----------------------------------------------------------------------------
# data

def ensure_data(run):
    """--data must hold every split's .npz episodes (a folder per split, or one folder split by
    position: data/robot/task.episode_files), else the run stops with one line naming the folder
    and the missing splits. The embedded robot data is the exception: its folder is generated
    (~15 s, rank 0) when it holds no split."""
    data = Path(run.args.data)
    missing = [s for s in ("train", "val", "test") if not episode_files(data, s)]
    ours = data.resolve() == DATA_DIR.resolve()
    if missing and not ours:
        run.fail(f"--data {data}: no .npz episodes for {', '.join(missing)} (a folder per split "
                 f"of .npz episodes, or one folder of them)")
    run.barrier()   # every rank has looked before rank 0 writes
    if run.master and ours:
        try:   # every split if none is there, and action_stats.json
            ensure_splits(DATA_DIR)
        except ValueError as e:   # some splits there, not all
            run.fail(f"--data {data}: {e}")
    run.barrier()   # the other ranks wait for rank 0's files


def load_clips(run, limits):
    """Each split's episodes (the first limits[split], 0 = all) from --data, resized to --size
    and cut into clips of --clip_len frames: dicts of image (T, H, W, 3) uint8, action (T, D)
    float and background (H, W, 3) or None -> [train, val, test] clips. Under torchrun each rank
    reads its share of the train episodes only (every world-th from its rank's), the held-out
    splits whole. A bad episode file or an empty split stops the run with one line."""
    args = run.args
    try:
        splits = [clips(load_split(args.data, split, args.size, n,
                                   *((run.rank, run.world) if split == "train" else (0, 1))),
                        args.clip_len)
                  for split, n in limits.items()]
    except ValueError as e:   # a bad episode file: one line naming it
        run.fail(str(e))
    if not all(splits):
        run.fail(f"{args.data}: some split has no episode of >= --clip_len={args.clip_len} frames")
    return splits


def as_frames(episodes):
    """Clips' images as one tensor (E, T, 3, H, W) uint8."""
    return torch.from_numpy(np.stack([ep["image"] for ep in episodes])).permute(0, 1, 4, 2, 3)


def crop_batch(frames, g, batch, crop, grid, max_gap, device):
    """Random (frame, context) pairs of train clips, cropped alike. frames: (E, T, 3, H, W)
    uint8. max_gap = 0: the context is unused (the frame itself); else frame t + k against
    context t, k in 1..max_gap. -> x, ctx (batch, 3, crop, crop) float in [0, 1] on `device`;
    the crops start on the code grid (multiples of `grid` pixels)."""
    E, T, side = frames.shape[0], frames.shape[1], frames.shape[-1]   # square frames
    e = torch.randint(E, (batch,), generator=g)                          # a random clip per pair
    # the gap k between context and target: 1..max_gap frames (the cond tokenizer codes frames
    # up to the horizon ahead), or 0 for the per-frame tokenizer (it rebuilds the frame itself)
    if max_gap:
        k = torch.randint(1, max_gap + 1, (batch,), generator=g)
    else:
        k = torch.zeros(batch, dtype=torch.long)
    t = (torch.rand(batch, generator=g) * (T - k)).long()   # context frame t, target t + k
    # one crop offset for the whole batch, on the code grid
    oy, ox = (grid * torch.randint((side - crop) // grid + 1, (2,), generator=g)).tolist()
    x = frames[e, t + k, :, oy:oy + crop, ox:ox + crop].float().div(255)   # the targets
    ctx = frames[e, t, :, oy:oy + crop, ox:ox + crop].float().div(255)     # their contexts
    return x.to(device), ctx.to(device)


# -----------------------------------------------------------------------------
# training

def read_header(run, path):
    """The JSON header of a tokenizer file, or a one-line failure naming it."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return json.loads((f.metadata() or {}).get("nanorlvr", "{}"))
    except Exception as e:   # safetensors raises its own error types
        run.fail(f"{path}: not a readable tokenizer checkpoint ({e}); "
                 f"pass --resume=0 or another --out_dir")


def train_file(final):
    """Where the tokenizer `final` keeps its resumable state: <stem>_train.safetensors."""
    return final.with_name(final.stem + "_train" + final.suffix)


def train_tokenizer(run, vq, steps, minutes, batch, state):
    """Fit a tokenizer (VQVAE or CondVQVAE) on batch(g) -> (x, ctx) pairs for `steps` steps or
    `minutes` (0: no limit), checkpointing to `state` -> (steps done, minutes). Loss:
    reconstruction MSE + quantiser loss; the cond tokenizer adds L1 and weighs changed pixels
    by 1 + --move_weight, so the few pixels that move (which its codes are for) are not
    drowned by the static background."""
    args = run.args
    cond = isinstance(vq, CondVQVAE)
    # each rank, and each tokenizer, draws its own crops
    g = torch.Generator().manual_seed(args.seed + run.rank + (100 if cond else 0))
    if args.quantizer == "vq":   # codebook from encoder outputs (DDP copies rank 0's)
        with torch.no_grad():
            z = vq.encode(*batch(g))                        # (B, code_dim, h, w) latents
            every_code = torch.ones(args.n_codes, dtype=torch.bool)
            vq.quantizer.restart(z.permute(0, 2, 3, 1).flatten(0, 2), every_code)
            vq.quantizer.initialised.fill_(True)            # so the forward pass keeps it
    _, trained = run.wrap(vq)                               # DDP under torchrun
    params = [p for p in vq.parameters() if p.requires_grad]   # cond: its frame VQ is frozen
    opt = torch.optim.Adam(params, lr=args.vq_lr)
    name = "cond_tokenizer" if cond else "tokenizer"   # the stage's name in logs and messages
    step, _ = run.resume_stage(state, vq, opt, g, name)   # 0, or where a killed run stopped
    t0 = time.time()
    bar = tqdm(total=steps, initial=step, desc=name, disable=not run.master)
    while step < steps:
        for group in opt.param_groups:                      # 50 warm-up steps, then cosine
            group["lr"] = lr_at(step, steps, args.vq_lr, 50)
        x, ctx = batch(g)                                   # (B, 3, crop, crop) each
        with run.autocast:
            rec, qloss, _ = trained(x, ctx)                 # reconstruction, quantiser loss, codes
        err = rec.float() - x                               # (B, 3, crop, crop)
        if cond:   # weight 1 on static pixels, 1 + move_weight where the frame left its context
            moved = (x - ctx).abs().amax(1, keepdim=True) > 0.05
            w = 1 + args.move_weight * moved.float()
            loss = (w * (err.square() + err.abs())).mean() + qloss
        else:
            loss = err.square().mean() + qloss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if run.finite(name, step, vq, loss):   # a NaN/inf stops, or skips the step (--on_nan)
            opt.step()
        step += 1
        # dead-code restart: codes unused lately are re-seeded with this batch's latents (not
        # in the last 20%, so the final codebook settles)
        if args.quantizer == "vq" and step % 50 == 0 and step < 0.8 * steps:
            with torch.no_grad():
                z = vq.encode(x, ctx).permute(0, 2, 3, 1).flatten(0, 2)   # (B*h*w, code_dim)
            n_dead = vq.quantizer.restart_dead(z)
            if run.ddp:                                     # every rank keeps rank 0's codebook
                dist.broadcast(vq.quantizer.codebook.data, 0)
                dist.broadcast(vq.quantizer.usage, 0)
            bar.set_postfix(loss=f"{loss.item():.5f}", restarted=n_dead)
        bar.update(1)
        run.save_stage(state, vq, opt, step, {}, g, done=False)   # every --ckpt_every steps
        # the wall-clock budget: every rank stops at the same step
        if run.any_rank(bool(minutes and time.time() - t0 > 60 * minutes)):
            run.print0(f"{name}: stopping after {minutes} minutes at step {step}")
            break
    bar.close()
    return step, (time.time() - t0) / 60


def finish_tokenizer(run, vq, final, stats):
    """Log the held-out stats, write the final file, drop the resumable one."""
    run.log({"stage": "cond_tokenizer" if isinstance(vq, CondVQVAE) else "tokenizer", **stats})
    if run.master:
        save_vq(final, vq, {**stats, "done": True, "args": run.recorded_args()})
        state = train_file(final)
        for f in (state, state.with_suffix(".json")):   # nothing left to resume
            f.unlink(missing_ok=True)
    run.barrier()


def frame_tokenizer(run, train_eps, held_eps, final):
    """The per-frame VQ at `final`: reused if complete, else trained on train_eps and checked
    on every frame of held_eps -> its path."""
    args = run.args
    if args.resume and final.is_file() and read_header(run, final).get("done"):
        run.print0(f"tokenizer: {final} is complete, reusing it")
        return final
    frames = as_frames(train_eps)                                   # (E, T, 3, H, W)
    config = VQConfig(size=args.size, quantizer=args.quantizer, n_codes=args.n_codes)
    vq = VQVAE(config).to(args.device)

    def batch(g):   # crops of single frames (no context)
        return crop_batch(frames, g, args.vq_batch, args.vq_crop, 8, 0, args.device)

    step, minutes = train_tokenizer(run, vq, args.vq_steps, args.vq_minutes, batch,
                                    train_file(final))
    vq.eval()
    # held-out check: every held-out frame encoded and decoded whole (the model saw crops)
    held = np.concatenate([ep["image"] for ep in held_eps])         # (N, H, W, 3)
    with torch.no_grad():
        codes = vq.tokenize(held)                                   # (N, 64)
        rec = vq.detokenize(codes).cpu()                            # (N, 3, H, W)
    stats = dict(psnr_heldout=float(psnr(rec, to_float(held)).mean()),
                 **codebook_stats(codes, vq.config.n_codes), n_codes=vq.config.n_codes,
                 steps=step, minutes=minutes)
    run.print0(f"tokenizer: held-out PSNR {stats['psnr_heldout']:.2f} dB on {len(held)} frames, "
               f"{stats['used']}/{stats['n_codes']} codes used, "
               f"perplexity {stats['perplexity']:.1f}")
    finish_tokenizer(run, vq, final, stats)
    return final


def cond_tokenizer(run, frame_vq_path, train_eps, val_eps, final):
    """The context-conditioned tokenizer at `final`, on top of a per-frame VQ (its context
    codes): reused if complete, else trained on train_eps and checked on val_eps -> its path."""
    args = run.args
    if args.resume and final.is_file() and read_header(run, final).get("done"):
        run.print0(f"tokenizer: {final} is complete, reusing it")
        return final
    frame_vq, _ = load_vq(frame_vq_path)
    if isinstance(frame_vq, CondVQVAE):
        run.fail(f"{frame_vq_path}: a cond tokenizer; --vq must name a per-frame one")
    vq = CondVQVAE(CondVQConfig(size=args.size, quantizer=args.quantizer, n_codes=args.n_codes,
                                frame=asdict(frame_vq.config)))
    vq.frame.load_state_dict(frame_vq.state_dict())   # context codes: the per-frame VQ's, frozen
    vq.frame.requires_grad_(False)
    vq = vq.to(args.device)
    frames = as_frames(train_eps)                       # (E, T, 3, H, W)
    gap = min(args.horizon, args.clip_len - 1)          # targets up to the horizon ahead

    def batch(g):   # crops of (frame t + k, context frame t) pairs
        return crop_batch(frames, g, args.cvq_batch, args.cvq_crop, 8, gap, args.device)

    step, minutes = train_tokenizer(run, vq, args.cvq_steps, args.cvq_minutes, batch,
                                    train_file(final))
    vq.eval()
    # held-out check: every next val frame coded against its previous frame and decoded,
    # against copying that frame
    held = as_frames(val_eps).float() / 255
    ctx, x = held[:, :-1].flatten(0, 1), held[:, 1:].flatten(0, 1)   # each frame, its context
    with torch.no_grad():
        codes = vq.tokenize(x, ctx)                                  # (N, L) the frames' codes
        rec = vq.detokenize(codes, ctx).cpu()                        # (N, 3, H, W)
    stats = dict(psnr_heldout=float(psnr(rec, x).mean()), mae_heldout=float(mae(rec, x).mean()),
                 ssim_heldout=float(ssim(rec, x).mean()), copy_mae=float(mae(ctx, x).mean()),
                 copy_ssim=float(ssim(ctx, x).mean()), **codebook_stats(codes, vq.config.n_codes),
                 n_codes=vq.config.n_codes, steps=step, minutes=minutes)
    run.print0(f"cond tokenizer: next val frame reconstructed MAE {stats['mae_heldout']:.4f} "
               f"SSIM {stats['ssim_heldout']:.4f} PSNR {stats['psnr_heldout']:.2f} "
               f"(copy-last-frame MAE {stats['copy_mae']:.4f} SSIM {stats['copy_ssim']:.4f}); "
               f"{stats['used']}/{stats['n_codes']} codes used")
    finish_tokenizer(run, vq, final, stats)
    return final


def train_tokenizers(run, train_eps, val_eps, test_eps):
    """The per-frame VQ (or the given --vq), then with --tokenizer=cond the context-conditioned
    one on top of it, in run.out_dir -> the path of the tokenizer a world model uses."""
    args = run.args
    if args.vq == "auto":   # checked on every val and test frame
        vq_path = frame_tokenizer(run, train_eps, val_eps + test_eps, run.out_dir / VQ_FILE)
    else:
        vq_path = Path(args.vq)
    if args.tokenizer == "cond":
        vq_path = cond_tokenizer(run, vq_path, train_eps, val_eps, run.out_dir / CVQ_FILE)
    return vq_path


# -----------------------------------------------------------------------------
# the script: the flags train_video.py would pass on, with its defaults

def main():
    p = argparse.ArgumentParser(description="train the video tokenizers of train_video.py",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--data", default=str(DATA_DIR),
                   help="episode .npz directory (the embedded data is generated when its folder "
                        "holds no split)")
    p.add_argument("--out_dir", default=OUT_DIR,
                   help="the tokenizers go here (train_video.py's default --out_dir)")
    p.add_argument("--vq", default="auto",
                   help="auto: train a per-frame VQ; else the per-frame VQ a cond tokenizer uses")
    p.add_argument("--resume", type=int, default=RESUME,
                   help="1: continue from out_dir's checkpoints")
    add_flags(p)
    p.add_argument("--horizon", type=int, default=HORIZON,
                   help="train_video.py's multi-step horizon: the cond tokenizer codes frames "
                        "up to this many ahead of their context")
    add_run_flags(p)
    args = p.parse_args()
    check_ranges(p, args, at_least_1=("horizon", "threads", "ckpt_every"),
                 at_least_0=("train_limit",))
    check_flags(p, args)
    # torchrun ranks, --device checked, threads, seeds, autocast, log.jsonl
    run = Run(args, args.out_dir, path_flags=("data", "out_dir", "vq"))
    ensure_data(run)
    train_eps, val_eps, test_eps = load_clips(run, {"train": args.train_limit, "val": 0, "test": 0})
    if run.master:   # the data is good: from here on the run writes
        run.out_dir.mkdir(parents=True, exist_ok=True)
    run.print0(f"data: {len(train_eps)} train / {len(val_eps)} val / {len(test_eps)} test clips "
               f"of {args.clip_len} frames, resized to {args.size}x{args.size}")
    run.print0(f"wrote {train_tokenizers(run, train_eps, val_eps, test_eps)}")
    run.finish()


if __name__ == "__main__":
    main()
