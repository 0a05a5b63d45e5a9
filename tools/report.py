"""
A run on one page: out_dir/report.md, its pictures beside it, from the run's own files (config.json,
log.jsonl, eval.json, eval_val.json). train_lang.py and train_video.py write it at their end; this
rebuilds it, e.g. for the shipped runs in results/ (which keep no checkpoints):

    python tools/report.py out/textgame
    python tools/report.py results/textgame_s1337 --command="python train_lang.py"

The page: the command, the commit and the wall time (what only the run knew: kept from the page it
wrote, or given here), the data and model sizes; the headroom lines of the start and of RLVR
(grpo.headroom, kept in eval.json); curves.svg, the curves per GRPO step from log.jsonl (plain SVG
written here: on-policy reward, the probe's reward greedy and at T=1, or video's greedy MAE on
validation, KL, entropy, groups kept); the paired tables as the run printed them (eval.py's and
video_eval.py's printers and bootstrap); then a text task's four test records side by side, picked
by the rule in RULES (eval.json's per-record scores and "answers"), or video's strip.png: the test
windows whose truth moves the most, drawn by tools/video_grid.py from every checkpoint at hand, and
rollout.gif, every predicted step, in the multi-step mode. A default text run's page takes 1-4
seconds on 2 busy CPU cores (the bootstrap over 2,000 records), a default video run's 4-9 (the
bootstrap of every pair, the rollouts of 4 windows per model).
"""
import argparse
import html
import io
import json
import math
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file: the repository root
from checkpoint import read_meta, recorded_path  # noqa: E402
from eval import print_comparison  # noqa: E402
from tasks import TASKS  # noqa: E402

MODELS = {"mle": "MLE start", "rlvr": "RLVR", "mle_more": "MLE continued (the control)"}
# the four text records: the first of the test split (in file order) where the start's score a
# and RLVR's b satisfy the rule; a score of 1 is full marks (exact state, F1 1)
RULES = (("the first record RLVR fixed (it scores above its start)", lambda a, b: b > a),
         ("the first record RLVR broke (it scores below its start)", lambda a, b: b < a),
         ("the first record both got right (full marks)", lambda a, b: min(a, b) >= 1),
         ("the first record both got wrong (below full marks)", lambda a, b: max(a, b) < 1))
CUT = 600                     # characters of a text shown in a table cell
WINDOWS, ZOOM = 4, 2          # the video strip: windows (rows) and pixel zoom
# the curves: one chart W x H pixels, margins for the y ticks, title and legend, x ticks; colours
W, H, LEFT, TOP, BOTTOM = 320, 200, 66, 34, 38
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


# -----------------------------------------------------------------------------
# the run's files

def shown(path):
    """A path as the page shows it: relative to the repository when under it (no machine's own)."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def read_json(path):
    """A JSON file of the run -> its value, None when the file is not there."""
    return json.loads(path.read_text()) if path.is_file() else None


def read_log(out_dir):
    """log.jsonl -> (the RLVR rows by step, the last control row or {}); a resumed run logs a
    step again: its last row wins; rows of no step (torchrun's checksums) are left out."""
    path, rl, control = out_dir / "log.jsonl", {}, {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        row = json.loads(line)
        if row.get("stage") == "rlvr" and "step" in row:
            rl.setdefault(row["step"], {}).update(row)
        elif row.get("stage") == "mle_more":
            control = row
    return [rl[s] for s in sorted(rl)], control


def the_task(config, rows):
    """The run's task: config.json's, else the one task whose headline metric eval.json scores
    ("video" when it scores windows)."""
    pr = rows["mle"]["per_record"]
    if "windows" in pr or "vq" in config:
        return "video"
    found = [config["task"]] if "task" in config else [t for t in TASKS if TASKS[t].headline in pr]
    if len(found) != 1:
        raise ValueError(f"eval.json's metrics {sorted(pr)} fit the tasks {found}: name one in "
                         f"config.json")
    return found[0]


def checkout():
    """The repository's commit, and whether tracked files differ from it; None without git."""
    def git(*a):
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True,
                              timeout=30)
    try:
        head, status = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "-uno")
    except OSError:
        return None
    dirty = " (with uncommitted changes)" if status.stdout.strip() else ""
    return head.stdout.strip() + dirty if head.returncode == 0 else None


def kept(old, key):
    """A line `- key: value` of the report written before -> value (None: none)."""
    m = re.search(rf"^- {key}: (.+)$", old, re.M)
    return m and m[1]


# -----------------------------------------------------------------------------
# the page's parts, each a list of markdown lines

def model_line(out_dir):
    """The post-trained model's shape and size, from its checkpoint's header (no tensor read)."""
    from safetensors import safe_open
    ckpt = next((out_dir / f for f in ("rlvr.safetensors", "video_rlvr.safetensors")
                 if (out_dir / f).is_file()), None)
    if ckpt is None:
        return "- model: no checkpoint in this folder"
    c = read_meta(ckpt)["config"]
    with safe_open(str(ckpt), framework="pt") as f:
        n = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith("model."))
    return (f"- model: {c['n_layer']} layers x {c['n_embd']}, {c['n_head']} heads, vocabulary "
            f"{c['vocab_size']}, block {c['block_size']}: {n / 1e6:.2f}M parameters ({ckpt.name})")


def header(out_dir, config, rl, control, facts, data):
    """The command, commit, data (its markdown lines), the model, wall time and compute."""
    lines = [f"- command: {facts['command'] or 'not recorded'}",
             f"- commit: {facts['commit'] or 'not recorded'}", *data, model_line(out_dir)]
    last = rl[-1] if rl else {}
    if "rl_seconds" in last:
        total = f"{facts['seconds']} in all" if facts["seconds"] else "the total not recorded"
        lines.append(f"- wall time: {total}; RLVR's {sum('reward_mean' in r for r in rl)} steps "
                     f"{last['rl_seconds'] / 60:.1f} min"
                     + (f", the control's {control['step']} MLE steps {control['minutes']:.1f} "
                        f"min" if "minutes" in control else ""))
    if "rl_compute" in last:
        lines.append(f"- compute (tokens through the model; forward 1, forward and backward 3): "
                     f"RLVR {last['rl_compute']:,}"
                     + (f", the control {control['compute']:,}" if "compute" in control else ""))
    if config:
        lines.append("- every flag: [config.json](config.json)")
    return lines


def text_data(task, config, out_dir):
    """A text run's data folder: config.json's --data_dir (relative to out_dir), else its
    default."""
    return recorded_path(config["data_dir"], out_dir) if "data_dir" in config else \
        ROOT / "data" / task


def data_line(task, config, out_dir, evals):
    """The data's sizes: records or episodes per split, and how many the evaluation scored."""
    scored = ", ".join(f"{r['mle']['n_windows'] if task == 'video' else r['mle']['n']} {s}"
                       for s, r in evals.items())
    if task == "video":
        from data.robot.prepare import DATA_DIR
        from data.robot.task import episode_files
        data = recorded_path(config["data"], out_dir) if "data" in config else DATA_DIR
        have = {s: len(episode_files(data, s)) for s in ("train", "val", "test")}
        what = "episodes"
    else:
        data = text_data(task, config, out_dir)
        have = {s: (data / f"{s}.jsonl").read_bytes().count(b"\n")
                for s in ("train", "val", "test") if (data / f"{s}.jsonl").is_file()}
        what = "records"
    sizes = (" / ".join(f"{n} {s}" for s, n in have.items()) + f" {what} in {shown(data)}"
             if any(have.values()) else f"{shown(data)} is not here")
    unit = "windows" if task == "video" else "records"
    return [f"- data: {task}, {sizes}; evaluated: {scored} {unit}"]


def headroom(rows, task):
    """The headroom lines of the start and of RLVR (grpo.headroom) as eval.json keeps them."""
    scale, unit = (-1000, "MAE x 1e-3") if task == "video" else (100, "reward x 100")
    found = {k: r["headroom"] for k, r in rows.items() if r.get("headroom")}
    if not found:
        return ["eval.json keeps no headroom line (a run before it was kept there, or no "
                "validation prompt fitted)."]
    n = next(iter(found.values()))["n"]
    lines = [f"On {n} fixed validation prompts ({unit}): the greedy answer against the best of G "
             f"samples at the RL temperature. RLVR can only sharpen what its samples find.",
             "", "| model | greedy | best of G | G, T | a sample beats greedy | groups with "
             "reward spread |", "| --- | ---: | ---: | --- | ---: | ---: |"]
    for k, h in found.items():
        lines.append(f"| {MODELS[k]} | {h['greedy'] * scale:.2f} | {h['best'] * scale:.2f} | "
                     f"{h['G']}, {h['temperature']:g} | {h['fixed']:.1%} | {h['spread']:.1%} |")
    return lines


def ticks(lo, hi):
    """Round values from lo to hi, 2 to 5 of them: steps of 1, 2 or 5 times a power of ten."""
    step = 10 ** math.floor(math.log10((hi - lo) / 2))
    step *= next(m for m in (1, 2, 5, 10) if (hi - lo) / (m * step) <= 4)
    return [k * step for k in range(math.ceil(lo / step), math.floor(hi / step) + 1)]


def chart(x0, y0, title, ylabel, series, last):
    """One chart of curves.svg at (x0, y0): a frame, round ticks on both axes, the axes' labels,
    one polyline per curve of `series` {label: [(step, value)]} (dots where it has few points)
    and a legend naming them; x from 0 to `last` -> SVG lines."""
    ys = [y for s in series.values() for _, y in s]
    pad = (max(ys) - min(ys)) * 0.08 or abs(ys[0]) * 0.1 or 1.0   # a flat curve: a band round it
    lo, hi = min(ys) - pad, max(ys) + pad
    lo = max(lo, 0.0) if min(ys) >= 0 else lo   # KL, entropy, groups: the axis stops at 0
    last, w, h = max(last, 1), W - LEFT - 12, H - TOP - BOTTOM

    def x_of(x):
        return x0 + LEFT + w * x / last

    def y_of(y):
        return y0 + TOP + h * (hi - y) / (hi - lo)

    out = [f'<g class="chart"><title>{html.escape(title)}</title>',
           f'<text x="{x0 + LEFT}" y="{y0 + 14}" font-size="13">{html.escape(title)}</text>',
           f'<rect x="{x0 + LEFT}" y="{y0 + TOP}" width="{w}" height="{h}" fill="none" '
           f'stroke="#888"/>',
           f'<text class="xlabel" x="{x0 + LEFT + w / 2}" y="{y0 + H - 6}" font-size="11" '
           f'text-anchor="middle">GRPO step</text>',
           f'<text class="ylabel" transform="translate({x0 + 11},{y0 + TOP + h / 2}) '
           f'rotate(-90)" font-size="11" text-anchor="middle">{html.escape(ylabel)}</text>']
    for t in [t for t in ticks(0, last) if t == int(t)]:   # whole steps
        out.append(f'<text x="{x_of(t):.1f}" y="{y0 + TOP + h + 13}" font-size="10" '
                   f'text-anchor="middle">{t:g}</text>')
    for t in ticks(lo, hi):
        out.append(f'<text x="{x0 + LEFT - 4}" y="{y_of(t) + 3:.1f}" font-size="10" '
                   f'text-anchor="end">{t:.3g}</text>')
    right = x0 + LEFT + w   # the legend, right-aligned above the frame
    for (label, s), colour in zip(series.items(), COLOURS):
        points = [(x_of(x), y_of(y)) for x, y in s]
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="'
                   + " ".join(f"{x:.1f},{y:.1f}" for x, y in points) + '"/>')
        if len(s) <= 12:
            out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>'
                    for x, y in points]
        out.append(f'<text x="{right}" y="{y0 + TOP - 6}" font-size="11" fill="{colour}" '
                   f'text-anchor="end">{html.escape(label)}</text>')
        right -= 7 * len(label) + 12
    return out + ["</g>"]


def curves(rl, task, path):
    """curves.svg from log.jsonl's RLVR rows: on-policy reward, the probe (video: greedy MAE on
    validation), KL, entropy, groups kept; a chart per quantity logged -> its markdown."""
    def steps(key):   # (step, value) where the step logged a finite value
        return [(r["step"], r[key]) for r in rl if math.isfinite(r.get(key, math.nan))]

    probe = (("greedy MAE on the validation split", "MAE", {"greedy": steps("val_mae")})
             if task == "video" else
             ("probe: reward on fixed train prompts", "reward",
              {"greedy": steps("probe_greedy"), "T=1": steps("probe_reward")}))
    charts = [("on-policy reward (the step's samples)", "reward", {"mean": steps("reward_mean")}),
              probe,
              ("KL to the start (k3, per token)", "KL", {"KL": steps("kl")}),
              ("entropy of the samples, per token", "nats", {"entropy": steps("entropy")}),
              ("groups kept (with reward spread)", "groups",
               {"kept": steps("groups_kept"), "drawn": steps("groups")})]
    charts = [(t, y, {k: v for k, v in s.items() if v}) for t, y, s in charts if any(s.values())]
    if not charts:
        return ["log.jsonl has no GRPO step."]
    last = max(x for _, _, s in charts for v in s.values() for x, _ in v)
    rows = math.ceil(len(charts) / 3)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{3 * W}" height="{rows * H}" '
           f'font-family="sans-serif">',
           f'<rect width="{3 * W}" height="{rows * H}" fill="white"/>']
    for i, c in enumerate(charts):
        svg += chart(W * (i % 3), H * (i // 3), *c, last)
    path.write_text("\n".join(svg + ["</svg>"]) + "\n")
    return [f"![curves per GRPO step]({path.name})"]


def tables(task, evals, split):
    """The paired tables, as the run printed them (eval.py's, video_eval.py's printers)."""
    buf = io.StringIO()
    if task == "video":
        from video_eval import print_video_report
        rows = evals[split]
        print(f"{split} windows ({rows['mle']['n']} predicted frames):", file=buf)
        print_video_report(rows, [(a, b) for a, b in (   # train_video.py's pairs
            ("rlvr", "mle"), ("rlvr", "mle_more"), ("rlvr", "copy"), ("mle", "copy"),
            ("mle_more", "mle")) if a in rows and b in {*rows, "copy"}], buf)
    else:
        for s, rows in evals.items():
            if rows:
                print_comparison(task, s, rows, buf)
    note = ["", "Windows resampled one by one, as the run printed them; the windows of one episode "
            "share its scene, and tools/results_table.py resamples them by episode (wider "
            "intervals)."] if task == "video" else []
    return ["```text", buf.getvalue().strip("\n"), "```"] + note


def cell(text):
    """A text as a table cell: code, HTML-escaped, its lines kept, cut after CUT characters."""
    text = text if len(text) <= CUT else text[:CUT] + " [...]"
    text = html.escape(text, quote=False).replace("|", "&#124;").replace("\n", "<br>")
    return f"<code>{text}</code>"


def records(task, config, out_dir, rows):
    """Four test records side by side (RULES): the action, the true change, each model's answer
    and its score."""
    T, pr = TASKS[task], rows["mle"]["per_record"]
    h, n = T.headline, len(pr["changed"])
    data = text_data(task, config, out_dir)
    recs = T.data.load_records(data / "test.jsonl")[:n] if (data / "test.jsonl").is_file() else []
    if [T.data.is_changed(r) for r in recs] != pr["changed"]:
        return [f"{data / 'test.jsonl'} is not here, or holds other records than the {n} this "
                f"run scored: no records to show."]
    lines = [f"Picked by a rule, not by eye: the first test record (in file order, of the {n} "
             f"scored) that meets each rule, the start's {h} against RLVR's."]
    if "answers" not in rows["mle"]:
        lines.append("This eval.json keeps no answers (it predates eval.py keeping them): the "
                     "scores only.")
    for rule, ok in RULES:
        i = next((i for i, (a, b) in enumerate(zip(pr[h], rows["rlvr"]["per_record"][h]))
                  if ok(a, b)), None)
        lines += ["", f"**{rule}**: " + ("none" if i is None else
                                        f"test record {i} (its action changes "
                                        f"{'the state' if pr['changed'][i] else 'nothing'})")]
        if i is None:
            continue
        lines += ["", f"| | text | {h} |", "| --- | --- | ---: |",
                  f"| action | {cell(recs[i]['action'])} | |",
                  f"| true change | {cell(T.data.target_text(recs[i]))} | |"]
        for k, r in rows.items():
            answer = cell(r["answers"][i]) if "answers" in r else "(not stored)"
            lines.append(f"| {MODELS[k]} | {answer} | {r['per_record'][h][i]:.2f} |")
    return lines


def strip(out_dir, config, rows, split):
    """strip.png: the `split` windows whose truth moves the most (tools/video_grid.py), context,
    truth, each model whose checkpoint is at hand, the error maps; rollout.gif: every predicted
    step (multi-step) -> its markdown."""
    import imageio.v2 as imageio
    import numpy as np
    from data.robot.prepare import DATA_DIR
    from data.robot.task import clips, load_split
    from tools.video_grid import grid
    from train_vq import SIZE
    from video_eval import load_video_model

    def found(name):   # this folder's checkpoint, else the recorded one: a start from a
        # checkpoints/ folder is the repository's shipped file (recorded on whichever machine)
        rec = Path(rows[name].get("checkpoint", ""))
        shipped = ROOT / "checkpoints" / rec.name if rec.parent.name == "checkpoints" else rec
        for f in (out_dir / f"video_{name}.safetensors", shipped, rec):
            if f.is_file() and f.suffix == ".safetensors":
                return f
    ckpts = {name: f for name in rows if (f := found(name))}
    if not ckpts:
        return ["No checkpoint of this run is at hand to draw its predictions."]
    # decoded as train_video.py decodes every model it compares: with the copy gate
    loaded = [(name, *load_video_model(f, copy_gate=1)[:2]) for name, f in ckpts.items()]
    a = read_meta(next(iter(ckpts.values())))["args"]   # the action bins of every model
    data = recorded_path(config["data"], out_dir) if "data" in config else DATA_DIR
    limit = config.get("test_limit", 0) if split == "test" else 0   # the episodes it scored
    try:
        episodes = clips(load_split(data, split, SIZE, limit),
                         config["clip_len"] if "clip_len" in config else a["clip_len"])
    except ValueError as e:   # the data is not here
        return [f"No picture: {e}."]
    first = rows["mle"]
    images, picks, maes = grid(loaded, episodes, first["context"], first["horizon"],
                               np.array(a["action_lo"], np.float32),
                               np.array(a["action_hi"], np.float32), WINDOWS, ZOOM)
    imageio.imwrite(out_dir / "strip.png", images[-1])
    lines = [f"The {len(picks)} {split} windows (clip, first frame) whose true frames differ the "
             f"most from the last context frame, predicted greedily; error maps: |prediction - "
             f"truth| x 3 (black: exact). MAE on these windows: "
             + ", ".join(f"{k} {v:.4f}" for k, v in maes.items()) + ".",
             "", f"![{split} windows: context, truth, each model, error maps](strip.png)"]
    if len(images) > 1:   # multi-step: the last step above, every step here
        imageio.mimsave(out_dir / "rollout.gif", images, duration=0.6, loop=0)
        lines += ["", f"Every predicted step: ![the rollout, step by step](rollout.gif)"]
    missing = [MODELS[k] for k in rows if k not in ckpts]
    if missing:
        lines += ["", f"Not drawn (no checkpoint at hand): {', '.join(missing)}."]
    return lines


# -----------------------------------------------------------------------------

def run_facts(out_dir, argv, seconds, command, commit):
    """What only the run knew, as markdown: its command, the commit, the wall time. The run's own
    (argv, seconds, and the checkout's commit), else `command` and `commit`, else the previous
    page's (a rebuild keeps them)."""
    page = out_dir / "report.md"
    old = page.read_text() if page.is_file() else ""
    if argv:
        return dict(command=f"`python {shlex.join(argv)}`", commit=checkout(),
                    seconds=f"{seconds / 60:.1f} min")
    wall = re.search(r"^- wall time: ([\d.]+ min) in all", old, re.M)
    return dict(command=f"`{command}`" if command else kept(old, "command"),
                commit=commit or kept(old, "commit"), seconds=wall and wall[1])


def write_report(out_dir, argv=None, seconds=None, command=None, commit=None):
    """Write out_dir/report.md and its pictures from the run's files -> its path. argv, seconds:
    the run's own command line and wall time (train_lang.py and train_video.py pass them); else
    `command` and `commit` as given, else the previous page's."""
    t0, out_dir = time.time(), Path(out_dir)
    facts = run_facts(out_dir, argv, seconds, command, commit)
    config = read_json(out_dir / "config.json") or {}
    rl, control = read_log(out_dir)
    evals = {s: read_json(out_dir / f) for s, f in (("test", "eval.json"),
                                                      ("val", "eval_val.json"))}
    evals = {s: r for s, r in evals.items() if r}
    task = the_task(config, next(iter(evals.values()))) if evals else None
    split = config.get("final_eval", "test") if task == "video" else "test"
    if task == "video":   # its eval.json holds the --final_eval split
        evals = {split: next(iter(evals.values()))}
    lines = [f"# {out_dir.name}: the run on one page", "",
             "Written by tools/report.py from this folder's files; `python tools/report.py "
             f"{shown(out_dir)}` rebuilds it.", ""]
    lines += header(out_dir, config, rl, control, facts,
                    data_line(task, config, out_dir, evals) if task else [])
    if not task:   # e.g. --stage=mle: no RLVR, no comparison
        lines += ["", "No eval.json: this run compared no models."]
    else:
        lines += ["", "## Headroom", ""] + headroom(evals[split], task)
        lines += ["", "## Curves per GRPO step", ""] + curves(rl, task, out_dir / "curves.svg")
        lines += ["", "## Held-out comparison", ""] + tables(task, evals, split)
    if task == "video":
        lines += ["", "## Predictions", ""] + strip(out_dir, config, evals[split], split)
    elif task and "test" in evals:
        lines += ["", "## Four test records", ""] + records(task, config, out_dir, evals["test"])
    page = out_dir / "report.md"
    page.write_text("\n".join(lines) + "\n")
    print(f"wrote {page} in {time.time() - t0:.1f} s")
    return page


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip(), allow_abbrev=False)
    p.add_argument("out_dir", help="a run's folder (its log.jsonl, eval.json, ...)")
    p.add_argument("--command", default=None, help="the run's command, where no report has it")
    p.add_argument("--commit", default=None, help="the run's commit, where no report has it")
    args = p.parse_args()
    if not Path(args.out_dir).is_dir():
        sys.exit(f"error: {args.out_dir}: no such folder")
    import torch
    torch.set_num_threads(1)   # the video rollouts: tiny models, one thread is fastest
    try:
        write_report(args.out_dir, command=args.command, commit=args.commit)
    except (ValueError, KeyError) as e:
        sys.exit(f"error: {args.out_dir}: {e}")


if __name__ == "__main__":
    main()
