"""eval.py: the paired bootstrap and the paired differences."""
import numpy as np
import pytest

from stats import paired_bootstrap, paired_diffs


def test_paired_bootstrap_matches_hand_computed_cases():
    # identical models: zero difference, zero-width interval
    assert paired_bootstrap([1, 0, 1, 1], [1, 0, 1, 1]) == (0.0, 0.0, 0.0)
    # a always 1 point better on every record: the interval is that point exactly
    m, lo, hi = paired_bootstrap([2.0] * 50, [1.0] * 50)
    assert (m, lo, hi) == (1.0, 1.0, 1.0)
    # 30 wins, 10 losses, 60 ties of a 0/1 metric: mean +0.2, the interval excludes 0 and holds the mean;
    # its width is close to the normal approximation 2 * 1.96 * sd / sqrt(n)
    a = [1] * 30 + [0] * 10 + [1] * 60
    b = [0] * 30 + [1] * 10 + [1] * 60
    m, lo, hi = paired_bootstrap(a, b, seed=1)
    assert m == 0.2 and 0 < lo < m < hi
    sd = (sum((x - y - 0.2) ** 2 for x, y in zip(a, b)) / 100) ** 0.5
    assert abs((hi - lo) - 2 * 1.96 * sd / 10) < 0.03
    # the same seed gives the same interval; the sign flips with the order
    assert paired_bootstrap(a, b, seed=1) == (m, lo, hi)
    assert paired_bootstrap(b, a, seed=1)[0] == -0.2


def test_paired_diffs_compare_every_pair_on_each_subset():
    # three models on four records, none of which changes: the "changed" subset is empty (None)
    rows = {name: {"per_record": {"f1": x, "changed": [False] * 4}}
            for name, x in (("a", [1.0, 0.0, 1.0, 0.0]), ("ref", [0.5] * 4), ("b", [0.5] * 4))}
    pairs = [("a", "ref"), ("b", "ref")]
    table = paired_diffs(rows, pairs, ["f1"])
    assert [d[:4] for d in table] == [("a", "ref", "f1", "all"), ("a", "ref", "f1", "changed"),
                                      ("b", "ref", "f1", "all"), ("b", "ref", "f1", "changed")]
    assert table[0][4] == 0.0 and table[2][4:] == (0.0, 0.0, 0.0)   # b equals the reference on every record
    assert table[1][4:] == table[3][4:] == (None, None, None)
    assert paired_diffs(rows, pairs, ["f1"], subsets=("all",)) == [table[0], table[2]]   # the same resamples


def test_paired_diffs_skip_missing_values_and_metrics():
    # a record where either has no value is left out, and so is a metric one of them lacks; every
    # record changed: no "changed" row (it would repeat "all")
    rows = {"x": {"per_record": {"f1": [1.0, None, 0.0], "r": [1.0] * 3, "changed": [True] * 3}},
            "y": {"per_record": {"f1": [0.0, 1.0, 0.0], "changed": [True] * 3}}}
    assert [d[:5] for d in paired_diffs(rows, [("x", "y")], ["f1", "r"])] == [("x", "y", "f1", "all", 0.5)]
    rows["y"]["per_record"]["f1"] = [0.0, 1.0]
    with pytest.raises(ValueError, match="x and y were evaluated on different records"):
        paired_diffs(rows, [("x", "y")], ["f1"])


def test_several_seeds_resample_seeds_and_records():
    # three seeds over the same 200 records: seed 0 gains 0.1, seed 1 gains 0.5, seed 2 loses 0.1
    noise = np.random.default_rng(0).normal(0, 0.05, (3, 200))
    d = np.array([[0.1], [0.5], [-0.1]]) + noise
    m, lo, hi = paired_bootstrap(d, np.zeros_like(d))
    assert abs(m - d.mean()) < 1e-12
    # the seeds disagree far beyond the records' noise: the interval spans the seeds' spread
    # (a record-only bootstrap of the per-record mean over seeds is ~0.01 wide)
    assert lo < 0.05 and hi > 0.35
    rec = paired_bootstrap(d.mean(0), np.zeros(200))
    assert rec[2] - rec[1] < 0.02
    # seeds that agree exactly: the record-level interval is all that is left
    same = np.repeat(d[:1], 3, axis=0)
    m1, lo1, hi1 = paired_bootstrap(same, np.zeros_like(same))
    one = paired_bootstrap(d[0], np.zeros(200))
    assert abs(m1 - one[0]) < 1e-12 and abs((hi1 - lo1) - (one[2] - one[1])) < 0.005


def test_one_seed_with_singleton_clusters_is_the_record_bootstrap():
    x = np.random.default_rng(1).random(50)
    assert paired_bootstrap(x, 0 * x, clusters=np.arange(50)) == paired_bootstrap(x, 0 * x)
    assert paired_bootstrap([x], [0 * x]) == paired_bootstrap(x, 0 * x)


def test_clustered_records_are_resampled_together():
    # 10 episodes of 20 records each, every record equal to its episode's value: the interval of
    # the clusters is that of 10 values, far wider than that of 200 independent records
    x = np.repeat(np.random.default_rng(2).normal(0, 1, 10), 20)
    _, lo, hi = paired_bootstrap(x, 0 * x, clusters=np.repeat(np.arange(10), 20))
    _, lo_r, hi_r = paired_bootstrap(x, 0 * x)
    assert (hi - lo) > 2.5 * (hi_r - lo_r)
