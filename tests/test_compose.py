"""Tests of the text game's composition split (prepare.py --compose, simulator.generate_compose): no
record's pattern (game, room object types, action) occurs in train, the split is deterministic and
loads, the rooms are the ones the docstrings name, and the data splits stay byte for byte what they
were (pinned hashes of small generated splits and planning rooms, taken without the split's
code)."""
import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from data.textgame import prepare
from data.textgame.simulator import (GAMES, HELD_OUT, compose_room, generate_compose,
                                     generate_split, pattern, planning_rooms)
from data.textgame.task import is_changed, load_records

ROOT = Path(__file__).resolve().parents[1]
PREPARE = ROOT / "data" / "textgame" / "prepare.py"
# sha256 of small seed-0 splits and of the planning rooms as made by the code without the
# composition split: it must not move a single draw of theirs
PINNED_SPLITS = {
    ("train", 400): "f4bf3af6dc846d1315c0175ca7d3f31f68d8f560d5cf9a7b738bdfe7e6e68de4",
    ("val", 100): "4a11aa181a381c357954e9bd74d36aa72c764380f7353b44386c33955a194388",
    ("test", 300): "2e04ed36d930394b2c847b7ab62ebecf5212db61805b46a99f78acf261149a6a",
}
PINNED_ROOMS = "aee8318120a4a4bb069c0acd8675efb54b1d3adc7403b47cbaa2b20e6a58566e"


def sha(records: list[dict]) -> str:
    """sha256 of the bytes checkpoint.write_jsonl writes for these records."""
    text = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records)
    return hashlib.sha256(text.encode()).hexdigest()


def rooms_sha() -> str:
    """sha256 of the first 60 val and test planning rooms (game and state)."""
    rooms = [[w.game, w.snapshot()]
             for split in ("val", "test") for w in planning_rooms(60, 0, split)]
    return hashlib.sha256(json.dumps(rooms).encode()).hexdigest()


def types(record: dict) -> set[str]:
    return {o["type"] for o in record["state"]["objects"]}


@pytest.fixture(scope="module")
def small():
    """A small train split, its patterns, and a composition split of 300 records against it."""
    train = generate_split("train", 3000, seed=0)
    seen = {pattern(r) for r in train}
    records, dropped = generate_compose(300, seen)
    return train, seen, records, dropped


def test_data_splits_unchanged_by_the_composition_split(small):
    # small generated splits and planning rooms hash as they did before; making a composition split
    # (above, in the fixture, and again here) does not move them
    generate_compose(50, small[1], seed=3)
    for (split, n), digest in PINNED_SPLITS.items():
        assert sha(generate_split(split, n, seed=0)) == digest, split
    assert rooms_sha() == PINNED_ROOMS


def test_no_compose_pattern_occurs_in_train(small):
    train, seen, records, dropped = small
    assert len(records) == 300 and dropped > 0
    assert not {pattern(r) for r in records} & seen
    # so no compose record is a train record either
    as_text = {json.dumps(r, sort_keys=True) for r in train}
    assert not any(json.dumps(r, sort_keys=True) in as_text for r in records)
    assert 0 < sum(map(is_changed, records)) < len(records)


def test_compose_is_deterministic_and_seeded(small):
    _, seen, records, dropped = small
    assert generate_compose(300, seen) == (records, dropped)
    assert generate_compose(100, seen, seed=1)[0] != records[:100]


def test_pattern_strips_ids_and_object_order():
    objects = [{"name": "egg (ID: 1)", "uuid": 1, "type": "Egg", "properties": {}, "contains": []},
               {"name": "pot (ID: 2)", "uuid": 2, "type": "Pot", "properties": {}, "contains": []}]
    a = {"game": "cook-egg", "state": {"objects": objects},
         "action": "put egg (ID: 1) in pot (ID: 2)"}
    b = {"game": "cook-egg", "state": {"objects": objects[::-1]}, "action": "put egg in pot"}
    assert pattern(a) == pattern(b) == ("cook-egg", ("Egg", "Pot"), "put egg in pot")
    assert pattern(dict(b, game="pack-box")) != pattern(b)
    assert pattern(dict(b, action="take egg")) != pattern(b)


def test_compose_rooms_hold_the_held_out_combination_where_the_game_allows():
    rng = random.Random(0)
    for game, (core, pool, _) in GAMES.items():
        allows = HELD_OUT <= set(core + pool)
        for _ in range(20):
            kinds = set(compose_room(game, rng).by_kind) - {"agent"}
            assert set(core) <= kinds and (HELD_OUT <= kinds) == allows, game


def test_prepare_cli_writes_the_composition_split(tmp_path):
    argv = ["--compose", "--out_dir", str(tmp_path), "--n_train", "500", "--n_val", "20",
            "--n_test", "20", "--n_compose", "60"]
    result = subprocess.run([sys.executable, str(PREPARE), *argv],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "dropped" in result.stdout
    train = load_records(tmp_path / "train.jsonl")   # the splits it needs, made first
    assert train == generate_split("train", 500, seed=0)
    compose = load_records(tmp_path / "compose.jsonl")
    assert compose == generate_compose(60, {pattern(r) for r in train})[0]
    bad = subprocess.run([sys.executable, str(PREPARE), "--compose", "--n_compose", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--n_compose" in bad.stderr


def test_ensure_compose_makes_it_only_when_missing(tmp_path):
    prepare.ensure_splits(tmp_path, n_train=400, n_val=10, n_test=10, verbose=False)
    path = prepare.ensure_compose(tmp_path, verbose=False)
    records = load_records(path)
    assert len(records) == prepare.COMPOSE_N
    train = load_records(tmp_path / "train.jsonl")
    assert not {pattern(r) for r in records} & {pattern(r) for r in train}
    path.write_text("kept\n")
    assert prepare.ensure_compose(tmp_path, verbose=False).read_text() == "kept\n"


@pytest.mark.slow
def test_default_composition_split_statistics(tmp_path):
    # the figures prepare.py's docstring and docs/results.md give for the default split
    path = prepare.make_compose(tmp_path, verbose=False)
    records = load_records(path)
    train = load_records(tmp_path / "train.jsonl")
    assert sha(train) == "026c6986465c9b35e4dfe690d7374586950ec36ef6c2b1a5aba8ca57caf86a8c"
    assert not {pattern(r) for r in records} & {pattern(r) for r in train}
    _, dropped = generate_compose(prepare.COMPOSE_N, {pattern(r) for r in train})
    held_out = [r for r in records if {"Egg", "Fridge"} <= types(r)]
    assert (len(records), dropped, sum(map(is_changed, records))) == (1000, 789, 509)
    assert (len(held_out), sum(map(is_changed, held_out))) == (872, 490)
