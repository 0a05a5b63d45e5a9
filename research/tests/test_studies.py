"""The text studies end to end on tiny settings (slow): research/placebo.py, research/labels.py (a fraction of the
labels, a small pool) and research/control_sweep.py write train_lang.py's eval JSON from a tiny MLE start."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
RL = ["--rl_steps=1", "--group_size=2", "--prompts_per_step=2", "--max_new_tokens=32", "--batch_size=4",
      "--val_limit=3", "--test_limit=3"]


def run(*args):
    p = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """Tiny data and a tiny train_lang.py run from scratch (MLE, RLVR, the control)."""
    tmp = tmp_path_factory.mktemp("studies")
    run("data/textgame/prepare.py", "--n_train=200", "--n_val=10", "--n_test=10", f"--out_dir={tmp / 'data'}")
    run("train_lang.py", "--init=scratch", f"--data_dir={tmp / 'data'}", f"--out_dir={tmp / 'run'}", "--n_layer=1",
        "--n_embd=32", "--mle_steps=10", *RL[:-2], "--eval_limit=3")
    return tmp


def evaluated(out, models=("mle", "rlvr", "mle_more")):
    for name in ("eval.json", "eval_val.json"):
        result = json.loads((out / name).read_text())
        assert set(result) == set(models) and all(r["n"] == 3 for r in result.values())


def test_placebo_writes_the_comparison(start):
    out = start / "placebo"
    run("research/placebo.py", f"--init={start / 'run' / 'mle.safetensors'}", f"--data_dir={start / 'data'}",
        f"--out_dir={out}", *RL)
    evaluated(out)


def test_labels_small_pool_and_fraction(start):
    out = start / "pool"
    run("research/labels.py", f"--init={start / 'run' / 'mle.safetensors'}", f"--data_dir={start / 'data'}",
        f"--out_dir={out}", "--rl_pool=8", "--rl_unchanged_frac=0", "--control=0", *RL)
    evaluated(out, ("mle", "rlvr"))
    out = start / "frac"
    run("research/labels.py", f"--data_dir={start / 'data'}", f"--out_dir={out}", "--label_frac=0.5",
        "--mle_steps=2", "--control=0", *RL)
    assert json.loads((out / "mle.json").read_text())["step"] == 2
    evaluated(out, ("mle", "rlvr"))


def test_control_sweep_rows(start):
    stdout = run("research/control_sweep.py", f"--run={start / 'run'}", "--factors=1,3", "--val_limit=3")
    assert "| x1 |" in stdout and "| x3 |" in stdout and "best on validation" in stdout
