"""
The regime table and figure: RLVR against its MLE start and against equal-compute MLE, paired over the same records,
for several train_lang.py or train_video.py runs (regimes, seeds, tasks), read from their eval.json / eval_val.json.

    python research/regimes.py "default=out/textgame,out/textgame_s1,out/textgame_s2" \
        "off-script prompts=out/textgame_cover" --split=test --out=docs/img/regimes_textgame.png
    python research/regimes.py "video=out/video,out/video_s1,out/video_s2"    # MAE per test window, x 1e-3

Each positional argument is `label=dir[,dir...]`; several folders under one label are seeds of one regime. A seed
row gives RLVR - model on the headline metric (exact accuracy or F1, in points) with a paired bootstrap 95% interval
over the split's records; a label with several seeds also gets a row over all its seeds, whose interval resamples the
seeds and the records (eval.paired_bootstrap: every seed scored the same records, so they stay paired).
Prints a markdown table, writes the figure (a forest plot, one line per comparison) and, with --json, the numbers.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root
from checkpoint import atomic_write, write_json  # noqa: E402
from stats import paired_bootstrap  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
p.add_argument("runs", nargs="+", help="label=dir[,dir...]: train_lang.py out_dirs, several = seeds of one regime")
p.add_argument("--split", default="test", choices=["test", "val"], help="eval.json (test) or eval_val.json (val)")
p.add_argument("--against", default="mle,mle_more", help="models RLVR is compared with (keys of eval.json)")
p.add_argument("--out", default=None, help="PNG forest plot to write")
p.add_argument("--json", default=None, help="JSON file for the rows")
p.add_argument("--target", type=float, default=None, help="draw a dashed line at this gain (points)")
p.add_argument("--pooled_only", type=int, default=0, help="1: a label with several seeds shows its all-seeds rows only")
args = p.parse_args()
against = args.against.split(",")
NAMES = {"mle": "MLE start", "mle_more": "equal-compute MLE", "placebo": "placebo"}
UNITS = {"accuracy": (100, "points"), "f1": (100, "points"), "mae": (1000, "x 1e-3")}   # metric -> (scale, unit)


def load(run_dir):
    """The eval JSON of one run -> (headline metric name, {model: per_record dict})."""
    path = Path(run_dir) / ("eval.json" if args.split == "test" else "eval_val.json")
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"error: {path}: {e}")
    if "rlvr" not in rows:
        sys.exit(f"error: {path}: no 'rlvr' entry (a run with --stage=mle?)")
    metric = next(m for m in UNITS if m in rows["rlvr"]["per_record"])   # the task's headline metric
    return metric, {name: r["per_record"] for name, r in rows.items()}


def diffs(rows, metric, ref, subset):
    """Per-record RLVR - ref on the metric, over all records or the changed ones -> (n,) array, or None."""
    if ref not in rows:
        return None
    keep = np.array(rows[ref]["changed"], bool) if subset == "changed" else np.ones(len(rows[ref][metric]), bool)
    return (np.asarray(rows["rlvr"][metric], float) - np.asarray(rows[ref][metric], float))[keep]


# -----------------------------------------------------------------------------
# one row per (label, seed or all seeds, reference model): the paired differences overall and on changed records

table = []
for spec in args.runs:
    label, _, dirs = spec.partition("=")
    if not dirs:
        sys.exit(f"error: '{spec}': expected label=dir[,dir...]")
    runs = [(d, *load(d)) for d in dirs.split(",")]
    for ref in against:
        per_seed = {sub: [] for sub in ("all", "changed")}
        for d, metric, rows in runs:
            row = {"regime": label, "run": d, "against": ref, "metric": metric, "n": len(rows["rlvr"][metric])}
            for sub in per_seed:
                x = diffs(rows, metric, ref, sub)
                if x is None:
                    break
                per_seed[sub].append(x)
                m, lo, hi = paired_bootstrap(x, np.zeros_like(x))
                row[sub] = [UNITS[metric][0] * v for v in (m, lo, hi)]
            else:
                if len(runs) == 1 or not args.pooled_only:
                    table.append(row)
        if len(runs) > 1 and len(per_seed["all"]) == len(runs):
            row = {"regime": label, "run": f"{len(runs)} seeds", "against": ref, "metric": runs[0][1],
                   "n": len(per_seed["all"][0])}
            for sub, xs in per_seed.items():
                x = np.stack(xs)   # (seeds, n): seeds and records resampled
                m, lo, hi = paired_bootstrap(x, np.zeros_like(x))
                row[sub] = [UNITS[row["metric"]][0] * v for v in (m, lo, hi)]
            table.append(row)

if len({r["metric"] for r in table}) > 1:   # one unit per table and figure
    sys.exit("error: the runs have different headline metrics (text and video?); give one task per call")

# -----------------------------------------------------------------------------
# print, save, plot


def ci(v):
    star = " *" if v[1] > 0 or v[2] < 0 else ""   # the interval excludes zero
    v = [round(x, 2) + 0.0 for x in v]             # no "-0.00"
    return f"{v[0]:+.2f} [{v[1]:+.2f}, {v[2]:+.2f}]{star}"


print(f"| regime | run | RLVR minus | n ({args.split}) | overall ({UNITS[table[0]['metric']][1]}, 95% CI) | changed |")
print("| --- | --- | --- | ---: | --- | --- |")
for r in table:
    print(f"| {r['regime']} | {r['run']} | {NAMES.get(r['against'], r['against'])} | {r['n']} | {ci(r['all'])} "
          f"| {ci(r['changed'])} |")
if args.json:
    write_json(args.json, {"split": args.split, "rows": table})
if args.out:
    try:   # a dev requirement, imported only to draw: --help and the table need only requirements.txt
        import matplotlib
    except ImportError:
        sys.exit("error: --out draws with matplotlib: pip install -r requirements-dev.txt")
    matplotlib.use("Agg")   # files only, no screen
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(table) + 1.4))
    for i, r in enumerate(table):
        y = len(table) - 1 - i
        for sub, dy, color in (("all", 0.12, "C0"), ("changed", -0.12, "C1")):
            m, lo, hi = r[sub]
            ax.errorbar(m, y + dy, xerr=[[m - lo], [hi - m]], fmt="o", color=color, capsize=3,
                        label=sub if i == 0 else None)
    ax.set_yticks(range(len(table)))
    ax.set_yticklabels([f"{r['regime']} · {Path(r['run']).name} · vs {NAMES.get(r['against'], r['against'])}"
                        for r in reversed(table)], fontsize=8)
    ax.axvline(0, color="k", lw=0.8)
    if args.target is not None:
        ax.axvline(args.target, color="k", ls="--", lw=0.8, label=f"target +{args.target:g}")
    ax.set_xlabel(f"RLVR minus model: {table[0]['metric']} {UNITS[table[0]['metric']][1]}, {args.split} split, "
                  "paired 95% CI")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    atomic_write(args.out, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    print(f"wrote {args.out}")
