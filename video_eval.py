"""
Evaluate a video world model of train_video.py on held-out episodes (the command line of data/robot/evaluate.py).

    python video_eval.py --ckpt=out/video/video_rlvr.safetensors [--mode=multi] [--json=OUT] [--grid=OUT.gif]
    python video_eval.py --tokenizer=checkpoints/video_cvq.safetensors [--mode=multi]   # a tokenizer's ceiling
    (also `python eval.py --task=video ...`, which forwards here)

Rollout (data/robot/task.rollout): a window is `context` true frames with their actions, then `horizon` predicted
frames: the GPT samples a frame's codes with the KV cache (`GPT.generate`), the next true action's tokens are appended
(injected, never sampled), and the next frame is sampled, and so on. Single-step is horizon 1. Predicted codes are
decoded with the true last context frame. The metrics and baselines are described in data/robot/evaluate.py.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from checkpoint import atomic_write_text
from data.robot.evaluate import (eval_video, load_video_model, print_video_table, to_float,  # noqa: F401
                                 tokenizer_ceiling, write_grid)
from data.robot.prepare import DATA_DIR, ensure_splits
from data.robot.task import clips, frame_codes, load_split, rollout  # noqa: F401  (importable from here, as before)
from rewards import load_lpips
from tokenizer_vq import load_vq


def main(argv=None):
    p = argparse.ArgumentParser(description="evaluate a video world model on held-out episodes")
    p.add_argument("--task", default="video", choices=["video"])
    p.add_argument("--ckpt", default=None, help="a world-model checkpoint of train_video.py")
    p.add_argument("--tokenizer", default=None, help="instead of --ckpt: a tokenizer file alone; prints its ceiling "
                                                     "(true frames encoded and decoded) against copy-last-frame")
    p.add_argument("--clip_len", type=int, default=16, help="clip length for --tokenizer (--ckpt: the checkpoint's)")
    p.add_argument("--horizon", type=int, default=7, help="predicted frames per window for --tokenizer --mode=multi")
    p.add_argument("--data", default=str(DATA_DIR), help="episode directory (default: the embedded robot data)")
    p.add_argument("--split", default="test")
    p.add_argument("--mode", default=None, choices=["single", "multi"], help="default: the checkpoint's")
    p.add_argument("--limit", type=int, default=0, help="first N episodes only (0 = all)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--lpips", default=None, help="LPIPS-VGG safetensors (bench/convert_lpips.py); else lpips is null")
    p.add_argument("--json", default=None)
    p.add_argument("--grid", default=None, help="write a .gif or .png grid here")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if (args.ckpt is None) == (args.tokenizer is None):
        p.error("give one of --ckpt (a world model) or --tokenizer (a tokenizer file)")
    if Path(args.data).resolve() == DATA_DIR.resolve():
        ensure_splits(DATA_DIR)
    if args.tokenizer:
        return ceiling_main(args)
    try:
        model, vq, meta = load_video_model(args.ckpt, args.device)
        a = meta["args"]
        episodes = clips(load_split(args.data, args.split, vq.config.size, args.limit), a.get("clip_len", 16))
        if not episodes:
            raise ValueError(f"no {args.split} episode has {a.get('clip_len', 16)} frames")
        mode = args.mode or a["mode"]
        res = eval_video(model, vq, episodes, None, np.array(a["action_lo"], np.float32),
                         np.array(a["action_hi"], np.float32), a["context"], a["horizon"] if mode == "multi" else 1,
                         load_lpips(args.lpips, args.device), temperature=args.temperature, grid_path=args.grid)
    except ValueError as e:
        sys.exit(f"error: {e}")
    print_video_table({Path(args.ckpt).name: res})
    if args.lpips is None:
        print("lpips: null (no --lpips weights given; see bench/convert_lpips.py)")
    if args.json:
        atomic_write_text(args.json, json.dumps(res, indent=2) + "\n")


def ceiling_main(args):
    """--tokenizer=FILE: the tokenizer's ceiling and copy-last-frame on the split, as a table (and --json)."""
    try:
        vq, _ = load_vq(args.tokenizer, args.device)
        episodes = clips(load_split(args.data, args.split, vq.config.size, args.limit), args.clip_len)
        if not episodes:
            raise ValueError(f"no {args.split} episode has {args.clip_len} frames")
    except ValueError as e:
        sys.exit(f"error: {e}")
    res = tokenizer_ceiling(vq, episodes, 1, args.horizon if args.mode == "multi" else 1)
    print(f"{Path(args.tokenizer).name} on {res['n']} {args.split} frames ({args.mode or 'single'}-step windows):")
    print(f"{'':<20}" + "".join(f"{c:>11}" for c in ("mae", "psnr", "ssim", "mae_moving")))
    for name in ("tokenizer_ceiling", "copy_last_frame"):
        print(f"{name:<20}" + "".join(f"{res[name][c]:>11.4f}" for c in ("mae", "psnr", "ssim", "mae_moving")))
    if args.json:
        atomic_write_text(args.json, json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
