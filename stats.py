"""
Comparing two models evaluated on the same records: the paired bootstrap, and the paired table of
every model against one reference, overall and on the records that change something.

Paired means record by record: both models answered the same records in the same order (evaluate's
and eval_video's `per_record` lists), so the difference is taken per record first and only then
averaged, and the records (not the two models separately) are resampled for the 95% interval.
Several seeds of one comparison (the same records, one row per seed) are resampled at two levels:
the seeds, and the records (or the clusters of records that share an episode), so the interval
holds the spread between seeds as well as between records.
"""
import numpy as np


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
