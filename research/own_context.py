"""
The robot data's transitions with a world model's own prediction as the context:

    python research/own_context.py --ckpt=out/ft_mirror3/video_mle.safetensors --mirror=1 \
        --src=out/robot4000 --out=out/own2000 --train=2000      # ~10 minutes on 1 core
Writes a data folder of 2-frame episodes for train_video.py --mode=single --clip_len=2.

Chained one frame at a time, a world model that was only ever shown true frames as context meets its own: a block
the gripper touches comes out a little smeared, the smear is re-encoded as the next context, and it grows until the
block is gone (policy_eval.py's `block_found`). Here the model predicts frame t + 1 of every training episode from
the true frame t (sampled at --temperature, as policy_eval imagines), and the transition (its frame t + 1, action
t + 1) -> the true frame t + 2 is kept: trained on it, the GPT learns to draw the true next frame from its own
drawing, the clean block where its last frame had smeared it.

The train split holds, for each of the first --train episodes of --src, the 14 transitions from its own frames and
(--clean=1) the episode's 15 true transitions, as research/mirror_data.py cuts them; val and test hold the true
transitions only, so validation losses compare with mirror_data.py's. --mirror=1: a model trained on mirror_data.py's
mirrored transitions predicts in its mirrored view (policy_eval.predict_frames), and every transition is mirrored so
its action points right and down.
"""
import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root
from data.robot.task import episode_files, read_npz  # noqa: E402
from research.mirror_data import cut  # noqa: E402
from research.policy_eval import load_world_model, predict_frames  # noqa: E402


def own_transitions(wm, eps, temperature, generator, batch_size, mirror_it):
    """Episodes -> their transitions (the model's frame t + 1 from the true frame t, action t + 1) -> the true frame
    t + 2, as 2-frame episodes (research/mirror_data.cut)."""
    ctx = np.concatenate([ep["image"][:-2] for ep in eps])                          # true frames t
    act = np.concatenate([ep["action"][:-2] for ep in eps])[:, None]                # and their actions
    pred = predict_frames(wm, ctx, act, temperature, generator, batch_size)[:, 0]   # the model's frames t + 1
    out, k = [], 0
    for ep in eps:
        for t in range(len(ep["image"]) - 2):
            pair = dict(ep, image=np.stack([pred[k], ep["image"][t + 2]]), action=ep["action"][t + 1:t + 3])
            out += cut(pair, mirror_it)
            k += 1
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description="transitions whose context is a world model's own predicted frame",
                                allow_abbrev=False)
    p.add_argument("--ckpt", required=True, help="a single-step world model of train_video.py")
    p.add_argument("--mirror", type=int, default=0, choices=[0, 1],
                   help="1: the model predicts in mirror_data.py's view, and every transition is mirrored")
    p.add_argument("--copy_gate", type=int, default=1, choices=[0, 1], help="decode with the copy gate")
    p.add_argument("--src", required=True, help="a data folder of data/robot/prepare.py")
    p.add_argument("--out", required=True, help="the new data folder (must not exist)")
    p.add_argument("--train", type=int, default=0, help="the first N train episodes (0: all)")
    p.add_argument("--clean", type=int, default=1, choices=[0, 1], help="1: also the true transitions")
    p.add_argument("--temperature", type=float, default=1.0, help="the model's sampling (0: greedy)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--episodes_per_batch", type=int, default=50, help="episodes predicted at once")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    src, out = Path(args.src), Path(args.out)
    if out.exists():
        sys.exit(f"error: --out={out} exists")
    if not (src / "action_stats.json").is_file():
        sys.exit(f"error: --src={src} has no action_stats.json (make it with data/robot/prepare.py)")
    if args.temperature < 0:
        sys.exit(f"error: --temperature must be >= 0, got {args.temperature}")
    try:
        wm, _ = load_world_model(args.ckpt, copy_gate=args.copy_gate, mirrored=args.mirror)
    except ValueError as e:
        sys.exit(f"error: --ckpt={e}")
    gen = torch.Generator().manual_seed(args.seed)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    for split, n in (("train", args.train), ("val", 0), ("test", 0)):
        (tmp / split).mkdir(parents=True)
        files, k = episode_files(src, split)[:n or None], 0
        for s in range(0, len(files), args.episodes_per_batch):
            eps = [read_npz(f) for f in files[s:s + args.episodes_per_batch]]
            cuts = own_transitions(wm, eps, args.temperature, gen, args.batch_size, args.mirror) \
                if split == "train" else []
            if split != "train" or args.clean:
                cuts += [c for ep in eps for c in cut(ep, args.mirror)]
            for c in cuts:
                np.savez(tmp / split / f"{k:06d}.npz", **c)
                k += 1
            print(f"\r{split}: {min(s + args.episodes_per_batch, len(files))}/{len(files)} episodes, {k} "
                  f"transitions", end="", flush=True)
        print()
    shutil.copy(src / "action_stats.json", tmp / "action_stats.json")
    tmp.rename(out)                              # whole or not at all
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
