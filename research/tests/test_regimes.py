"""research/regimes.py: paired RLVR-minus-model rows from eval.json files, per seed and over all seeds."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def fake_run(path, rlvr, mle, mle_more, changed):
    """An out_dir with an eval.json in train_lang.py's shape (per-record accuracy and changed flags)."""
    path.mkdir(parents=True)
    entry = lambda acc: {"per_record": {"accuracy": acc, "changed": changed}}  # noqa: E731
    (path / "eval.json").write_text(json.dumps({"mle": entry(mle), "rlvr": entry(rlvr), "mle_more": entry(mle_more)}))
    return str(path)


def regimes(*argv):
    return subprocess.run([sys.executable, "research/regimes.py", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_rows_are_paired_differences_per_seed_and_over_seeds(tmp_path):
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
    seeds = by[("2 seeds", "mle")]["all"]
    assert seeds[0] == pytest.approx(25.0)   # the mean of the two seeds
    # the seeds are resampled too: +50 and 0 points apart, the interval spans both
    assert seeds[1] <= 0.0 + 1e-9 and seeds[2] >= 50.0 - 1e-9
    assert by[("a", "mle_more")]["changed"][0] == pytest.approx(100.0)
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert "| demo | 2 seeds | MLE start | 200 | +25.00" in p.stdout


def test_bad_input_is_one_line(tmp_path):
    p = regimes("no-equals-sign")
    assert p.returncode != 0 and p.stderr.strip().splitlines()[-1].startswith("error: 'no-equals-sign'")
    p = regimes(f"x={tmp_path / 'missing'}")
    assert p.returncode != 0 and "eval.json" in p.stderr.strip().splitlines()[-1]


def test_video_runs_use_mae_in_thousandths_and_refuse_mixing(tmp_path):
    """train_video.py's eval.json: per-window MAE, reported x 1e-3; a text run and a video run in one call: one line."""
    v = tmp_path / "v"
    v.mkdir()
    entry = lambda mae: {"per_record": {"mae": mae, "ssim": [0.9] * 4, "changed": [True] * 4}}  # noqa: E731
    (v / "eval.json").write_text(json.dumps({"mle": entry([0.010] * 4), "rlvr": entry([0.008] * 4),
                                             "mle_more": entry([0.009] * 4)}))
    p = regimes(f"video={v}", f"--json={tmp_path / 'v.json'}")
    assert p.returncode == 0, p.stderr
    assert "overall (x 1e-3, 95% CI)" in p.stdout
    rows = {r["against"]: r for r in json.loads((tmp_path / "v.json").read_text())["rows"]}
    assert rows["mle"]["all"] == pytest.approx([-2.0, -2.0, -2.0]) and rows["mle_more"]["all"][0] == pytest.approx(-1.0)
    t = fake_run(tmp_path / "t", [1.0] * 4, [0.0] * 4, [0.0] * 4, [True] * 4)
    p = regimes(f"video={v}", f"text={t}")
    assert p.returncode == 1 and p.stderr.strip() == ("error: the runs have different headline metrics (text and "
                                                      "video?); give one task per call")
