"""
Plot what an RLVR run did, from its log.jsonl: does the optimiser climb its own reward?

    python research/plot_rl.py out/textgame/log.jsonl out/textgame_placebo/log.jsonl --labels=RLVR,placebo \
        --out=docs/img/textgame_rl.png

Panels, against the GRPO step: the reward on the fixed probe set of training prompts (mean of 4 samples at T=1, and
greedy), the on-policy reward of each step's rollouts, and KL to the MLE start with the policy's entropy. A working
optimiser shows the probe reward rising; the placebo (rewards permuted within each group) does not. (The weight
movement panel went with the core's weight-path log at 107457f: it did not tell the two apart, research/README.md.)
Needs matplotlib (requirements-dev.txt).
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root
from checkpoint import atomic_write  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
p.add_argument("logs", nargs="+", help="log.jsonl files of train_lang.py runs")
p.add_argument("--labels", default=None, help="comma-separated names of the runs (default: their folders)")
p.add_argument("--out", default="rl_run.png", help="the PNG to write")
p.add_argument("--smooth", type=int, default=5, help="moving-average window for the per-step rewards")
args = p.parse_args()
labels = args.labels.split(",") if args.labels else [Path(f).parent.name for f in args.logs]
if len(labels) != len(args.logs):
    sys.exit(f"error: --labels names {len(labels)} runs, {len(args.logs)} logs given")
try:   # a dev requirement, imported after the flags: --help needs only requirements.txt
    import matplotlib
except ImportError:
    sys.exit("error: research/plot_rl.py draws with matplotlib: pip install -r requirements-dev.txt")
matplotlib.use("Agg")   # files only, no screen
import matplotlib.pyplot as plt  # noqa: E402


def rlvr_rows(path):
    """The RLVR rows of a log, the last one per step (a resumed run repeats the steps after its last checkpoint)."""
    try:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        sys.exit(f"error: {path}: {e}")
    by_step = {}
    for r in rows:
        if r.get("stage") == "rlvr" and "step" in r:
            by_step[r["step"]] = {**by_step.get(r["step"], {}), **r}
    return [by_step[s] for s in sorted(by_step)]


def series(rows, key):
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [s for s, _ in pts], [v for _, v in pts]


def smooth(ys, k):
    return [sum(ys[max(0, i - k + 1):i + 1]) / len(ys[max(0, i - k + 1):i + 1]) for i in range(len(ys))]


fig, (ax_probe, ax_reward, ax_kl) = plt.subplots(1, 3, figsize=(16, 4.5))
ax_ent = ax_kl.twinx()
for path, label, color in zip(args.logs, labels, plt.rcParams["axes.prop_cycle"].by_key()["color"]):
    rows = rlvr_rows(path)
    if not rows:
        sys.exit(f"error: {path}: no RLVR rows (is it a train_lang.py log?)")
    x, y = series(rows, "probe_reward")
    ax_probe.plot(x, y, "o-", color=color, label=f"{label}: T=1 (4 samples)")
    x, y = series(rows, "probe_greedy")
    ax_probe.plot(x, y, "s--", color=color, alpha=0.6, label=f"{label}: greedy")
    x, y = series(rows, "reward_mean")
    ax_reward.plot(x, smooth(y, args.smooth), color=color, label=label)
    x, y = series(rows, "kl")
    ax_kl.plot(x, y, color=color, label=f"{label}: KL")
    x, y = series(rows, "entropy")
    ax_ent.plot(x, y, ":", color=color, label=f"{label}: entropy")
ax_probe.set(title="reward on the fixed probe set of training prompts", xlabel="GRPO step", ylabel="reward")
ax_reward.set(title=f"on-policy reward of the step's rollouts ({args.smooth}-step mean)", xlabel="GRPO step")
ax_kl.set(title="KL to the MLE start (solid) and entropy (dotted)", xlabel="GRPO step", ylabel="KL per token")
ax_ent.set_ylabel("entropy per token (nats)")
for ax in (ax_probe, ax_reward):
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
ax_kl.legend(fontsize=8, loc="upper left")
ax_ent.legend(fontsize=8, loc="lower right")
fig.tight_layout()
atomic_write(args.out, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
print(f"wrote {args.out}")
