"""
Paired statistics and the tables both evaluators print (eval.py for text, video_eval.py for video):
the paired bootstrap, the paired differences of pairs of models, the printers.

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


def paired_diffs(rows, pairs, metrics, subsets=("all", "changed")):
    """Paired differences a - b of per-record metrics with bootstrap 95% intervals. rows: name -> a
    result with "per_record": {metric: [...], "changed": [...]} over the same records (a None
    value: none for that record, e.g. no gripper move in the window); pairs: (a, b) names. Each
    metric both have, on the records where both have a value, in each subset: "all" and "changed"
    (the records b marks changed; left out when that is every record: it would repeat "all").
    -> list of (a, b, metric, subset, mean, low, high), (None, None, None) for no record."""
    out = []
    for a, b in pairs:
        x, y = rows[a]["per_record"], rows[b]["per_record"]
        for m in [m for m in metrics if m in x and m in y]:
            if len(x[m]) != len(y[m]):
                raise ValueError(f"{a} and {b} were evaluated on different records")
            for sub in ("all",) if all(y["changed"]) else subsets:
                both = [(u, v) for u, v, c in zip(x[m], y[m], y["changed"])
                        if u is not None and v is not None and (sub == "all" or c)]
                out.append((a, b, m, sub, *paired_bootstrap([u for u, _ in both],
                                                            [v for _, v in both])))
    return out


def print_diffs(title, diffs, points=False, file=None):
    """Print paired_diffs' list under `title`: a - b, metric, subset, the mean difference and its
    95% interval, in points (x 100: shares) or as they are; * marks an interval that excludes 0."""
    print(title, file=file)
    w = max([len(d[2]) for d in diffs], default=0)   # the metrics' column
    for a, b, m, sub, *v in diffs:
        if v[0] is not None:   # None: no record in this subset
            mean, lo, hi = (f"{100 * x:+6.2f}" if points else f"{x:+.5f}" for x in v)
            sig = "  *" if v[1] > 0 or v[2] < 0 else ""
            print(f"  {a + ' - ' + b:<22} {m:<{w}} {sub:<8} {mean}  [{lo}, {hi}]{sig}", file=file)


def print_rows(rows, widths, file=None):
    """A table, one line per row of cells (strings): the first left-, the others right-aligned."""
    # each column `widths` wide, or as wide as its widest cell
    widths = [max([w] + [len(r[i]) for r in rows if len(r) > i]) for i, w in enumerate(widths)]
    for cells in rows:
        print(" ".join([f"{cells[0]:<{widths[0]}}"]
                       + [f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:])]), file=file)
