"""Smoke test of the bench/ scripts and research/rl_headroom.py: each runs in its tiniest mode and prints its table. Not a timing test: the
numbers are not checked, only that every script still runs against the current code (TRL's is skipped without trl)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {"bench/bench_rollout.py": "ours / HF", "bench/bench_grpo.py": "TRL / ours", "bench/bench_mle.py": "MFU",
           "bench/bench_rewards.py": "ours / scikit-image", "bench/bench_e2e.py": "live tensors",
           "research/rl_headroom.py": "best-of-G"}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_bench_script_runs_tiny(script):
    if script == "bench/bench_grpo.py" and importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed (pip install -r requirements-dev.txt)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([sys.executable, str(ROOT / script), "--tiny"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert SCRIPTS[script] in p.stdout and ("machine:" in p.stdout or script.startswith("research")), p.stdout[-3000:]
