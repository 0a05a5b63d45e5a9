"""Tests of the text-game reward (rewards.py): the truth scores the maximum, perturbations score what the
formulas say (expected values computed by hand in the comments), and no text makes it raise."""
import copy
import json
import random
from pathlib import Path

import pytest

from data.textgame.prepare import convert_record
from data.textgame.simulator import generate_split
from data.textgame.task import compact, is_changed, make_diff, target_text
from rewards import apply_diff, parse_diff, textgame_metrics, textgame_reward

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
SAMPLE = SHARED / "data" / "bytesized32_sample.jsonl"


def obj(name, uuid, type_, properties, contains=()):
    return {"name": f"{name} (ID: {uuid})", "uuid": uuid, "type": type_, "properties": properties,
            "contains": list(contains)}


SCORE = {"score": 1, "gameOver": False, "gameWon": False}
# "turn on stove": pot (with the egg) on the stove heats by 20; 8 object checks (agent: contains; pot: temp,
# contains; egg: temp, isCooked, contains; stove: isOn, contains), 3 changed fields (pot temp, egg temp,
# stove isOn), 3 score keys.
STOVE_STATE = {"objects": [obj("agent", 0, "Agent", {}), obj("pot", 1, "Pot", {"temp": 20}, ["egg (ID: 2)"]),
                           obj("egg", 2, "Egg", {"temp": 20, "isCooked": False}),
                           obj("stove", 3, "Stove", {"isOn": False}, ["pot (ID: 1)"])], "score": SCORE}
STOVE_NEXT = {"objects": [obj("agent", 0, "Agent", {}), obj("pot", 1, "Pot", {"temp": 40}, ["egg (ID: 2)"]),
                          obj("egg", 2, "Egg", {"temp": 40, "isCooked": False}),
                          obj("stove", 3, "Stove", {"isOn": True}, ["pot (ID: 1)"])], "score": SCORE}
# "turn on sink": the running sink fills the cup in it, creating water (ID: 3); 6 object checks (agent 1,
# sink 2, cup 1, water 2), 4 changed fields (sink isOn, cup contains, water temp, water contains).
SINK_STATE = {"objects": [obj("agent", 0, "Agent", {}), obj("sink", 1, "Sink", {"isOn": False}, ["cup (ID: 2)"]),
                          obj("cup", 2, "Cup", {})], "score": SCORE}
SINK_NEXT = {"objects": [obj("agent", 0, "Agent", {}), obj("sink", 1, "Sink", {"isOn": True}, ["cup (ID: 2)"]),
                         obj("cup", 2, "Cup", {}, ["water (ID: 3)"]), obj("water", 3, "Water", {"temp": 20})],
             "score": SCORE}


def truth(state, next_state):
    return compact(make_diff(state, next_state))


def edited(state, next_state, edit):
    """The true diff after edit(diff), as text."""
    diff = copy.deepcopy(make_diff(state, next_state))
    edit(diff)
    return compact(diff)


def both(text, state, next_state):
    return (textgame_reward(text, state, next_state, "binary"),
            textgame_reward(text, state, next_state, "task_specific"))


def assert_truth_is_max(records):
    for r in records:
        metrics = textgame_metrics(target_text(r), r["state"], r["next_state"])
        assert metrics["parsed"] and metrics["exact"] == 1, r["action"]
        assert metrics["binary"] == 1.0
        assert metrics["task_specific"] == pytest.approx(1.3 if is_changed(r) else 0.3), r["action"]


@pytest.fixture(scope="module")
def sim_records():
    return generate_split("train", 400, seed=0) + generate_split("test", 300, seed=0)


@pytest.fixture(scope="module")
def shared_records():
    if not SAMPLE.exists():
        pytest.skip(f"shared sample not found at {SAMPLE} (only present in the development checkout)")
    with open(SAMPLE) as f:
        return [convert_record(json.loads(line)) for line in f if line.strip()]


def test_truth_scores_max_on_simulator_records(sim_records):
    assert any(is_changed(r) for r in sim_records) and not all(is_changed(r) for r in sim_records)
    assert any(len(r["next_state"]["objects"]) > len(r["state"]["objects"]) for r in sim_records)  # new objects
    assert any(make_diff(r["state"], r["next_state"])["removed"] for r in sim_records)
    assert_truth_is_max(sim_records)


def test_truth_scores_max_on_shared_bytesized32_sample(shared_records):
    assert len(shared_records) == 40
    # the sample has transitions that create objects: the official merge would score their truth 0
    assert any(len(r["next_state"]["objects"]) > len(r["state"]["objects"]) for r in shared_records)
    assert_truth_is_max(shared_records)


def test_one_property_wrong():
    text = edited(STOVE_STATE, STOVE_NEXT, lambda d: d["modified"][1]["properties"].update(temp=30))
    # object 7/8, score 1, not exact, changed 2/3
    assert both(text, STOVE_STATE, STOVE_NEXT) == (0.0, pytest.approx(0.09 * 7 / 8 + 0.01 + 2 / 3))
    m = textgame_metrics(text, STOVE_STATE, STOVE_NEXT)
    assert (m["object_acc"], m["score_acc"], m["changed_acc"]) == (7 / 8, 1.0, pytest.approx(2 / 3))


def test_missing_object():
    text = edited(STOVE_STATE, STOVE_NEXT, lambda d: (d["modified"].pop(1), d["removed"].append(2)))
    # the egg is gone: 1 error for it, the other 5 checks right -> 5/6; its changed temp is wrong -> 2/3
    assert both(text, STOVE_STATE, STOVE_NEXT) == (0.0, pytest.approx(0.09 * 5 / 6 + 0.01 + 2 / 3))


def test_wrong_score():
    text = edited(STOVE_STATE, STOVE_NEXT,
                  lambda d: d.update(score={"score": 2, "gameOver": True, "gameWon": True}))
    # objects all right (0.09), score 0/3, not exact, the 3 changed fields right (1)
    assert both(text, STOVE_STATE, STOVE_NEXT) == (0.0, pytest.approx(1.09))
    half = edited(STOVE_STATE, STOVE_NEXT, lambda d: d.update(score={"score": 1, "gameOver": True}))
    # score 2/3 right (gameWon missing)
    assert both(half, STOVE_STATE, STOVE_NEXT) == (0.0, pytest.approx(0.09 + 0.01 * 1 / 3 + 1))


def test_spurious_property_key_and_object_are_errors():
    text = edited(STOVE_STATE, STOVE_NEXT, lambda d: d["modified"][0]["properties"].update(isOn=True))
    # 8 right + 1 spurious key -> 8/9, changed 3/3
    assert both(text, STOVE_STATE, STOVE_NEXT) == (0.0, pytest.approx(0.09 * 8 / 9 + 0.01 + 1))
    extra = edited(STOVE_STATE, STOVE_NEXT, lambda d: d["modified"].append(obj("bread", 9, "Bread", {})))
    assert both(extra, STOVE_STATE, STOVE_NEXT) == (0.0, pytest.approx(0.09 * 8 / 9 + 0.01 + 1))


def test_new_object_added_correctly_scores_max():
    text = truth(SINK_STATE, SINK_NEXT)
    assert '"uuid":3' in text
    assert both(text, SINK_STATE, SINK_NEXT) == (1.0, pytest.approx(1.3))
    # leaving the new water out: sink and cup right (4 checks), water missing (1 error) -> 4/5; changed 2/4
    without = edited(SINK_STATE, SINK_NEXT, lambda d: d["modified"].pop())
    assert both(without, SINK_STATE, SINK_NEXT) == (0.0, pytest.approx(0.09 * 4 / 5 + 0.01 + 0.5))


def test_contents_order_does_not_matter():
    state = {"objects": [obj("agent", 0, "Agent", {}), obj("box", 1, "Box", {"isOpen": True}, ["a", "b"])],
             "score": SCORE}
    nxt = copy.deepcopy(state)
    nxt["objects"][1]["contains"] = ["b", "a", "c"]
    text = edited(state, nxt, lambda d: d["modified"][0].update(contains=["c", "a", "b"]))
    assert both(text, state, nxt) == (1.0, pytest.approx(1.3))


def test_unchanged_transition():
    assert both(truth(STOVE_STATE, STOVE_STATE), STOVE_STATE, STOVE_STATE) == (1.0, pytest.approx(0.3))
    assert both('{"modified":[],"removed":[],"score":{}}', STOVE_STATE, STOVE_STATE) == (1.0, pytest.approx(0.3))
    wrong = compact({"modified": [obj("stove", 3, "Stove", {"isOn": True}, ["pot (ID: 1)"])], "removed": [],
                     "score": {}})
    # 7/8 objects, score right, no changed-field term
    assert both(wrong, STOVE_STATE, STOVE_STATE) == (0.0, pytest.approx(0.09 * 7 / 8 + 0.01))


@pytest.mark.parametrize("wrap", [
    lambda t: "Sure, here is the diff: " + t + " Hope this helps {:)",
    lambda t: "Let me think.\n```json\n" + t + "\n```\nDone.",
    lambda t: "First guess {\"modified\": 1}. The final answer is: " + t,
    lambda t: "the final state is:\n" + t + "\n",
    lambda t: t.replace("]}", "],}").replace("}]", "},]"),        # trailing commas
    lambda t: t.replace('"', "'"),                                 # single quotes
    lambda t: t.replace("true", "True").replace("false", "False"),  # Python literals
])
def test_wrapped_and_damaged_truth_still_scores_max(wrap):
    text = wrap(truth(STOVE_STATE, STOVE_NEXT))
    assert both(text, STOVE_STATE, STOVE_NEXT) == (1.0, pytest.approx(1.3))


def test_answer_without_modified_or_removed_scores_zero():
    # the reward hole: '{"modified": [' was repaired to {"modified": []} and scored 1.0 on unchanged transitions
    for text in ('{"modified": [', '{"modified": []}', '{"removed": []}', '{"modified":[],"score":{}}',
                 '{"removed":[],"score":{}}', '{"score":{}}', '{"modified":[],"removed"'):
        assert both(text, STOVE_STATE, STOVE_STATE) == (0.0, 0.0), text
        assert both(text, STOVE_STATE, STOVE_NEXT) == (0.0, 0.0), text
    full = truth(STOVE_STATE, STOVE_NEXT)
    cut = full[:full.index('"temp":40', full.index("egg")) + len('"temp":40')]   # truncated inside "modified"
    assert both(cut, STOVE_STATE, STOVE_NEXT) == (0.0, 0.0)
    # both keys in a damaged answer: the repair reads it. modified = [pot, egg with only temp], cut inside
    # "removed": no score written. Checks: agent 1/1, pot 2/2, egg 1/3 (isCooked and contains missing), stove 1/2
    # -> 5/8; score 0/3 (none predicted); changed: pot and egg temp right, stove isOn wrong -> 2/3
    damaged = cut + '}}],"removed":['
    assert both(damaged, STOVE_STATE, STOVE_NEXT) == (0.0, pytest.approx(0.09 * 5 / 8 + 2 / 3))


def test_answer_without_score_predicts_no_score():
    # the official merge adds no score entry: every true score key is missing, so never exact
    no_score = '{"modified":[],"removed":[]}'
    m = textgame_metrics(no_score, STOVE_STATE, STOVE_STATE)
    assert m["parsed"] and m["score_acc"] == 0.0 and both(no_score, STOVE_STATE, STOVE_STATE) == (0.0, 0.09)
    # on a changed transition the score fields are unchanged fields, so only objects count: 5/8 checks right (the
    # pot's and egg's temperatures and the stove's isOn are wrong), changed 0/3
    assert both(no_score, STOVE_STATE, STOVE_NEXT) == (0.0, pytest.approx(0.09 * 5 / 8))
    # "score": {} means unchanged; "score": null is the wrong shape
    assert both('{"modified":[],"removed":[],"score":{}}', STOVE_STATE, STOVE_STATE) == (1.0, pytest.approx(0.3))
    assert both('{"modified":[],"removed":[],"score":null}', STOVE_STATE, STOVE_STATE) == (0.0, 0.0)


def check_every_prefix(state, next_state):
    """Every prefix of the true answer: never raises, none lacking a key earns anything, none beats the full answer,
    and the binary reward only when nothing but closing brackets is cut. Returns how many prefixes earned > 0."""
    full = truth(state, next_state)
    best = both(full, state, next_state)
    content = full.rstrip("}]")            # the answer without its final closing brackets
    has_removed = full.index('"removed":') + len('"removed":') + 1   # shortest prefix with both keys' values begun
    paid = 0
    for n in range(len(full)):
        binary, task = both(full[:n], state, next_state)
        if n < has_removed:
            assert (binary, task) == (0.0, 0.0), full[:n]
        assert task <= best[1] + 1e-12, full[:n]
        assert binary == 0.0 or n >= len(content), full[:n]
        paid += task > 0
    return paid


def test_every_prefix_of_a_correct_answer(sim_records, shared_records):
    records = sim_records[::5] + shared_records       # 140 simulator records, 40 ByteSized32 transitions
    paid = [check_every_prefix(r["state"], r["next_state"]) for r in records]
    assert sum(paid) > 0   # prefixes with both keys keep their partial, task-specific credit
    assert check_every_prefix(STOVE_STATE, STOVE_NEXT) and check_every_prefix(SINK_STATE, SINK_NEXT)
    assert check_every_prefix(STOVE_STATE, STOVE_STATE) > 0


@pytest.mark.parametrize("text", [
    "", "no json here", "modified: pot is hot", '{"modified": [1, 2}', "{{{{", '{"foo": 1}',
    '{"modified": {"uuid": 1}}', '{"modified": [{"name": "pot"}]}', '{"modified": [{"uuid": true}]}',
    '{"modified": [{"uuid": 1.5}]}', '{"modified": [], "removed": 3}', '{"score": [1, 2]}',
    '{"modified":[],"removed":[],"score":{"score":' + "9" * 5000 + "}}",   # too many digits for int()
    '{"modified":[{"uuid":' + "1" * 5000 + "}]}",
    "[" * 100000, '{"modified":' + "[" * 100000,                          # too deep
    None, b'{"modified":[]}', 42,
])
def test_unparseable_scores_zero(text):
    assert parse_diff(text) is None
    assert both(text, STOVE_STATE, STOVE_NEXT) == (0.0, 0.0)
    assert textgame_metrics(text, STOVE_STATE, STOVE_NEXT)["parsed"] is False


def test_parse_diff_defaults_and_odd_values():
    assert parse_diff('{"removed":[3],"modified":[]}') == {"modified": [], "removed": [3], "score": None}
    assert parse_diff('{"removed":[3]}') is None and parse_diff('{"modified":[]}') is None
    # an infinite temperature is just a wrong value; junk in "removed" matches nothing
    text = compact({"modified": [obj("pot", 1, "Pot", {"temp": 40}, ["egg (ID: 2)"])], "removed": []}).replace(
        "40", "1e999")
    assert parse_diff(text)["modified"][0]["properties"]["temp"] == float("inf")
    junk = '{"modified":[],"removed":[[1],{"a":2},"3",true,null],"score":{}}'
    assert both(junk, STOVE_STATE, STOVE_STATE) == (1.0, pytest.approx(0.3))


def test_apply_diff_adds_replaces_removes_without_mutating():
    state = copy.deepcopy(SINK_STATE)
    water = obj("water", 3, "Water", {"temp": 20})
    diff = {"modified": [water, obj("sink", 1, "Sink", {"isOn": True})], "removed": [2, 7],
            "score": {"score": 5, "gameOver": True, "gameWon": True}}
    merged = apply_diff(state, diff)
    assert [o["uuid"] for o in merged["objects"]] == [0, 1, 3]
    assert merged["objects"][1]["properties"] == {"isOn": True} and merged["score"]["score"] == 5
    assert state == SINK_STATE
    # removal wins over modification, for old and new uuids alike; an empty score keeps the old one
    both_ways = apply_diff(state, {"modified": [water, obj("cup", 2, "Cup", {})], "removed": [2, 3], "score": {}})
    assert [o["uuid"] for o in both_ways["objects"]] == [0, 1] and both_ways["score"] == SCORE


def test_unknown_kind_raises():
    with pytest.raises(ValueError, match="kind"):
        textgame_reward("{}", STOVE_STATE, STOVE_NEXT, kind="f1")


def _mutate(text: str, rng: random.Random) -> str:
    pieces = '{}[]",:0123456789 truefalsenull"uuid""modified""removed""score""properties""contains"'
    for _ in range(rng.randint(1, 2)):
        i = rng.randrange(len(text) + 1)
        op = rng.randrange(4)
        if op == 0:
            text = text[:i] + text[i + 1:]
        elif op == 1:
            text = text[:i] + rng.choice(pieces) + text[i:]
        elif op == 2:
            text = text[:i]
        else:
            j = rng.randrange(len(text) + 1)
            text = text[:min(i, j)] + text[max(i, j):] + text[min(i, j):max(i, j)]
    return text


def _replace_somewhere(value, rng: random.Random):
    """A copy of a JSON value with one nested value (maybe the whole) replaced by random JSON."""
    if isinstance(value, (dict, list)) and value and rng.random() < 0.8:
        value = copy.copy(value)
        key = rng.choice(list(value)) if isinstance(value, dict) else rng.randrange(len(value))
        value[key] = _replace_somewhere(value[key], rng)
        return value
    return _random_json(rng)


def _random_json(rng: random.Random, depth=0):
    keys = ["modified", "removed", "score", "uuid", "properties", "contains", "temp", "x"]
    choice = rng.randrange(7 if depth < 4 else 4)
    if choice == 0:
        return rng.choice([0, 1, -3, 10 ** 30, 1.5, float("inf")])
    if choice == 1:
        return rng.choice([True, False, None])
    if choice == 2:
        return rng.choice(["", "egg (ID: 2)", "pot (ID: 1)", "\u00e9\u4e2d"])
    if choice == 3:
        return rng.randrange(5)
    if choice == 4:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_random_text_never_raises_and_stays_in_range(sim_records):
    rng = random.Random(0)
    cases = [(STOVE_STATE, STOVE_NEXT), (SINK_STATE, SINK_NEXT)] + [(r["state"], r["next_state"])
                                                                  for r in sim_records[:50]]
    alphabet = '{}[]",:\'` \n\\abcdefxyz0123456789.-eE'
    outcomes = set()
    for i in range(1000):
        state, nxt = cases[i % len(cases)]
        kind = i % 4
        if kind == 0:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(200)))
        elif kind == 1:
            text = _mutate(truth(state, nxt), rng)
        elif kind == 2:
            text = json.dumps(_replace_somewhere(copy.deepcopy(make_diff(state, nxt)), rng))
        else:
            text = json.dumps(_random_json(rng))
        metrics = textgame_metrics(text, state, nxt)
        assert isinstance(metrics["parsed"], bool) and metrics["exact"] in (0, 1)
        assert metrics["binary"] in (0.0, 1.0)
        assert 0.0 <= metrics["task_specific"] <= 1.3 + 1e-12
        assert metrics["task_specific"] == textgame_reward(text, state, nxt, "task_specific")
        outcomes.add((metrics["parsed"], metrics["binary"], 0 < metrics["task_specific"] < 0.3))
    # unparseable, wrong-but-parsed, partly right (below the 0.3 of an exact unchanged answer), exact
    assert {(False, 0.0, False), (True, 0.0, True), (True, 1.0, False)} <= outcomes
