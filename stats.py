"""
Comparing two models evaluated on the same records: the paired bootstrap, and the paired table of
every model against one reference, overall and on the records that change something.

Paired means record by record: both models answered the same records in the same order (evaluate's
and eval_video's `per_record` lists), so the difference is taken per record first and only then
averaged, and the records (not the two models separately) are resampled for the 95% interval.
"""
import numpy as np


def pool_seeds(runs):
    """Several seeds' per-record values (runs: one list per seed, the same records in the same
    order) -> their mean per record, (n,): the values to compare when the seeds are pooled."""
    return np.mean(np.asarray(runs, dtype=np.float64), axis=0)


def paired_bootstrap(a, b, n_boot=10000, seed=0):
    """Mean of a - b over paired records and its bootstrap 95% interval (records resampled with
    replacement) -> (mean difference, low, high); (None, None, None) for no records."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(d) == 0:
        return None, None, None
    # n_boot resamples of the n records, each the mean of n records drawn with replacement
    idx = np.random.default_rng(seed).integers(0, len(d), size=(n_boot, len(d)))  # (n_boot, n)
    means = d[idx].mean(1)
    return float(d.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def paired_table(rows, metric, against, subsets=("all", "changed")):
    """Paired differences `name - against` of one per-record metric for every other model in rows
    (name -> a result with "per_record": {metric: [...], "changed": [...]}), overall and on changed
    records -> list of (name, subset, mean, low, high)."""
    base = rows[against]["per_record"]
    out = []
    for name, r in rows.items():
        if name == against:
            continue
        pr = r["per_record"]
        for sub in subsets:
            # the subset is the reference's: records it marks changed (or all of them)
            keep = [sub == "all" or c for c in base["changed"]]
            a = [x for x, k in zip(pr[metric], keep) if k]
            b = [x for x, k in zip(base[metric], keep) if k]
            out.append((name, sub, *paired_bootstrap(a, b)))
    return out
