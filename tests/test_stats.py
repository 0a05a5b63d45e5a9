"""stats.py: the paired bootstrap and the paired table."""
from stats import paired_bootstrap, paired_table, pool_seeds


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


def test_paired_table_compares_every_row_with_the_reference_on_each_subset():
    # three models on four records, none of which changes: the "changed" subset is empty (None)
    rows = {name: {"per_record": {"f1": x, "changed": [False] * 4}}
            for name, x in (("a", [1.0, 0.0, 1.0, 0.0]), ("ref", [0.5] * 4), ("b", [0.5] * 4))}
    table = paired_table(rows, "f1", "ref")
    assert [(n, s) for n, s, *_ in table] == [("a", "all"), ("a", "changed"), ("b", "all"), ("b", "changed")]
    assert table[0][2] == 0.0 and table[2][2:] == (0.0, 0.0, 0.0)   # b equals the reference on every record
    assert table[1][2:] == table[3][2:] == (None, None, None)
    assert paired_table(rows, "f1", "ref", subsets=("all",)) == [table[0], table[2]]   # the same resamples


def test_pooled_seeds_are_averaged_per_record_before_the_bootstrap():
    runs = [[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    assert pool_seeds(runs).tolist() == [2 / 3, 1 / 3, 1.0]
    assert pool_seeds(runs[:1]).tolist() == runs[0]   # one seed: its own values
