"""
Held-out evaluation of a video world model (train_video.py's final comparison;
`eval.py --task=video` is its command line). `eval_video` rolls the model out on windows of the
split (greedy, or sampled as EvalSpec says; OFFICIAL: the paper's T=1, top-k 100), decodes against
the true last context frame and reports, averaged over predicted frames, against the *true* frames:
- mse, mae, psnr, ssim, lpips (null without LPIPS weights), and repetition_rate (rewards_video.py);
- mae_moving: MAE on the pixels that truly move (> MOVE_TOL from the last context frame), where
  copy_last_frame, strong on whole frames of a mostly static scene, is weak;
- copy_last_frame and tokenizer_ceiling (the true frames' own codes decoded): the baselines;
- objects and action_effect (episodes with a `background`, the embedded robot data): object pixels
  (> OBJECT_TOL from the bare table) and object_recall, which falls when a model erases objects to
  lower MAE; action_response, how the predicted gripper follows the true move
  (data/robot/detect.gripper_response: 1 right, 0 no motion);
- per_record: one entry per window in a fixed order (mae, ssim, repetition, changed, and the action
  effects), for `paired_video` / `paired_effects`: paired differences between models with bootstrap
  95% intervals (stats.py), as the language tasks'.
"""
import sys
from dataclasses import dataclass
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import torch
from tqdm import tqdm

from checkpoint import load_model
from data.robot.detect import gripper_response
from data.robot.task import Layout, frame_codes, rollout, to_float, tokenize_split, windows
from rewards_video import MOVE_TOL, OBJECT_TOL, mae, mse, psnr, repetition_rate, ssim, to_uint8
from stats import paired_bootstrap, paired_table
from tokenizer_vq import load_vq

# RLVR-World's video evaluation protocol: sampled at T=1, top-k 100
OFFICIAL = dict(temperature=1.0, top_k=100)
# the per-window action-effect metrics (eval_video's per_record, with the embedded robot data)
EFFECTS = ("object_recall", "action_response")


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


def metrics(pred, true, lpips_net):
    """Per-frame mse, mae, psnr, ssim (and lpips with its network) of (N, 3, H, W) frames."""
    row = dict(mse=mse(pred, true), mae=mae(pred, true), psnr=psnr(pred, true),
               ssim=ssim(pred, true))
    if lpips_net is not None:   # in chunks of 64 frames (the VGG's memory)
        row["lpips"] = torch.cat([lpips_net(pred[i:i + 64], true[i:i + 64])
                                  for i in range(0, len(pred), 64)])
    return row


def frame_scores(x, true, mask, lpips_net):
    """Score frames x against the true frames -> (their metrics, their absolute error on the
    moving pixels (mask: (N, 1, H, W)), the count of those pixel values), the last two summed over
    batches for mae_moving = error / count."""
    return (metrics(x, true, lpips_net), float(((x - true).abs() * mask).sum()),
            float(mask.sum() * 3))


@torch.no_grad()
def eval_video(model, vq, episodes, tokens, spec, lpips_net=None, grid_path=None, desc="eval",
               share=None):
    """Evaluate on windows starting every `horizon` frames of each clip, as EvalSpec `spec` says.
    tokens: the split's tokens (data/robot/task.tokenize_split, with at least `horizon` future
    frames), or None to compute them here. share (greedy only; e.g. runtime.rank_map: the torchrun
    ranks): computes the batches, as map(score, batches) would; they are summed up in order, so the
    result is the same whoever computed them."""
    lo, hi, context, horizon = spec.lo, spec.hi, spec.context, spec.horizon
    temperature, top_k, batch_size = spec.temperature, spec.top_k, spec.batch_size
    if share and temperature > 0:
        raise ValueError("eval_video: sampled batches draw from one stream, in order; not shared")
    model.eval()
    layout = Layout.of(vq, episodes[0]["action"].shape[1])
    tokens = tokens or tokenize_split(vq, episodes, horizon, layout, lo, hi)
    E, T = tokens["actions"].shape[:2]
    P, FL, L = layout.prompt_len(context), layout.frame_len, layout.L
    # the windows: (clip, first context frame), every `horizon` frames
    wins = [(e, t) for e in range(E) for t in range(0, T - context - horizon + 1, horizon)]
    g = torch.Generator().manual_seed(spec.seed)

    def score(s):
        """The windows wins[s:s + batch_size], rolled out and scored -> their part of the sums."""
        batch = wins[s:s + batch_size]
        B = len(batch)
        seq = windows(tokens, layout, [e for e, _ in batch], [t for _, t in batch], context,
                      horizon)                                                 # (B, n)
        # roll out: the model writes each frame's codes, the true actions are injected between
        acts = seq[:, P:P + (horizon - 1) * FL].view(B, horizon - 1, FL)[:, :, L:]
        out, _, _ = rollout(model, seq[:, :P].tolist(), acts, horizon, L, temperature, g, top_k)
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
        part = dict(changed=mask.view(B, -1).amax(1) > 0, effects={k: [] for k in EFFECTS},
                    rows={name: frame_scores(x, tf, mask, lpips_net)
                          for name, x in (("pred", pred), ("copy", cf), ("ceiling", ceil))})
        # objects: pixels away from the bare table, in the truth, the prediction and both
        if episodes[0]["background"] is not None:
            bg = torch.stack([to_float(episodes[e]["background"]) for e, _ in batch])[:, None]
            bg = bg.expand_as(true).flatten(0, 1)
            ot = (tf - bg).abs().amax(1) > OBJECT_TOL
            op = (pred - bg).abs().amax(1) > OBJECT_TOL
            part["objects"] = dict(truth=float(ot.sum()), pred=float(op.sum()),
                                   hit=float((ot & op).sum()), n=ot.numel())
            add_effects(part["effects"], episodes, batch, context, horizon, ot.view(B, -1),
                        op.view(B, -1), pred.view(B, horizon, *pred.shape[1:]))
        # the codes of "nothing changed" (per frame: the context's)
        still_codes = vq.tokenize(ctx, ctx).cpu()
        part["reps"] = repetition_rate(pc.cpu(), still_codes, true, ctx)
        # the first 6 windows make the picture
        part["grid"] = [(ctx[i], true[i], pred.view(B, horizon, *pred.shape[1:])[i])
                        for i in range(min(6 - s, B))]
        return part

    # three rows scored alike: the model's prediction, copy-last-frame, the tokenizer's ceiling
    acc = {k: [] for k in ("pred", "copy", "ceiling")}
    moving = {k: [0.0, 0.0] for k in acc}
    objects = dict(truth=0.0, pred=0.0, hit=0.0, n=0)
    reps, changed, grid = [], [], []
    effects = {k: [] for k in EFFECTS}                    # per window, with the objects
    bar = tqdm(range(0, len(wins), batch_size), desc=desc, leave=False, disable=desc is None)
    for part in (share or map)(score, bar):               # the batches' parts, summed in order
        for name, (m, error, count) in part["rows"].items():
            acc[name].append(m)
            moving[name][0] += error
            moving[name][1] += count
        for k, v in part.get("objects", {}).items():
            objects[k] += v
        for k in EFFECTS:
            effects[k] += part["effects"][k]
        reps.append(part["reps"])
        changed.append(part["changed"])
        grid += part["grid"]

    def per_window(name, key):
        """One value per window (the mean over its `horizon` frames), in window order."""
        return torch.cat([r[key] for r in acc[name]]).view(len(wins), horizon).mean(1).tolist()

    def summary(name):
        rows = acc[name]
        res = {k: float(torch.cat([r[k] for r in rows]).mean()) for k in rows[0]}
        res.setdefault("lpips", None)
        res["mae_moving"] = moving[name][0] / max(moving[name][1], 1)
        return res

    res = dict(summary("pred"), n=sum(len(r["mae"]) for r in acc["pred"]), n_windows=len(wins),
               context=context, horizon=horizon, temperature=temperature, top_k=top_k,
               repetition_rate=float(torch.cat(reps).mean()),
               copy_last_frame=summary("copy"), tokenizer_ceiling=summary("ceiling"))
    res["per_record"] = dict(mae=per_window("pred", "mae"), ssim=per_window("pred", "ssim"),
                             repetition=torch.cat(reps).tolist(),
                             changed=torch.cat(changed).tolist(),
                             windows=[list(w) for w in wins])
    res["copy_last_frame"]["per_record"] = dict(mae=per_window("copy", "mae"),
                                                ssim=per_window("copy", "ssim"))
    if objects["n"]:
        res["objects"] = dict(pixels_truth=objects["truth"] / objects["n"],
                              pixels_pred=objects["pred"] / objects["n"],
                              recall=objects["hit"] / max(objects["truth"], 1))
        res["per_record"].update(effects)
        res["action_effect"] = summarize_effects(effects)
    if grid_path:
        write_grid(grid, grid_path)
    return res


def add_effects(effects, episodes, batch, context, horizon, truth, pred_objects, pred):
    """Append a batch's per-window object_recall and action_response to `effects`. truth and
    pred_objects (B, horizon * H * W) bool: the object pixels of the true and predicted frames;
    pred (B, horizon, 3, H, W): the predicted frames."""
    hit, n = (truth & pred_objects).sum(1).tolist(), truth.sum(1).tolist()
    effects["object_recall"] += [h / t if t else None for h, t in zip(hit, n)]
    for (e, t), p in zip(batch, to_uint8(pred)):
        img = episodes[e]["image"]
        effects["action_response"].append(
            gripper_response(img[t + context - 1], img[t + context:t + context + horizon], p))


def summarize_effects(effects):
    """Per-window action-effect values -> their means over the windows that have one, and the
    count of windows with a true gripper move."""
    kept = {k: [x for x in v if x is not None] for k, v in effects.items()}
    return dict({k: float(np.mean(v)) if v else None for k, v in kept.items()},
                response_windows=len(kept["action_response"]))


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


def print_video_table(rows, file=sys.stdout):
    """rows: name -> eval_video dict; baselines are printed from the first row."""
    cols = ("mae", "mse", "psnr", "ssim", "lpips", "mae_moving")
    print(f"{'model':<22}" + "".join(f"{c:>11}" for c in cols) + f"{'repeat':>8}{'obj.recall':>11}"
          f"{'response':>9}", file=file)

    def line(name, r, rep="", rec="", resp=""):
        vals = "".join(f"{'-':>11}" if r.get(c) is None else f"{r[c]:>11.4f}" for c in cols)
        print(f"{name:<22}{vals}{rep:>8}{rec:>11}{resp:>9}", file=file)

    for name, r in rows.items():
        rec = f"{r['objects']['recall']:.3f}" if "objects" in r else "-"
        # the gripper's response to the action (mean over the windows where it truly moves)
        resp = r.get("action_effect", {}).get("action_response")
        line(name, r, f"{r['repetition_rate']:.3f}", rec, "-" if resp is None else f"{resp:.3f}")
    first = next(iter(rows.values()))
    line("copy-last-frame", first["copy_last_frame"])
    line("tokenizer ceiling", first["tokenizer_ceiling"])


def paired_video(rows, pairs, metrics=("mae", "ssim")):
    """Paired differences a - b over the same held-out windows, with bootstrap 95% intervals
    (stats.paired_table). rows: name -> eval_video result of the same windows; "copy" names the
    first row's copy-last-frame baseline. pairs: (a, b) names.
    -> list of (a, b, metric, subset, mean, low, high); subset "all", and "moving" (the windows
    whose truth moves) when some window does not move."""
    first = next(iter(rows.values()))
    # when every window moves, "moving" would repeat "all"
    subsets = ("all",) if all(first["per_record"]["changed"]) else ("all", "changed")
    per = {name: r["per_record"] for name, r in rows.items()}
    per["copy"] = dict(first["copy_last_frame"]["per_record"],
                       changed=first["per_record"]["changed"])
    out = []
    for a, b in pairs:
        if len(per[a]["mae"]) != len(per[b]["mae"]):
            raise ValueError(f"paired_video: {a} and {b} were evaluated on different windows")
        for m in metrics:   # paired_table compares every row with `b`: here the one row `a`
            two = {a: {"per_record": per[a]}, b: {"per_record": per[b]}}
            for _, sub, mean, lo, hi in paired_table(two, m, b, subsets):
                out.append((a, b, m, "moving" if sub == "changed" else sub, mean, lo, hi))
    return out


def paired_effects(rows, pairs, metrics=EFFECTS):
    """Paired differences a - b of the per-window action-effect metrics (object_recall,
    action_response) over the windows where both have a value, with bootstrap 95% intervals
    (stats.paired_bootstrap). rows: name -> eval_video result; pairs: (a, b) model names.
    -> list of (a, b, metric, "all", mean, low, high) as paired_video's; [] without the metrics."""
    out = []
    for a, b in pairs:
        for m in metrics:
            x, y = rows[a]["per_record"].get(m), rows[b]["per_record"].get(m)
            if x is None or y is None:
                continue
            if len(x) != len(y):
                raise ValueError(f"paired_effects: {a} and {b} were evaluated on different windows")
            both = [(u, v) for u, v in zip(x, y) if u is not None and v is not None]
            out.append((a, b, m, "all", *paired_bootstrap([u for u, _ in both],
                                                         [v for _, v in both])))
    return out


def print_video_paired(diffs, file=sys.stdout):
    """Print paired_video's (or paired_effects') list; * marks an interval that excludes 0 (MAE:
    lower is better, SSIM, object_recall and action_response: higher)."""
    print("paired differences over the same held-out windows "
          "(bootstrap 95% CI; * = the CI excludes 0):", file=file)
    for a, b, m, sub, mean, lo, hi in diffs:
        if mean is not None:   # no window in this subset
            sig = "  *" if lo > 0 or hi < 0 else ""
            print(f"  {a + ' - ' + b:<18} {m:<5} {sub:<7} {mean:+.5f}  [{lo:+.5f}, {hi:+.5f}]{sig}",
                  file=file)
