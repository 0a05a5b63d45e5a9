"""The task interface (tasks.Task) for every registered task, and the worked example of docs/tasks.md,
data/lights/task.py: its world rule, its seeded splits, its rewards, and a tiny end-to-end training run."""
import json
import math
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from data.lights import task as lights
from tasks import TASKS, Task

ROOT = Path(__file__).resolve().parents[1]
# answers a model may write that no task may crash on
ODD_ANSWERS = ["", " ", "none", "{", "}{", '{"modified":[', "New items:", "3=1 3=0", "=", "\x00", "é" * 50]


# -----------------------------------------------------------------------------
# every registered task satisfies the interface

@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_satisfies_the_interface(name, tmp_path):
    T = TASKS[name]
    assert isinstance(T, Task) and all(getattr(T, f.name) is not None for f in fields(Task))
    assert T.rewards and all(isinstance(k, str) for k in T.rewards) and isinstance(T.no_change, str)
    paths = T.prepare.ensure_splits(tmp_path, n_train=12, n_val=12, n_test=24, seed=0, verbose=False)
    assert sorted(paths) == ["test", "train", "val"] and all(p.is_file() for p in paths.values())
    records = T.data.load_records(paths["test"])
    assert 0 < sum(map(T.data.is_changed, records)) < len(records)   # both kinds, for the baseline
    for r in records:
        assert isinstance(r["action"], str)                       # a run's report.md shows it
        prompt, target = T.data.prompt_text(r), T.data.target_text(r)
        assert isinstance(prompt, str) and prompt and isinstance(target, str) and target
        truth = T.score(target, r)
        assert truth[T.headline] == 1.0 and all(isinstance(v, float) for v in truth.values())
        assert (T.score(T.no_change, r)[T.headline] == 1.0) == (not T.data.is_changed(r))
        best = {kind: T.reward(target, r, kind) for kind in T.rewards}
        for text in [T.no_change] + ODD_ANSWERS:
            assert set(T.score(text, r)) == set(truth)          # the same metrics for every answer
            for kind in T.rewards:                              # a float, the truth's the highest
                assert 0.0 <= T.reward(text, r, kind) <= best[kind] and math.isfinite(best[kind])


# -----------------------------------------------------------------------------
# the example: Lights Out

def test_press_flips_the_lamp_and_its_neighbours():
    assert lights.step("0110100010", "press 3") == "0001100010"
    assert lights.step("0000000000", "press 1") == "1100000000"    # an end lamp: one neighbour
    assert lights.step("0000000000", "press 10") == "0000000011"
    assert lights.step("0110100010", "on 2") == "0110100010"       # already on: nothing changes
    assert lights.step("0110100010", "off 2") == "0010100010"


def test_splits_are_seeded_and_val_test_states_are_never_train_states():
    a, b = lights.generate_split("train", 200, seed=0), lights.generate_split("train", 200, seed=0)
    assert a == b and a != lights.generate_split("train", 200, seed=1)
    assert lights.generate_split("val", 50) != lights.generate_split("test", 50)
    assert all(r["next_state"] == lights.step(r["state"], r["action"]) for r in a)
    states = {split: {r["state"] for r in lights.generate_split(split, 300)} for split in lights.SIZES}
    assert not states["train"] & states["val"] and not states["train"] & states["test"]
    unchanged = 1 - sum(map(lights.is_changed, a)) / len(a)
    assert 0.2 < unchanged < 0.45                                 # about a third, by construction


def test_ensure_splits_writes_all_or_refuses_a_partial_folder(tmp_path):
    paths = lights.ensure_splits(tmp_path, n_train=5, n_val=3, n_test=4, verbose=False)
    assert [len(lights.load_records(paths[s])) for s in ("train", "val", "test")] == [5, 3, 4]
    before = paths["train"].read_bytes()
    lights.ensure_splits(tmp_path, verbose=False)                   # complete: left as it is
    assert paths["train"].read_bytes() == before
    paths["val"].unlink()
    with pytest.raises(ValueError, match="add the others"):
        lights.ensure_splits(tmp_path, verbose=False)


def test_a_malformed_record_names_its_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"state": "01", "action": "on 1", "next_state": "11"}\n'
                 '{"state": "01", "action": "on 1", "next_state": "1"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: state and next_state"):
        lights.load_records(f)


def test_exact_and_partial_credit():
    r = {"state": "0110100010", "action": "press 3", "next_state": "0001100010"}
    assert lights.target_text(r) == "2=0 3=0 4=1" and lights.prompt_text(r).endswith("changes:")
    assert lights.score("4=1 2=0 3=0", r) == {"exact": 1.0, "f1": 1.0}   # order does not matter
    assert lights.score("2=0 3=0", r) == {"exact": 0.0, "f1": 0.8}       # 2 of 3 claimed, none wrong
    assert lights.score("2=0 3=1 4=1", r)["f1"] == pytest.approx(2 / 3)  # one claim wrong
    assert lights.score("none", r) == {"exact": 0.0, "f1": 0.0}
    unchanged = {"state": "0110100010", "action": "on 2", "next_state": "0110100010"}
    assert lights.target_text(unchanged) == lights.no_change == TASKS["lights"].no_change
    assert lights.score(" none\n", unchanged) == {"exact": 1.0, "f1": 1.0}
    assert lights.score("2=1", unchanged) == {"exact": 0.0, "f1": 0.0}
    assert [lights.reward("2=0 3=0", r, k) for k in lights.rewards] == [0.0, 0.8]


# -----------------------------------------------------------------------------
# train_lang.py --task=lights, end to end on tiny settings

TINY = ["--n_layer=1", "--n_embd=32", "--batch_size=8", "--eval_limit=12",
        "--max_new_tokens=16", "--group_size=4", "--prompts_per_step=2"]


@pytest.mark.slow
def test_train_lang_trains_and_evaluates_the_example(tmp_path):
    lights.ensure_splits(tmp_path / "data", n_train=300, n_val=20, n_test=20, verbose=False)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "train_lang.py", "--task=lights", "--init=scratch",
                        f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'out'}", "--mle_steps=30",
                        "--rl_steps=2", *TINY],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert set(result) == {"mle", "rlvr", "mle_more"}
    for r in result.values():
        pr = r["per_record"]
        assert r["n"] == 12 and set(pr) == {"exact", "f1", "changed"} and all(len(v) == 12 for v in pr.values())
        assert sum(pr["exact"]) / 12 == r["exact"] and r["baseline_no_change"]["exact_changed"] == 0.0
    assert "always-no-change baseline" in p.stdout and "rlvr - mle_more" in p.stdout
    log = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in log if row["stage"] == "rlvr" and "reward_mean" in row] == [1, 2]
