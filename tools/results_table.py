"""
The results tables of README.md, docs/results.md and research/README.md, computed from the
per-record evaluations in results/.

    python tools/results_table.py                     # the README's results block
    python tools/results_table.py --block=seeds       # one block (--block=list: their names)
    python tools/results_table.py --write             # rewrite every block in its page
    python tools/results_table.py --check             # exit 1 when a block there differs

Each block sits in its page between `<!-- results:begin NAME -->` and `<!-- results:end NAME -->`,
so a figure in those tables is typed by no one: it is read from a run's eval.json (test split),
eval_val.json (validation split) or log.jsonl (results/README.md says which command made which
folder). Differences between models of one run are paired per record, with a bootstrap 95%
interval over the records (eval.paired_bootstrap: 10,000 resamples, seed 0; the video windows of
one episode resampled together). Several seeds are summed up by the mean of their per-seed
differences with a t-interval over the seeds (`seed_ci`): the spread between seeds, not a draw
chosen among them. `*` marks an interval that excludes 0.
"""
import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file: the repository root
from stats import paired_bootstrap  # noqa: E402

RESULTS = ROOT / "results"
# the runs the tables read (results/<folder>), seeds in the order 1337 (the default), 1, 2
TEXT_SEEDS = ("textgame_s1337", "textgame_s1", "textgame_s2")
WEB_SEEDS = ("webpage_s1337", "webpage_s1", "webpage_s2")
VIDEO_SEEDS = ("video_default", "video_default_s1", "video_default_s2")   # machine A
# issue 58's runs (this machine, validation first, test once after): one-step video over 8 seeds,
# and RLVR from the weak text start (checkpoints/textgame/mle_lf10) over 3 seeds
VIDEO_8 = tuple(f"video_seeds/s{s}" for s in (1337, 1, 2, 3, 4, 5, 6, 7))
WEAK = ("textgame_weak_s1337", "textgame_weak_s1", "textgame_weak_s2")
VIDEO_B = ("video_default_machine_b",)   # seed 1337 again on machine B (other float rounding)
MULTI_B = ("video_multi4000", "video_multi4000_s1")   # machine B, seeds 1337 and 1
MULTI_A = ("video_multi4000_machine_a", "video_multi4000_machine_a_s1")   # machine A, the same
# validation: one run per video configuration, RLVR (eval.json there is the validation split) and
# its control alone (`--stage=control`, eval_val.json)
VIDEO_VAL = {"video_default": ("video_default_val", "video_control_val/default_x0.3"),
             "video_multi4000": ("video_multi4000_val", "video_control_val/multi4000_x1")}
# a control whose rate was kept after a test split was seen (video.md at a76ad68: the 0.3x control's
# test runs, results/video_multi4000_x03 there, were above the start; the 1x default was kept)
CONTROL_NOTE = {"video": "", "multi": " (rate kept after a 0.3x control's test was seen)"}
# when those validation runs were made, against the test runs (their commits' order in git)
VAL_WHEN = {"video_default": "RLVR in the same commit as the test runs, its control after them",
            "video_multi4000": "RLVR before the test runs, its control after them"}
VAL_ONLY = {v[0] for v in VIDEO_VAL.values()}   # runs whose eval.json is the validation split
SEED_NAMES = ("1337", "1", "2")
COMMANDS = {   # the command of each default run
    "textgame": "python train_lang.py",
    "webpage": "python train_lang.py --task=webpage",
    "video": "python train_video.py",
    "multi": "python train_video.py --mode=multi --out_dir=out/video_multi"}
MODELS = {"mle": "MLE start", "rlvr": "RLVR", "mle_more": "MLE continued"}   # eval.json's keys

# -----------------------------------------------------------------------------
# reading results/


@functools.cache
def compute_matched(run):
    """Whether the run's control ("mle_more") had RLVR's counted compute (its log records
    rl_compute), as the code trains it, or is a control alone (--stage=control: no RLVR rows, a
    given compute). A control of an older rule does not reproduce: the tables leave it out
    ("-")."""
    log = (RESULTS / run / "log.jsonl").read_text()
    return '"rl_compute"' in log or '"stage": "rlvr"' not in log


def load(run, split="test"):
    """results/<run>/eval.json (test) or eval_val.json (val) -> {model: evaluation}; without
    "mle_more" where the run's control is not compute-matched."""
    path = RESULTS / run / ("eval.json" if split == "test" or run in VAL_ONLY else "eval_val.json")
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"error: {path}: {e}")
    if not compute_matched(run):
        rows.pop("mle_more", None)
    return rows


def per_record(rows, model, metric, subset="all"):
    """One model's per-record values of a metric, on all records or on the changed ones (the
    MLE start's marks: every model scored the same records). Video: model "copy" is the
    copy-last-frame baseline."""
    r = rows["mle"]["copy_last_frame"] if model == "copy" else rows[model]
    x = np.asarray(r["per_record"][metric], dtype=np.float64)
    if subset != "all":   # "changed" or "unchanged"
        changed = np.asarray(rows["mle"]["per_record"]["changed"], dtype=bool)
        x = x[changed if subset == "changed" else ~changed]
    return x


def episodes(rows):
    """The episode of each video window (a window is [episode, start]), resampled together by the
    bootstrap; None where the records carry no episode (the language tasks)."""
    pr = rows["mle"]["per_record"]
    return np.asarray([w[0] for w in pr["windows"]]) if "windows" in pr else None


def diff(runs, a, b, metric, subset="all", split="test"):
    """a - b over the same records -> (mean, low, high); several runs are seeds, resampled too.
    a or b may be (run, model), to pair models of two runs (RLVR against a placebo run)."""
    xs = []
    for i, run in enumerate(runs):
        ra, ma = a if isinstance(a, tuple) else (run, a)
        rb, mb = b if isinstance(b, tuple) else (run, b)
        A, B = load(ra, split), load(rb, split)
        if ma not in {*A, "copy"} or mb not in {*B, "copy"}:
            return None, None, None   # a model left out (a control of an older rule)
        xs.append(per_record(A, ma, metric, subset) - per_record(B, mb, metric, subset))
    d = np.stack(xs)   # (seeds, n): per seed and record
    ep = episodes(load(runs[0], split))
    ep = None if ep is None or subset != "all" else ep
    keep = np.isfinite(d).all(0)   # a metric undefined on some records (null: NaN) skips them
    return paired_bootstrap(d[:, keep], np.zeros_like(d[:, keep]),
                            clusters=None if ep is None else ep[keep])


def pct(x):
    """A share as a percentage with 2 decimals; "-" for none."""
    return "-" if x is None else f"{100 * x:.2f}"


def ci(v, scale=100, digits=2, star=True):
    """(mean, low, high) -> "+1.23 [+0.45, +2.01] *", scaled (100: points); no "-0.00"; "-" for
    a comparison left out."""
    if v[0] is None:
        return "-"
    m, lo, hi = (round(scale * x, digits) + 0.0 for x in v)
    mark = " *" if star and (lo > 0 or hi < 0) else ""
    return f"{m:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]{mark}"


def three(run, a, b, metric, split="test"):
    """a - b overall, on the changed and on the unchanged records: "overall / changed /
    unchanged", each a paired 95% CI."""
    return " / ".join(ci(diff([run], a, b, metric, sub, split))
                      for sub in ("all", "changed", "unchanged"))


def share(x):
    """A success rate in %, no decimals; "-" for none."""
    return "-" if x is None else f"{100 * x:.0f}"


def table(header, rows, right=()):
    """A markdown table; the columns whose index is in `right` are right-aligned."""
    align = ["---:" if i in right else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def summary(plan_file):
    """results/plan/<plan_file>.json -> its planners' summary rows (experiments/plan.summarize)."""
    return json.loads((RESULTS / "plan" / f"{plan_file}.json").read_text())["summary"]


def plan_success(spec):
    """"file:planner" -> that planner's success per episode, 0 or 1, in start-state order."""
    f, planner = spec.split(":", 1)
    episodes = json.loads((RESULTS / "plan" / f"{f}.json").read_text())["episodes"][planner]
    return [float(e["success"]) for e in episodes]


def plan_diff(specs, ref):
    """Success of the planners `specs` (several: seeds, resampled too) minus that of `ref` over
    the same start states -> (mean, low, high), as experiments/plan.paired does."""
    return paired_bootstrap([plan_success(s) for s in specs], [plan_success(ref)])


def seed_ci(runs, a, b, metric, split="test", scale=100, digits=2, subset="all"):
    """a - b, one mean difference per seed (run), -> "mean [low, high] *" with the t-interval over
    the seeds' means (95%); a single run: the bootstrap interval over its records instead."""
    if len(runs) == 1:
        return ci(diff(runs, a, b, metric, subset, split), scale, digits) + " (records)"
    d = []
    for run in runs:
        r = load(run, split)
        x = per_record(r, a, metric, subset) - per_record(r, b, metric, subset)
        d.append(np.nanmean(x))
    d = np.asarray(d)
    half = st.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return ci((d.mean(), d.mean() - half, d.mean() + half), scale, digits)


def each(runs, model, metric, split="test", fmt=pct):
    """A model's headline metric in each run (seed), joined by " / "; "-" where it was left out."""
    rows = [load(run, split) for run in runs]
    return " / ".join(fmt(r[model][metric]) if model in r else "-" for r in rows)


def milli(x):
    """An MAE in units of 1e-3, 2 decimals."""
    return f"{1000 * x:.2f}"


# -----------------------------------------------------------------------------
# README.md


def readme():
    """The README's results: per task and split, the MLE start, RLVR and MLE continued for the
    same compute in each seed, the baseline, and RLVR minus its start over the seeds."""
    head = ["task", "split (n), metric", "MLE start", "RLVR, each seed",
            "MLE continued (same compute), each seed", "baseline",
            "RLVR - MLE start, mean over seeds, 95% CI"]
    rows = []
    for task, seeds, metric, what in (
            ("textgame", TEXT_SEEDS, "accuracy", "exact next state, %"),
            ("webpage", WEB_SEEDS, "f1", "F1 of the page changes, %")):
        for split in ("test", "val"):
            r = load(seeds[0], split)
            rows.append([f"`{COMMANDS[task]}`" if split == "test" else "",
                         f"{split} ({r['mle']['n']}), {what}", pct(r["mle"][metric]),
                         each(seeds, "rlvr", metric, split), each(seeds, "mle_more", metric, split),
                         pct(r["mle"]["baseline_no_change"][metric]) + ' ("no change")',
                         seed_ci(seeds, "rlvr", "mle", metric, split)])
    # one-step video: 8 seeds on one machine, validation first, test once after (issue 58)
    for i, split in enumerate(("val", "test")):
        have = [r for r in VIDEO_8 if (RESULTS / r / ("eval_val.json" if split == "val"
                                                      else "eval.json")).is_file()]
        if have:
            r = load(have[0], split)
            rows.append([f"`{COMMANDS['video']}`" if i == 0 else "",
                         f"{split} ({r['mle']['n_windows']} windows), MAE x 1e-3 of the next "
                         f"frame, {len(have)} seeds", milli(r["mle"]["mae"]),
                         each(have, "rlvr", "mae", split, milli),
                         each(have, "mle_more", "mae", split, milli),
                         milli(r["mle"]["copy_last_frame"]["mae"]) + " (copy the last frame)",
                         seed_ci(have, "rlvr", "mle", "mae", split, scale=1000)])
    # seven-step video: docs/results.md (the seeds block), as its README bullet says
    return table(head, rows, right=(2,))


# -----------------------------------------------------------------------------
# docs/results.md


def seeds():
    """Every seed (and machine) of the four default runs on both splits: RLVR minus its start, RLVR
    minus MLE continued for the same compute, MLE continued minus the start, each paired over the
    records (video: windows resampled by episode); then the mean over the seeds with its
    t-interval. Language in points, video MAE in units of 1e-3 (lower is better)."""
    head = ["run", "split", "seed", "RLVR - MLE start", "RLVR - MLE continued",
            "MLE continued - MLE start"]
    pairs = (("rlvr", "mle"), ("rlvr", "mle_more"), ("mle_more", "mle"))
    rows = []

    def add(label, split, runs, names, metric, scale):
        for name, run in zip(names, runs):
            rows.append([label, split, name, *(ci(diff([run], a, b, metric, split=split), scale)
                                               for a, b in pairs)])
        if len(runs) > 1:
            rows.append([label, split, f"mean of {len(runs)}, t-interval",
                         *(seed_ci(runs, a, b, metric, split, scale) for a, b in pairs)])
    for task, runs, metric in (("textgame", TEXT_SEEDS, "accuracy"), ("webpage", WEB_SEEDS, "f1")):
        for split in ("test", "val"):
            add(f"`{COMMANDS[task]}`", split, runs, SEED_NAMES, metric, 100)
    for task, draws in (("video", ((VIDEO_SEEDS, "A"), (VIDEO_B, "B"))),
                        ("multi", ((MULTI_B, "B"), (MULTI_A, "A")))):
        for runs, machine in draws:
            add(f"`{COMMANDS[task]}`", "test", runs,
                [f"{s}, machine {machine}" for s in SEED_NAMES], "mae", 1000)
        val_run, val_control = VIDEO_VAL[draws[0][0][0]]
        rows.append([f"`{COMMANDS[task]}`", "val", "1337 (RLVR and the control: two runs)",
                     ci(diff([val_run], "rlvr", "mle", "mae", split="val"), 1000),
                     ci(diff([val_run], "rlvr", (val_control, "mle_more"), "mae", split="val"),
                        1000),
                     ci(diff([val_control], "mle_more", "mle", "mae", split="val"), 1000)])
    return table(head, rows)


def wins():
    """Where RLVR may beat equal-compute MLE (issue 58): one-step video over 8 seeds and the weak
    text start over 3, each split: the MLE start, RLVR and MLE continued (means over the seeds),
    and RLVR minus each, the mean over seeds with its t-interval (text: overall / changed /
    unchanged records)."""
    head = ["regime (results/)", "split (n)", "MLE start", "RLVR, mean", "MLE continued, mean",
            "RLVR - MLE start", "RLVR - MLE continued, same compute"]
    rows = []
    for label, runs, metric, scale, fmt, subsets in (
            ("one-step video, MAE x 1e-3 (`video_seeds/`)", VIDEO_8, "mae", 1000, milli, ("all",)),
            ("text game from the weak start, % (`textgame_weak_s*`)", WEAK, "accuracy", 100, pct,
             ("all", "changed", "unchanged"))):
        for split in ("val", "test"):
            have = [r for r in runs if (RESULTS / r / ("eval_val.json" if split == "val"
                                                       else "eval.json")).is_file()]
            if not have:
                continue
            rs = [load(r, split) for r in have]
            n = rs[0]["mle"].get("n_windows", rs[0]["mle"]["n"])
            rows.append([label if split == "val" else "", f"{split} ({n}), {len(have)} seeds",
                         fmt(rs[0]["mle"][metric]),
                         fmt(float(np.mean([r["rlvr"][metric] for r in rs]))),
                         fmt(float(np.mean([r["mle_more"][metric] for r in rs]))),
                         *(" / ".join(seed_ci(have, "rlvr", b, metric, split, scale, subset=x)
                                      for x in subsets) for b in ("mle", "mle_more"))])
    return table(head, rows)


def headroom():
    """The headroom line of each demo's start (grpo.headroom, results/headroom/<start>.json: the
    line the command printed before its first GRPO step): greedy against the best of G samples on
    64 fixed validation prompts, the share a sample fixes, the share of groups with spread."""
    head = ["start (command)", "metric", "greedy", "best of 8 at T=1", "a sample beats greedy",
            "groups with reward spread"]
    rows = []
    for name, what, scale in (("textgame", "exact next state, %", 100),
                              ("textgame_weak", "exact next state, %", 100),
                              ("webpage", "F1 of the page changes, %", 100),
                              ("video", "MAE x 1e-3 (lower is better)", -1000)):
        r = json.loads((RESULTS / "headroom" / f"{name}.json").read_text())
        h = r["headroom"]
        rows.append([f"`{r['command']}`", what, f"{scale * h['greedy']:.2f}",
                     f"{scale * h['best']:.2f}", f"{h['fixed']:.1%}", f"{h['spread']:.1%}"])
    return table(head, rows)


def control_left_out(run, split):
    """Why a run's table shows no control: none was run ("-"), or it trained for RLVR's
    wall-clock, not its compute (load leaves it out)."""
    path = RESULTS / run / ("eval.json" if split == "test" else "eval_val.json")
    ran = "mle_more" in json.loads(path.read_text())
    return "- (its control had RLVR's wall-clock, not its compute)" if ran else "-"


def regimes():
    """The text game's regimes: RLVR minus its MLE start per split, overall / changed / unchanged
    records (paired 95% CIs), and the placebos (rewards permuted within each kept group)."""
    head = ["regime (results/)", "split (n)", "MLE start", "RLVR",
            "RLVR - MLE start: overall / changed / unchanged", "RLVR - MLE continued, same compute"]
    rows = []
    for label, run, splits in (
            ("(b) MLE on 10% of the labels (`textgame_lf10`)", "textgame_lf10", ("test", "val")),
            ("(c) partial-credit reward (`textgame_task_specific`)", "textgame_task_specific",
             ("val",)),
            ("(d) RL on off-script prompts (`textgame_cover`)", "textgame_cover", ("test", "val")),
            ("placebo: permuted rewards (`textgame_placebo`)", "textgame_placebo", ("test", "val")),
            ("small RL pool, 128 records (`textgame_pool128`)", "textgame_pool128", ("val",)),
            ("its placebo (`textgame_pool128_placebo`)", "textgame_pool128_placebo", ("val",))):
        for split in splits:
            r = load(run, split)
            rows.append([label, f"{split} ({r['mle']['n']})", pct(r["mle"]["accuracy"]),
                         pct(r["rlvr"]["accuracy"]), three(run, "rlvr", "mle", "accuracy", split),
                         ci(diff([run], "rlvr", "mle_more", "accuracy", split=split))
                         if "mle_more" in r else control_left_out(run, split)])
    for real, placebo, splits in (("textgame_s1337", "textgame_placebo", ("test", "val")),
                                  ("textgame_pool128", "textgame_pool128_placebo", ("val",))):
        for split in splits:
            rows.append([f"RLVR (`{real}`) - its placebo",
                         f"{split} ({load(real, split)['mle']['n']})",
                         "", "", three(real, "rlvr", (placebo, "rlvr"), "accuracy", split), ""])
    return table(head, rows, right=(2, 3))


def budget():
    """Ten times the GRPO steps (300, from the default start and seed; the control continued for
    their compute): per task and split, RLVR minus its start, minus its control, and the control
    minus the start (overall, paired 95% CI)."""
    head = ["run (results/)", "split (n)", "RLVR - MLE start", "RLVR - MLE continued",
            "MLE continued - MLE start"]
    rows = [[f"`{run}`", f"{split} ({load(run, split)['mle']['n']})",
             *(ci(diff([run], a, b, metric, split=split))
               for a, b in (("rlvr", "mle"), ("rlvr", "mle_more"), ("mle_more", "mle")))]
            for run, metric in (("textgame_x10", "accuracy"), ("webpage_x10", "f1"))
            for split in ("test", "val")]
    return table(head, rows)


def ceiling():
    """What the video metric allows: copying the last frame, the per-frame tokenizer's ceiling (the
    true frames encoded and decoded) and the MLE start, on the default runs' test windows."""
    rows = []
    for run, what in (("video_default", "next frame"), ("video_multi4000", "7 frames")):
        r = load(run)["mle"]
        rows.append([f"{r['n_windows']} windows, {what}", milli(r["copy_last_frame"]["mae"]),
                     milli(r["tokenizer_ceiling"]["mae"]), milli(r["mae"]),
                     ci(diff([run], "copy", "mle", "mae"), 1000)])
    return table(["test", "copy the last frame", "tokenizer ceiling", "MLE start",
                  "copy - MLE start, 95% CI"], rows, right=(1, 2, 3))


# -----------------------------------------------------------------------------
# research/README.md


def planning():
    """Planning with a world model, 100 episodes per split (plan.py's default flags): the text-game
    planner with the MLE model and the RLVR models of three seeds (rooms and seeds resampled), and
    the web-page planner among a word-overlap policy's 3 best actions: success %."""
    tg_mle, web_mle = "checkpoints/textgame/mle.safetensors", "checkpoints/webpage/mle.safetensors"
    rlvr = ("out/textgame/rlvr.safetensors", "out/textgame_s1/rlvr.safetensors",
            "out/textgame_s2/rlvr.safetensors")
    files = {"test": ("textgame_mle_rlvr_noop_tw", "textgame_rlvr_s1_s2_noop_tw"),
             "val": ("textgame_val_mle_rlvr", "textgame_val_rlvr_s1_s2")}
    head = ["task", "split", "random", "policy alone", "MLE world model", "paired 95% CI"]
    rows = []
    for split, (first, others) in files.items():
        d = plan_diff([f"{first}:{rlvr[0]}", *(f"{others}:{m}" for m in rlvr[1:])],
                      f"{first}:{tg_mle}")
        rand = summary("textgame_mle_noop_tw")["random"]["success"] if split == "test" else None
        rows.append(["text game rooms", split, share(rand), "-",
                     share(summary(first)[tg_mle]["success"]),
                     "RLVR - MLE: " + ci(d, 100, 1) + " (3 seeds)"])
    web = summary("webpage_policy3")
    rows.append(["web pages, among the policy's 3 best actions", "test",
                 share(web["random"]["success"]),
                 share(web["policy"]["success"]), share(web[web_mle]["success"]), "MLE - policy: " +
                 ci(plan_diff([f"webpage_policy3:{web_mle}"], "webpage_policy3:policy"), 100, 1)])
    val = summary("webpage_val_policy3_nomodel")
    rows.append(["", "val", share(val["random"]["success"]), share(val["policy"]["success"]),
                 share(summary("webpage_val_propose")["3"]["success"]) + " (3 chosen here)", "-"])
    return table(head, rows, right=(2, 3, 4))


BLOCKS = {   # name -> (page, the function that makes it)
    "readme": ("README.md", readme),
    "headroom": ("README.md", headroom),
    "seeds": ("docs/results.md", seeds),
    "regimes": ("docs/results.md", regimes),
    "wins": ("docs/results.md", wins),
    "budget": ("docs/results.md", budget),
    "ceiling": ("docs/results.md", ceiling),
    "planning": ("research/README.md", planning),
}


def markers(name):
    """The two comment lines around block `name` in its page."""
    return f"<!-- results:begin {name} -->", f"<!-- results:end {name} -->"


def in_page(text, name):
    """Block `name` as it stands in a page's text (None when its markers are missing)."""
    begin, end = markers(name)
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        return None
    return text[i + len(begin):j].strip("\n")


def replace_in_page(text, name, block):
    """The page's text with block `name` replaced."""
    begin, end = markers(name)
    i, j = text.find(begin), text.find(end)
    return text[:i + len(begin)] + "\n" + block + "\n" + text[j:]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip(), allow_abbrev=False)
    p.add_argument("--block", default="readme", help="the block to print (list: their names)")
    p.add_argument("--write", action="store_true", help="rewrite every block in its page")
    p.add_argument("--check", action="store_true", help="exit 1 when a block in a page differs")
    args = p.parse_args(argv)
    if args.block == "list":
        print("\n".join(f"{name:<22} {page}" for name, (page, _) in BLOCKS.items()))
        return
    if args.block not in BLOCKS:
        sys.exit(f"error: --block: unknown block {args.block!r} (--block=list names them)")
    if not (args.write or args.check):
        print(BLOCKS[args.block][1]())
        return
    # every page's markers first, so that a missing one stops the run before anything is written
    pages = {page: (ROOT / page).read_text() for page, _ in BLOCKS.values()}
    for name, (page, _) in BLOCKS.items():
        if in_page(pages[page], name) is None:
            sys.exit(f"error: {page}: no {markers(name)[0]} ... {markers(name)[1]}")
    stale = []
    for name, (page, make) in BLOCKS.items():
        block = make()
        if in_page(pages[page], name) != block:
            stale.append(f"{page}: {name}")
            pages[page] = replace_in_page(pages[page], name, block)
    if args.write:
        for page in {s.split(":")[0] for s in stale}:
            (ROOT / page).write_text(pages[page])
    for s in stale:
        print(("rewrote " if args.write else "differs from results/: ") + s)
    if stale and args.check:
        sys.exit(1)


if __name__ == "__main__":
    main()
