"""Draw truth against the predictions of video world models on a few held-out windows, as a PNG (or animated GIF).

    python tools/video_grid.py --models mle=checkpoints/video_cond_mle.safetensors \
        rlvr=out/video/video_rlvr.safetensors --out=docs/img/video_grid.png
    python tools/video_grid.py --models mle=A rlvr=B --out=grid.gif --mode=multi   # one GIF frame per predicted step

One row per test window; columns: the last context frame (= copy-last-frame's prediction), the true next frame,
then each model's greedy prediction (in --models order), then the errors |prediction - truth| x 3 (black = exact)
of copy-last-frame and of each model. The windows are the --n test windows whose truth changes the most pixels (the gripper pushing a block), so
the grid shows what the models do where it matters, not the static table. All models must share one tokenizer
and window layout (they do when one was post-trained from the other).
"""
import argparse
import sys
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from data.robot.evaluate import MOVE_TOL, load_video_model, to_float  # noqa: E402
from data.robot.prepare import DATA_DIR, ensure_splits  # noqa: E402
from data.robot.task import Layout, clips, frame_codes, load_split, rollout, tokenize_split, windows  # noqa: E402


def moving_windows(episodes, context, horizon, n):
    """The n windows (clip, first frame) of eval_video's grid whose true future frames differ from the last
    context frame in the most pixels, most first (ties: the earlier window)."""
    T = len(episodes[0]["image"])
    scored = []
    for e, ep in enumerate(episodes):
        img = ep["image"].astype(np.int16)                                       # (T, H, W, 3)
        for t in range(0, T - context - horizon + 1, horizon):
            diff = np.abs(img[t + context:t + context + horizon] - img[t + context - 1]).max(-1)   # (K, H, W)
            scored.append((-int((diff > 255 * MOVE_TOL).sum()), e, t))
    return [(e, t) for _, e, t in sorted(scored)[:n]]


@torch.no_grad()
def predict(model, vq, episodes, picks, lo, hi, context, horizon):
    """Greedy predicted frames of `model` on windows `picks` -> (N, K, 3, H, W) float in [0, 1]."""
    model.eval()
    layout = Layout.of(vq, episodes[0]["action"].shape[1])
    sub = [episodes[e] for e, _ in picks]                                        # only the clips we draw
    tokens = tokenize_split(vq, sub, horizon, layout, lo, hi)
    seq = windows(tokens, layout, list(range(len(sub))), [t for _, t in picks], context, horizon)   # (N, n)
    P, FL, L = layout.prompt_len(context), layout.frame_len, layout.L
    acts = seq[:, P:P + (horizon - 1) * FL].view(len(picks), horizon - 1, FL)[:, :, L:]   # the true later actions
    out, _, _ = rollout(model, seq[:, :P].tolist(), acts, horizon, L, 0.0)               # greedy rollouts
    codes = frame_codes(out, layout, horizon)                                            # (N, K, L)
    ctx = torch.stack([to_float(ep["image"][t + context - 1]) for ep, (_, t) in zip(sub, picks)])   # (N, 3, H, W)
    frames = vq.detokenize(codes.flatten(0, 1), ctx.repeat_interleave(horizon, 0)).cpu()           # (N*K, 3, H, W)
    return frames.view(len(picks), horizon, *frames.shape[1:])


def grid_images(ctx, truth, preds, scale):
    """ctx (N, 3, H, W), truth (N, K, 3, H, W), preds: list of (N, K, 3, H, W) -> K uint8 images (rows = windows)."""
    images = []
    for k in range(truth.shape[1]):
        rows = []
        for i in range(len(ctx)):
            cells = [ctx[i], truth[i, k]] + [p[i, k] for p in preds]
            guesses = [ctx[i]] + [p[i, k] for p in preds]                                # copy, then the models
            cells += [((g - truth[i, k]).abs() * 3).clamp(0, 1) for g in guesses]        # error maps
            gap = torch.ones(3, ctx.shape[-2], 2)                                        # white 2-pixel gutters
            rows.append(torch.cat([x for c in cells for x in (c, gap)][:-1], 2))
        img = torch.cat([x for r in rows for x in (r, torch.ones(3, 2, r.shape[-1]))][:-1], 1)
        img = (img.permute(1, 2, 0).numpy() * 255 + 0.5).astype(np.uint8)
        images.append(img.repeat(scale, 0).repeat(scale, 1))                             # nearest-neighbour zoom
    return images


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", required=True, help="name=checkpoint pairs, drawn in this order")
    p.add_argument("--out", required=True, help=".png (the last predicted step) or .gif (every step)")
    p.add_argument("--data", default=str(DATA_DIR), help="episode directory (default: the embedded robot data)")
    p.add_argument("--split", default="test")
    p.add_argument("--mode", default=None, choices=["single", "multi"], help="default: the first checkpoint's")
    p.add_argument("--n", type=int, default=4, help="windows (rows) to draw")
    p.add_argument("--scale", type=int, default=3, help="pixel zoom")
    args = p.parse_args()
    torch.set_num_threads(1)
    pairs = [m.split("=", 1) for m in args.models]
    if any(len(m) != 2 for m in pairs) or args.n < 1 or args.scale < 1:
        p.error("--models takes name=checkpoint pairs; --n and --scale must be >= 1")
    if Path(args.data).resolve() == DATA_DIR.resolve():
        ensure_splits(DATA_DIR)
    try:
        loaded = [(name, *load_video_model(path)) for name, path in pairs]         # (name, GPT, tokenizer, meta)
    except (ValueError, OSError) as e:
        sys.exit(f"error: --models: {e}")
    a = loaded[0][3]["args"]                                                      # window layout of the first model
    horizon = a["horizon"] if (args.mode or a["mode"]) == "multi" else 1
    lo, hi = np.array(a["action_lo"], np.float32), np.array(a["action_hi"], np.float32)
    episodes = clips(load_split(args.data, args.split, a["size"]), a["clip_len"])
    picks = moving_windows(episodes, a["context"], horizon, args.n)
    preds = [predict(m, vq, episodes, picks, lo, hi, a["context"], horizon) for _, m, vq, _ in loaded]
    ctx = torch.stack([to_float(episodes[e]["image"][t + a["context"] - 1]) for e, t in picks])
    truth = torch.stack([to_float(episodes[e]["image"][t + a["context"]:t + a["context"] + horizon])
                         for e, t in picks])                                      # (N, K, 3, H, W)
    images = grid_images(ctx, truth, preds, args.scale)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if args.out.endswith(".gif"):
        imageio.mimsave(args.out, images, duration=0.6, loop=0)
    else:
        imageio.imwrite(args.out, images[-1])
    names = " | ".join(n for n, _ in pairs)
    print(f"wrote {args.out}: {len(picks)} {args.split} windows (clip, frame) {picks}; columns: context | truth | "
          f"{names} | error of copy | {names}")
    for name, pr in zip([n for n, _ in pairs], preds):   # the drawn windows' MAE, to read the picture against
        print(f"  {name}: MAE {float((pr - truth).abs().mean()):.4f} on these windows "
              f"(copy-last-frame {float((ctx[:, None] - truth).abs().mean()):.4f})")


if __name__ == "__main__":
    main()
