"""Tests of the text-game data: simulator.py (world rules, splits), task.py (diffs, prompts, loading) and
prepare.py (CLI, ByteSized32 conversion, ensure_splits)."""
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from data.textgame import simulator
from data.textgame.prepare import convert_bytesized32, ensure_splits
from data.textgame.simulator import HELD_OUT, SPLIT_BUCKETS, World, generate_split, layout_bucket, sample_room
from data.textgame.task import is_changed, load_records, make_diff, prompt_text, target_text
from rewards import apply_diff

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SAMPLE = SHARED / "data" / "bytesized32_sample.jsonl"
PREPARE = ROOT / "data" / "textgame" / "prepare.py"


def canonical(state: dict) -> dict:
    """A state with object order and contents order removed."""
    objects = {o["uuid"]: (o["name"], o["type"], o["properties"], sorted(o["contains"])) for o in state["objects"]}
    assert len(objects) == len(state["objects"]), "duplicate uuids"
    return {"objects": objects, "score": state["score"]}


def kinds(state: dict) -> set[str]:
    return {o["name"].split(" (ID")[0] for o in state["objects"]}


@pytest.fixture(scope="module")
def splits():
    return {"train": generate_split("train", 3000, seed=0), "val": generate_split("val", 400, seed=0),
            "test": generate_split("test", 800, seed=0)}


def test_generation_is_deterministic():
    assert generate_split("val", 150, seed=3) == generate_split("val", 150, seed=3)
    assert generate_split("val", 150, seed=3) != generate_split("val", 150, seed=4)
    with pytest.raises(ValueError, match="split"):
        generate_split("dev", 10)


def test_splits_are_disjoint(splits):
    prompts = {name: {prompt_text(r) for r in records} for name, records in splits.items()}
    assert not prompts["train"] & prompts["val"]
    assert not prompts["train"] & prompts["test"]
    assert not prompts["val"] & prompts["test"]


def test_rooms_follow_layout_buckets():
    rng = random.Random(0)
    for split, buckets in SPLIT_BUCKETS.items():
        for game in simulator.GAMES:
            for _ in range(20):
                w = sample_room(split, game, False, rng)
                layout = [o["name"].split(" (ID")[0] for o in w.objects[1:]]
                assert layout_bucket(game, layout) in buckets and not HELD_OUT <= set(layout)
                assert not w.score["gameOver"]
    assert HELD_OUT <= kinds(sample_room("test", "pack-box", True, rng).snapshot())


def test_held_out_combination_only_in_test(splits):
    held = {name: sum(HELD_OUT <= kinds(r["state"]) for r in records) for name, records in splits.items()}
    assert held["train"] == 0 and held["val"] == 0
    assert held["test"] >= 0.1 * len(splits["test"])


def test_every_game_in_every_split_and_sizes(splits):
    for records in splits.values():
        assert {r["game"] for r in records} == set(simulator.GAMES)
    train = splits["train"]
    assert all(4 <= len(r["state"]["objects"]) <= 7 for r in train)
    assert statistics.mean(len(prompt_text(r)) for r in train) < 700
    assert statistics.mean(len(target_text(r)) for r in train) < 300


def test_changed_fraction_in_band(splits):
    for records in splits.values():
        assert 0.45 <= sum(map(is_changed, records)) / len(records) <= 0.65


def test_uuids_follow_object_order_and_names(splits):
    for r in splits["train"][:500]:
        objects = r["next_state"]["objects"]
        assert [o["uuid"] for o in objects] == sorted(o["uuid"] for o in objects)
        assert objects[0]["name"] == "agent (ID: 0)"
        assert all(o["name"].endswith(f" (ID: {o['uuid']})") for o in objects)


def assert_round_trip(records):
    for r in records:
        diff = make_diff(r["state"], r["next_state"])
        assert canonical(apply_diff(r["state"], diff)) == canonical(r["next_state"]), r["action"]
        assert json.loads(target_text(r)) == diff
        assert bool(diff["modified"] or diff["removed"] or diff["score"]) == is_changed(r)


def test_diff_round_trip_on_generated_records(splits):
    for records in splits.values():
        assert_round_trip(records)


def test_diff_round_trip_on_shared_sample(tmp_path):
    if not SAMPLE.exists():
        pytest.skip(f"shared sample not found at {SAMPLE} (only present in the development checkout)")
    records = convert_bytesized32(SAMPLE, tmp_path / "bs.jsonl")
    assert len(records) == 40
    assert_round_trip(records)


def test_make_diff_keeps_next_state_order_and_full_objects():
    w = World("boil-water", ["agent", "sink", "cup", "stove"])
    w.move("cup", "sink")
    before = w.snapshot()
    w.act(("turn on", "sink"))
    w.tick()
    diff = make_diff(before, w.snapshot())
    assert [o["name"] for o in diff["modified"]] == ["sink (ID: 1)", "cup (ID: 2)", "water (ID: 4)"]
    assert diff["modified"][2] == {"name": "water (ID: 4)", "uuid": 4, "type": "Water",
                                   "properties": {"temp": 20}, "contains": []}
    assert diff["score"] == {"score": 1, "gameOver": False, "gameWon": False} and diff["removed"] == []


def test_world_rules():
    w = World("cook-egg", ["agent", "stove", "pot", "egg"])
    still = w.snapshot()
    for action in [("take", "stove"), ("open", "pot"), ("put", "egg", "pot"), ("look",), ("eat", "egg"),
                   ("nonsense", "dance"), ("take", "milk")]:
        w.act(action)
        w.tick()
        assert w.snapshot() == still, action  # impossible or idle: nothing changes
    for action in [("take", "egg"), ("put", "egg", "pot"), ("take", "pot"), ("put", "pot", "stove"),
                   ("turn on", "stove")]:
        w.act(action)
        w.tick()
    assert (w.props("egg")["temp"], w.score["score"]) == (40, 1)   # heating is the tick's doing
    w.act(("wait",))
    w.tick()
    w.act(("wait",))
    w.tick()
    assert w.props("egg") == {"temp": 80, "isCooked": True}
    assert w.score == {"score": 2, "gameOver": True, "gameWon": True}
    # out of the heat things cool back toward 20; the fridge cools to 0
    w = World("chill-milk", ["agent", "fridge", "milk", "pot"])
    w.props("pot")["temp"] = 60
    w.act(("open", "fridge"))
    w.tick()
    assert w.props("pot")["temp"] == 50
    for action in [("take", "milk"), ("put", "milk", "fridge"), ("close", "fridge")]:
        w.act(action)
        w.tick()
    assert (w.props("milk")["temp"], w.score) == (0, {"score": 2, "gameOver": True, "gameWon": True})


def test_plant_watering_removes_water_and_grows():
    w = World("water-plant", ["agent", "sink", "cup", "plant"])
    for action in [("take", "cup"), ("put", "cup", "sink"), ("turn on", "sink"), ("turn off", "sink"),
                   ("take", "cup")]:
        w.act(action)
        w.tick()
    assert w.by_kind["cup"]["contains"] == ["water (ID: 4)"]
    before = w.snapshot()
    w.act(("water", "plant"))
    w.tick()
    diff = make_diff(before, w.snapshot())
    assert diff["removed"] == [4] and w.props("plant") == {"water": 1, "growth": 1}
    assert w.score == {"score": 1, "gameOver": False, "gameWon": False}


def test_load_records_errors_name_file_and_line(tmp_path):
    good = json.dumps(generate_split("train", 1)[0])
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text(good + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        load_records(bad_json)
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps({"game": "g", "state": {}, "action": "look"}) + "\n")
    with pytest.raises(ValueError, match=r"missing\.jsonl:1.*next_state"):
        load_records(missing)
    bad_state = tmp_path / "state.jsonl"
    bad_state.write_text(json.dumps({"game": "g", "state": {"objects": []}, "action": "a", "next_state": {}}))
    with pytest.raises(ValueError, match=r"state\.jsonl:1"):
        load_records(bad_state)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"empty\.jsonl"):
        load_records(empty)


def test_prepare_cli_converts_shared_sample(tmp_path):
    if not SAMPLE.exists():
        pytest.skip(f"shared sample not found at {SAMPLE} (only present in the development checkout)")
    out = tmp_path / "bs.jsonl"
    result = subprocess.run([sys.executable, str(PREPARE), f"--bytesized32={SAMPLE}", f"--out={out}"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "40 records" in result.stdout
    records = load_records(out)
    raws = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    for r, raw in zip(records, raws):
        assert r["game"] == raw["game"] and r["action"] == raw["tick_state"]["lastAction"]
        assert r["state"]["score"] == raw["current_score_state"]
        assert r["next_state"]["objects"][0]["properties"] == raw["tick_state"]["objects"][0]["properties"]
        assert set(r["state"]["objects"][0]) == {"name", "uuid", "type", "properties", "contains"}


def test_prepare_cli_names_bad_input_line(tmp_path):
    bad = tmp_path / "raw.jsonl"
    bad.write_text('{"game": "x", "current_state": {"objects": []}}\n')
    result = subprocess.run([sys.executable, str(PREPARE), f"--bytesized32={bad}", f"--out={tmp_path / 'o'}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and f"{bad}:1" in result.stderr
    assert not (tmp_path / "o").exists()


def test_prepare_cli_generates_splits(tmp_path):
    result = subprocess.run([sys.executable, str(PREPARE), "--out_dir", str(tmp_path), "--n_train", "300",
                             "--n_val", "50", "--n_test", "80", "--seed", "2"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "changed" in result.stdout
    for split, n in (("train", 300), ("val", 50), ("test", 80)):
        assert load_records(tmp_path / f"{split}.jsonl") == generate_split(split, n, seed=2)
    assert not list(tmp_path.glob("*.tmp"))


def test_ensure_splits_generates_only_missing(tmp_path):
    (tmp_path / "train.jsonl").write_text("kept\n")
    paths = ensure_splits(tmp_path, n_train=20, n_val=30, n_test=40, seed=1, verbose=False)
    assert set(paths) == {"train", "val", "test"}
    assert paths["train"].read_text() == "kept\n"
    assert len(load_records(paths["val"])) == 30 and len(load_records(paths["test"])) == 40
