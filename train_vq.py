"""
Train the video tokenizer (tokenizer_vq.VQVAE, per frame; the research's context-conditioned one is
research/cond_tokenizer.py) on random crops of train frames; MLE and RLVR then see only its codes.

    python train_vq.py                      # out/video/video_vq.safetensors
    python train_vq.py --steps=3 --n_codes=32 --out_dir=/tmp/vq   # a tiny one, for tests

train_video.py calls frame_tokenizer (--stage=tokenizer) with TokenizerConfig's defaults, or
`--vq=FILE` uses one trained here: --out_dir/video_vq.safetensors, its held-out statistics and the
flags in its header. While it trains, video_vq_train.safetensors holds its resumable state (every
--ckpt_every steps): a re-run resumes, and reuses a finished tokenizer.
"""
import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from checkpoint import recorded_args, resume_stage, save_stage
from data.robot.prepare import DATA_DIR, ensure_splits
from data.robot.task import clips, episode_files, load_split, to_float
from runtime import Run, check_ranges, lr_at
from tokenizer_vq import VQConfig, VQVAE, codebook_stats, load_vq, save_vq
from video_rewards import psnr

VQ_FILE = "video_vq.safetensors"   # the tokenizer file in --out_dir
OUT_DIR, RESUME, SIZE = "out/video", 1, 64   # train_video.py's too: --out_dir, --resume, frame side


@dataclass
class TokenizerConfig:
    """How the tokenizer trains (this script's flags): Adam at `lr`, `steps` steps (or `minutes`,
    0: no limit) of `batch` random crops of side `crop` (a multiple of 8: on the code grid)."""
    n_codes: int = 512      # codebook size
    steps: int = 2500
    minutes: float = 0
    batch: int = 32
    crop: int = 32
    lr: float = 1e-3


def add_run_flags(add):
    """--train_limit and the system flags, added with `add` (add_argument; train_video.py's too)."""
    add("--train_limit", type=int, default=0, help="train episodes to use (0 = all)")
    add("--device", default="cpu", help="cpu | cuda | cuda:N")
    add("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
        help="autocast precision")
    add("--threads", type=int, default=1, help="torch CPU threads (1: fastest for tiny models)")
    add("--seed", type=int, default=1337, help="seed of every random stream")
    add("--ckpt_every", type=int, default=200, help="steps between resumable checkpoints")


# -----------------------------------------------------------------------------
# data

def ensure_data(run):
    """--data must hold every split's .npz episodes, else the run stops naming the missing splits;
    the embedded robot data's are generated (~15 s, rank 0)."""
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


def load_clips(run, clip_len, test_limit=0):
    """[train, val, test] clips of `clip_len` frames from --data resized to SIZE (data/robot/task's
    dicts). Under torchrun a rank reads every world-th train episode, the held-out splits whole."""
    limits = {"train": run.args.train_limit, "val": 0, "test": test_limit}   # episodes (0: all)
    try:
        splits = [clips(load_split(run.args.data, split, SIZE, n,
                                   *((run.rank, run.world) if split == "train" else (0, 1))),
                        clip_len)
                  for split, n in limits.items()]
    except ValueError as e:   # a bad episode file: one line naming it
        run.fail(str(e))
    if not all(splits):
        run.fail(f"{run.args.data}: some split has no episode of >= {clip_len} frames")
    return splits


def crop_batch(frames, g, batch, crop, device, grid=8):
    """Random grid-aligned crops (batch, 3, crop, crop) in [0, 1] of frames (E, T, 3, H, W)."""
    E, T, side = frames.shape[0], frames.shape[1], frames.shape[-1]   # square frames
    e = torch.randint(E, (batch,), generator=g)                          # a random clip each
    t = (torch.rand(batch, generator=g) * T).long()                     # a random frame each
    oy, ox = (grid * torch.randint((side - crop) // grid + 1, (2,), generator=g)).tolist()
    return frames[e, t, :, oy:oy + crop, ox:ox + crop].float().div(255).to(device)


# -----------------------------------------------------------------------------
# training

def train_tokenizer(run, vq, cfg, batch, state):
    """Fit `vq` on batch(g) -> crops, checkpointing to `state` -> (steps done, minutes)."""
    g = torch.Generator().manual_seed(run.args.seed + run.rank)   # each rank draws its own crops
    with torch.no_grad():   # the codebook from encoder outputs (DDP copies rank 0's)
        z = vq.encode(batch(g)).permute(0, 2, 3, 1).flatten(0, 2)   # (B*h*w, code_dim) latents
        vq.quantizer.restart(z, torch.ones(cfg.n_codes, dtype=torch.bool))
        vq.quantizer.initialised.fill_(True)                # so the forward pass keeps it
    _, trained = run.wrap(vq)                               # DDP under torchrun
    opt = torch.optim.Adam(vq.parameters(), lr=cfg.lr)
    step, _ = resume_stage(run, state, vq, opt, g, "tokenizer")   # 0, or where a run stopped
    t0 = time.time()
    bar = tqdm(total=cfg.steps, initial=step, desc="tokenizer", disable=not run.master)
    while step < cfg.steps:
        for group in opt.param_groups:                      # 50 warm-up steps, then cosine
            group["lr"] = lr_at(step, cfg.steps, cfg.lr, 50)
        x = batch(g)                                        # (B, 3, crop, crop)
        with run.autocast:
            rec, qloss, _ = trained(x)                      # reconstruction, quantiser loss, codes
        loss = (rec.float() - x).square().mean() + qloss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if run.finite("tokenizer", step, vq, loss):   # a NaN/inf stops the run
            opt.step()
        step += 1
        # dead-code restart: codes unused lately are re-seeded with this batch's latents (not
        # in the last 20%, so the final codebook settles)
        if step % 50 == 0 and step < 0.8 * cfg.steps:
            with torch.no_grad():
                z = vq.encode(x).permute(0, 2, 3, 1).flatten(0, 2)   # (B*h*w, code_dim)
            n_dead = vq.quantizer.restart_dead(z)
            if run.ddp:                                     # every rank keeps rank 0's codebook
                dist.broadcast(vq.quantizer.codebook.data, 0)
                dist.broadcast(vq.quantizer.usage, 0)
            bar.set_postfix(loss=f"{loss.item():.5f}", restarted=n_dead)
        bar.update(1)
        save_stage(run, state, vq, opt, step, {}, g, done=False)   # every --ckpt_every steps
        # the wall-clock budget: every rank stops at the same step
        if run.any_rank(bool(cfg.minutes and time.time() - t0 > 60 * cfg.minutes)):
            run.print0(f"tokenizer: stopping after {cfg.minutes} minutes at step {step}")
            break
    bar.close()
    return step, (time.time() - t0) / 60


def frame_tokenizer(run, cfg, train_eps, held_eps, final):
    """The per-frame VQ at `final`: reused if complete, else trained and checked on held_eps."""
    if run.args.resume and final.is_file() and run.or_fail(load_vq, final)[1].get("done"):
        run.print0(f"tokenizer: {final} is complete, reusing it")
        return final
    state = final.with_name(final.stem + "_train" + final.suffix)   # its resumable state
    frames = torch.from_numpy(np.stack([ep["image"] for ep in train_eps])).permute(0, 1, 4, 2, 3)
    vq = VQVAE(VQConfig(size=SIZE, n_codes=cfg.n_codes)).to(run.device)
    step, minutes = train_tokenizer(
        run, vq, cfg, lambda g: crop_batch(frames, g, cfg.batch, cfg.crop, run.device), state)
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
               f"{stats['used']}/{cfg.n_codes} codes used, perplexity {stats['perplexity']:.1f}")
    run.log({"stage": "tokenizer", **stats})
    if run.master:   # the final file; nothing left to resume
        save_vq(final, vq, {**stats, "done": True, "args": recorded_args(run)})
        for f in (state, state.with_suffix(".json")):
            f.unlink(missing_ok=True)
    run.barrier()
    return final


# -----------------------------------------------------------------------------
# the script

def main():
    p = argparse.ArgumentParser(description="train the video tokenizer of train_video.py",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                allow_abbrev=False)
    add = p.add_argument
    add("--data", default=str(DATA_DIR), help="episode .npz directory (ours generated if empty)")
    add("--out_dir", default=OUT_DIR, help="the tokenizer goes here (train_video.py's too)")
    add("--resume", type=int, default=RESUME, help="1: continue from out_dir's checkpoint")
    add("--clip_len", type=int, default=16, help="episodes are cut into clips of this many frames")
    for name, kind, what in (("n_codes", int, "codebook size"), ("steps", int, "training steps"),
                             ("minutes", float, "stop after this wall-clock (0 = off)"),
                             ("batch", int, "crops per step"),
                             ("crop", int, "crop side (a multiple of 8)"),
                             ("lr", float, "peak learning rate (cosine decay)")):
        add(f"--{name}", type=kind, default=getattr(TokenizerConfig, name), help=what)
    add_run_flags(add)
    args = p.parse_args()
    check_ranges(p, args, at_least_1=("clip_len", "n_codes", "steps", "batch", "crop", "threads",
                                      "ckpt_every"), at_least_0=("minutes", "lr", "train_limit"))
    if args.crop % 8 or args.crop > SIZE or args.clip_len < 2:
        p.error(f"--crop must be a multiple of 8 and <= {SIZE}, --clip_len >= 2")
    # torchrun ranks, --device checked, threads, seeds, autocast, log.jsonl
    run = Run(args, args.out_dir, path_flags=("data", "out_dir"))
    ensure_data(run)
    train_eps, val_eps, test_eps = load_clips(run, args.clip_len)
    if run.master:   # the data is good: from here on the run writes
        run.out_dir.mkdir(parents=True, exist_ok=True)
    run.print0(f"data: {len(train_eps)} train / {len(val_eps)} val / {len(test_eps)} test clips "
               f"of {args.clip_len} frames, resized to {SIZE}x{SIZE}")
    cfg = TokenizerConfig(**{k: getattr(args, k) for k in TokenizerConfig.__dataclass_fields__})
    final = frame_tokenizer(run, cfg, train_eps, val_eps + test_eps, run.out_dir / VQ_FILE)
    run.print0(f"wrote {final}")
    run.finish()


if __name__ == "__main__":
    main()
