"""
How a language world model is scored on held-out records, and the tables that report it (eval.py and
train_lang.py print with them).

`evaluate` decodes greedily (and optionally at T=1 and best-of-k) and returns the summary metrics
overall, on the records that change something (`_changed`) and on those that do not
(`_unchanged`), plus `per_record`: one value per record per metric, in file order, so two models
evaluated on the same records can be compared *paired* (stats.paired_table: the mean difference
with a bootstrap 95% interval over records).
"""
from contextlib import nullcontext

import torch

from runtime import fork_map
from stats import paired_table
from tasks import TASKS, crop, generate_texts, load_lang_model


# -----------------------------------------------------------------------------
# scoring

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
    prompts = [tok.encode(T.data.prompt_text(r)) for r in records]
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

    outs = fork_map(run, jobs, workers)
    results = {split: {} for split in splits}
    for name in ckpts:   # in the checkpoints' order, whatever order the jobs ran in
        for split in splits:
            results[split][name] = outs[jobs.index((name, split))]
    return results


# -----------------------------------------------------------------------------
# printing

def pct(x):
    """A share as a percentage, 6 wide with 2 decimals; "-" for None."""
    return "     -" if x is None else f"{100 * x:6.2f}"


def print_table(task, rows, file=None, metric=None):
    """rows: name -> evaluate result. Greedy `metric` (default: the headline metric) overall /
    changed / unchanged, then T=1 and extras, then the always-no-change baseline."""
    h = metric or TASKS[task].headline
    extra = ["precision", "recall"] if task == "webpage" and h == TASKS[task].headline else []
    print(f"{'model (' + h + ' %)':<28} {'overall':>7} {'changed':>7} {'unchanged':>9} {'T=1':>6}"
          + "".join(f" {e:>9}" for e in extra), file=file)
    baseline = next(iter(rows.values()))["baseline_no_change"]   # the same records for every row
    for name, r in list(rows.items()) + [("always-no-change baseline", baseline)]:
        s = r.get("sampled", {}).get(h)
        print(f"{name:<28} {pct(r[h]):>7} {pct(r[h + '_changed']):>7} "
              f"{pct(r[h + '_unchanged']):>9} {pct(s):>6}"
              + "".join(f" {pct(r[e]):>9}" for e in extra), file=file)


def print_paired(task, rows, against, file=None, metric=None):
    """Paired differences of `metric` (default: the headline metric) against model `against`, in
    points, with bootstrap 95% intervals; * marks an interval that excludes 0."""
    h = metric or TASKS[task].headline
    print(f"paired differences in {h} (points, bootstrap 95% CI over the same records):", file=file)
    for name, sub, m, lo, hi in paired_table(rows, h, against):
        if m is not None:   # None: no record in this subset
            sig = "  *" if lo > 0 or hi < 0 else ""
            print(f"  {name + ' - ' + against:<22} {sub:<8} {100 * m:+6.2f}  "
                  f"[{100 * lo:+6.2f}, {100 * hi:+6.2f}]{sig}", file=file)


def print_comparison(task, split, rows, file=None, metrics=None, what="transitions"):
    """train_lang.py's report of one split (rows: name -> evaluate result, "mle" among them): the
    table of metrics[0] (default: the headline metric), then the paired differences in each of
    `metrics` against the MLE start and, when the control ran, against the control ("mle_more")."""
    first, metrics = rows["mle"], metrics or (TASKS[task].headline,)
    print(f"\n{split} split ({first['n']} {what}, {first['n_changed']} changed), "
          f"{metrics[0]} % (greedy):", file=file, flush=True)
    print_table(task, rows, file, metrics[0])
    for m in metrics:
        print_paired(task, rows, "mle", file, m)
        if "mle_more" in rows:
            print_paired(task, {k: v for k, v in rows.items() if k != "mle"}, "mle_more", file, m)
