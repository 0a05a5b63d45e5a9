"""
The results tables of README.md and docs/, computed from the per-record evaluations in results/.

    python tools/results_table.py                          # the README's results block
    python tools/results_table.py --block=textgame_seeds   # one block (--block=list: their names)
    python tools/results_table.py --write                  # rewrite every block in its page
    python tools/results_table.py --check                  # exit 1 when a block there differs

Each block sits in its page between `<!-- results:begin NAME -->` and `<!-- results:end NAME -->`,
so a figure in those tables is typed by no one: it is read from a run's eval.json (test split),
eval_val.json (validation split), log.jsonl or planning JSON (results/README.md says which command
made which folder). Differences are paired per record, with their bootstrap 95% interval over the
records (stats.paired_bootstrap: 10,000 resamples, seed 0); video windows of one episode are
resampled together. Several seeds of one run are resampled
at two levels, the seeds and the records (stats.paired_bootstrap on one row per seed), as
experiments/regimes.py does. `*` marks an interval that excludes 0.
"""
import argparse
import functools
import io
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file: the repository root
from stats import paired_bootstrap  # noqa: E402

RESULTS = ROOT / "results"
# the runs the tables read (results/<folder>); seeds in the order 1337 (the default), 1, 2
TEXT_SEEDS = ("textgame_s1337", "textgame_s1", "textgame_s2")
WEB_SEEDS = ("webpage_s1337", "webpage_s1", "webpage_s2")
# single-step video: the default run (from video_mle_4000), and from the context-conditioned start
VIDEO_DEFAULT_SEEDS = ("video_default", "video_default_s1", "video_default_s2")
VIDEO_SEEDS = ("video_single", "video_single_s1", "video_single_s2")
# --copy_gate=1 runs from the per-frame MLE model: the default reward, and the object term's
GATE_SEEDS = ("video_pf_gate", "video_pf_gate_s1", "video_pf_gate_s2")
GATE_O05_SEEDS = ("video_pf_gate_o05", "video_pf_gate_o05_s1", "video_pf_gate_o05_s2")
GATE_4000_SEEDS = ("video_pf4000", "video_pf4000_s1", "video_pf4000_s2")
MULTI_4000_SEEDS = ("video_multi4000", "video_multi4000_s1")   # the multi-step default, 2 seeds
# the same two runs on machine A, whose float kernels round otherwise than B's: other draws
MULTI_4000_A = ("video_multi4000_machine_a", "video_multi4000_machine_a_s1")
# the same two seeds on B with the control at 0.3x its start's final rate (RLVR's runs are the same)
MULTI_4000_X03 = ("video_multi4000_x03", "video_multi4000_x03_s1")
SEED_NAMES = ("1337", "1", "2")
# RLVR from the mirrored 4000-episode model (out/ft_mirror4k), prompts from its mirrored transitions:
# on validation (eval.json is validation there), then on test
MIRROR_VAL_SEEDS = ("video_mirror4000_val", "video_mirror4000_val_s1", "video_mirror4000_val_s2")
MIRROR_SEEDS = ("video_mirror4000", "video_mirror4000_s1", "video_mirror4000_s2")
# runs evaluated on experiments/mirror_data.py's transitions, written episode by episode: record k is
# a transition of the 16-frame source episode k // 15, and the bootstrap resamples those episodes
PER_EPISODE = 15
TRANSITION_RUNS = {*MIRROR_VAL_SEEDS, *MIRROR_SEEDS, "video_mirror4000_val_placebo",
                   "chain_rlvr/control", "chain_rlvr/control_x0.1", "chain_rlvr/control_x0.03"}
# the video single-step control's other rates tried on validation, beside its default (0.3x its
# start's final rate, the one not significantly worse than the start): the start's final rate and less
OTHER_RATES = (("1e-4", "1x"), ("1e-5", "0.1x"))
# the video metrics of the validation rows: (metric, scale, digits, unit)
VAL_METRICS = (("mae", 1000, 2, " x 1e-3"), ("ssim", 1, 4, ""))
RL_RUNS = ("textgame_final", *TEXT_SEEDS, "textgame_placebo", "textgame_pool128",
           "textgame_pool128_placebo", "textgame_lf10", "textgame_task_specific", "textgame_cover",
           "textgame_cover_rlvr", "textgame_x10", "webpage_final", *WEB_SEEDS, "webpage_placebo",
           "webpage_x10", *VIDEO_DEFAULT_SEEDS, *VIDEO_SEEDS,
           "video_multi", "video_multi_o0", *MULTI_4000_SEEDS, "metaworld_push")
COMMANDS = {   # the command of each default run, shown beside its README row
    "textgame_final": "python train_lang.py",
    "webpage_final": "python train_lang.py --task=webpage",
    "video_default": "python train_video.py",
    "video_multi4000": "python train_video.py --mode=multi --out_dir=out/video_multi"}
MODELS = {"mle": "MLE start", "rlvr": "RLVR", "mle_more": "MLE continued"}   # eval.json's keys
TG_MLE, WEB_MLE = "checkpoints/textgame/mle.safetensors", "checkpoints/webpage/mle.safetensors"

# -----------------------------------------------------------------------------
# reading results/


@functools.lru_cache(maxsize=None)
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
    path = RESULTS / run / ("eval.json" if split == "test" else "eval_val.json")
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
    copy-last-frame baseline, "<model>:sampled" the model sampled at T=1, top-k 100."""
    model, _, sampled = model.partition(":")
    r = rows["mle"]["copy_last_frame"] if model == "copy" else rows[model]
    x = np.asarray((r[sampled] if sampled else r)["per_record"][metric], dtype=np.float64)
    if subset == "changed":
        x = x[np.asarray(rows["mle"]["per_record"]["changed"], dtype=bool)]
    return x


def episodes(rows, subset="all", run=None):
    """The episode of each record (video: a window's [episode, start]; for TRANSITION_RUNS the
    source episode of a transition), resampled together by the bootstrap; None where the records
    carry no episode (the language tasks)."""
    pr = rows["mle"]["per_record"]
    if "windows" in pr:   # video: a window's episode
        ep = np.asarray([w[0] for w in pr["windows"]]) // (PER_EPISODE if run in TRANSITION_RUNS else 1)
    elif "episode" in pr:   # k-step chains: a chain's episode
        ep = np.asarray(pr["episode"])
    else:
        return None
    return ep[np.asarray(pr["changed"], dtype=bool)] if subset == "changed" else ep


def diff(runs, a, b, metric, subset="all", split="test"):
    """a - b over the same records -> (mean, low, high); several runs are seeds, resampled too.
    a or b may be (run, model), to pair models of two runs (RLVR against a placebo run), or
    (runs, model), a run per seed (a seed's stronger control)."""
    xs = []
    for i, run in enumerate(runs):
        ra, ma = a if isinstance(a, tuple) else (run, a)
        rb, mb = b if isinstance(b, tuple) else (run, b)
        ra, rb = (r[i] if isinstance(r, list) else r for r in (ra, rb))
        A, B = load(ra, split), load(rb, split)
        if ma.partition(":")[0] not in {*A, "copy"} or mb.partition(":")[0] not in {*B, "copy"}:
            return None, None, None   # a model left out (a control of an older rule)
        xs.append(per_record(A, ma, metric, subset) - per_record(B, mb, metric, subset))
    d = np.stack(xs)   # (seeds, n): per seed and record
    ep = episodes(load(runs[0], split), subset, runs[0])
    keep = np.isfinite(d).all(0)   # a metric undefined on some records (null: NaN) skips them
    return paired_bootstrap(d[:, keep], np.zeros_like(d[:, keep]),
                            clusters=None if ep is None else ep[keep])


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


# -----------------------------------------------------------------------------
# formatting


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


def both(run, a, b, metric, split="test"):
    """a - b overall and on the changed records: "overall CI / changed CI"."""
    return " / ".join(ci(diff([run], a, b, metric, sub, split)) for sub in ("all", "changed"))


def share(x):
    """A planner's share as a percentage with 1 decimal; "-" where it has none (no model)."""
    return "-" if x is None else f"{100 * x:.1f}"


def success_ci(r):
    """A planner's success with its Wilson 95% interval, in %."""
    lo, hi = r["success_ci"]
    return f"{100 * r['success']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def table(header, rows, right=()):
    """A markdown table; the columns whose index is in `right` are right-aligned."""
    align = ["---:" if i in right else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


# -----------------------------------------------------------------------------
# README.md


def readme():
    """The README's results: one row per task, then the planners of docs/downstream.md."""
    head = ["task", "metric (test split, n)", "MLE start", "RLVR", "MLE continued, same compute",
            "baseline", "RLVR - MLE start, paired 95% CI"]
    rows = []
    for name, run, seeds, metric, what in (
            ("text game", "textgame_final", TEXT_SEEDS, "accuracy", "exact next-state accuracy, %"),
            ("web page", "webpage_final", WEB_SEEDS, "f1", "F1 of the predicted page changes, %")):
        r = load(run)
        rows.append([f"{name} (`{COMMANDS[run]}`)", f"{what} ({r['mle']['n']})",
                     *(pct(r[m][metric] if m in r else None) for m in MODELS),
                     pct(r["mle"]["baseline_no_change"][metric]) + ' ("no change")',
                     ci(diff(seeds, "rlvr", "mle", metric)) + f" ({len(seeds)} seeds)"])
    for name, run, seeds, what in (
            ("robot video, 1 step", "video_default", VIDEO_DEFAULT_SEEDS, "MAE of the next frame"),
            ("robot video, 7 steps", "video_multi4000", MULTI_4000_SEEDS, "MAE of 7 frames")):
        r = load(run)
        seeds_said = f"({len(seeds)} seed{'s' * (len(seeds) > 1)})"
        rows.append([f"{name} (`{COMMANDS[run]}`)",
                     f"{what}, lower is better ({r['mle']['n_windows']} windows)",
                     *(f"{r[m]['mae']:.4f}" if m in r else "-" for m in MODELS),
                     f"{r['mle']['copy_last_frame']['mae']:.4f} (copy the last frame)",
                     ci(diff(seeds, "rlvr", "mle", "mae"), 1000, 2) + " x 1e-3 " + seeds_said])
    tasks = table(head, rows, right=(2, 3, 4, 5))
    # planning: success on 100 test episodes with plan.py's default flags; the RLVR text models of
    # three seeds (resampled with the rooms) against the MLE model
    tg, web = summary("textgame_mle_noop_tw"), summary("webpage_policy3")
    rlvr = plan_diff(["textgame_mle_rlvr_noop_tw:out/textgame/rlvr.safetensors",
                      "textgame_rlvr_s1_s2_noop_tw:out/textgame_s1/rlvr.safetensors",
                      "textgame_rlvr_s1_s2_noop_tw:out/textgame_s2/rlvr.safetensors"],
                     f"textgame_mle_rlvr_noop_tw:{TG_MLE}")
    head = ["planning (100 test episodes, success %)", "random", "policy alone",
            "MLE world model", "RLVR world model - MLE, paired 95% CI"]
    rows = [[f"text game rooms (`python experiments/plan.py --planners=random,{TG_MLE}`)",
             f"{100 * tg['random']['success']:.0f}", "-", f"{100 * tg[TG_MLE]['success']:.0f}",
             ci(rlvr, 100, 1) + " (3 seeds)"],
            ["web pages, among the policy's 3 best actions (`python experiments/plan.py "
             f"--task=webpage --planners=random,policy,{WEB_MLE}`)",
             f"{100 * web['random']['success']:.0f}", f"{100 * web['policy']['success']:.0f}",
             f"{100 * web[WEB_MLE]['success']:.0f}", "not run"]]
    return tasks + "\n\n" + table(head, rows, right=(1, 2, 3))


def readme_sample():
    """What `python train_lang.py` prints last (the test split), printed by the function that
    prints it, evaluate_lang.print_comparison, from the shipped default run's eval.json."""
    from evaluate_lang import print_comparison   # imports torch: only for this block
    buf = io.StringIO()
    print_comparison("textgame", "test", load("textgame_final"), file=buf)
    return "```\n" + buf.getvalue().strip("\n") + "\n```"


# -----------------------------------------------------------------------------
# docs/results.md: the language tasks


def lang_default(task, run):
    """A default run's full table: both splits, every model overall / changed / unchanged, and
    RLVR minus each model, paired (overall / changed)."""
    h = "accuracy" if task == "textgame" else "f1"
    extra = ("precision", "recall") if task == "webpage" else ()
    head = ["split", "model", "accuracy" if h == "accuracy" else "F1", "changed", "unchanged",
            *extra, "RLVR - this model, paired 95% CI (overall / changed)"]
    rows = []
    for split in ("val", "test"):
        r = load(run, split)
        label = f"{split} ({r['mle']['n']})"
        for m in filter(r.__contains__, MODELS):   # the models the run has
            rows.append([label, MODELS[m], pct(r[m][h]), pct(r[m][h + "_changed"]),
                         pct(r[m][h + "_unchanged"]), *(pct(r[m][e]) for e in extra),
                         "" if m == "rlvr" else both(run, "rlvr", m, h, split)])
        b = r["mle"]["baseline_no_change"]   # scored on the same records as every model
        rows.append([label, 'always "no change"', pct(b[h]), pct(b[h + "_changed"]),
                     pct(b[h + "_unchanged"]), *("" for _ in extra), ""])
    return table(head, rows, right=tuple(range(2, 5 + len(extra))))


def compose():
    """The text game's composition split beside its test split: each model of the default run on
    test (results/textgame_final) and on data/textgame/compose.jsonl (results/textgame_compose/
    <model>.json, one eval.py file per model), and RLVR minus each model, paired (overall /
    changed)."""
    head = ["split", "model", "accuracy", "changed", "unchanged",
            "RLVR - this model, paired 95% CI (overall / changed)"]
    splits = {"test": load("textgame_final"),
              "compose": {m: json.loads((RESULTS / "textgame_compose" / f"{m}.json").read_text())
                          for m in MODELS}}
    rows = []
    for split, r in splits.items():
        label = f"{split} ({r['mle']['n']})"
        for m in MODELS:
            # RLVR minus this model on the same records: overall, then the changed ones
            paired = [paired_bootstrap(per_record(r, "rlvr", "accuracy", sub),
                                       per_record(r, m, "accuracy", sub))
                      for sub in ("all", "changed")]
            rows.append([label, MODELS[m], pct(r[m]["accuracy"]), pct(r[m]["accuracy_changed"]),
                         pct(r[m]["accuracy_unchanged"]),
                         "" if m == "rlvr" else " / ".join(map(ci, paired))])
        b = r["mle"]["baseline_no_change"]   # scored on the same records as every model
        rows.append([label, 'always "no change"', pct(b["accuracy"]), pct(b["accuracy_changed"]),
                     pct(b["accuracy_unchanged"]), ""])
    return table(head, rows, right=(2, 3, 4))


def lang_seeds(seeds, metric):
    """Per seed: RLVR on val and test, MLE continued on test, RLVR minus both on test; then the
    seeds resampled with the records, on test and on val (overall / changed)."""
    head = ["seed", "val RLVR", "test RLVR", "test MLE continued", "test RLVR - MLE start",
            "test RLVR - MLE continued", "MLE continued - MLE start (test / val)"]
    rows = []
    for name, run in zip(SEED_NAMES, seeds):
        val, test = load(run, "val"), load(run)
        rows.append([name, pct(val["rlvr"][metric]), pct(test["rlvr"][metric]),
                     pct(test["mle_more"][metric] if "mle_more" in test else None),
                     ci(diff([run], "rlvr", "mle", metric)),
                     ci(diff([run], "rlvr", "mle_more", metric)),
                     " / ".join(ci(diff([run], "mle_more", "mle", metric, split=split))
                                for split in ("test", "val"))])
    for split in ("test", "val"):
        cells = [" / ".join(ci(diff(seeds, a, b, metric, sub, split)) for sub in ("all", "changed"))
                 for a, b in (("rlvr", "mle"), ("rlvr", "mle_more"), ("mle_more", "mle"))]
        rows.append([f"{len(seeds)} seeds, seed-level CI ({split}; overall / changed)", "", "", "",
                     *cells])
    return table(head, rows, right=(1, 2, 3))


def k_step(runs):
    """k-step imagination runs {label: (headline metric, runs, strongers)}, one run per seed (the
    stronger control of each seed in `strongers`, its "mle_more": MLE also on imagined states;
    None: not run, for every seed or for one). Per split and seed the chains' headline metric of
    RLVR, MLE continued (teacher-forced) and the stronger control, RLVR minus each and minus its
    start on the first step (the chains of one episode resampled together where eval.json numbers
    them); with several seeds, a last row of their means and the seed-level intervals. The MLE
    start is every seed's and is shown once, on the seeds' row (or the only seed's)."""
    head = ["run", "seed", "split (chains)", "MLE start", "RLVR", "MLE continued",
            "stronger control", "RLVR - MLE start", "RLVR - MLE continued",
            "RLVR - stronger control", "stronger control - MLE start",
            "first step: RLVR - MLE start", "MLE start: right chains after a wrong first step"]
    rows = []
    for label, (h, seeds, strongers) in runs.items():
        strongers = strongers or (None,) * len(seeds)
        groups = [((name,), (run,), (s,)) for name, run, s in zip(SEED_NAMES, seeds, strongers)]
        if len(seeds) > 1:
            groups.append((SEED_NAMES[:len(seeds)], seeds, strongers))
        for split in ("val", "test"):
            for names, rs, ss in groups:
                ev = [load(r, split) for r in rs]
                strong = all(ss) and [load(s, split)["mle_more"][h + "_k"] for s in ss]
                pooled = len(rs) == len(seeds)   # the seeds' row, or the only seed's
                d = lambda a, b, m=h + "_k": ci(diff(list(rs), a, b, m, split=split))
                rows.append([
                    label, "+".join(names) if len(names) > 1 else names[0],
                    f"{split} ({ev[0]['mle']['n']})",
                    pct(ev[0]["mle"][h + "_k"]) if pooled else "",
                    pct(np.mean([e["rlvr"][h + "_k"] for e in ev])),
                    pct(np.mean([e["mle_more"][h + "_k"] for e in ev])
                        if all("mle_more" in e for e in ev) else None),
                    pct(np.mean(strong) if strong else None),
                    d("rlvr", "mle"), d("rlvr", "mle_more"),
                    d("rlvr", (list(ss), "mle_more")) if strong else "-",
                    d((list(ss), "mle_more"), "mle") if strong else "-",
                    d("rlvr", "mle", h), recovered(h, ev[0]) if pooled else ""])
    return table(head, rows, right=(3, 4, 5, 6))


def budget(run, default, metric):
    """The budget question: RLVR run for more GRPO steps than the default run of the same seed
    (`default`, whose own rows are in the seeds and default tables; the probe reward and the
    control's steps of both are in the logs' table). Per split, overall / changed: RLVR minus its
    start, minus its control (MLE continued for the run's compute) and minus the default's RLVR,
    and the control minus the start."""
    head = ["split", "RLVR - MLE start", "RLVR - MLE continued", "RLVR - the default's RLVR",
            "MLE continued - MLE start"]
    rows = [[f"{split} ({load(run, split)['mle']['n']})", both(run, "rlvr", "mle", metric, split),
             both(run, "rlvr", "mle_more", metric, split),
             both(run, "rlvr", (default, "rlvr"), metric, split),
             both(run, "mle_more", "mle", metric, split)] for split in ("test", "val")]
    return table(head, rows)


def recovered(metric, rows):
    """Accuracy (the text game): of the MLE start's chains with a wrong first step, how many end
    exact ("n of m"); "-" for F1 (the web page), which is not all or nothing."""
    if metric != "accuracy":
        return "-"
    first, last = (per_record(rows, "mle", m) for m in ("accuracy", "accuracy_k"))
    return f"{int(((first == 0) & (last == 1)).sum())} of {int((first == 0).sum())}"


def regimes():
    """The text game's regime study: RLVR against its MLE start and against the equal-compute MLE
    of each regime (overall / changed); the placebos (rewards permuted within each kept group) as rows of their own."""
    head = ["regime", "what changes", "split", "RLVR - MLE start (overall / changed)",
            "RLVR - equal-compute MLE (overall / changed)"]
    pooled = "the all-seeds rows of the three-seed table"
    rows = [["(a) default, 3 seeds", "converged start, fixed GRPO", "test, val", pooled, pooled]]
    for label, what, run, prefix, control in (
            ("(b) MLE on 10% of labels", "start far below its best-of-8; RL prompts it never saw "
             "targets for", "textgame_lf10", "", "MLE on all labels"),
            ("(c) `--reward=task_specific`", "partial credit per object",
             "textgame_task_specific", "", None),
            ("(d) off-script prompts", "RL pool adds 20,000 valid off-script actions at visited "
             "states (`data/textgame/cover`)", "textgame_cover", "off-script ",
             "MLE on those labels")):
        for i, split in enumerate(("test", "val") if control else ("val",)):   # (c): val only
            rows.append([label if i == 0 else "", what if i == 0 else "",
                         f"{prefix}{split} ({load(run, split)['mle']['n']})",
                         both(run, "rlvr", "mle", "accuracy", split),
                         both(run, "rlvr", "mle_more", "accuracy", split) + f" ({control})"
                         if control else "not run"])
    # a placebo's "rlvr" is the placebo model: against its start, and the real RLVR against it
    for label, what, placebo, real, splits in (
            ("placebo", "rewards permuted within each kept group", "textgame_placebo", "textgame_final",
             ("test", "val")),
            ("small pool, placebo", "", "textgame_pool128_placebo", "textgame_pool128", ("val",))):
        if real == "textgame_pool128":
            rows.append(["small pool (`--rl_pool=128`)", "RL prompts: 128 training records (the "
                         "probe checks the optimiser on them)", "val (500)",
                         both(real, "rlvr", "mle", "accuracy", "val"), "not run"])
        for i, split in enumerate(splits):
            rows.append([label if i == 0 else "", what if i == 0 else "",
                         f"{split} ({load(placebo, split)['mle']['n']})",
                         both(placebo, "rlvr", "mle", "accuracy", split) + " (the placebo's)",
                         "RLVR - placebo: "
                         + both(real, "rlvr", (placebo, "rlvr"), "accuracy", split)])
    rows.append(["(e) k-step imagination", "3 steps, each from the model's own previous prediction; "
                 "chain reward or reward to go", "test, val",
                 "below its start, or within noise of it: the k-step section below",
                 "not beaten (teacher-forced and imagined-state controls)"])
    rows.append(["(f) 10x the GRPO steps", "300 steps from the default's start and seed, the control "
                 "for their compute", "test, val", "within noise on test, below on val: the section "
                 "\"Ten times the GRPO steps\"", "not beaten"])
    return table(head, rows)


def control_sweep(task):
    """experiments/control_sweep.py's rows: the control at multiples of its start's final MLE rate,
    for the default run's RLVR compute, minus its start on validation (paired)."""
    sweep = json.loads((RESULTS / f"control_sweep_{task}.json").read_text())
    rows = [[f"x{r['factor']:g}", f"{r['lr']:.2g}", r["steps"], pct(r["start"]), pct(r["control"]),
             ci(r["diff"])] for r in sweep["rows"]]
    head = ["rate (x the start's final)", "lr", "steps", "start", "control", "control - start"]
    return table(head, rows, right=(2, 3, 4))


def webpage_placebo():
    """The web page's placebo against its start, and the default RLVR against the placebo."""
    rows = [[f"{split} ({load('webpage_placebo', split)['mle']['n']})",
             both("webpage_placebo", "rlvr", "mle", "f1", split),
             both("webpage_final", "rlvr", ("webpage_placebo", "rlvr"), "f1", split)]
            for split in ("test", "val")]
    return table(["split", "placebo - MLE start (overall / changed)",
                  "RLVR - placebo (overall / changed)"], rows)


def rl_logs():
    """What each RL run's log.jsonl says per GRPO step: groups sampled and kept (those with reward
    spread), the rollout's share of the RL time, the probe reward, and the control's last step."""
    head = ["run (results/)", "GRPO steps", "groups sampled per step, mean (min-max)",
            "kept with spread, mean (min-max)", "rollout share of RL time", "RL minutes",
            "probe reward (greedy): start -> end", "MLE continued: steps in minutes"]
    rows = []
    for run in RL_RUNS:
        log = [json.loads(line) for line in (RESULTS / run / "log.jsonl").read_text().splitlines()]
        steps = [d for d in log if d.get("stage") == "rlvr" and "t_step" in d]
        probe = [d for d in log if "probe_reward" in d]   # at step 0, every --probe_every, the end
        control = [d for d in log if d.get("stage") == "mle_more"]

        def spread(key):
            x = [d[key] for d in steps]
            return f"{sum(x) / len(x):.1f} ({min(x)}-{max(x)})"
        rollout = sum(d["t_rollout"] for d in steps) / sum(d["t_step"] for d in steps)
        probed = "-" if not probe else (
            f"{probe[0]['probe_reward']:.3f} ({probe[0]['probe_greedy']:.3f}) -> "
            f"{probe[-1]['probe_reward']:.3f} ({probe[-1]['probe_greedy']:.3f})")
        rows.append([run, len(steps), spread("groups"), spread("groups_kept"),
                     f"{100 * rollout:.0f}%", f"{steps[-1]['rl_seconds'] / 60:.1f}",
                     probed,
                     f"{control[-1]['step']} in {control[-1]['minutes']:.1f}"
                     if control and compute_matched(run) else "-"])
    return table(head, rows, right=(1, 4, 5))


# -----------------------------------------------------------------------------
# docs/downstream.md: planning


def plan_table(plan_file, labels):
    """Planners of one results/plan/ JSON (labels: planner -> row name, in order): the full row
    (success with its Wilson 95% interval, steps, lost and the per-step shares), then success per
    game or site."""
    summ, rows, by = summary(plan_file), [], []
    for planner, label in labels.items():
        r = summ[planner]
        rows.append([label, r["episodes"], success_ci(r), f"{r['steps_success']:.1f}",
                     f"{r['steps_all']:.1f}",
                     *(share(r[k]) for k in ("lost", "agree", "wm_acc", "cand_exact", "tie",
                                             "repeat"))])
        by.append([label, *(share(x) for x in r["success_by"].values())])
    games = list(summ[next(iter(labels))]["success_by"])
    head = ["planner", "episodes", "success % [95% CI]", "steps (won)", "steps (all)", "lost %",
            "agree %", "wm_acc %", "cand_exact %", "tie %", "repeat %"]
    return (table(head, rows, right=(1, *range(3, 11))) + "\n\n"
            + table(["planner", *games], by, right=tuple(range(1, len(games) + 1))))


def plan_variants():
    """The text game's planner variants on 100 validation rooms (shipped MLE): each variant's flags
    on top of --noop=0 --trust_win=0, its row, and its success minus the first row's, paired."""
    path = RESULTS / "plan" / "textgame_val_variants.json"
    variants = list(json.loads(path.read_text())["variants"].values())
    first = [float(e["success"]) for e in variants[0]["episodes"]]
    chosen = {"noop": 0.5, "trust_win": 0.5}   # experiments/plan.py's text-game defaults
    rows = []
    for i, v in enumerate(variants):
        flags = " ".join(f"--{k}={x:g}" for k, x in v["kw"].items()) or "--noop=0 --trust_win=0"
        flags = f"**`{flags}` (chosen)**" if v["kw"] == chosen else f"`{flags}`"
        r = v["summary"]
        paired = paired_bootstrap([float(e["success"]) for e in v["episodes"]], first)
        rows.append([flags, success_ci(r), share(r["lost"]), f"{r['steps_all']:.1f}",
                     share(r["agree"]), share(r["wm_acc"]), share(r["tie"]),
                     "" if i == 0 else ci(paired, 100, 1, star=False)])
    head = ["flags (MLE, `--split=val --episodes=100`)", "success % [95% CI]", "lost %",
            "steps (all)", "agree %", "wm_acc %", "tie %", "paired vs first row"]
    return table(head, rows, right=(2, 3, 4, 5, 6))


def plan_models():
    """The text-game planner with each world model on 100 validation and 100 test rooms (the
    default flags): success with its Wilson 95% interval, candidate exactness, lost rooms, and RLVR
    minus its own MLE start paired over the same rooms (seeds resampled with the rooms)."""
    cover, cover_rl = "out/tg_cover_mle/mle.safetensors", "out/tg_cover_rlvr/rlvr.safetensors"
    rl, s1, s2 = (f"out/textgame{x}/rlvr.safetensors" for x in ("", "_s1", "_s2"))
    where = {   # planner -> (its validation file, its test file) in results/plan/
        TG_MLE: ("textgame_val_mle_rlvr", "textgame_mle_rlvr_noop_tw"),
        rl: ("textgame_val_mle_rlvr", "textgame_mle_rlvr_noop_tw"),
        s1: ("textgame_val_rlvr_s1_s2", "textgame_rlvr_s1_s2_noop_tw"),
        s2: ("textgame_val_rlvr_s1_s2", "textgame_rlvr_s1_s2_noop_tw"),
        cover: ("textgame_val_cover", "textgame_cover_noop_tw"),
        cover_rl: ("textgame_val_cover", "textgame_cover_noop_tw")}

    def cells(planner):   # val then test: success, cand_exact, lost
        return [c for f in where[planner] for r in [summary(f)[planner]]
                for c in (success_ci(r), share(r["cand_exact"]), share(r["lost"]))]

    def paired(planners, ref):   # val then test, in the success column
        return [c for i in (0, 1) for c in (ci(plan_diff([f"{where[p][i]}:{p}" for p in planners],
                                                         f"{where[ref][i]}:{ref}"),
                                               100, 1, star=False), "", "")]

    rows = [[f"shipped MLE (`{TG_MLE}`)", *cells(TG_MLE)],
            [f"its RLVR (`{rl}`)", *cells(rl)],
            ["RLVR - MLE, paired", *paired([rl], TG_MLE)],
            [f"its RLVR, `--seed=1` (`{s1}`)", *cells(s1)],
            [f"its RLVR, `--seed=2` (`{s2}`)", *cells(s2)],
            ["**RLVR (3 seeds) - MLE, paired, seeds and rooms resampled**", *paired([rl, s1, s2], TG_MLE)],
            ["coverage MLE (`checkpoints/textgame/mle_cover.safetensors`)", *cells(cover)],
            [f"its RLVR (`{cover_rl}`)", *cells(cover_rl)],
            ["RLVR - MLE, paired", *paired([cover_rl], cover)]]
    head = ["world model", "val success % [95% CI]", "val cand_exact %", "val lost %",
            "test success % [95% CI]", "test cand_exact %", "test lost %"]
    return table(head, rows, right=(2, 3, 5, 6))


# -----------------------------------------------------------------------------
# docs/video.md


def video_ceiling():
    """Copy-last-frame and the context-conditioned tokenizer's ceiling (the true frames encoded and
    decoded) on the test windows of the default single- and multi-step runs."""
    rows = []
    for run, what in (("video_single", "next frame"),
                      ("video_multi", "7 frames after one context frame")):
        r = load(run)["mle"]
        n = f"{r['n']}" + (f" ({r['n_windows']} windows)" if r["n"] != r["n_windows"] else "")
        for name, key in (("copy the last frame", "copy_last_frame"),
                          ("context-conditioned ceiling (`video_cvq`)", "tokenizer_ceiling")):
            m = r[key]
            rows.append([f"{n}, {what}", name, f"{m['mae']:.4f}", f"{m['psnr']:.2f}",
                         f"{m['ssim']:.4f}", f"{m['mae_moving']:.4f}"])
    return table(["test frames", "prediction", "MAE", "PSNR", "SSIM", "mae_moving"], rows,
                 right=(2, 3, 4, 5))


def video(run, multi=False, than=(), o0=None):
    """A video run's greedy table of its models, then RLVR's paired differences, greedy and
    sampled (T=1, top-k 100); than: ((run, label), ...), other runs' RLVR on the same windows,
    compared with this one's too; o0: a run without the reward's object term, its RLVR a row."""
    r = load(run)
    n = r["mle"]["n_windows"]
    cols = ["MAE", "PSNR", "SSIM", "mae_moving"] + ["repetition"] * multi + ["object recall",
                                                                              "action response"]
    names = dict(MODELS, rlvr="RLVR (default reward)") if multi else MODELS

    def line(name, m):
        rep = [f"{m['repetition_rate']:.3f}"] if multi else []
        # the gripper's response (evaluate_video's action_effect); "-": a run evaluated without it
        response = m.get("action_effect", {}).get("action_response")
        return [name, f"{m['mae']:.4f}", f"{m['psnr']:.2f}", f"{m['ssim']:.4f}",
                f"{m['mae_moving']:.4f}", *rep, f"{m['objects']['recall']:.3f}",
                "-" if response is None else f"{response:.3f}"]

    rows = [line(names[k], r[k]) for k in MODELS if k in r]
    if o0:   # the same run without the reward's object term
        rows.append(line(f"RLVR without the object term (`--object_weight=0`, results/{o0})",
                         load(o0)["rlvr"]))
    what = f"{n} test windows x 7 frames" if multi else f"{n} test windows, next frame"
    models = table([f"{what}, greedy", *cols], rows, right=tuple(range(1, len(cols) + 1)))
    # paired differences: MAE with 5 decimals, SSIM 4, repetition and the action effect 3
    digits = {"mae": 5, "ssim": 4, "repetition": 3, "object_recall": 3, "action_response": 3}
    pairs = [("mle", "mae"), ("mle", "ssim"), ("mle_more", "mae"), ("mle_more", "ssim"),
             ("copy", "mae")]
    pairs += [("mle", "repetition"), ("mle_more", "repetition")] if multi else [("copy", "ssim")]
    if "action_response" in r["rlvr"]["per_record"]:   # runs evaluated with the action effect
        pairs += [(ref, m) for m in ("object_recall", "action_response")
                  for ref in ("mle", "mle_more")]
    labels = dict(than)
    pairs += [((other, "rlvr"), m) for other in labels
              for m in ("mae", "object_recall", "action_response")]
    rows = []
    for ref, m in pairs:
        name = labels[ref[0]] if isinstance(ref, tuple) else MODELS.get(ref, ref)
        label = f"RLVR - {name}, {m.upper() if m in ('mae', 'ssim') else m}"
        greedy = ci(diff([run], "rlvr", ref, m), 1, digits[m])
        # sampled: against the models only (copy is not sampled; repetition is greedy only)
        sampled_ref = ((ref[0], ref[1] + ":sampled") if isinstance(ref, tuple)
                       else ref + ":sampled")
        sampled = ("" if ref == "copy" or m == "repetition" else
                   ci(diff([run], "rlvr:sampled", sampled_ref, m), 1, digits[m]))
        rows.append([label, greedy, sampled])
    paired = table([f"paired difference (95% CI over the {n} windows)", "greedy",
                    "T=1, top-k 100"], rows)
    return models + "\n\n" + paired


def window_ci(d, episodes):
    """Differences over video windows, (n,) or (seeds, n), -> (mean, low, high): the windows of one
    episode resampled together (and the seeds, when several)."""
    d = np.atleast_2d(d)
    return paired_bootstrap(d, np.zeros_like(d), clusters=episodes)


def control_val(name, metric):
    """results/video_control_val/<name>.json, what `eval.py --task=video --ckpt=<a control>
    --compare=<its MLE start> --split=val` wrote (name: s<seed>, s<seed>_lr<rate> or multi), or the
    folder <name> of a `train_video.py --stage=control` run (its eval_val.json) -> (control - start
    per window, each window's episode)."""
    path = RESULTS / "video_control_val" / name
    if path.is_dir():
        rows = load(f"video_control_val/{name}", "val")
        runs = [rows["mle_more"], rows["mle"]]
    else:
        runs = list(json.loads(Path(f"{path}.json").read_text()).values())
    control, start = (np.asarray(r["per_record"][metric], dtype=np.float64) for r in runs)
    return control - start, np.asarray([w[0] for w in runs[0]["per_record"]["windows"]])


def control_rates_val(head, rows):
    """Controls minus their start on the validation split, one row per (label, control_val name)."""
    cells = []
    for label, name in rows:
        pairs = [control_val(name, metric) for metric, *_ in VAL_METRICS]
        cells.append([f"{label} ({len(pairs[0][0])} windows)",
                      *(ci(window_ci(d, ep), scale, digits)
                        for (d, ep), (_, scale, digits, _) in zip(pairs, VAL_METRICS))])
    return table([head, "MAE x 1e-3", "SSIM"], cells)


def rate_rows(prefix, rates):
    """control_rates_val's rows of the controls alone at several rates: ((factor, rate), ...) ->
    one row each, the folder results/video_control_val/<prefix>_x<factor>."""
    return [(f"{x}x its final rate, {lr}", f"{prefix}_x{x}") for x, lr in rates]


def video_seeds(runs=VIDEO_SEEDS, control_rates=True, multi=False, names=None):
    """Video runs, one per seed of SEED_NAMES (its first len(runs)): RLVR minus each model and the
    control minus its start, in MAE x 1e-3, object recall and action response (multi: RLVR's
    repetition minus its start's too), per seed and over the seeds (seeds and windows resampled;
    copying is the same in every seed, so its row has no seed-level interval); then, with
    control_rates, the control minus its start on the validation split (control_val), and at the
    other rates (OTHER_RATES). names: the runs' column heads instead, and no pooled column (runs
    that are not seeds of one experiment)."""
    rows = []
    for a, b, metric, scale, digits in (
            ("rlvr", "mle", "mae", 1000, 2), ("rlvr", "mle_more", "mae", 1000, 2),
            ("rlvr", "copy", "mae", 1000, 2), ("mle_more", "mle", "mae", 1000, 2),
            ("rlvr", "mle", "object_recall", 1, 3), ("rlvr", "mle_more", "object_recall", 1, 3),
            ("rlvr", "mle", "action_response", 1, 3),
            ("rlvr", "mle_more", "action_response", 1, 3),
            *((("rlvr", "mle", "repetition", 1, 3),) if multi else ())):
        cells = [ci(diff([run], a, b, metric), scale, digits) for run in runs]
        seeds = "" if b == "copy" else ci(diff(runs, a, b, metric), scale, digits)
        unit = " x 1e-3" if metric == "mae" else ""
        rows.append([f"{MODELS[a]} - {MODELS.get(b, 'copy the last frame')}: {metric}{unit}",
                     *cells, *([] if names else [seeds])])
    for rate, times in (("", ""), *OTHER_RATES) if control_rates else ():   # default rate first
        label = (f"{MODELS['mle_more']} - {MODELS['mle']}" if not rate
                 else f"the same at {times} the rate ({rate})")
        for metric, scale, digits, unit in VAL_METRICS:
            pairs = [control_val(f"s{name}" + (f"_lr{rate}" if rate else ""), metric)
                     for name in SEED_NAMES]   # [(control - start, episodes)]
            d = np.stack([d for d, _ in pairs])   # (seeds, windows): the same windows in each
            rows.append([f"{label}: {metric}{unit}, validation",
                         *(ci(window_ci(d, ep), scale, digits) for d, ep in pairs),
                         ci(window_ci(d, pairs[0][1]), scale, digits)])
    head = (["difference", *names] if names else
            ["difference", *(f"seed {s}" for s in SEED_NAMES[:len(runs)]),
             f"{len(runs)} seeds, seed-level CI"])
    return table(head, rows)


VAL_PF = "video_single_action_val_pf"
GATE_VAL = (("`video_mle`, gated", (("the base reward", f"{VAL_PF}_gate"),
                                    ("`--object_weight=0.5`", f"{VAL_PF}_gate_o05"),
                                    ("`--action_weight=0.1`", f"{VAL_PF}_gate_a01"))),)
GATE_4000_VAL = (("`video_mle_4000`, gated", (
    ("`--object_weight=0.5`", f"{VAL_PF}4000_o05"),
    ("`--object_weight=0.5 --push_weight=0.1`", f"{VAL_PF}4000_o05_p01"),
    ("`--object_weight=0.5 --push_weight=0.5`", f"{VAL_PF}4000_o05_p05"),
    ("`--object_weight=0.5 --push_weight=0.1 --counterfactual_frac=0.5`", f"{VAL_PF}4000_o05_p01_cf"),
    ("`--object_weight=0.5 --push_weight=0.1 --placebo=1`", f"{VAL_PF}4000_o05_p01_placebo"),
    ("`--object_weight=0.5 --push_weight=0.1 --push_frac=0.5`", f"{VAL_PF}4000_o05_p01_pf05"),
    ("`--object_weight=0.5 --push_weight=1 --push_frac=1`", f"{VAL_PF}4000_o05_pp1"),
    ("the same, 300 steps (`--rl_steps=300`)", f"{VAL_PF}4000_o05_pp1_s300"),
    ("the default run's (`--object_weight=0.5 --push_weight=0.1`, prompts from the default 1000 "
     "episodes)", "video_default_val"))),)

MULTI_4000_VAL = (("`video_mle_4000`, gated, 7 frames", (
    ("the default reward (`M=1, O=0.5`)", "video_multi4000_val"),
    ("`--moving_weight=0`", "video_multi4000_val_mw0"),
    ("`--rl_lr=3e-5`", "video_multi4000_val_lr3e5"),
    ("`--temperature=0.7`", "video_multi4000_val_t07"),
    ("`--temperature=0.5`", "video_multi4000_val_t05"),
    ("`--rl_steps=80`", "video_multi4000_val_s80"))),)


def gate_val(starts):
    """Copy-gated per-frame starts' RLVR runs on the validation split (--final_eval=val, so their
    eval.json is validation): copying, the gated tokenizer's ceiling, then each start of `starts`
    ((name, ((reward, run), ...)), ...) and its rewards' RLVR with RLVR minus the start, paired
    (greedy; the response also sampled)."""
    first = load(starts[0][1][0][1])["mle"]
    rows = [[name, f"{m['mae']:.4f}", f"{m['ssim']:.4f}", *[""] * 6] for name, m in (
        ("copy the last frame", first["copy_last_frame"]),
        ("the per-frame tokenizer's ceiling, gated", first["tokenizer_ceiling"]))]
    for start, runs in starts:   # the start's row (from its first run's eval.json), then its runs'
        for name, run, arm in ((start, runs[0][1], "mle"),
                               *((f"its RLVR, {r}", run, "rlvr") for r, run in runs)):
            m = load(run)[arm]
            paired = [] if arm == "mle" else [
                ci(diff([run], "rlvr", "mle", "mae"), 1000, 2),
                *(ci(diff([run], "rlvr", "mle", k), 1, 3)
                  for k in ("object_recall", "action_response")),
                ci(diff([run], "rlvr:sampled", "mle:sampled", "action_response"), 1, 3)]
            rows.append([name, f"{m['mae']:.4f}", f"{m['ssim']:.4f}",
                         f"{m['objects']['recall']:.3f}",
                         f"{m['action_effect']['action_response']:.3f}", *(paired or [""] * 4)])
    return table([f"{first['n_windows']} val windows, greedy", "MAE", "SSIM", "object recall",
                  "action response", "RLVR - start: MAE x 1e-3", "object_recall",
                  "action_response", "action_response, sampled"], rows, right=(1, 2, 3, 4))

MIRROR_VAL = (("mirrored, on all 4000 episodes (`out/ft_mirror4k`), mirrored transitions", (
    *((f"the default reward, seed {s}", run) for s, run in zip(SEED_NAMES, MIRROR_VAL_SEEDS)),
    ("the same, `--placebo=1`", "video_mirror4000_val_placebo"))),)

CHAIN_SEEDS = ("k3", "k3_s1", "k3_s2")   # chain RLVR's three seeds, chains of 3 frames
CHAIN_VAL = (   # (row, results/chain_rlvr/val15/<file>.jsonl, its one-step control run or None)
    ("the start, `ft_mirror4k`", "start", None),
    ("chains of 3 frames, 100 GRPO steps, seed 0", "k3", None),
    ("the same, seed 1", "k3_s1", None),
    ("the same, seed 2", "k3_s2", None),
    ("chains of 3 frames, 200 GRPO steps, seed 0", "k3_200", None),
    ("chains of 3 frames, push term 0.3, seed 0", "k3_push0.3", None),
    ("chains of 5 frames, 100 GRPO steps, seed 0", "k5", None),
    ("chains of 3 frames, `--placebo=1`", "k3_placebo", None),
    ("MLE continued for the chain run's compute, at 0.3x", "control", "chain_rlvr/control"),
    ("the same at 0.1x", "control_x0.1", "chain_rlvr/control_x0.1"),
    ("the same at 0.03x", "control_x0.03", "chain_rlvr/control_x0.03"))


def chain_val():
    """experiments/chain_rlvr.py --steps=0 --val_chain=15: each world model's greedy chains of the
    32 validation episodes, whole (frames 1-15 from frame 0): the mean chain reward, minus the
    start's (paired over the episodes), the MAE of frame 15; for the controls, their one-step
    validation MAE minus the start's (their eval.json)."""
    last = chain_scores("val15", [name for _, name, _ in CHAIN_VAL])
    start = last["start"]["val_rewards"]
    rows = []
    for label, name, control in CHAIN_VAL:
        r = last[name]
        rows.append([label, f"{r['val_reward']:.4f}",
                     "" if name == "start" else ci(paired_bootstrap(r["val_rewards"], start), 1, 4),
                     f"{r['val_mae_last']:.5f}",
                     ci(diff([control], "mle_more", "mle", "mae"), 1000, 2) if control else ""])
    rows += [[label, "", d, "", ""] for label, d in chain_seeds(last)]
    return table(["world model", "chain reward, 32 val episodes", "- the start's",
                  "MAE of frame 15", "one-step val MAE - the start's, x 1e-3"], rows, right=(1, 3))


def chain_scores(folder, names):
    """results/chain_rlvr/<folder>/<name>.jsonl (chain_rlvr.py --steps=0 --val_chain=15) -> name ->
    its log's last row with the chains' rewards."""
    last = {}
    for name in names:
        rows = (RESULTS / "chain_rlvr" / folder / f"{name}.jsonl").read_text().splitlines()
        last[name] = [r for r in map(json.loads, rows) if "val_rewards" in r][-1]
    return last


def chain_seeds(last):
    """The three chain seeds minus the start and minus the 0.1x control, paired over the episodes,
    seeds resampled too -> [(label, CI)]."""
    seeds = np.array([last[name]["val_rewards"] for name in CHAIN_SEEDS])   # (3, episodes)
    out = []
    for label, ref in (("the start's", "start"), ("the control's at 0.1x", "control_x0.1")):
        base = np.broadcast_to(last[ref]["val_rewards"], seeds.shape)   # the same each seed
        out.append((f"chains of 3 frames, 3 seeds (resampled too), minus {label}",
                    ci(paired_bootstrap(seeds, base), 1, 4)))
    return out


def chain_test():
    """The same chains on the 64 test episodes (--eval_split=test), the start, the three chain seeds
    and the control chosen on validation: each one's chain reward and MAE of frame 15, minus the
    start's, then chain_seeds."""
    names = ("start", *CHAIN_SEEDS, "control_x0.1")
    last = chain_scores("test15", names)
    labels = {name: label for label, name, _ in CHAIN_VAL}
    labels["control_x0.1"] = "MLE continued for the chain run's compute, at 0.1x (chosen on validation)"
    rows = [[labels[name], f"{last[name]['val_reward']:.4f}",
             "" if name == "start" else ci(paired_bootstrap(last[name]["val_rewards"],
                                                            last["start"]["val_rewards"]), 1, 4),
             f"{last[name]['val_mae_last']:.5f}"] for name in names]
    rows += [[label, "", d, ""] for label, d in chain_seeds(last)]
    n = len(last["start"]["val_rewards"])
    return table(["world model", f"chain reward, {n} test episodes", "- the start's",
                  "MAE of frame 15"], rows, right=(1, 3))


def chain_onestep():
    """eval.py --copy_gate=1 of each chain seed against its start, one step on the mirrored
    validation transitions (results/chain_rlvr/onestep_val_k3*.json: {checkpoint: result}, the
    seed's first): the seed minus the start per seed and over the seeds, the source episodes
    (PER_EPISODE transitions each) resampled whole."""
    runs = [json.loads((RESULTS / "chain_rlvr" / f"onestep_val_k3{s}.json").read_text())
            for s in ("", "_s1", "_s2")]      # {chain seed's checkpoint: result, its start's: result}
    rows = []
    for metric, scale, digits, unit in (("mae", 1000, 2, " x 1e-3"), ("object_recall", 1, 3, ""),
                                        ("action_response", 1, 3, "")):
        d = np.stack([per_record(r, a, metric) - per_record(r, b, metric)
                      for r in runs for a, b in [list(r)]])                  # (seeds, n)
        keep = np.isfinite(d).all(0)
        ep = np.arange(d.shape[1]) // PER_EPISODE
        zero = np.zeros_like(d[:, keep])
        cells = [ci(paired_bootstrap(row[keep], zero[0], clusters=ep[keep]), scale, digits)
                 for row in d]
        rows.append([f"chains of 3 frames - the start: {metric}{unit}", *cells,
                     ci(paired_bootstrap(d[:, keep], zero, clusters=ep[keep]), scale, digits)])
    return table(["480 val transitions, greedy, one step", "seed 0", "seed 1", "seed 2",
                  "3 seeds, seed-level CI"], rows)


# -----------------------------------------------------------------------------
# the blocks, the pages they go in, and the command line

def action_targets():
    """Issue 24's one-step, RLVR and policy-evaluation targets for the default runs' models: the
    shipped start `video_mle_4000` (decoded with the copy gate, as its runs decode it) and the
    default run's RLVR (seed 1337; the differences over its three seeds, the multi-step run's two).
    Each row: the bar, both models, the per-frame tokenizer's own value where it bounds the GPT,
    whether each model meets the bar, and where a miss stops (computed, not typed)."""
    def rows_of(path):
        return json.loads((RESULTS / path).read_text())["rows"]
    pe = json.loads((RESULTS / "policy_eval" / "default.json").read_text())
    checks = pe["checks"]   # policy_eval's one-step checks of both models, 750 transitions
    default = rows_of("video_default/diagnosis.json")   # the default run's RLVR and the tokenizer
    diag = {"mle": rows_of("video_pf4000/diagnosis.json")["GPT video_mle_4000"],
            "rlvr": default["GPT video/video_rlvr"]}
    vq = default["tokenizer video_vq"]   # its reconstruction of the true next frame
    tokenizer = "the tokenizer " + ("passes" if vq["checks"]["push"]["passed"] else "fails too")
    ungated = rows_of("action_fix_data/diagnosis_4000.json")["GPT out_data4c/video_mle"]
    guided = rows_of("action_guidance/diagnosis.json")   # the start decoded with the action's contrast
    gentle, full = guided["GPT video_mle_4000, guided 0.25"], guided["GPT video_mle_4000, guided 1"]
    true_push = checks["mle"]["push"]["true_px"]
    band = (0.7 * true_push, 1.3 * true_push)   # the "within 30% of the truth"
    rows = []

    def met(values, ok):
        return " / ".join("yes" if ok(v) else "**no**" for v in values)

    def check_row(what, bar, key, ok, fmt, stop):
        vals = [checks[m][key[0]][key[1]] for m in ("mle", "rlvr")]
        rows.append([what, bar, *(fmt.format(v) for v in vals),
                     fmt.format(vq["checks"][key[0]][key[1]]), met(vals, ok), stop])

    g = checks["mle"]["gripper"]
    check_row(f"gripper response ({g['n']} moves of {g['true_px']:.2f} px)", ">= 0.8",
              ("gripper", "response"), lambda v: v >= 0.8, "{:.2f}",
              f"the start's decoding: {ungated['checks']['gripper']['response']:.2f} without the copy gate, "
              f"{gentle['checks']['gripper']['response']:.2f} guided (W = 0.25)")
    check_row("gripper end error, px", f"<= {g['true_px'] / 2:.2f} (half the move)",
              ("gripper", "error_px"), lambda v: v <= g["true_px"] / 2, "{:.2f}", "")
    p = checks["mle"]["push"]
    short = band[0] - max(checks[m]["push"]["pred_px"] for m in ("mle", "rlvr"))
    check_row(f"pushed block's move, px (true {true_push:.2f}, {p['n']} pushes)",
              f"{band[0]:.2f}-{band[1]:.2f} (30%)", ("push", "pred_px"),
              lambda v: band[0] <= v <= band[1], "{:.2f}",
              f"the GPT: {short:.2f} px short; {tokenizer}")
    over = min(checks[m]["push"]["error_px"] for m in ("mle", "rlvr")) - true_push / 2
    check_row("push end error, px", f"<= {true_push / 2:.2f} (half the move)",
              ("push", "error_px"), lambda v: v <= true_push / 2, "{:.2f}",
              f"the GPT: {over:.2f} px over; {tokenizer}; guided the whole way (W = 1) "
              f"{full['checks']['push']['error_px']:.2f} px")
    vals = [diag[m]["counterfactual"]["cos"] for m in ("mle", "rlvr")]
    rows.append(["8 commanded directions, mean cosine", ">= 0.8",
                 *(f"{v:.2f}" for v in vals), f"{vq['counterfactual']['cos']:.2f}",
                 met(vals, lambda v: v >= 0.8), ""])
    # policy evaluation, 5 policies x 50 scenes x 2 samples, open / closed loop
    models = pe["summary"]["models"]
    expert = next(x for x in pe["policies"] if x["policy"] == "0.0")
    imagined = max(expert["models"][m][loop]["estimate"] for m in models for loop in pe["loops"])
    for what, key, bar, ok, fmt, stop in (
            ("policy evaluation: Spearman on success, open / closed", "spearman", ">= 0.8",
             lambda v: v >= 0.8, "{:.2f}",
             f"the push: the expert succeeds in {100 * expert['real']:.0f}% of real episodes, "
             f"in at most {100 * imagined:.0f}% imagined"),
            ("policy evaluation: mean abs gap, open / closed", "mean_gap", "<= 0.15",
             lambda v: v <= 0.15, "{:.3f}", "the push: a model that moves nothing is "
             f"{pe['summary']['static_world_gap']:.3f} off")):
        vals = [[models[m][loop][key] for loop in pe["loops"]] for m in ("mle", "rlvr")]
        rows.append([what, bar, *(" / ".join(fmt.format(v) for v in x) for x in vals), "",
                     met([all(ok(v) for v in x) for x in vals], bool), stop])
    # RLVR against its start, the control and copying, on test over the seeds
    for ref, metric, scale, digits, bar, ok in (
            ("mle", "mae", 1000, 2, "CI < 0", lambda d: d[2] < 0),
            ("mle", "object_recall", 1, 3, "mean >= -0.01", lambda d: d[0] >= -0.01),
            ("mle", "action_response", 1, 3, "mean >= -0.01", lambda d: d[0] >= -0.01),
            ("mle_more", "mae", 1000, 2, "CI < 0", lambda d: d[2] < 0),
            ("mle_more", "object_recall", 1, 3, "mean >= -0.01", lambda d: d[0] >= -0.01),
            ("mle_more", "action_response", 1, 3, "mean >= -0.01", lambda d: d[0] >= -0.01)):
        d = diff(VIDEO_DEFAULT_SEEDS, "rlvr", ref, metric)
        unit = " x 1e-3" if metric == "mae" else ""
        rows.append([f"RLVR - {MODELS[ref]}, test {metric}{unit} "
                     f"({len(VIDEO_DEFAULT_SEEDS)} seeds)", bar, "",
                     ci(d, scale, digits), "", met([d], ok), ""])
    beats = [diff([run], "rlvr", "copy", "mae")[2] < 0 for run in VIDEO_DEFAULT_SEEDS]
    ties = ", ".join(f"seed {s}" for s, b in zip(SEED_NAMES, beats) if not b)
    rows.append(["RLVR - copy the last frame, test MAE, per seed", "CI < 0", "",
                 f"{sum(beats)} of {len(beats)} seeds", "", "yes" if all(beats) else "**no**",
                 f"{ties} ties copying (its interval holds 0)" if ties else ""])
    # multi-step: repetition of the 7-frame default run against the context-conditioned MLE's
    old = load("video_multi")["mle"]["repetition_rate"]
    reps = [load(MULTI_4000_SEEDS[0])[m]["repetition_rate"] for m in ("mle", "rlvr")]
    rows.append([f"7 steps: frame repetition (`video_cond_multi_mle`: {old:.3f})",
                 f"<= {old / 2:.3f} (half)", *(f"{v:.3f}" for v in reps), "",
                 met(reps, lambda v: v <= old / 2), ""])
    return table(["target", "bar", "MLE start", "RLVR", "the tokenizer's own",
                  "met (MLE / RLVR)", "where a miss stops"], rows,
                 right=(2, 3, 4))


def action_guidance():
    """experiments/action_diagnosis.py --guidance: the start's one-step checks decoded greedy and with the action's
    contrast at each weight W (results/action_guidance/diagnosis.json, 750 held-out transitions)."""
    rows = json.loads((RESULTS / "action_guidance" / "diagnosis.json").read_text())["rows"]
    out = []
    for name, r in rows.items():
        if not name.startswith("GPT "):
            continue
        g, p = r["checks"]["gripper"], r["checks"]["push"]
        w = name.split(", guided ")[1] if ", guided " in name else None
        mark = {True: "", False: " x"}
        out.append([f"W = {w}" if w else "greedy (W = 0)",
                    f"{g['response']:.2f} / {g['error_px']:.2f}{mark[g['passed']]}",
                    f"{p['pred_px']:.2f}, {p['response']:.2f} / {p['error_px']:.2f}{mark[p['passed']]}",
                    f"{p['false_px']:.2f}", f"{r['counterfactual']['cos']:.2f}"])
    true_push = next(iter(rows.values()))["checks"]["push"]["true_px"]
    return table(["`video_mle_4000`, gated, 750 held-out transitions", "gripper resp / err px",
                  f"push: predicted px (true {true_push:.2f}), resp / err px",
                  "block moved where it stays, px", "(d) cos"], out, right=(3, 4))


BLOCKS = {   # name -> (page, the function that makes it)
    "readme": ("README.md", readme),
    "readme_sample": ("README.md", readme_sample),
    "textgame_default": ("docs/results.md", lambda: lang_default("textgame", "textgame_final")),
    "textgame_seeds": ("docs/results.md", lambda: lang_seeds(TEXT_SEEDS, "accuracy")),
    "textgame_compose": ("docs/results.md", compose),
    "textgame_regimes": ("docs/results.md", regimes),
    "webpage_default": ("docs/results.md", lambda: lang_default("webpage", "webpage_final")),
    "webpage_seeds": ("docs/results.md", lambda: lang_seeds(WEB_SEEDS, "f1")),
    "webpage_placebo": ("docs/results.md", webpage_placebo),
    "rl_logs": ("docs/results.md", rl_logs),
    "textgame_control_sweep": ("docs/results.md", lambda: control_sweep("textgame")),
    "k_step": ("docs/results.md", lambda: k_step({
        "text, `last`": ("accuracy", ("textgame_k3",), None),
        "text, `to_go`": ("accuracy", ("textgame_k3_togo", "textgame_k3_togo_s1",
                                        "textgame_k3_togo_s2"),
                          ("textgame_k3_imag", "textgame_k3_imag_s1", "textgame_k3_imag_s2")),
        "web, `to_go`": ("f1", ("webpage_k3_togo", "webpage_k3_togo_s1", "webpage_k3_togo_s2"),
                         ("webpage_k3_imag", "webpage_k3_imag_s1", "webpage_k3_imag_s2"))})),
    "textgame_budget": ("docs/results.md", lambda: budget("textgame_x10", "textgame_s1337",
                                                          "accuracy")),
    "webpage_budget": ("docs/results.md", lambda: budget("webpage_x10", "webpage_s1337", "f1")),
    "webpage_control_sweep": ("docs/results.md", lambda: control_sweep("webpage")),
    "plan_textgame_first": ("docs/downstream.md", lambda: plan_table(
        "textgame_mle_random_sim", {"random": "random", "sim": "sim",
                                    TG_MLE: f"MLE (`{TG_MLE}`)"})),
    "plan_variants": ("docs/downstream.md", plan_variants),
    "plan_textgame_chosen": ("docs/downstream.md", lambda: plan_table(
        "textgame_mle_noop_tw", {TG_MLE: f"MLE (`{TG_MLE}`), `--noop=0.5 --trust_win=0.5`"})),
    "plan_models": ("docs/downstream.md", plan_models),
    "plan_webpage_every": ("docs/downstream.md", lambda: plan_table(
        "webpage_mle_random_sim", {"random": "random", "sim": "sim",
                                   WEB_MLE: f"MLE (`{WEB_MLE}`)"})),
    "plan_webpage_propose": ("docs/downstream.md", lambda: plan_table(
        "webpage_policy3", {"policy": "policy alone", "random": "random among the policy's 3 best",
                            "sim": "sim among the policy's 3 best",
                            WEB_MLE: f"**MLE (`{WEB_MLE}`)**"})),
    "video_ceiling": ("docs/video.md", video_ceiling),
    "action_targets": ("docs/video.md", action_targets),
    "action_guidance": ("docs/video.md", action_guidance),
    "video_default_machine_b": ("docs/video.md", lambda: video_seeds(
        ("video_default", "video_default_machine_b"), False,
        names=("seed 1337, machine A", "seed 1337, machine B"))),
    "video_default": ("docs/video.md", lambda: video(
        "video_default", than=(("video_single", "RLVR of `video_cond_mle`"),))),
    "video_default_seeds": ("docs/video.md", lambda: video_seeds(VIDEO_DEFAULT_SEEDS, False)),
    "video_single": ("docs/video.md", lambda: video("video_single")),
    "video_seeds": ("docs/video.md", video_seeds),
    "video_multi4000": ("docs/video.md", lambda: video(
        "video_multi4000", multi=True, than=(("video_multi", "RLVR of `video_cond_multi_mle`"),))),
    "video_multi4000_seeds": ("docs/video.md", lambda: video_seeds(MULTI_4000_SEEDS, False, True)),
    "video_multi4000_x03": ("docs/video.md",
                            lambda: video_seeds(MULTI_4000_X03, False, True)),
    "video_multi4000_seeds_machine_a": ("docs/video.md",
                                   lambda: video_seeds(MULTI_4000_A, False, True)),
    "video_multi": ("docs/video.md", lambda: video("video_multi", multi=True, o0="video_multi_o0")),
    "video_multi_control_val": ("docs/video.md", lambda: control_rates_val(
        "validation, 7 frames", ((f"{MODELS['mle_more']} - {MODELS['mle']}", "multi"),))),
    "video_default_control_val": ("docs/video.md", lambda: control_rates_val(
        "validation, control - `video_mle_4000`", rate_rows("default", (
            ("0.1", "1e-5"), ("0.3", "3e-5"), ("1", "1e-4"), ("3", "3e-4"))))),
    "video_multi4000_control_val": ("docs/video.md", lambda: control_rates_val(
        "validation, 7 frames, control - `video_mle_4000`", rate_rows("multi4000", (
            ("0.3", "3e-5"), ("1", "1e-4"))))),
    "video_gate_val": ("docs/video.md", lambda: gate_val(GATE_VAL)),
    "video_gate4000_val": ("docs/video.md", lambda: gate_val(GATE_4000_VAL)),
    "video_multi4000_val": ("docs/video.md", lambda: gate_val(MULTI_4000_VAL)),
    "video_gate_test": ("docs/video.md", lambda: video(
        "video_pf_gate_o05", than=(("video_single", "RLVR of `video_cond_mle`"),))),
    "video_gate_seeds": ("docs/video.md", lambda: video_seeds(GATE_O05_SEEDS, False)),
    "video_gate_seeds_o0": ("docs/video.md", lambda: video_seeds(GATE_SEEDS, False)),
    "video_gate4000_test": ("docs/video.md", lambda: video(
        "video_pf4000", than=(("video_default", "RLVR of the default run"),
                              ("video_single", "RLVR of `video_cond_mle`"),
                              ("video_pf_gate_o05", "RLVR of `video_mle`")))),
    "video_gate4000_seeds": ("docs/video.md", lambda: video_seeds(GATE_4000_SEEDS, False)),
    "video_mirror4000_val": ("docs/downstream.md", lambda: gate_val(MIRROR_VAL)),
    "video_mirror4000_seeds": ("docs/downstream.md", lambda: video_seeds(MIRROR_SEEDS, False)),
    "chain_val": ("docs/downstream.md", chain_val),
    "chain_onestep": ("docs/downstream.md", chain_onestep),
    "chain_test": ("docs/downstream.md", chain_test),
    "video_single_action": ("docs/video.md", lambda: video(
        "video_single_action", than=(("video_single", "RLVR without the action term"),))),
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
