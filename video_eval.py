"""
Evaluate video world models on held-out episodes (train_video.py's final comparison; the command
line is also `python eval.py --task=video`):

    python video_eval.py --ckpt=out/video/video_rlvr.safetensors --official=1 --grid=g.gif

`eval_video` rolls a world model out on the split's windows, greedy or sampled as EvalSpec says,
decodes against the true last context frame and reports, averaged over predicted frames, against
the *true* frames:
- mse, mae, psnr, ssim, lpips (null without LPIPS weights), and repetition_rate (video_rewards.py);
- mae_moving: MAE on the pixels that truly move (> MOVE_TOL from the last context frame), where
  copy_last_frame, strong on whole frames of a mostly static scene, is weak;
- copy_last_frame and tokenizer_ceiling (the true frames' own codes decoded): the baselines;
- objects and action_effect (episodes with a `background`, the embedded robot data): object pixels
  (> OBJECT_TOL from the bare table) and object_recall, which falls when a model erases objects to
  lower MAE; action_response, how the predicted gripper follows the true move
  (data/robot/detect.gripper_response: 1 right, 0 no motion);
- per_record: one entry per window in a fixed order (mae, ssim, repetition, changed, and the
  action effects), for the paired differences between models (eval.py's paired statistics).
--official=1 adds the paper's protocol (T=1, top-k 100) under "sampled".
"""
import argparse
import sys
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import torch
from tqdm import tqdm

from checkpoint import load_model, write_json
from data.robot.prepare import DATA_DIR, ensure_splits
from data.robot.task import (EFFECTS, Layout, clips, frame_codes, load_split, object_report,
                             object_scores, rollout, to_float, tokenize_split, windows)
from runtime import check_device, check_ranges, fork_map
from stats import paired_diffs, print_diffs, print_rows
from tokenizer_vq import load_vq
from video_rewards import MOVE_TOL, load_lpips, mae, mse, psnr, repetition_rate, ssim


# RLVR-World's video evaluation protocol: sampled at T=1, top-k 100
OFFICIAL = dict(temperature=1.0, top_k=100)


@dataclass
class EvalSpec:
    """Which windows eval_video scores and how it samples: the action bins (lo, hi per dimension),
    `context` true frames then `horizon` predicted ones, greedy (temperature 0) or sampled (top_k:
    only the k likeliest codes) from a generator seeded by `seed`, `batch_size` windows at once."""
    lo: np.ndarray
    hi: np.ndarray
    context: int = 1
    horizon: int = 1
    temperature: float = 0.0
    top_k: int = None
    seed: int = 0
    batch_size: int = 64


def load_video_model(path, device="cpu", copy_gate=-1):
    """A world-model checkpoint of train_video.py -> (GPT, tokenizer, meta). The tokenizer is named
    in the meta, relative to the checkpoint's folder. copy_gate 1 / 0: the tokenizer decodes with /
    without its copy gate; -1: as the model was trained."""
    path = Path(path)
    model, meta = load_model(path, device)
    a = meta["args"]
    if "vq" not in a or "action_lo" not in a:
        raise ValueError(f"{path}: not a video world-model checkpoint "
                         "(no tokenizer or action bins in its metadata)")
    vq, _ = load_vq(path.parent / a["vq"], device)
    # the decoding the model was trained with, unless forced
    vq.copy_gate = bool(a.get("copy_gate", 0) if copy_gate < 0 else copy_gate)
    return model, vq, meta


def frame_scores(x, true, mask, lpips_net):
    """Score frames x (N, 3, H, W) against the true frames -> (per frame mse, mae, psnr, ssim (and
    lpips with its network); their absolute error on the moving pixels (mask: (N, 1, H, W)) and
    the count of those pixel values, summed over batches for mae_moving = error / count)."""
    row = dict(mse=mse(x, true), mae=mae(x, true), psnr=psnr(x, true), ssim=ssim(x, true))
    if lpips_net is not None:   # in chunks of 64 frames (the VGG's memory)
        row["lpips"] = torch.cat([lpips_net(x[i:i + 64], true[i:i + 64])
                                  for i in range(0, len(x), 64)])
    return row, float(((x - true).abs() * mask).sum()), float(mask.sum() * 3)


@torch.no_grad()
def eval_video(model, vq, episodes, tokens, spec, lpips_net=None, grid_path=None, desc="eval",
               share=None, position=None):
    """Evaluate on windows starting every `horizon` frames of each clip, as EvalSpec `spec` says.
    tokens: the split's tokens (data/robot/task.tokenize_split, with at least `horizon` future
    frames), or None to compute them here. share (greedy only; e.g. runtime.rank_map: the torchrun
    ranks): computes the batches, as map(score, batches) would; they are summed up in order, so the
    result is the same whoever computed them. desc: the bar's name (None: none), on line
    `position` (a forked worker's)."""
    if share and spec.temperature > 0:
        raise ValueError("eval_video: sampled batches draw from one stream, in order; not shared")
    model.eval()
    layout = Layout.of(vq, episodes[0]["action"].shape[1])
    tokens = tokens or tokenize_split(vq, episodes, spec.horizon, layout, spec.lo, spec.hi)
    E, T = tokens["actions"].shape[:2]
    # the windows: (clip, first context frame), every `horizon` frames
    wins = [(e, t) for e in range(E)
            for t in range(0, T - spec.context - spec.horizon + 1, spec.horizon)]
    g = torch.Generator().manual_seed(spec.seed)
    # score(s): the batch of windows from wins[s] on -> its part of the sums
    score = partial(score_windows, model, vq, episodes, tokens, layout, spec, g, lpips_net, wins)
    bar = tqdm(range(0, len(wins), spec.batch_size), desc=desc, leave=False, disable=desc is None,
               position=position)
    parts = list((share or map)(score, bar))              # the batches' parts, summed in order
    if grid_path:   # the first 6 windows
        write_grid(sum((p["grid"] for p in parts), []), grid_path)
    return video_result(parts, wins, spec)


def score_windows(model, vq, episodes, tokens, layout, spec, g, lpips_net, wins, s):
    """eval_video's windows wins[s:s + batch_size] rolled out from their context (sampling from
    g), decoded and scored -> their part of the sums."""
    batch = wins[s:s + spec.batch_size]
    context, horizon, B = spec.context, spec.horizon, len(batch)
    P, FL, L = layout.prompt_len(context), layout.frame_len, layout.L
    seq = windows(tokens, layout, [e for e, _ in batch], [t for _, t in batch], context,
                  horizon)                                                 # (B, n)
    # roll out: the model writes each frame's codes, the true actions are injected between
    acts = seq[:, P:P + (horizon - 1) * FL].view(B, horizon - 1, FL)[:, :, L:]
    out, _, _ = rollout(model, seq[:, :P].tolist(), acts, horizon, L, spec.temperature, g,
                        spec.top_k)
    pc = frame_codes(out, layout, horizon)            # (B, K, L) predicted codes
    tc = frame_codes(seq[:, P:], layout, horizon)     # (B, K, L) the true frames' codes
    # decode against the true last context frame and compare pixels with the true frames
    true = torch.stack([to_float(episodes[e]["image"][t + context:t + context + horizon])
                        for e, t in batch])
    ctx = torch.stack([to_float(episodes[e]["image"][t + context - 1])
                       for e, t in batch])                                 # (B, 3, H, W)
    tf, cf = true.flatten(0, 1), ctx[:, None].expand_as(true).flatten(0, 1)  # (B*K, 3, H, W)
    pred = vq.detokenize(pc.flatten(0, 1).to(pc.device), cf).cpu()
    ceil = vq.detokenize(tc.flatten(0, 1).to(pc.device), cf).cpu()
    mask = ((tf - cf).abs().amax(1, keepdim=True) > MOVE_TOL).float()     # (B*K, 1, H, W)
    part = dict(changed=mask.view(B, -1).amax(1) > 0,
                rows={name: frame_scores(x, tf, mask, lpips_net)
                      for name, x in (("pred", pred), ("copy", cf), ("ceiling", ceil))})
    # the embedded robot data (a bare table per clip): the objects kept, the action followed
    if episodes[0]["background"] is not None:
        part["objects"] = object_scores(episodes, batch, context, horizon, tf, pred)
    # frames repeated while the truth moves; "nothing changed": the context coded against itself
    part["reps"] = repetition_rate(pc.cpu(), vq.tokenize(ctx, ctx).cpu(), true, ctx)
    # the first 6 windows make the picture
    part["grid"] = [(ctx[i], true[i], pred.view(B, horizon, *pred.shape[1:])[i])
                    for i in range(min(6 - s, B))]
    return part


def video_result(parts, wins, spec):
    """eval_video's result, summed up from the parts of its batches (in window order)."""
    # three rows scored alike: the model's prediction, copy-last-frame, the tokenizer's ceiling
    acc = {k: [p["rows"][k][0] for p in parts] for k in ("pred", "copy", "ceiling")}
    moving = {k: [sum(p["rows"][k][i] for p in parts) for i in (1, 2)] for k in acc}
    reps, changed = (torch.cat([p[k] for p in parts]) for k in ("reps", "changed"))

    def per_window(name):
        """mae and ssim per window (the mean over its `horizon` frames), in window order."""
        return {k: torch.cat([r[k] for r in acc[name]]).view(len(wins), -1).mean(1).tolist()
                for k in ("mae", "ssim")}

    def summary(name):
        rows = acc[name]
        res = {k: float(torch.cat([r[k] for r in rows]).mean()) for k in rows[0]}
        res.setdefault("lpips", None)
        res["mae_moving"] = moving[name][0] / max(moving[name][1], 1)
        return res

    res = dict(summary("pred"), n=sum(len(r["mae"]) for r in acc["pred"]), n_windows=len(wins),
               context=spec.context, horizon=spec.horizon, temperature=spec.temperature,
               top_k=spec.top_k, repetition_rate=float(reps.mean()),
               copy_last_frame=summary("copy"), tokenizer_ceiling=summary("ceiling"))
    res["per_record"] = dict(per_window("pred"), repetition=reps.tolist(), changed=changed.tolist(),
                             windows=[list(w) for w in wins])
    res["copy_last_frame"]["per_record"] = per_window("copy")
    if "objects" in parts[0]:   # the embedded robot data: the objects kept, the action followed
        res["objects"], effects, res["action_effect"] = object_report([p["objects"] for p in parts])
        res["per_record"].update(effects)
    return res


def write_grid(rows, path):
    """rows: (context (3,H,W), truth (K,3,H,W), prediction (K,3,H,W)) -> one image per predicted
    step with columns context | truth | prediction | |error| x 3; a .gif animates the K steps, a
    .png shows the last step."""
    frames = []
    for k in range(rows[0][1].shape[0]):
        lines = [torch.cat([c, t[k], p[k], ((t[k] - p[k]).abs() * 3).clamp(0, 1)], 2)
                 for c, t, p in rows]
        img = torch.cat(lines, 1).permute(1, 2, 0).numpy()
        frames.append((img * 255 + 0.5).astype(np.uint8).repeat(2, 0).repeat(2, 1))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    if str(path).endswith(".gif"):
        imageio.mimsave(path, frames, duration=0.5, loop=0)
    else:
        imageio.imwrite(path, frames[-1])


def evaluate_video_models(models, lpips_net, official, workers=1, share=None, autocast=None):
    """Each world model of `models` (name -> eval_video's (model, vq, episodes, tokens, spec,
    grid_path)) as its spec says and, with `official`, sampled with the paper's protocol from the
    spec's seed (one seed for all: the models' samples pair up) -> name -> the result, the sampled
    one under "sampled". workers, share: as evaluate_checkpoints' (share: the ranks share each
    greedy job's batches; a sampled job, one random stream through its batches, goes whole)."""
    runs = (False, True) if official else (False,)   # as the spec says; sampled
    jobs = [(name, sampled) for name in models for sampled in runs]

    def evaluate(job, batches=None):   # batches: eval_video's share (greedy only)
        name, sampled = job
        model, vq, episodes, tokens, spec, grid = models[name]
        if sampled:   # the paper's protocol, no grid
            spec, grid, name = replace(spec, **OFFICIAL), None, name + " T=1 top-k"
        with autocast or nullcontext():   # shared by ranks: no bars; forked: a line each
            return eval_video(model, vq, episodes, tokens, spec, lpips_net, grid,
                              None if share else name, batches,
                              jobs.index(job) if workers > 1 else None)

    if share:
        outs = {job: evaluate(job, share) for job in jobs if not job[1]}
        whole = [job for job in jobs if job[1]]
        outs |= dict(zip(whole, share(evaluate, whole)))
    else:
        outs = dict(zip(jobs, fork_map(evaluate, jobs, workers)))
    return {name: outs[name, False] | ({"sampled": outs[name, True]} if official else {})
            for name in models}


def print_video_report(rows, pairs, file=None):
    """The table of rows (name -> eval_video's result, the paper's protocol's under "sampled"):
    each greedy row, its sampled one, the first row's baselines; then the paired differences of
    pairs ((a, b) names; b "copy": the first row's copy-last-frame) greedy, then sampled."""
    tag = "T={temperature:g} top-k {top_k}".format(**OFFICIAL)
    cols = ("mae", "mse", "psnr", "ssim", "lpips", "mae_moving")

    def cells(r):   # the frame metrics ("-": lpips without its weights)
        return ["-" if r.get(c) is None else f"{r[c]:.4f}" for c in cols]

    lines = [["model", *cols, "repeat", "obj.recall", "response"]]
    for name, r in rows.items():
        for label, x in [(name, r)] + ([(f"{name} {tag}", r["sampled"])] if "sampled" in r else []):
            # the gripper's response to the action (mean over the windows where it truly moves)
            resp = x.get("action_effect", {}).get("action_response")
            lines.append([label, *cells(x), f"{x['repetition_rate']:.3f}",
                          f"{x['objects']['recall']:.3f}" if "objects" in x else "-",
                          "-" if resp is None else f"{resp:.3f}"])
    first, metrics = next(iter(rows.values())), ("mae", "ssim") + EFFECTS
    lines += [["copy-last-frame", *cells(first["copy_last_frame"])],
              ["tokenizer ceiling", *cells(first["tokenizer_ceiling"])]]
    print_rows(lines, (21,) + (10,) * 6 + (7, 10, 8), file)
    copy = dict(per_record=dict(first["copy_last_frame"]["per_record"],
                                changed=first["per_record"]["changed"]))
    # MAE: lower is better; SSIM, object_recall and action_response: higher
    title = "paired differences over the same held-out windows (bootstrap 95% CI; *: it excludes 0)"
    print_diffs(title + ", greedy:", paired_diffs(rows | {"copy": copy}, pairs, metrics), file=file)
    if "sampled" in first:
        sampled = {k: r["sampled"] for k, r in rows.items()}
        print_diffs(f"{title}, sampled at {tag}:", paired_diffs(
            sampled, [(a, b) for a, b in pairs if b != "copy"], metrics), file=file)


def main(argv=None, prog=None):
    """The command line; argv: the flags (default: sys.argv's), prog: the usage line's command."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip(), prog=prog,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    add = p.add_argument
    add("--ckpt", required=True, help="a world-model checkpoint of train_video.py")
    add("--compare", default=None, help="a second one; paired differences: --ckpt - it")
    add("--limit", type=int, default=0, help="the first N episodes only (0 = all)")
    add("--json", default=None, help="write the result here")
    add("--seed", type=int, default=0, help="seed of the sampled rollouts")
    add("--device", default="cpu")
    add("--threads", type=int, default=1, help="torch CPU threads (1 is fastest for tiny models)")
    add("--data", default=str(DATA_DIR),
        help="episode directory (default: the embedded robot data)")
    add("--split", default="test")
    add("--mode", default=None, choices=["single", "multi"], help="default: the checkpoint's")
    add("--temperature", type=float, default=0.0, help="0: greedy")
    add("--top_k", type=int, default=0, help="sample among the k likeliest codes only (0: all)")
    add("--copy_gate", type=int, default=-1, choices=[-1, 0, 1],
        help="1 / 0: decode every model with / without the tokenizer's copy gate "
             "(train_video.py's RLVR and control decode with it); -1: as each was trained")
    add("--official", type=int, default=0,
        help="1: also the paper's protocol (T=1, top-k 100, seed --seed): \"sampled\"")
    add("--lpips", default=None,
        help="LPIPS-VGG safetensors (tools/convert_lpips.py); else lpips is null")
    add("--grid", default=None, help="write a .gif or .png grid here")
    args = p.parse_args(argv)
    check_ranges(p, args, at_least_1=("threads",), at_least_0=("limit", "temperature", "top_k"))
    torch.set_num_threads(args.threads)
    rows = video_main(args)   # checkpoint -> result, reported
    if args.json:   # the --ckpt's result, or with --compare both under their checkpoints
        write_json(args.json, rows[args.ckpt] if not args.compare else rows)


def video_main(args):
    """--ckpt (and --compare) on the --split windows of each model's own mode, clip length and
    action bins, sampled as the flags say; with --official, also the paper's protocol."""
    ckpts = [args.ckpt] + ([args.compare] if args.compare else [])
    try:
        check_device(args.device)
        # every model and the LPIPS weights first: a bad file stops before any data is generated
        loaded = {ck: load_video_model(ck, args.device, args.copy_gate) for ck in ckpts}
        lpips_net = load_lpips(args.lpips, args.device)
        # the embedded robot data is generated when its folder holds no split (a ValueError when
        # it holds some); any other --data is read as it is
        if Path(args.data).resolve() == DATA_DIR.resolve():
            ensure_splits(DATA_DIR)
        models = {}
        for ck, (model, vq, meta) in loaded.items():
            a, frames = meta["args"], meta["args"].get("clip_len", 16)   # frames per clip
            episodes = clips(load_split(args.data, args.split, vq.config.size, args.limit), frames)
            if not episodes:
                raise ValueError(f"no {args.split} episode has {frames} frames")
            spec = EvalSpec(np.array(a["action_lo"], np.float32),
                            np.array(a["action_hi"], np.float32), a.get("context", 1),
                            a["horizon"] if (args.mode or a["mode"]) == "multi" else 1,
                            args.temperature, args.top_k or None, args.seed)
            models[ck] = (model, vq, episodes, None, spec, args.grid if ck == args.ckpt else None)
        rows = evaluate_video_models(models, lpips_net, args.official)
    except ValueError as e:
        sys.exit(f"error: {e}")
    names = {k: f"{i}:{Path(k).name}" if args.compare else Path(k).name for i, k in enumerate(rows)}
    a, b = names[args.ckpt], names.get(args.compare)
    try:   # each model against copying, and --ckpt minus --compare
        print_video_report({names[k]: r for k, r in rows.items()},
                           [(a, b), (a, "copy"), (b, "copy")] if b else [(a, "copy")])
    except ValueError as e:   # another clip length or mode: not the same windows
        sys.exit(f"error: --compare: {e}")
    if args.lpips is None:
        print("lpips: null (no --lpips weights given; see tools/convert_lpips.py)")
    return rows


if __name__ == "__main__":
    main()
