"""
Video world model: rollouts (single- and multi-step) and held-out evaluation with baselines and reward-hacking checks.

    python video_eval.py --ckpt=out/video/video_rlvr.safetensors [--mode=multi] [--json=OUT] [--grid=OUT.gif]
    (also `python eval.py --task=video ...`, which forwards here)

Rollout. A window is `context` true frames with their actions, then `horizon` predicted frames: the GPT samples a
frame's L codes with the KV cache (`GPT.generate`), we append the next true action's tokens (injected, never sampled)
and sample the next frame, and so on. Single-step is horizon 1. Each frame is one `generate` call on the grown prompt:
re-running the prompt costs one batched forward pass per frame, far less than the L sequential decoding steps, and
keeps model.py's sampler unchanged.

What is reported (`eval_video`), all on decoded pixels against the *true* frames, averaged over predicted frames:
- mse, mae, psnr, ssim, lpips (null without LPIPS weights), and repetition_rate (rewards.py).
- copy_last_frame: the same metrics for the baseline that repeats the last context frame. On a mostly static scene
  it is strong on whole-frame metrics, so we also report every model on the pixels that truly move:
  mae_moving = MAE over pixels where the true frame differs from the last context frame by > 0.1 in some channel.
- tokenizer_ceiling: the metrics of the tokenizer's own reconstruction of the true frame, the best a model that
  predicts codes can do; whole-frame numbers above it are impossible, differences below it are the model's.
- objects (when episodes carry their `background`): pixels differing from the bare table by > 0.15, in the truth and
  in the prediction, and object_recall = share of the truth's object pixels where the prediction also shows something.
  A reward-hacking model that erases objects to lower MAE shows object pixels and recall falling.
"""
import argparse
import json
import sys
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import torch
from tqdm import tqdm

from checkpoint import atomic_write_text, load_model
from data.robot.prepare import DATA_DIR, ensure_splits
from data.robot.task import Layout, action_bins, clips, load_split
from tokenizer_vq import load_vq
from rewards import load_lpips, mae, mse, psnr, repetition_rate, ssim

MOVE_TOL, OBJECT_TOL = 0.1, 0.15


def load_video_model(path, device="cpu"):
    """A world-model checkpoint of train_video.py -> (GPT, tokenizer, meta). The tokenizer is named in the meta,
    relative to the checkpoint's folder."""
    path = Path(path)
    model, meta = load_model(path, device)
    a = meta["args"]
    if "vq" not in a or "action_lo" not in a:
        raise ValueError(f"{path}: not a video world-model checkpoint (no tokenizer or action bins in its metadata)")
    vq, _ = load_vq(path.parent / a["vq"], device)
    return model, vq, meta


def episode_tokens(layout, codes, episodes, lo, hi):
    """codes (E, T, L) -> (E, T * frame_len) long: every frame's codes followed by its action's tokens."""
    E, T, L = codes.shape
    acts = np.stack([layout.action_tokens(action_bins(ep["action"], lo, hi)) for ep in episodes])   # (E, T, D)
    return torch.cat([codes, torch.from_numpy(acts)], 2).reshape(E, -1)


def rollout(model, prompts, actions, horizon, L, temperature, generator=None):
    """Predict `horizon` frames of L codes after each prompt, injecting actions (N, horizon - 1, D) token ids between
    them. -> tokens (N, horizon * L + (horizon - 1) * D), their log-probs (0 for injected), sampled mask."""
    seqs = [list(p) for p in prompts]
    toks, lps, sampled = [], [], []
    for k in range(horizon):
        tok, lp = model.generate(seqs, L, temperature=temperature, generator=generator)
        toks.append(tok)
        lps.append(lp)
        sampled.append(torch.ones_like(tok, dtype=torch.bool))
        if k < horizon - 1:
            act = actions[:, k].to(tok.device)
            toks.append(act)
            lps.append(torch.zeros(act.shape, device=tok.device))
            sampled.append(torch.zeros_like(act, dtype=torch.bool))
            seqs = [s + t + a for s, t, a in zip(seqs, tok.tolist(), act.tolist())]
    return torch.cat(toks, 1), torch.cat(lps, 1), torch.cat(sampled, 1)


def frame_codes(tokens, layout, horizon):
    """Rollout tokens (N, ...) -> (N, horizon, L) codes; a sampled non-visual token becomes code 0."""
    t = torch.as_tensor(tokens)
    out = torch.stack([t[:, k * layout.frame_len:k * layout.frame_len + layout.L] for k in range(horizon)], 1)
    return torch.where((out >= 0) & (out < layout.K), out, torch.zeros_like(out))


def to_float(frames):
    """uint8 (..., H, W, 3) array -> float tensor (..., 3, H, W) in [0, 1]."""
    return torch.from_numpy(np.ascontiguousarray(frames)).movedim(-1, -3).float() / 255


def metrics(pred, true, lpips_net):
    row = dict(mse=mse(pred, true), mae=mae(pred, true), psnr=psnr(pred, true), ssim=ssim(pred, true))
    if lpips_net is not None:
        row["lpips"] = torch.cat([lpips_net(pred[i:i + 64], true[i:i + 64]) for i in range(0, len(pred), 64)])
    return row


@torch.no_grad()
def eval_video(model, vq, episodes, codes, lo, hi, context, horizon, lpips_net=None, batch_size=64,
               temperature=0.0, seed=0, grid_path=None, desc="eval"):
    """Evaluate on windows starting every `horizon` frames of each episode. codes: (E, T, L) true-frame codes."""
    model.eval()
    layout = Layout(vq.config.n_codes, vq.config.codes_per_frame, episodes[0]["action"].shape[1])
    FL, L = layout.frame_len, layout.L
    E, T, _ = codes.shape
    tokens = episode_tokens(layout, codes, episodes, lo, hi)
    wins = [(e, t) for e in range(E) for t in range(0, T - context - horizon + 1, horizon)]
    g = torch.Generator().manual_seed(seed)
    acc = {k: [] for k in ("pred", "copy", "ceiling")}
    moving = {k: [0.0, 0.0] for k in acc}
    objects = dict(truth=0.0, pred=0.0, hit=0.0, n=0)
    reps, grid = [], []
    for s in tqdm(range(0, len(wins), batch_size), desc=desc, leave=False, disable=desc is None):
        batch = wins[s:s + batch_size]
        prompts = [tokens[e, t * FL:(t + context) * FL].tolist() for e, t in batch]
        acts = torch.stack([tokens[e, (t + context) * FL:(t + context + horizon - 1) * FL].view(horizon - 1, FL)[:, L:]
                            for e, t in batch]) if horizon > 1 else None
        out, _, _ = rollout(model, prompts, acts, horizon, L, temperature, g)
        pc = frame_codes(out, layout, horizon)                                           # (B, K, L)
        device = pc.device
        B = len(batch)
        pred = vq.detokenize(pc.flatten(0, 1)).cpu()                                     # (B*K, 3, H, W)
        true = torch.stack([to_float(episodes[e]["image"][t + context:t + context + horizon]) for e, t in batch])
        ctx = torch.stack([to_float(episodes[e]["image"][t + context - 1]) for e, t in batch])
        ceil = vq.detokenize(torch.stack([codes[e, t + context:t + context + horizon] for e, t in batch])
                             .flatten(0, 1).to(device)).cpu()
        tf, cf = true.flatten(0, 1), ctx[:, None].expand_as(true).flatten(0, 1)
        mask = ((tf - cf).abs().amax(1, keepdim=True) > MOVE_TOL).float()
        for name, x in (("pred", pred), ("copy", cf), ("ceiling", ceil)):
            acc[name].append(metrics(x, tf, lpips_net))
            moving[name][0] += float(((x - tf).abs() * mask).sum())
            moving[name][1] += float(mask.sum() * 3)
        if episodes[0]["background"] is not None:
            bg = torch.stack([to_float(episodes[e]["background"]) for e, _ in batch])[:, None]
            bg = bg.expand_as(true).flatten(0, 1)
            ot = (tf - bg).abs().amax(1) > OBJECT_TOL
            op = (pred - bg).abs().amax(1) > OBJECT_TOL
            objects["truth"] += float(ot.sum())
            objects["pred"] += float(op.sum())
            objects["hit"] += float((ot & op).sum())
            objects["n"] += ot.numel()
        last_codes = codes[[e for e, _ in batch], [t + context - 1 for _, t in batch]]           # (B, L)
        reps.append(repetition_rate(pc.cpu(), last_codes, true, ctx))
        if len(grid) < 6:
            grid += [(ctx[i], true[i], pred.view(B, horizon, *pred.shape[1:])[i]) for i in range(min(6 - len(grid), B))]

    def summary(name):
        rows = acc[name]
        res = {k: float(torch.cat([r[k] for r in rows]).mean()) for k in rows[0]}
        res.setdefault("lpips", None)
        res["mae_moving"] = moving[name][0] / max(moving[name][1], 1)
        return res

    res = dict(summary("pred"), n=sum(len(r["mae"]) for r in acc["pred"]), n_windows=len(wins), context=context,
               horizon=horizon, temperature=temperature, repetition_rate=float(torch.cat(reps).mean()),
               copy_last_frame=summary("copy"), tokenizer_ceiling=summary("ceiling"))
    if objects["n"]:
        res["objects"] = dict(pixels_truth=objects["truth"] / objects["n"], pixels_pred=objects["pred"] / objects["n"],
                              recall=objects["hit"] / max(objects["truth"], 1))
    if grid_path:
        write_grid(grid, grid_path)
    return res


def write_grid(rows, path):
    """rows: (context (3,H,W), truth (K,3,H,W), prediction (K,3,H,W)) -> one image per predicted step with
    columns context | truth | prediction | |error| x 3; a .gif animates the K steps, a .png shows the last step."""
    frames = []
    for k in range(rows[0][1].shape[0]):
        lines = [torch.cat([c, t[k], p[k], ((t[k] - p[k]).abs() * 3).clamp(0, 1)], 2) for c, t, p in rows]
        img = torch.cat(lines, 1).permute(1, 2, 0).numpy()
        frames.append((img * 255 + 0.5).astype(np.uint8).repeat(2, 0).repeat(2, 1))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    if str(path).endswith(".gif"):
        imageio.mimsave(path, frames, duration=0.5, loop=0)
    else:
        imageio.imwrite(path, frames[-1])


def print_video_table(rows, file=sys.stdout):
    """rows: name -> eval_video dict; baselines are printed from the first row."""
    cols = ("mae", "mse", "psnr", "ssim", "lpips", "mae_moving")
    print(f"{'model':<22}" + "".join(f"{c:>11}" for c in cols) + f"{'repeat':>8}{'obj.recall':>11}", file=file)

    def line(name, r, rep="", rec=""):
        vals = "".join(f"{'-':>11}" if r.get(c) is None else f"{r[c]:>11.4f}" for c in cols)
        print(f"{name:<22}{vals}{rep:>8}{rec:>11}", file=file)

    for name, r in rows.items():
        rec = f"{r['objects']['recall']:.3f}" if "objects" in r else "-"
        line(name, r, f"{r['repetition_rate']:.3f}", rec)
    first = next(iter(rows.values()))
    line("copy-last-frame", first["copy_last_frame"])
    line("tokenizer ceiling", first["tokenizer_ceiling"])


def main(argv=None):
    p = argparse.ArgumentParser(description="evaluate a video world model on held-out episodes")
    p.add_argument("--task", default="video", choices=["video"])
    p.add_argument("--ckpt", required=True, help="a world-model checkpoint of train_video.py")
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
    try:
        model, vq, meta = load_video_model(args.ckpt, args.device)
        a = meta["args"]
        if Path(args.data).resolve() == DATA_DIR.resolve():
            ensure_splits(DATA_DIR)
        episodes = clips(load_split(args.data, args.split, vq.config.size, args.limit), a.get("clip_len", 16))
        if not episodes:
            raise ValueError(f"no {args.split} episode has {a.get('clip_len', 16)} frames")
        codes = torch.stack([vq.tokenize(ep["image"]) for ep in episodes]).cpu()
        mode = args.mode or a["mode"]
        res = eval_video(model, vq, episodes, codes, np.array(a["action_lo"], np.float32),
                         np.array(a["action_hi"], np.float32), a["context"], a["horizon"] if mode == "multi" else 1,
                         load_lpips(args.lpips, args.device), temperature=args.temperature, grid_path=args.grid)
    except ValueError as e:
        sys.exit(f"error: {e}")
    print_video_table({Path(args.ckpt).name: res})
    if args.lpips is None:
        print("lpips: null (no --lpips weights given; see bench/convert_lpips.py)")
    if args.json:
        atomic_write_text(args.json, json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
