"""
Evaluate world-model checkpoints on a held-out split: one entry point for every task.

    python eval.py --task=textgame --ckpt=out/textgame/rlvr.safetensors
    python eval.py --task=textgame --ckpt=out/textgame/rlvr.safetensors \
        --compare=out/textgame/mle.safetensors
    python eval.py --task=webpage --ckpt=out/webpage/rlvr.safetensors --json=result.json
    python eval.py --task=textgame --ckpt=/path/to/hf_dir --data=my_test.jsonl --device=cuda
    python eval.py --task=textgame --ckpt=out/textgame/rlvr.safetensors \
        --data=data/textgame/compose.jsonl
    python eval.py --task=video --ckpt=out/video/video_rlvr.safetensors --official=1 \
        --grid=g.gif  (--task=video -h)

Every language task writes "what changes" as text and is scored by its reward in rewards.py
(tasks.py):
- textgame: the state difference is merged into the current state and compared with the true next
  state; `accuracy` = exact state (binary reward), `task_specific` = the graded reward.
- webpage: the three sections of changed page items; `precision`, `recall`, `f1` (per record, then
  averaged).
Each metric is reported overall and on the transitions that change something (`_changed`) or nothing
(`_unchanged`), greedy (T=0) at the top level of the JSON, sampled (T=1) under "sampled", best-of-k
under "pass@k", per record under "per_record" (one value per record, in file order, and "changed"),
plus the baseline that exposes fake gains: always answering "nothing changes", scored by the same
reward. With --compare the paired differences (bootstrap 95% intervals over the same records) are
printed too.
`n_cropped` counts prompts too long for the model's block_size, which keep only their last tokens
(tasks.crop).
data/textgame/compose.jsonl, the text game's composition split (records whose game, room objects and
action never occur together in train; data/textgame/prepare.py), is made when it is missing.

Video (the video section below): rollouts on the split's windows, decoded with the true last context
frame, against copy-last-frame and the tokenizer's ceiling; --official=1 adds the paper's protocol
(T=1, top-k 100) under "sampled".
"""
import argparse
import sys
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import torch
from tqdm import tqdm

from checkpoint import ROOT, load_model, read_meta, write_json
from data.robot.prepare import DATA_DIR, ensure_splits
from data.robot.task import (EFFECTS, Layout, clips, frame_codes, load_split, object_report,
                             object_scores, rollout, to_float, tokenize_split, windows)
from data.textgame.prepare import COMPOSE_PATH, ensure_compose
from runtime import check_device, check_ranges, fork_map, rank_map
from tasks import TASKS, crop, generate_texts, load_lang_model
from tokenizer_vq import load_vq
from video_rewards import MOVE_TOL, load_lpips, mae, mse, psnr, repetition_rate, ssim


# -------------------------------------------------------------------------------------------------
# paired statistics and the tables, text and video alike: the paired bootstrap, the paired
# differences of pairs of models (overall and on the records that change something), the printers.
#
# Paired means record by record: both models answered the same records in the same order (evaluate's
# and eval_video's `per_record` lists), so the difference is taken per record first and only then
# averaged, and the records (not the two models separately) are resampled for the 95% interval.
# Several seeds of one comparison (the same records, one row per seed) are resampled at two levels:
# the seeds, and the records (or the clusters of records that share an episode), so the interval
# holds the spread between seeds as well as between records.
def paired_bootstrap(a, b, n_boot=10000, seed=0, clusters=None):
    """Mean of a - b over paired records and its bootstrap 95% interval -> (mean difference, low,
    high); (None, None, None) for no records. a, b: (n,) one value per record, or (S, n) one row
    per seed over the same records. clusters: (n,) a label per record (e.g. its episode); records
    of one cluster are resampled together (None: every record its own cluster). Each resample
    draws the clusters with replacement and, with several seeds, the seeds with replacement."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    d = d.reshape(-1, d.shape[-1]) if d.size else d.reshape(1, 0)   # (S, n)
    if d.shape[1] == 0:
        return None, None, None
    S, n = d.shape
    rng = np.random.default_rng(seed)
    # per seed and cluster: the sum of the differences and the number of records (S, K), (K,)
    label = np.unique(np.arange(n) if clusters is None else np.asarray(clusters),
                      return_inverse=True)[1].reshape(-1)
    K = label.max() + 1
    sums = np.stack([np.bincount(label, weights=row, minlength=K) for row in d])   # (S, K)
    size = np.bincount(label, minlength=K).astype(np.float64)                      # (K,)
    # n_boot resamples: K clusters and S seeds, each drawn with replacement
    idx = rng.integers(0, K, size=(n_boot, K))      # (n_boot, K) the clusters of each resample
    pick = rng.integers(0, S, size=(n_boot, S))     # (n_boot, S) the seeds of each resample
    per_seed = np.stack([row[idx].sum(1) for row in sums], 1)   # (n_boot, S) resampled sums
    total = np.take_along_axis(per_seed, pick, 1).sum(1)        # over the drawn seeds
    means = total / (S * size[idx].sum(1))
    return float(d.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def paired_diffs(rows, pairs, metrics, subsets=("all", "changed")):
    """Paired differences a - b of per-record metrics with bootstrap 95% intervals. rows: name -> a
    result with "per_record": {metric: [...], "changed": [...]} over the same records (a None
    value: none for that record, e.g. no gripper move in the window); pairs: (a, b) names. Each
    metric both have, on the records where both have a value, in each subset: "all" and "changed"
    (the records b marks changed; left out when that is every record: it would repeat "all").
    -> list of (a, b, metric, subset, mean, low, high), (None, None, None) for no record."""
    out = []
    for a, b in pairs:
        x, y = rows[a]["per_record"], rows[b]["per_record"]
        for m in [m for m in metrics if m in x and m in y]:
            if len(x[m]) != len(y[m]):
                raise ValueError(f"{a} and {b} were evaluated on different records")
            for sub in ("all",) if all(y["changed"]) else subsets:
                both = [(u, v) for u, v, c in zip(x[m], y[m], y["changed"])
                        if u is not None and v is not None and (sub == "all" or c)]
                out.append((a, b, m, sub, *paired_bootstrap([u for u, _ in both],
                                                            [v for _, v in both])))
    return out


def print_diffs(title, diffs, points=False, file=None):
    """Print paired_diffs' list under `title`: a - b, metric, subset, the mean difference and its
    95% interval, in points (x 100: shares) or as they are; * marks an interval that excludes 0."""
    print(title, file=file)
    w = max([len(d[2]) for d in diffs], default=0)   # the metrics' column
    for a, b, m, sub, *v in diffs:
        if v[0] is not None:   # None: no record in this subset
            mean, lo, hi = (f"{100 * x:+6.2f}" if points else f"{x:+.5f}" for x in v)
            sig = "  *" if v[1] > 0 or v[2] < 0 else ""
            print(f"  {a + ' - ' + b:<22} {m:<{w}} {sub:<8} {mean}  [{lo}, {hi}]{sig}", file=file)


def print_rows(rows, widths, file=None):
    """A table, one line per row of cells (strings): the first left-, the others right-aligned."""
    # each column `widths` wide, or as wide as its widest cell
    widths = [max([w] + [len(r[i]) for r in rows if len(r) > i]) for i, w in enumerate(widths)]
    for cells in rows:
        print(" ".join([f"{cells[0]:<{widths[0]}}"]
                       + [f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:])]), file=file)


# -------------------------------------------------------------------------------------------------
# the language tasks: answers scored by the task (the metrics: the docstring above), summaries and
# tables (eval.py and train_lang.py print them)

def summarize(per_record, changed):
    """List of per-record metric dicts -> each metric's mean overall, on changed and on unchanged
    records (None for an empty subset)."""
    def mean(xs):
        return sum(xs) / len(xs) if xs else None
    out = {}
    for k in per_record[0]:
        out[k] = mean([m[k] for m in per_record])
        out[k + "_changed"] = mean([m[k] for m, c in zip(per_record, changed) if c])
        out[k + "_unchanged"] = mean([m[k] for m, c in zip(per_record, changed) if not c])
    return out


def evaluate(task, model, tok, records, max_new_tokens=256, batch_size=64, sampled=False, pass_k=0,
             seed=0, desc="eval", share=None):
    """Score a language world model on records -> summary metrics (greedy) with `per_record` lists,
    the always-no-change baseline, and optionally "sampled" (T=1) and "pass@k" (best of k samples
    at T=1). share: who decodes the greedy batches (tasks.generate_texts; runtime.rank_map: the
    torchrun ranks, each a share of them)."""
    T = TASKS[task]
    prompts = [tok.prompt(T.data.prompt_text(r)) for r in records]
    changed = [T.data.is_changed(r) for r in records]

    def score(texts):
        return [T.score(t, r) for t, r in zip(texts, records)]

    def label(what):   # the progress bar's name (none when desc is None)
        return desc and desc + " " + what

    # greedy: the headline numbers, with the "nothing changes" answer scored by the same reward
    greedy = generate_texts(model, tok, prompts, max_new_tokens, 0.0, batch_size,
                            desc=label("greedy"), share=share)
    scores = score(greedy)
    res = dict(summarize(scores, changed), n=len(records), n_changed=sum(changed),
               n_cropped=crop(prompts, model.config.block_size, max_new_tokens)[1],
               baseline_no_change=summarize(score([T.no_change] * len(records)), changed))
    # sampled and best-of-k draw from one seeded stream, in this order
    g = torch.Generator().manual_seed(seed)
    if sampled:
        texts = generate_texts(model, tok, prompts, max_new_tokens, 1.0, batch_size, g,
                               label("T=1"))
        res["sampled"] = summarize(score(texts), changed)
    if pass_k > 0:
        best = [-1.0] * len(records)
        for _ in range(pass_k):
            texts = generate_texts(model, tok, prompts, max_new_tokens, 1.0, batch_size, g,
                                   label("pass@k"))
            best = [max(b, m[T.headline]) for b, m in zip(best, score(texts))]
        res[f"pass@{pass_k}"] = summarize([{T.headline: b} for b in best], changed)
    res["examples"] = [dict(action=r["action"], changed=c, prediction=t)
                       for r, c, t in list(zip(records, changed, greedy))[:5]]
    res["per_record"] = {k: [float(m[k]) for m in scores] for k in scores[0]} | {"changed": changed}
    return res


def evaluate_checkpoints(task, ckpts, tok, splits, max_new_tokens, device="cpu", autocast=None,
                         workers=1, share=None, score=None):
    """Each checkpoint of {name: path} greedy on every split's records {split: records} (under
    `autocast`), so differences are paired per record -> {split: {name: evaluate's result}}.
    workers > 1 (CPU only): that many forked processes share the (checkpoint, split) jobs, largest
    first; every job computes what it would alone. share (runtime.rank_map, with workers 1): every
    torchrun rank runs every job, decoding its share of each job's batches, and gets every result,
    the same as one process's. score(model, records, share) -> a result: another evaluation (a
    research script's), in place of `evaluate`."""
    jobs = sorted(((name, split) for name in ckpts for split in splits),
                  key=lambda j: -len(splits[j[1]]))

    def run(job):
        name, split = job
        with autocast or nullcontext():
            model = load_lang_model(ckpts[name], device)[0]
            if score:
                return score(model, splits[split], share)
            # forked or shared: no bars
            return evaluate(task, model, tok, splits[split], max_new_tokens,
                            desc=f"{split} {name}" if workers <= 1 and not share else None,
                            share=share)

    outs = dict(zip(jobs, fork_map(run, jobs, workers)))
    # in the checkpoints' order, whatever order the jobs ran in
    return {split: {name: outs[name, split] for name in ckpts} for split in splits}


def pct(x):
    """A share as a percentage, 6 wide with 2 decimals; "-" for None."""
    return "     -" if x is None else f"{100 * x:6.2f}"


def print_table(task, rows, file=None, metric=None):
    """rows: name -> evaluate result. Greedy `metric` (default: the headline metric) overall /
    changed / unchanged, then T=1 and extras, then the always-no-change baseline."""
    h = metric or TASKS[task].headline
    extra = ["precision", "recall"] if task == "webpage" and h == TASKS[task].headline else []
    baseline = next(iter(rows.values()))["baseline_no_change"]   # the same records for every row
    lines = [[f"model ({h} %)", "overall", "changed", "unchanged", "T=1", *extra]]
    for name, r in list(rows.items()) + [("always-no-change baseline", baseline)]:
        lines.append([name, pct(r[h]), pct(r[h + "_changed"]), pct(r[h + "_unchanged"]),
                      pct(r.get("sampled", {}).get(h)), *(pct(r[e]) for e in extra)])
    print_rows(lines, (28, 7, 7, 9, 6, 9, 9), file)


def print_comparison(task, split, rows, file=None, metrics=None, what="transitions", pairs=None):
    """The report of one split (rows: name -> evaluate result): the table of metrics[0] (default:
    the headline metric), then the paired differences in each of `metrics` of `pairs` ((a, b)
    names; None, train_lang.py's: every model against the MLE start "mle" and, when the control
    ran, against the control "mle_more")."""
    first, metrics = next(iter(rows.values())), metrics or (TASKS[task].headline,)
    print(f"\n{split} split ({first['n']} {what}, {first['n_changed']} changed), "
          f"{metrics[0]} % (greedy):", file=file, flush=True)
    print_table(task, rows, file, metrics[0])
    if pairs is None:
        pairs = [(k, "mle") for k in rows if k != "mle"]            # against the MLE start
        if "mle_more" in rows:                                       # and against the control
            pairs += [(k, "mle_more") for k in rows if k not in ("mle", "mle_more")]
    for m in metrics if pairs else ():   # (no pairs: no paired differences)
        print_diffs(f"paired differences in {m} (points, bootstrap 95% CI over the same records):",
                    paired_diffs(rows, pairs, [m]), True, file)


def compare_checkpoints(run, task, ckpts, tok, splits, max_new_tokens):
    """A text run's final comparison (train_lang.py's, a study's): every checkpoint of {name: path}
    greedy on every split {split: records}, paired; rank 0 writes eval.json (test) and
    eval_val.json (val) in out_dir and prints each split's report -> {split: {name: result}}."""
    # a CPU: two processes share the jobs; torchrun: each rank decodes a share of every job
    workers = 2 if run.forks else 1
    results = evaluate_checkpoints(task, ckpts, tok, splits, max_new_tokens, run.device,
                                   run.autocast, workers, rank_map if run.world > 1 else None)
    if run.master:
        for split, r in results.items():
            write_json(run.out_dir / ("eval.json" if split == "test" else "eval_val.json"), r)
            print_comparison(task, split, r)   # RLVR - start, RLVR - control: paired 95% CIs
    return results


# -------------------------------------------------------------------------------------------------
# video (train_video.py's final comparison; `eval.py --task=video` is its command line):
# `eval_video` rolls a world model out on the split's windows, greedy or sampled as EvalSpec says,
# decodes against the true last context frame and reports, averaged over predicted frames, against
# the *true* frames:
# - mse, mae, psnr, ssim, lpips (null without weights), and repetition_rate (video_rewards.py);
# - mae_moving: MAE on the pixels that truly move (> MOVE_TOL from the last context frame), where
#   copy_last_frame, strong on whole frames of a mostly static scene, is weak;
# - copy_last_frame and tokenizer_ceiling (the true frames' own codes decoded): the baselines;
# - objects and action_effect (episodes with a `background`, the embedded robot data): object pixels
#   (> OBJECT_TOL from the bare table) and object_recall, which falls when a model erases objects to
#   lower MAE; action_response, how the predicted gripper follows the true move
#   (data/robot/detect.gripper_response: 1 right, 0 no motion);
# - per_record: one entry per window in a fixed order (mae, ssim, repetition, changed, and the
#   action effects), for the paired differences between models (the paired statistics above).
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

    bar = tqdm(range(0, len(wins), batch_size), desc=desc, leave=False, disable=desc is None)
    parts = list((share or map)(score, bar))              # the batches' parts, summed in order
    # three rows scored alike: the model's prediction, copy-last-frame, the tokenizer's ceiling
    acc = {k: [p["rows"][k][0] for p in parts] for k in ("pred", "copy", "ceiling")}
    moving = {k: [sum(p["rows"][k][i] for p in parts) for i in (1, 2)] for k in acc}
    reps, changed = (torch.cat([p[k] for p in parts]) for k in ("reps", "changed"))
    grid = sum((p["grid"] for p in parts), [])

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
               repetition_rate=float(reps.mean()),
               copy_last_frame=summary("copy"), tokenizer_ceiling=summary("ceiling"))
    res["per_record"] = dict(mae=per_window("pred", "mae"), ssim=per_window("pred", "ssim"),
                             repetition=reps.tolist(), changed=changed.tolist(),
                             windows=[list(w) for w in wins])
    res["copy_last_frame"]["per_record"] = dict(mae=per_window("copy", "mae"),
                                                ssim=per_window("copy", "ssim"))
    if episodes[0]["background"] is not None:   # the objects kept, the action followed
        res["objects"], effects, res["action_effect"] = object_report([p["objects"] for p in parts])
        res["per_record"].update(effects)
    if grid_path:
        write_grid(grid, grid_path)
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
        with autocast or nullcontext():   # forked or shared: no bars
            return eval_video(model, vq, episodes, tokens, spec, lpips_net, grid,
                              None if workers > 1 or share else name, batches)

    if share:
        outs = {job: evaluate(job, share) for job in jobs if not job[1]}
        whole = [job for job in jobs if job[1]]
        outs |= dict(zip(whole, share(evaluate, whole)))
    else:
        outs = dict(zip(jobs, fork_map(evaluate, jobs, workers)))
    return {name: outs[name, False] | ({"sampled": outs[name, True]} if official else {})
            for name in models}


def print_video_report(rows, pairs, file=None):
    """eval.py's and train_video.py's report. rows: name -> eval_video result, with the paper's
    protocol's result under "sampled" when it ran; pairs: (a, b) names, b "copy" for the first
    row's copy-last-frame. The table (each greedy row, then its sampled one, then the first row's
    baselines), and the paired differences of `pairs` greedy, then of the models' pairs sampled
    (copying does not sample)."""
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


def main():
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--task", default="textgame")
    video = pre.parse_known_args()[0].task == "video"   # decoded frames, not text: flags of its own
    p = argparse.ArgumentParser(
        description=("evaluate a video world model on held-out episodes" if video
                     else __doc__.split("\n\n")[0]), prog="eval.py --task=video" if video else None,
        formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    add = p.add_argument
    add("--task", default="textgame", choices=sorted(TASKS) + ["video"],
        help="a language task, or video (its flags: python eval.py --task=video --help)")
    add("--ckpt", required=True, help="our .safetensors checkpoint or an HF model directory "
        "(video: a world-model checkpoint of train_video.py)")
    add("--compare", default=None, help="a second checkpoint; paired differences: --ckpt - it")
    add("--limit", type=int, default=0, help="the first N records (video: episodes) only (0 = all)")
    add("--json", default=None, help="write the result here")
    add("--seed", type=int, default=0, help="seed of the sampled answers (video: rollouts)")
    add("--device", default="cpu")
    add("--threads", type=int, default=1, help="torch CPU threads (1 is fastest for tiny models)")
    if not video:
        add("--data", default=None, help="JSONL records (default: the embedded split --split)")
        add("--split", default="test", choices=["val", "test"],
            help="the embedded split when --data is not given")
        add("--max_new_tokens", type=int, default=256)
        add("--batch_size", type=int, default=64)
        add("--pass_k", type=int, default=4, help="samples per record for pass@k (0 = skip)")
    else:
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
    args = p.parse_args()
    check_ranges(p, args, at_least_1=("threads",) if video else
                 ("max_new_tokens", "batch_size", "threads"),
                 at_least_0=("limit", "temperature", "top_k") if video else ("limit", "pass_k"))
    torch.set_num_threads(args.threads)
    rows = video_main(args) if video else text_main(args)   # checkpoint -> result, reported
    if args.json:   # the --ckpt's result, or with --compare both under their checkpoints
        write_json(args.json, rows[args.ckpt] if not args.compare else rows)


def text_main(args):
    """A language task: --ckpt (and --compare) on the records, greedy, T=1 and pass@k."""
    T = TASKS[args.task]
    data = Path(args.data) if args.data else ROOT / "data" / args.task / f"{args.split}.jsonl"
    # the composition split: made from train when missing
    if data.resolve() == COMPOSE_PATH.resolve():
        ensure_compose()
    if not data.is_file():
        hint = "" if args.data else f" (run python data/{args.task}/prepare.py)"
        sys.exit(f"error: --data {data}: file not found{hint}")
    ckpts = [args.ckpt] + ([args.compare] if args.compare else [])
    try:
        check_device(args.device)
        for ck in ckpts:   # a file of ours must be a language model (an HF directory always is)
            if Path(ck).is_file() and "vq" in read_meta(ck)["args"]:
                raise ValueError(f"{ck}: a video world model of train_video.py; evaluate it with "
                                 f"python eval.py --task=video --ckpt={ck}")
        records = T.data.load_records(data)[:args.limit or None]
        rows = {}
        for ck in ckpts:
            model, tok, _ = load_lang_model(ck, args.device)
            rows[ck] = evaluate(args.task, model, tok, records, args.max_new_tokens,
                                args.batch_size, True, args.pass_k, args.seed,
                                desc=Path(ck).name)
    except ValueError as e:
        sys.exit(f"error: {e}")
    names = {k: f"{i}:{Path(k).name}" for i, k in enumerate(rows)}   # two files may share a name
    print_comparison(args.task, data.stem, {names[k]: v for k, v in rows.items()},
                     pairs=[(names[args.ckpt], names[args.compare])] if args.compare else [])
    if args.pass_k:
        for k, v in rows.items():
            print(f"{names[k]}: pass@{args.pass_k} = {pct(v[f'pass@{args.pass_k}'][T.headline])}")
    return rows


def video_main(args):
    """--task=video: --ckpt (and --compare) on the --split windows of each model's own mode, clip
    length and action bins, sampled as the flags say; with --official, also the paper's protocol."""
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
