"""Tests of the coverage splits (prepare.py --cover): off-script records at the states of the scripted
trajectories, for the text game and the web page. The records load with the tasks' loaders, their next state
is the simulator's, their action is valid and not the episode's own, they are deterministic, and the scripted
splits (and so the first part of cover/train.jsonl) stay exactly what they were."""
import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from data.textgame import prepare as tg_prepare
from data.textgame import simulator as tg_sim
from data.textgame import task as tg_task
from data.webpage import prepare as web_prepare
from data.webpage import simulator as web_sim
from data.webpage import task as web_task

ROOT = Path(__file__).resolve().parents[1]
SIMS = {"textgame": tg_sim, "webpage": web_sim}
TASKS = {"textgame": tg_task, "webpage": web_task}
PREPARES = {"textgame": tg_prepare, "webpage": web_prepare}
# sha256 of the scripted splits as shipped (seed 0): val 500 records, test 2000, the first 2000 of train.
# The coverage work must never change them; a change here means every result on the old data is stale.
PINNED = {
    ("textgame", "val", 500): "d9074712af88fce5219909b45a89d1b5cf3b2319043675498c9321daf5cfd69c",
    ("textgame", "test", 2000): "4f4c3a9c7abbb56333fdbc4d771d82990fa29ed949df5b053e88416ca75c97cc",
    ("textgame", "train", 2000): "80e37f643785e894ab8f383d87cdf1c42731d7821d2c0e80556e7858e967d266",
    ("webpage", "val", 500): "7e5ee14971e4049c3b7363f810fc03de2a47fae328a8063a8d94c75399f0240a",
    ("webpage", "test", 2000): "0f4c45806a2364f7e30337ac4adcc55c7bd8c0efc3411b2de010c62ef0646604",
    ("webpage", "train", 2000): "87e040f5956795b70efe8c31c6412ad70709783f2b3eb0d78c74e7dd728efe1d",
}


def jsonl_bytes(records: list[dict]) -> bytes:
    """The bytes checkpoint.write_jsonl writes for these records."""
    return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records).encode()


def clone(state):
    """A copy of a world or a page to act on; a page shares its episode's rng (acting never draws from it)."""
    rng = getattr(state, "rng", None)
    return copy.deepcopy(state, {id(rng): rng} if rng is not None else None)


def visited(task: str, split: str, n: int) -> list:
    """Copies of the world / page at each state of the first n scripted records, taken by an independent visit."""
    states = []
    SIMS[task].generate_split(split, n, 0, visit=lambda state, taken: states.append(clone(state)))
    return states[:n]


def replay(task: str, state, action_text: str):
    """The simulator's next state (text game: snapshot; web: rendered page) after the valid action so spelled."""
    sim = SIMS[task]
    if task == "textgame":
        options = {sim.action_text(a): a for a in sim.valid_actions(state)}
    else:   # the typed text is part of the action; valid_actions types the texts it is given
        texts = (action_text.rsplit("] [", 1)[1][:-1],) if action_text.startswith("type ") else ()
        options = {sim.action_text(a): a for a in sim.valid_actions(state, texts)}
    assert action_text in options, f"{action_text!r} is not a valid action here"
    state = clone(state)
    state.act(options[action_text])
    if task == "textgame":
        state.tick()
        return state.snapshot()
    return state.render()


@pytest.mark.parametrize("task,split,n", sorted(PINNED))
def test_scripted_splits_unchanged(task, split, n):
    assert hashlib.sha256(jsonl_bytes(SIMS[task].generate_split(split, n, 0))).hexdigest() == PINNED[task, split, n]


@pytest.mark.parametrize("task", sorted(SIMS))
@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_offscript_records_are_valid_true_and_off_script(task, split):
    n, sim = 150, SIMS[task]
    scripted, cover = sim.generate_cover(split, n, seed=0)
    assert scripted == sim.generate_split(split, n, 0)          # the scripted records, untouched
    assert len(cover) == n                                       # one per state (there is always another action)
    state_key, next_key = ("state", "next_state") if task == "textgame" else ("observation", "next_observation")
    for record, script, state in zip(cover, scripted, visited(task, split, n)):
        assert record["source"] == "offscript" and record[state_key] == script[state_key]
        assert record["action"] != script["action"]              # not what the episode does here
        assert record[next_key] == replay(task, state, record["action"])


@pytest.mark.parametrize("task", sorted(SIMS))
def test_cover_is_deterministic_and_prefix_stable(task):
    sim = SIMS[task]
    assert sim.generate_cover("val", 80, seed=0) == sim.generate_cover("val", 80, seed=0)
    assert sim.generate_cover("val", 200, seed=0)[1][:80] == sim.generate_cover("val", 80, seed=0)[1]
    assert sim.generate_cover("val", 80, seed=1)[1] != sim.generate_cover("val", 80, seed=0)[1]


@pytest.mark.parametrize("task", sorted(SIMS))
def test_per_state_gives_distinct_actions_at_each_state(task):
    scripted, cover = SIMS[task].generate_cover("val", 60, seed=0, per_state=3)
    state_key = "state" if task == "textgame" else "observation"
    i = 0
    for script in scripted:
        here = []
        while i < len(cover) and cover[i][state_key] == script[state_key] and len(here) < 3:
            here.append(cover[i]["action"])
            i += 1
        assert 1 <= len(here) <= 3 and len(set(here)) == len(here) and script["action"] not in here
    assert i == len(cover) and len(cover) > 2 * len(scripted)   # 3 at most states, all accounted for
    assert sum(map(TASKS[task].is_changed, cover)) > 0.3 * len(cover)


@pytest.mark.parametrize("task", sorted(SIMS))
def test_prepare_cover_cli_writes_loadable_splits(task, tmp_path):
    prepare = ROOT / "data" / task / "prepare.py"
    sizes = ["--n_train", "120", "--n_val", "30", "--n_test", "40"]
    for extra in ([], ["--cover"]):
        subprocess.run([sys.executable, str(prepare), "--out_dir", str(tmp_path), *sizes, *extra],
                       check=True, capture_output=True, text=True)
    cover, plain = tmp_path / "cover", tmp_path
    train = (cover / "train.jsonl").read_bytes().splitlines(keepends=True)
    assert b"".join(train[:120]) == (plain / "train.jsonl").read_bytes()   # scripted records first, bit for bit
    loaded = {s: TASKS[task].load_records(cover / f"{s}.jsonl") for s in ("train", "val", "test")}
    assert [len(loaded[s]) for s in ("train", "val", "test")] == [240, 30, 40]
    assert all("source" not in r for r in loaded["train"][:120])
    assert all(r["source"] == "offscript" for s in loaded for r in (loaded[s][120:] if s == "train" else loaded[s]))
    assert [TASKS[task].prompt_text(r) for r in loaded["val"]]   # the task's text functions take them


@pytest.mark.parametrize("task", sorted(SIMS))
def test_ensure_splits_makes_cover_in_the_cover_dir(task, tmp_path, monkeypatch):
    prepare = PREPARES[task]
    monkeypatch.setattr(prepare, "COVER_DIR", tmp_path / "cover")
    paths = prepare.ensure_splits(tmp_path / "cover", n_train=50, n_val=10, n_test=10, verbose=False)
    records = {s: TASKS[task].load_records(p) for s, p in paths.items()}
    assert len(records["train"]) == 100 and all(r["source"] == "offscript" for r in records["val"])
    assert prepare.ensure_splits(tmp_path / "cover", verbose=False) == paths   # present: used as they are
    plain = prepare.ensure_splits(tmp_path / "plain", n_train=50, n_val=10, n_test=10, verbose=False)
    assert all("source" not in r for r in TASKS[task].load_records(plain["val"]))
