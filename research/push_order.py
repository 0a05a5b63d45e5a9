"""
Where is the push lost? policy_eval's push check split by the direction the simulator pushes the block, with the
frames as they are and transposed:

    python research/push_order.py --models checkpoints/video_mle_4000.safetensors      # ~4 min on 1 core
Writes results/push_order/push_order.json (--json) and prints one table.

A GPT writes the next frame's 64 codes in raster order: row by row from the top, each row from the left. A block
pushed up or left lies before the gripper that pushes it in that order, so the GPT draws the block's new place before
it has drawn the gripper's; pushed down or right, the gripper comes first. The simulator's renderer is symmetric
under the transpose x <-> y (the shadows, the blocks' shading and the gripper's highlight all lie along the diagonal;
only the table's faint grain turns by 90 degrees), so the same transitions transposed, the action's two dimensions
swapped, are the same pushes drawn in another order: a push up is drawn as a push left, a push right as a push down.
Where a model's push follows the order it is drawn in rather than the direction it goes in the world, the order is
the layer that loses it.

The transitions are action_diagnosis's (policy_eval's check episodes: the 5 graded policies x --limit held-out scenes
x 15 steps); the pushes are those where the target block's true centre moves by more than MOVED_PX. Rows: the
tokenizer's reconstruction of the true next frame (the first model's tokenizer; it codes cells independently, so it
has no order) and each model's greedy prediction, as is and transposed. Per true push direction (the larger of the
displacement's two components): n, response (the predicted displacement projected on the true one, over the true,
as policy_eval.move_checks) and the end-position error in px; the JSON also splits the error along the true push
(along_px, signed: below 0 the block falls short; abs_along_px) and across it (across_px).
"""
import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root
from checkpoint import write_json  # noqa: E402
from data.robot.detect import locate_block  # noqa: E402
from research.action_diagnosis import (add_transition_args, reconstruct, transition_policies,  # noqa: E402
                                         transitions)
from research.policy_eval import MOVED_PX, load_world_model, mirror_each, predict_frames  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DIRECTIONS = ("up", "down", "left", "right")


def direction(t):
    """The direction of a displacement (x, y) in the frame (y points down): the larger of its two components."""
    if abs(t[1]) > abs(t[0]):
        return "up" if t[1] < 0 else "down"
    return "left" if t[0] < 0 else "right"


def transpose(frames):
    """(N, H, W, 3) frames with x and y swapped."""
    return np.ascontiguousarray(frames.transpose(0, 2, 1, 3))


def pushes(eps):
    """The transitions of episodes eps that push the target block (its true centre moves by more than MOVED_PX)
    -> context (N, H, W, 3), true next frame (N, H, W, 3), action (N, 1, D), block colours, push directions."""
    pushed = np.concatenate([np.hypot(*(ep["block"][1:] - ep["block"][:-1]).T) > MOVED_PX for ep in eps])
    ctx = np.concatenate([ep["image"][:-1] for ep in eps])[pushed]
    nxt = np.concatenate([ep["image"][1:] for ep in eps])[pushed]
    act = np.concatenate([ep["action"][:-1] for ep in eps])[pushed][:, None]
    colors = [c for ep in eps for c in [ep["color"]] * (len(ep["image"]) - 1)]
    moves = np.concatenate([ep["block"][1:] - ep["block"][:-1] for ep in eps])[pushed]
    return ctx, nxt, act, [c for c, k in zip(colors, pushed) if k], [direction(t) for t in moves]


def push_by_direction(ctx, nxt, pred, colors, directions):
    """Per true push direction (directions: one name per transition, of the world as it is), the push check of the
    frames given (ctx -> nxt true, pred predicted, all in the same view) -> {direction: dict(n, response, error_px,
    along_px, abs_along_px, across_px)}, and "all"."""
    rows = {d: [] for d in DIRECTIONS}
    for c, n, p, color, d in zip(ctx, nxt, pred, colors, directions):
        p0, p1, q = locate_block(c, color), locate_block(n, color), locate_block(p, color)
        if p0 is None or p1 is None:
            continue
        q = p0 if q is None else q                      # a prediction that lost the block: no motion
        t, e = p1 - p0, q - p1                          # the true move, the error of the predicted end
        u = t / np.hypot(*t)                            # the unit vector of the true push
        rows[d].append(((q - p0) @ u, np.hypot(*t), np.hypot(*e), e @ u, abs(e[0] * u[1] - e[1] * u[0])))
    rows["all"] = [r for d in list(rows) for r in rows[d]]
    out = {}
    for d, r in rows.items():
        r = np.array(r, np.float64).reshape(-1, 5)
        mean = (lambda x: float(x.mean())) if len(r) else (lambda x: None)
        out[d] = dict(n=len(r), response=float(r[:, 0].mean() / r[:, 1].mean()) if len(r) else None,
                      error_px=mean(r[:, 2]), along_px=mean(r[:, 3]), abs_along_px=mean(np.abs(r[:, 3])),
                      across_px=mean(r[:, 4]))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description="policy_eval's push check by push direction, as drawn and transposed",
                                allow_abbrev=False)
    p.add_argument("--models", nargs="+", required=True, help="world models of train_video.py")
    p.add_argument("--copy_gate", type=int, default=-1, choices=[-1, 0, 1],
                   help="-1: decode as each checkpoint records; 1: with the copy gate; 0: without")
    p.add_argument("--mirror", type=int, default=0, choices=[0, 1],
                   help="1: also a third view, every transition mirrored so that its action points right and down "
                        "(the frames of a model trained on research/mirror_data.py's transitions)")
    add_transition_args(p)
    p.add_argument("--json", default=str(ROOT / "results" / "push_order" / "push_order.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        policies = transition_policies(args)
        models = {}
        for path in args.models:
            models[path] = load_world_model(path, copy_gate=args.copy_gate)[0]
    except ValueError as e:
        sys.exit(f"error: {e}")

    # --- the pushes of the check episodes: context, true next frame, action, block colour, direction
    ctx, nxt, act, colors, dirs = pushes(transitions(policies, args.limit, args.length, args.seed)[0])

    # --- each row as is and transposed (frames x <-> y, the action's dimensions swapped)
    views = {"as is": (ctx, nxt, act), "transposed": (transpose(ctx), transpose(nxt), act[..., ::-1].copy())}
    if args.mirror:   # each transition mirrored so that its action points right and down
        views["mirrored"] = (mirror_each(ctx, act[:, 0]), mirror_each(nxt, act[:, 0]), np.abs(act))
    rows = {}
    first_vq = next(iter(models.values()))[1]
    rows["tokenizer reconstruction"] = {v: push_by_direction(c, n, reconstruct(first_vq, n, c), colors, dirs)
                                        for v, (c, n, a) in views.items()}
    for path, wm in models.items():
        rows[path] = {v: push_by_direction(c, n, predict_frames(wm, c, a, batch_size=args.batch_size)[:, 0],
                                           colors, dirs) for v, (c, n, a) in views.items()}

    # --- the table: response / end error per true push direction
    head = "".join(f"{d + ' (' + str(rows['tokenizer reconstruction']['as is'][d]['n']) + ')':>16}"
                   for d in (*DIRECTIONS, "all"))
    print(f"{len(ctx)} pushes of the target block; response / end error px per true push direction (n)")
    print(f"{'row':<58}{'view':<12}{head}")
    for name, r in rows.items():
        for view, cells in r.items():
            line = "".join(f"{c['response']:>9.2f} / {c['error_px']:4.2f}" if c["n"] else f"{'-':>16}"
                           for c in (cells[d] for d in (*DIRECTIONS, "all")))
            print(f"{name[-57:]:<58}{view:<12}{line}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, dict(rows=rows, policies=args.policies, scenes=args.limit, length=args.length,
                                   seed=args.seed, copy_gate=args.copy_gate, models=args.models))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
