"""experiments/regimes.py: paired RLVR-minus-model rows from eval.json files, per seed and pooled over seeds."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def fake_run(path, rlvr, mle, mle_more, changed):
    """An out_dir with an eval.json in train_lang.py's shape (per-record accuracy and changed flags)."""
    path.mkdir(parents=True)
    entry = lambda acc: {"per_record": {"accuracy": acc, "changed": changed}}  # noqa: E731
    (path / "eval.json").write_text(json.dumps({"mle": entry(mle), "rlvr": entry(rlvr), "mle_more": entry(mle_more)}))
    return str(path)


def regimes(*argv):
    return subprocess.run([sys.executable, "experiments/regimes.py", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_rows_are_paired_differences_and_pooled_over_seeds(tmp_path):
    pytest.importorskip("matplotlib")
    n = 200
    changed = [i % 2 == 0 for i in range(n)]
    # seed a: RLVR right on every record, MLE on half of them -> +50 points; seed b: RLVR = MLE -> 0 points
    a = fake_run(tmp_path / "a", [1.0] * n, [float(i % 4 < 2) for i in range(n)], [0.0] * n, changed)
    b = fake_run(tmp_path / "b", [1.0] * n, [1.0] * n, [1.0] * n, changed)
    p = regimes(f"demo={a},{b}", f"--out={tmp_path / 'r.png'}", f"--json={tmp_path / 'r.json'}")
    assert p.returncode == 0, p.stderr
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    by = {(Path(r["run"]).name, r["against"]): r for r in rows}
    assert by[("a", "mle")]["all"][0] == pytest.approx(50.0)
    assert by[("a", "mle")]["all"][1] > 0                       # the interval excludes zero
    assert by[("b", "mle")]["all"] == [0.0, 0.0, 0.0]            # no difference on any record
    assert by[("2 seeds pooled", "mle")]["all"][0] == pytest.approx(25.0)   # the mean of the two seeds
    assert by[("a", "mle_more")]["changed"][0] == pytest.approx(100.0)
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert "| demo | 2 seeds pooled | MLE start | 200 | +25.00" in p.stdout


def test_bad_input_is_one_line(tmp_path):
    p = regimes("no-equals-sign")
    assert p.returncode != 0 and p.stderr.strip().splitlines()[-1].startswith("error: 'no-equals-sign'")
    p = regimes(f"x={tmp_path / 'missing'}")
    assert p.returncode != 0 and "eval.json" in p.stderr.strip().splitlines()[-1]
