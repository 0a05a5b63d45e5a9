"""Lights Out, the worked example of docs/tasks.md: a row of lamps, an action, the lamps it changes.

A record is {"state": "0110100010", "action": "press 3", "next_state": "0001100010"}: "1" is a lamp
on, lamps count from 1. "press i" flips lamp i and its neighbours; "on i" and "off i" set one lamp,
often to what it is (a third of the records change nothing). The answer is what changes, "2=0 3=0
4=1", or "none". Val and test states are never train states (a state's number % 10 decides).
"""
import random
from pathlib import Path

from checkpoint import write_jsonl
from data.jsonl import load_jsonl

N_LAMPS, SIZES = 10, {"train": 5000, "val": 200, "test": 1000}
headline, rewards, no_change = "exact", ("exact", "f1"), "none"   # fields of tasks.Task


def step(state, action):
    """The world's rule: the lamps after `action`."""
    verb, i = action.split()
    lamps, i = list(state), int(i) - 1
    for j in ([i - 1, i, i + 1] if verb == "press" else [i]):
        if 0 <= j < len(lamps):   # an end lamp has one neighbour
            lamps[j] = {"press": str(1 - int(lamps[j])), "on": "1", "off": "0"}[verb]
    return "".join(lamps)


def generate_split(split, n, seed=0):
    """n records on the split's states, from a random stream seeded by split and seed."""
    rng = random.Random(f"lights/{split}/{seed}")
    residues = {"test": [0], "val": [1], "train": range(2, 10)}[split]
    states = [format(s, f"0{N_LAMPS}b") for s in range(2 ** N_LAMPS) if s % 10 in residues]
    records = []
    for _ in range(n):   # the next state comes from the rule, never from the stream
        state = rng.choice(states)
        action = f"{rng.choice(['press', 'on', 'off'])} {rng.randint(1, N_LAMPS)}"
        records.append({"state": state, "action": action, "next_state": step(state, action)})
    return records


def ensure_splits(data_dir, n_train=SIZES["train"], n_val=SIZES["val"], n_test=SIZES["test"],
                  seed=0, verbose=True):
    """data_dir's train/val/test.jsonl, all three generated if none exists -> {split: path}."""
    paths = {split: Path(data_dir) / f"{split}.jsonl" for split in SIZES}
    present = [split for split, path in paths.items() if path.is_file()]
    if present and len(present) < len(paths):   # your own files are never topped up with ours
        raise ValueError(f"{data_dir}: has {present} of train, val, test; add the others")
    if not present:
        for (split, path), n in zip(paths.items(), (n_train, n_val, n_test)):
            write_jsonl(path, generate_split(split, n, seed))
            if verbose:
                print(f"wrote {path}")
    return paths


def load_records(path):
    """A .jsonl file's records; ValueError naming the line of a state that is not 0s and 1s."""
    def check(record, where):
        a, b = record["state"], record["next_state"]
        if not (type(a) is type(b) is str and 0 < len(a) == len(b) and set(a + b) <= set("01")):
            raise ValueError(f"{where}: state and next_state must be 0/1 strings of one length")
        return record
    return load_jsonl(path, ("state", "action", "next_state"), check)


def is_changed(record):   # each metric is also reported on changed and unchanged records
    return record["state"] != record["next_state"]


def prompt_text(record):   # what the model reads, ending in the cue "changes:"
    return f"lamps:{record['state']}\naction:{record['action']}\nchanges:"


def target_text(record):   # what it must write (train_lang.py adds the EOS token)
    pairs = enumerate(zip(record["state"], record["next_state"]), start=1)
    return " ".join(f"{i}={after}" for i, (before, after) in pairs if before != after) or no_change


def score(text, record):
    """The answer's words ("3=1", or "none") against the target's, as sets: exact, 1 when they are
    the same; f1, partial credit, 2 |claimed & true| / (|claimed| + |true|)."""
    claimed, true = set(text.split()), set(target_text(record).split())
    return {"exact": float(claimed == true),
            "f1": 2 * len(claimed & true) / (len(claimed) + len(true))}   # true is never empty


def reward(text, record, kind):   # RLVR's reward, --reward=exact (the default) or f1
    return score(text, record)[kind]
