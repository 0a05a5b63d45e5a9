"""The text-game state-prediction task: records, diffs, and the text the model reads and writes.

A record is one transition of a text game (one JSON object per line of a .jsonl file), in the schema
of ByteSized32-State-Prediction, so our simulator's records and converted ByteSized32 ones
(prepare.py) read alike:

    {"game": "cook-egg", "action": "put egg in pot",
     "state":      {"objects": [...], "score": {"score": 0, "gameOver": false, "gameWon": false}},
     "next_state": {"objects": [...], "score": {...}}}

with objects {"name": "pot (ID: 3)", "uuid": 3, "type": "Pot", "properties": {...},
"contains": ["egg (ID: 4)"]}.

Like RLVR-World (the GPT-simulator paper's "diff" setting) the model writes only a *difference*
(`make_diff`); about half the transitions change nothing and their answer is
{"modified":[],"removed":[],"score":{}}. rewards.apply_diff merges a diff back into the state. Two
objects are the same when their properties are equal and they contain the same objects in any order
(names and types never change and are not compared, as in that paper's evaluation). The prompt is
compact JSON, keys in the data's order, since a tiny model reads it; the training code adds the EOS
token.
"""
import json

from data.jsonl import load_jsonl

RECORD_KEYS = ("game", "state", "action", "next_state")


def compact(obj) -> str:
    """JSON without spaces, keys in their given order."""
    return json.dumps(obj, separators=(",", ":"))


# -----------------------------------------------------------------------------
# reading records

def _check_state(state, where: str, key: str) -> None:
    """A state must be {"objects": [...], "score": {...}}, every object with a uuid, properties and
    contents (what make_diff and the rewards read); else a ValueError naming `where` (file:line)
    and `key`."""
    if not isinstance(state, dict) or not isinstance(state.get("objects"), list) \
            or not isinstance(state.get("score"), dict):
        raise ValueError(f"{where}: '{key}' must be an object with an 'objects' list "
                         "and a 'score' object")
    for obj in state["objects"]:
        if not isinstance(obj, dict) or not {"uuid", "properties", "contains"} <= obj.keys():
            raise ValueError(f"{where}: every object in '{key}' needs 'uuid', 'properties' "
                             "and 'contains'")


def check_record(record: dict, where: str) -> dict:
    """The record, once both its states have the shape _check_state asks for."""
    _check_state(record["state"], where, "state")
    _check_state(record["next_state"], where, "next_state")
    return record


def load_records(path) -> list[dict]:
    """Read a .jsonl file of records; ValueError naming the file and line for anything malformed."""
    return load_jsonl(path, RECORD_KEYS, check_record)


# -----------------------------------------------------------------------------
# the answer: what changed

def same_object(a: dict, b: dict) -> bool:
    """Equal properties, and the same contents in any order."""
    return a["properties"] == b["properties"] and sorted(a["contains"]) == sorted(b["contains"])


def make_diff(state: dict, next_state: dict) -> dict:
    """The answer the model must write: what changed from `state` to `next_state`. `modified`: full
    objects (new ones included) in next_state's order; `removed`: uuids in state's order; `score`:
    the next score only if it changed."""
    before = {obj["uuid"]: obj for obj in state["objects"]}
    after_uuids = {obj["uuid"] for obj in next_state["objects"]}
    # an object is modified when it is new or no longer the same_object as before
    modified = [obj for obj in next_state["objects"]
                if obj["uuid"] not in before or not same_object(before[obj["uuid"]], obj)]
    removed = [obj["uuid"] for obj in state["objects"] if obj["uuid"] not in after_uuids]
    score = next_state["score"] if next_state["score"] != state["score"] else {}
    return {"modified": modified, "removed": removed, "score": score}


def is_changed(record: dict) -> bool:
    """Whether the transition changes any object or the score."""
    diff = make_diff(record["state"], record["next_state"])
    return bool(diff["modified"] or diff["removed"] or diff["score"])


def is_gold(record: dict) -> bool:
    """The official split's "gold" (RLVR-World's process_jsonl_train.py): an object there before
    and after changed its properties or contents; an object added or removed, or the score alone,
    does not count."""
    after = {obj["uuid"]: obj for obj in record["next_state"]["objects"]}
    return any(obj["uuid"] in after and not same_object(obj, after[obj["uuid"]])
               for obj in record["state"]["objects"])


# -----------------------------------------------------------------------------
# the text the model reads and writes

def prompt_text(record: dict) -> str:
    """What the model reads: the game, the current state, the action, then the cue 'diff:'; or the
    paper's own prompt, when the record holds it (prepare.py --gpt_simulator)."""
    if "prompt" in record:
        return record["prompt"]
    return (f"game:{record['game']}\nstate:{compact(record['state'])}\n"
            f"action:{record['action']}\ndiff:")


def target_text(record: dict) -> str:
    """What the model must write after the prompt (without the end-of-sequence token)."""
    return compact(make_diff(record["state"], record["next_state"]))
