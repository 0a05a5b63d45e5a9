"""
The control's learning rate, chosen on validation. The control is the MLE start trained further by
MLE for RLVR's compute; a control that damages its start is no control. For each rate (a multiple of
the start's own final MLE rate, which the default --control_lr=0 continues) this trains the control
alone for a finished RLVR run's compute (research/common.py's control), evaluates it on the
validation split beside the start, and prints one row per rate: the control minus the start, paired,
with its bootstrap 95% interval.

    python research/control_sweep.py --run=out/textgame                 # the default text run
    python research/control_sweep.py --run=out/webpage --factors=1,3,10

The run folder's config.json names the task, the start (--init) and the seed; its log.jsonl the
compute RLVR used (rl_compute). Controls go to <run>_control_sweep/x<factor>; --json writes the
rows.
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file: the repository root
from checkpoint import write_json  # noqa: E402
from mle import final_lr as start_final_lr  # noqa: E402
from research import common  # noqa: E402
from stats import paired_bootstrap  # noqa: E402
from tasks import TASKS  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1].strip(), allow_abbrev=False)
p.add_argument("--run", required=True, help="a finished train_lang.py run folder (RLVR done)")
p.add_argument("--factors", default="1,3,10",
               help="control rates as multiples of the start's final MLE rate")
p.add_argument("--val_limit", type=int, default=0, help="validation records (0 = all)")
p.add_argument("--threads", type=int, default=1)
p.add_argument("--json", default=None, help="write the rows here")
args = p.parse_args()

# ---------------------------------------------------------------------------------------------
# the run: its flags, start and RLVR's compute
run = Path(args.run)
try:
    config = json.loads((run / "config.json").read_text())   # the flags, paths relative to run
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    factors = [float(f) for f in args.factors.split(",")]
except (OSError, ValueError, KeyError) as e:
    sys.exit(f"error: --run {run} / --factors {args.factors}: {e}")
compute = [r["rl_compute"] for r in rows if r.get("stage") == "rlvr" and "rl_compute" in r]
if not compute:
    sys.exit(f"error: {run / 'log.jsonl'}: no RLVR step with rl_compute (a run of this code?)")
# the start: --init, or the run's own MLE stage (--init=scratch)
init = run / ("mle.safetensors" if config["init"] == "scratch" else config["init"])
data_dir = run / config["data_dir"]   # relative to the run folder, or absolute
final_lr = start_final_lr(init)
if final_lr is None:
    sys.exit(f"error: {init}: records no MLE schedule; this sweep is in multiples of its final rate")
task = TASKS[config["task"]]
print(f"{config['task']}: start {init} (final MLE rate {final_lr:.3g}), RLVR compute "
      f"{compute[-1]:.4g} forward-token units")

# ---------------------------------------------------------------------------------------------
# one control per rate, evaluated on validation beside the start
table = []
for f in factors:
    out = Path(f"{run}_control_sweep") / f"x{f:g}"
    flags = common.parser(common.__doc__).parse_args([
        f"--task={config['task']}", f"--init={init}", f"--seed={config['seed']}",
        f"--data_dir={data_dir}",
        f"--val_limit={args.val_limit}", f"--threads={args.threads}", f"--out_dir={out}"])
    print(f"x{f:g}: lr {f * final_lr:.3g} -> {out}", flush=True)
    r, (train, val, _), _, _, tok = common.setup(flags, ["mle_more.safetensors"])
    ckpt = common.control(r, str(init), tok, flags, train, val, compute[-1], f * final_lr)
    common.evaluate(r, tok, flags, {"mle": str(init), "mle_more": str(ckpt)}, val)
    ev = json.loads((out / "eval_val.json").read_text())
    h = task.headline
    m, lo, hi = paired_bootstrap(ev["mle_more"]["per_record"][h], ev["mle"]["per_record"][h])
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steps = [r for r in log if r.get("stage") == "mle_more"][-1]
    table.append(dict(factor=f, lr=f * final_lr, steps=steps["step"], compute=steps["compute"],
                      start=ev["mle"][h], control=ev["mle_more"][h], diff=[m, lo, hi]))

print(f"\ncontrol minus start, {task.headline} on validation, points (paired 95% CI):")
print("| rate | lr | steps | start | control | control - start |")
print("| --- | --- | ---: | ---: | ---: | --- |")
for r in table:
    m, lo, hi = (100 * x for x in r["diff"])
    star = " *" if lo > 0 or hi < 0 else ""   # the interval excludes 0
    print(f"| x{r['factor']:g} | {r['lr']:.3g} | {r['steps']} | {100 * r['start']:.2f} | "
          f"{100 * r['control']:.2f} | {m:+.2f} [{lo:+.2f}, {hi:+.2f}]{star} |")
best = max(table, key=lambda r: r["control"])
print(f"best on validation: x{best['factor']:g} (lr {best['lr']:.3g})")
if args.json:
    write_json(args.json, dict(run=str(run), rl_compute=compute[-1], final_lr=final_lr, rows=table))
