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

Every language task writes "what changes" as text, scored by its reward in rewards.py (tasks.py):
- textgame: the state difference is merged into the current state and compared with the true next
  state; `accuracy` = exact state (binary reward), `task_specific` = the graded reward.
- webpage: the three sections of changed page items; `precision`, `recall`, `f1` (per record, then
  averaged).
Each metric is reported overall and on the transitions that change something (`_changed`) or nothing
(`_unchanged`), greedy (T=0) at the top level of the JSON, sampled (T=1) under "sampled", best-of-k
under "pass@k", per record under "per_record" (one value per record, in file order, and "changed")
and "answers" (the greedy answers), plus the baseline that exposes fake gains: always answering
"nothing changes", scored by the same reward. With --compare the paired differences (bootstrap 95%
intervals over the same records) are printed too.
`n_cropped` counts the prompts over the model's block_size, cut to their last tokens (tasks.crop).
data/textgame/compose.jsonl, the text game's composition split (records whose game, room objects and
action never occur together in train; data/textgame/prepare.py), is made when it is missing.

Video: --task=video runs video_eval.py (rollouts on held-out episodes), with flags of its own.
"""
import argparse
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

from checkpoint import ROOT, read_meta, write_json
from data.textgame.prepare import COMPOSE_PATH, ensure_compose
from runtime import check_device, check_ranges, fork_map, rank_map
from stats import paired_diffs, print_diffs, print_rows
from tasks import TASKS, crop, generate_texts, load_lang_model


# -------------------------------------------------------------------------------------------------
# the language tasks: answers scored by the task (the metrics: the docstring above), summaries and
# tables (eval.py and train_lang.py print them)

def summarize(per_record, changed):
    """List of per-record metric dicts -> each metric's mean overall, on changed and on unchanged
    records (None for an empty subset)."""
    def mean(xs):
        return sum(xs) / len(xs) if xs else None
    kept = {"": [True] * len(changed), "_changed": changed, "_unchanged": [not c for c in changed]}
    return {k + s: mean([m[k] for m, keep in zip(per_record, mask) if keep])
            for k in per_record[0] for s, mask in kept.items()}


def evaluate(task, model, tok, records, max_new_tokens=256, batch_size=64, sampled=False, pass_k=0,
             seed=0, desc="eval", share=None, position=None):
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
                            desc=label("greedy"), share=share, position=position)
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
    res["answers"] = greedy   # every record's greedy answer, in file order (tools/report.py)
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
            # shared by ranks: no bars; forked: each job's bar on a line of its own
            return evaluate(task, model, tok, splits[split], max_new_tokens,
                            desc=None if share else f"{split} {name}", share=share,
                            position=jobs.index(job) if workers > 1 else None)

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


def compare_checkpoints(run, task, ckpts, tok, splits, max_new_tokens, headroom=None, done=None):
    """A text run's final comparison (train_lang.py's, a study's): every checkpoint of {name: path}
    greedy on every split {split: records}, paired; rank 0 writes eval.json (test) and
    eval_val.json (val) in out_dir, with each model's `headroom` {name: dict} beside its results,
    and prints each split's report -> {split: {name: result}}. done: the same of some checkpoints,
    evaluated already (evaluate_checkpoints's), not run again."""
    done = done or {split: {} for split in splits}
    todo = {name: path for name, path in ckpts.items() if name not in done[next(iter(splits))]}
    # a CPU: two processes share the jobs; torchrun: each rank decodes a share of every job
    new = evaluate_checkpoints(task, todo, tok, splits, max_new_tokens, run.device, run.autocast,
                               2 if run.forks else 1, rank_map if run.world > 1 else None)
    results = {split: {name: (done[split] | new[split])[name] for name in ckpts}
               for split in splits}
    if run.master:
        for split, r in results.items():
            r = {k: v | {"headroom": headroom[k]} if k in (headroom or ()) else v
                 for k, v in r.items()}
            write_json(run.out_dir / ("eval.json" if split == "test" else "eval_val.json"), r)
            print_comparison(task, split, r)   # RLVR - start, RLVR - control: paired 95% CIs
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--task", default="textgame", choices=sorted(TASKS), help="a language task "
        "(--task=video, a video world model: python eval.py --task=video --help)")
    add("--ckpt", required=True, help="our .safetensors checkpoint or an HF model directory")
    add("--compare", default=None, help="a second checkpoint; paired differences: --ckpt - it")
    add("--limit", type=int, default=0, help="the first N records only (0 = all)")
    add("--json", default=None, help="write the result here")
    add("--seed", type=int, default=0, help="seed of the sampled answers")
    add("--device", default="cpu")
    add("--threads", type=int, default=1, help="torch CPU threads (1 is fastest for tiny models)")
    add("--data", default=None, help="JSONL records (default: the embedded split --split)")
    add("--split", default="test", choices=["val", "test"],
        help="the embedded split when --data is not given")
    add("--max_new_tokens", type=int, default=256)
    add("--batch_size", type=int, default=64)
    add("--pass_k", type=int, default=4, help="samples per record for pass@k (0 = skip)")
    args = p.parse_args()
    check_ranges(p, args, at_least_1=("max_new_tokens", "batch_size", "threads"),
                 at_least_0=("limit", "pass_k"))
    torch.set_num_threads(args.threads)
    T = TASKS[args.task]   # --ckpt (and --compare) on the records, greedy, T=1 and pass@k
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
                                args.batch_size, True, args.pass_k, args.seed, desc=Path(ck).name)
    except ValueError as e:
        sys.exit(f"error: {e}")
    names = {k: f"{i}:{Path(k).name}" for i, k in enumerate(rows)}   # two files may share a name
    print_comparison(args.task, data.stem, {names[k]: v for k, v in rows.items()},
                     pairs=[(names[args.ckpt], names[args.compare])] if args.compare else [])
    if args.pass_k:
        for k, v in rows.items():
            print(f"{names[k]}: pass@{args.pass_k} = {pct(v[f'pass@{args.pass_k}'][T.headline])}")
    if args.json:   # the --ckpt's result, or with --compare both under their checkpoints
        write_json(args.json, rows[args.ckpt] if not args.compare else rows)


if __name__ == "__main__":
    # the command line's dispatch: --task=video (decoded frames, not text) runs video_eval.py's
    # main with the other flags; imported here only, so that eval's importers load no video code
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--task")
    known, rest = pre.parse_known_args()
    if known.task == "video":
        import video_eval
        video_eval.main(rest, prog="eval.py --task=video")
    else:
        main()
