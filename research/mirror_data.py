"""
The robot data cut into single transitions, each mirrored so that its action points right and down:

    python research/mirror_data.py --src=out/robot4000 --out=out/mirror2000 --train=2000     # 20 seconds
    python research/mirror_data.py --src=out/robot4000 --out=out/plain2000 --train=2000 --mirror=0

A GPT writes a frame's codes row by row from the top, each row from the left, so a block pushed up or left is drawn
before the gripper that pushes it (research/push_order.py measures what that costs). Mirrored so that every action
points right and down, every push is drawn after its gripper. The world is symmetric under the mirrors but for its
light: the shadows, the blocks' shading and the gripper's highlight come from the top left, and mirrored frames show
them from another corner, so a model must learn those frames (train_video.py --mode=single --clip_len=2 on the
output). --mirror=0 cuts the same transitions without mirroring: the control.

Each transition t -> t + 1 of the first --train episodes of --src's train split (all of val and test) becomes a
2-frame episode (image, background, action with a zero second row; the episode's success and noise kept), in the
layout of data/robot/prepare.py; action_stats.json is copied, so the action bins stay --src's.
"""
import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root
from data.robot.task import episode_files, read_npz  # noqa: E402


def mirror(frames, action):
    """Frames (..., H, W, 3) of one transition mirrored so that its action (x, y) points right and down: left-right
    where x < 0, upside down where y < 0 (research/push_order.py scores models in this view too)."""
    if action[0] < 0:
        frames = frames[..., :, ::-1, :]
    if action[1] < 0:
        frames = frames[..., ::-1, :, :]
    return np.ascontiguousarray(frames)


def cut(ep, mirror_it):
    """An episode -> its transitions as 2-frame episodes, each mirrored so its action points right and down."""
    out = []
    for t in range(len(ep["image"]) - 1):
        img, bg, a = ep["image"][t:t + 2], ep["background"], ep["action"][t]
        if mirror_it:                            # the action's turned components turn positive
            img, bg, a = mirror(img, a), mirror(bg, a), np.abs(a)
        out.append(dict(image=np.ascontiguousarray(img), background=np.ascontiguousarray(bg),
                        action=np.stack([a, np.zeros_like(a)]), success=ep["success"], noise=ep["noise"]))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description="the robot data as single transitions mirrored so actions point right "
                                            "and down", allow_abbrev=False)
    p.add_argument("--src", required=True, help="a data folder of data/robot/prepare.py")
    p.add_argument("--out", required=True, help="the new data folder (must not exist)")
    p.add_argument("--train", type=int, default=0, help="the first N train episodes (0: all)")
    p.add_argument("--mirror", type=int, default=1, choices=[0, 1], help="0: the same transitions, not mirrored")
    args = p.parse_args(argv)
    src, out = Path(args.src), Path(args.out)
    if out.exists():
        sys.exit(f"error: --out={out} exists")
    if not (src / "action_stats.json").is_file():
        sys.exit(f"error: --src={src} has no action_stats.json (make it with data/robot/prepare.py)")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    for split, n in (("train", args.train), ("val", 0), ("test", 0)):
        (tmp / split).mkdir(parents=True)
        k = 0
        for f in episode_files(src, split)[:n or None]:
            for ep in cut(read_npz(f), args.mirror):
                np.savez(tmp / split / f"{k:06d}.npz", **ep)
                k += 1
        print(f"{split}: {k} transitions")
    shutil.copy(src / "action_stats.json", tmp / "action_stats.json")
    tmp.rename(out)                              # whole or not at all
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
