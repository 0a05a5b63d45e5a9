"""eval.py's aggregation and its baselines, without any model."""
import pytest

from data.textgame.simulator import generate_split as textgame_split
from data.webpage.simulator import generate_split as webpage_split
from eval import TASKS, print_table, summarize


def test_summarize_splits_changed_and_unchanged():
    per = [{"accuracy": 1.0}, {"accuracy": 0.0}, {"accuracy": 1.0}, {"accuracy": 1.0}]
    s = summarize(per, [True, True, False, False])
    assert s == {"accuracy": 0.75, "accuracy_changed": 0.5, "accuracy_unchanged": 1.0}
    assert summarize(per, [True] * 4)["accuracy_unchanged"] is None


@pytest.mark.parametrize("task,split", [("textgame", textgame_split), ("webpage", webpage_split)])
def test_no_change_answer_is_right_exactly_on_unchanged_records(task, split):
    T = TASKS[task]
    records = split("val", 60, 0)
    for r in records:
        m = T.metrics(T.no_change, r)[T.headline]
        assert (m == 1.0) == (not T.data.is_changed(r)), r["action"]
        assert T.metrics(T.data.target_text(r), r)[T.headline] == 1.0  # the truth scores the maximum


def test_print_table_has_baseline_row(capsys):
    row = {"accuracy": 0.5, "accuracy_changed": 0.25, "accuracy_unchanged": 1.0,
           "sampled": {"accuracy": 0.4}, "baseline_no_change": {"accuracy": 0.45, "accuracy_changed": 0.0,
                                                                "accuracy_unchanged": 1.0}}
    print_table("textgame", {"mle": row})
    out = capsys.readouterr().out
    assert "always-no-change baseline" in out and " 50.00" in out and " 45.00" in out
