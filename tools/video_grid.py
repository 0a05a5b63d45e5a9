"""Draw truth against the predictions of video world models on a few held-out windows, as a PNG (or animated GIF).

    python tools/video_grid.py --models mle=checkpoints/video_cond_mle.safetensors \
        rlvr=out/video/video_rlvr.safetensors --out=out/video_grid.png
    python tools/video_grid.py --models mle=A rlvr=B --out=grid.gif --mode=multi   # one GIF frame per predicted step

One row per test window; columns: the last context frame (= copy-last-frame's prediction), the true next frame,
then each model's greedy prediction (in --models order), then the errors |prediction - truth| x 3 (black = exact)
of copy-last-frame and of each model. The windows are the --n test windows whose truth changes the most pixels (the gripper pushing a block), so
the grid shows what the models do where it matters, not the static table. All models must share one tokenizer
and window layout (they do when one was post-trained from the other).

Labels: a header row names the columns (context, truth, the model names, "err copy", "err <model>"),
a label at the left of each row names its window (clip, first frame), and the top-left corner the
predicted step drawn (step k/K: a GIF has one frame per step), in a built-in 5x7 font, in capitals.
"""
import argparse
import sys
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from data.robot.prepare import DATA_DIR, ensure_splits  # noqa: E402
from data.robot.task import (Layout, clips, frame_codes, load_split, rollout, to_float, tokenize_split,  # noqa: E402
                             windows)
from video_eval import load_video_model  # noqa: E402
from video_rewards import MOVE_TOL  # noqa: E402


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


# A 5x7 bitmap font for the labels, so that drawing text needs numpy only: each glyph is 7 rows of 5
# pixels, a row one hex byte whose bit 4 is the leftmost pixel ("A" starts .###. then #...#).
FONT = {
    " ": "00000000000000", "A": "0e11111f111111", "B": "1e11111e11111e", "C": "0e11101010110e",
    "D": "1c12111111121c", "E": "1f10101e10101f", "F": "1f10101e101010", "G": "0e11101711110f",
    "H": "1111111f111111", "I": "0e04040404040e", "J": "0702020202120c", "K": "11121418141211",
    "L": "1010101010101f", "M": "111b1515111111", "N": "11111915131111", "O": "0e11111111110e",
    "P": "1e11111e101010", "Q": "0e11111115120d", "R": "1e11111e141211", "S": "0f10100e01011e",
    "T": "1f040404040404", "U": "1111111111110e", "V": "11111111110a04", "W": "1111111515150a",
    "X": "11110a040a1111", "Y": "11110a04040404", "Z": "1f01020408101f", "0": "0e11131519110e",
    "1": "040c040404040e", "2": "0e11010204081f", "3": "1f02040201110e", "4": "02060a121f0202",
    "5": "1f101e0101110e", "6": "0608101e11110e", "7": "1f010204080808", "8": "0e11110e11110e",
    "9": "0e11110f01020c", "_": "0000000000001f", "-": "0000001f000000", "+": "0004041f040400",
    "|": "04040404040404", ".": "00000000000c0c", "/": "00010204081000", ":": "000c0c000c0c00",
    "=": "00001f001f0000", "?": "0e110102040004"
}
GLYPH_W, GLYPH_H = 5, 7


def glyph(ch):
    """The (7, 5) bool pixels of character `ch`, in capitals; '?' for one the font lacks."""
    code = FONT.get(ch.upper(), FONT["?"])
    rows = [int(code[i:i + 2], 16) for i in range(0, 2 * GLYPH_H, 2)]
    return np.array([[(r >> (GLYPH_W - 1 - j)) & 1 for j in range(GLYPH_W)] for r in rows], bool)


def text_block(lines, height, width, px):
    """A white (height, width, 3) uint8 block with `lines` of black text from its top left, each
    font pixel drawn as px x px, one font pixel of margin and spacing; what does not fit is cut."""
    out = np.full((height, width, 3), 255, np.uint8)
    for r, line in enumerate(lines):
        for c, ch in enumerate(line):
            y, x = px * (1 + r * (GLYPH_H + 2)), px * (1 + c * (GLYPH_W + 1))
            pixels = glyph(ch).repeat(px, 0).repeat(px, 1)[:max(height - y, 0), :max(width - x, 0)]
            out[y:y + pixels.shape[0], x:x + pixels.shape[1]][pixels] = 0
    return out


def labelled(image, columns, rows, corner, frame_hw, scale):
    """One image of grid_images with a header row naming its `columns` and, at its left, each
    row's label `rows[i]` (a list of lines); `corner` goes above the row labels. frame_hw: (H, W) of
    a frame before the zoom. The image is unchanged, below the header and right of the labels."""
    px, gap = scale, 2 * scale                     # the font grows with the zoom, as the gutters do
    H, W = frame_hw[0] * scale, frame_hw[1] * scale
    head = px * (GLYPH_H + 3)                      # one line of text and its margins
    longest = max(len(s) for s in [corner, *(line for lines in rows for line in lines)])
    left = px * (4 + (GLYPH_W + 1) * longest)      # room for the longest row label or the corner

    def white(h, w):
        return np.full((h, w, 3), 255, np.uint8)

    top = [text_block([corner], head, left, px)]
    for i, name in enumerate(columns):             # a name over each frame, white over the gutters
        top += [white(head, gap)] * (i > 0) + [text_block([name], head, W, px)]
    side = []
    for i, lines in enumerate(rows):
        side += [white(gap, left)] * (i > 0) + [text_block(lines, H, left, px)]
    body = np.concatenate([np.concatenate(side, 0), image], 1)
    return np.concatenate([np.concatenate(top, 1), body], 0)


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


def grid(loaded, episodes, context, horizon, lo, hi, n, scale):
    """The labelled grid of `loaded` [(name, GPT, tokenizer)] on the n windows of `episodes` whose truth moves the
    most (moving_windows) -> (one uint8 image per predicted step, the windows (clip, first frame), the MAE of each
    model and of "copy" (copy-last-frame) on them)."""
    picks = moving_windows(episodes, context, horizon, n)
    preds = [predict(m, vq, episodes, picks, lo, hi, context, horizon) for _, m, vq in loaded]
    ctx = torch.stack([to_float(episodes[e]["image"][t + context - 1]) for e, t in picks])
    truth = torch.stack([to_float(episodes[e]["image"][t + context:t + context + horizon])
                         for e, t in picks])                                      # (N, K, 3, H, W)
    names = [name for name, _, _ in loaded]
    columns = ["context", "truth", *names, "err copy", *(f"err {name}" for name in names)]
    rows = [[f"clip {e}", f"frame {t}"] for e, t in picks]
    images = [labelled(img, columns, rows, f"step {k + 1}/{horizon}", ctx.shape[-2:], scale)
              for k, img in enumerate(grid_images(ctx, truth, preds, scale))]
    maes = {name: float((pr - truth).abs().mean()) for name, pr in zip(names, preds)}
    return images, picks, maes | {"copy": float((ctx[:, None] - truth).abs().mean())}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
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
    try:   # the models first: a bad file stops before any data is generated
        loaded = [(name, *load_video_model(path)) for name, path in pairs]         # (name, GPT, tokenizer, meta)
    except (ValueError, OSError) as e:
        sys.exit(f"error: --models: {e}")
    a = loaded[0][3]["args"]                                                      # window layout of the first model
    horizon = a["horizon"] if (args.mode or a["mode"]) == "multi" else 1
    lo, hi = np.array(a["action_lo"], np.float32), np.array(a["action_hi"], np.float32)
    try:
        if Path(args.data).resolve() == DATA_DIR.resolve():   # the embedded data, generated on first use
            ensure_splits(DATA_DIR)
        episodes = clips(load_split(args.data, args.split, a["size"]), a["clip_len"])
    except (ValueError, OSError) as e:
        sys.exit(f"error: --data: {e}")
    images, picks, maes = grid([(n, m, vq) for n, m, vq, _ in loaded], episodes, a["context"], horizon,
                               lo, hi, args.n, args.scale)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if args.out.endswith(".gif"):
        imageio.mimsave(args.out, images, duration=0.6, loop=0)
    else:
        imageio.imwrite(args.out, images[-1])
    names = [n for n, _ in pairs]
    print(f"wrote {args.out}: {len(picks)} {args.split} windows (clip, frame) {picks}; columns: context | truth | "
          f"{' | '.join(names)} | error of copy | {' | '.join(names)}")
    for name in names:   # the drawn windows' MAE, to read the picture against
        print(f"  {name}: MAE {maes[name]:.4f} on these windows (copy-last-frame {maes['copy']:.4f})")


if __name__ == "__main__":
    main()
