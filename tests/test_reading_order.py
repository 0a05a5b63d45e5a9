"""The README's reading order is what one RLVR step runs: a trace from train_lang.py's first line to its first
optimizer step (tools/trace_step.py) runs through exactly the files the table lists, with 2 functions of the
top-level files on the stack at the step (grpo_step, update), and the table's total row adds up. Its size is a
ratchet: issue 56 asked for 1,300 lines in 7 files; today's 1,619 in 9 (issue 57's per-block FSDP and
sharded reference run through runtime.py; issue 68's update rows in passes by length, the start's evaluation
beside RLVR) may shrink, never grow."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def reading_order():
    """README.md's reading-order table -> {file: lines} and the total row's (files, lines)."""
    section = ROOT.joinpath("README.md").read_text().split("## Reading order", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| \d+ \| \[([^\]]+)\]\([^)]+\) \| (\d+) \|", section, re.M))
    total = re.search(r"^\| \| all \| (\d+) files, (\d+) lines \|", section, re.M)
    assert rows and total, "README.md: no reading-order table with a total row"
    return {f: int(n) for f, n in rows.items()}, (int(total[1]), int(total[2]))


def test_the_total_row_adds_up():
    rows, (n_files, n_lines) = reading_order()
    assert (n_files, n_lines) == (len(rows), sum(rows.values())), "README.md: the total row is off"
    assert n_files <= 9 and n_lines <= 1619, "README.md: the reading order grew (python tools/trace_step.py --write)"


@pytest.mark.slow
def test_the_step_runs_through_the_listed_files(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TRACE_JSON": str(tmp_path / "t.json")}
    run = dict(cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    p = subprocess.run([sys.executable, "data/textgame/prepare.py", "--n_train=60", "--n_val=4", "--n_test=4",
                        f"--out_dir={tmp_path / 'data'}"], **run)
    assert p.returncode == 0, p.stderr[-2000:]
    # max_rounds 4 on a converged model: groups without spread make the step draw more prompts (the refill path)
    p = subprocess.run([sys.executable, "tools/trace_step.py", f"--data_dir={tmp_path / 'data'}",
                        f"--out_dir={tmp_path / 'out'}", "--stage=rlvr", "--rl_steps=1", "--control=0",
                        "--eval_limit=1", "--prompts_per_step=2", "--group_size=4",
                        "--max_new_tokens=64"], **run)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    traced = json.loads((tmp_path / "t.json").read_text())
    rows, _ = reading_order()
    assert set(traced["lines"]) == set(rows), f"the step runs through {sorted(traced['lines'])}; README.md lists {sorted(rows)}"
    # the loop is the script's: grpo_step and update between its top level and the optimizer step
    assert traced["stack"] == ["grpo.py:grpo_step", "grpo.py:update"], traced["stack"]
