"""The web-page state-prediction task: records, diffs, and the text the model reads and writes.

A record is one transition on a web page (one JSON object per line of a .jsonl file):

    {"site": "dashboard",
     "observation":      "[1] RootWebArea 'Dashboard / Luma Admin'\n[2] link 'admin amy'\n...",
     "action":           "click [5]",
     "next_observation": "[1] RootWebArea 'Dashboard / Luma Admin'\n..."}

Observations are WebArena accessibility trees, one node per line, `[id] role 'name' attr: value`. This is
also the import format for your own data (WebArena trajectories): "site" is optional (default "web"), and
the answer is never stored but computed from the two observations, so it cannot disagree with them.
`python data/webpage/prepare.py --import=IN.jsonl --out=OUT.jsonl` checks and normalises such a file.

The answer, as in RLVR-World (after the WMA web-agent paper), is not the whole next page but what changed,
as three sections of items, an item being one tree line:

    New items:
    [13] link 'Orders'

    Deleted items:
    None

    Updated items:
    [5] link 'SALES' expanded: True

Lines are matched by their `[id]`: an id only in the next page is new, an id only in the current page is
deleted, an id in both whose line differs is updated (written as its new line). Lines are compared
without leading and trailing whitespace, so WebArena's tab indentation never makes a line "updated"; a
line without an `[id]` is its own key (so it can only be new or deleted), and an id that occurs twice is
matched occurrence by occurrence. Items keep page order (deleted ones the current page's order). An empty
section is written `None`, so an unchanged transition has the short answer of three `None`s.

The prompt is kept small, because it is what a tiny model has to read: one instruction line, the site,
the page, the action, then the cue "changes:". The end-of-sequence token is added by the training code.
"""
import re
from collections import Counter

from data.jsonl import load_jsonl

REQUIRED_KEYS = ("observation", "action", "next_observation")
DEFAULT_SITE = "web"
SECTIONS = (("new", "New items"), ("deleted", "Deleted items"), ("updated", "Updated items"))
_ID = re.compile(r"\[(\d+)\]")


def tree_lines(tree: str) -> list[str]:
    """The non-blank lines of an accessibility tree, without surrounding whitespace."""
    return [line.strip() for line in tree.splitlines() if line.strip()]


def keyed_lines(tree: str) -> dict[tuple, str]:
    """{(key, occurrence): line} in page order; key = the line's leading [id], else the whole line."""
    seen, keyed = {}, {}
    for line in tree_lines(tree):
        m = _ID.match(line)
        key = m.group(1) if m else line
        seen[key] = seen.get(key, 0) + 1
        keyed[(key, seen[key])] = line
    return keyed


def diff_items(observation: str, next_observation: str) -> dict[str, list[str]]:
    """{"new": [...], "deleted": [...], "updated": [...]}: the changed lines (see module docstring)."""
    before, after = keyed_lines(observation), keyed_lines(next_observation)
    return {"new": [line for key, line in after.items() if key not in before],
            "deleted": [line for key, line in before.items() if key not in after],
            "updated": [line for key, line in after.items() if key in before and before[key] != line]}


def format_sections(items: dict[str, list[str]]) -> str:
    """The three-section answer text; an empty section is written None."""
    return "\n\n".join(f"{title}:\n" + ("\n".join(items[key]) if items[key] else "None")
                       for key, title in SECTIONS)


def diff_text(observation: str, next_observation: str) -> str:
    """The answer the model must write for a transition from `observation` to `next_observation`."""
    return format_sections(diff_items(observation, next_observation))


def _key(line: str) -> str:
    m = _ID.match(line)
    return m.group(1) if m else line


def apply_changes(observation: str, items: dict[str, list[str]]) -> str:
    """The page after a (predicted) change: `items` {"new", "deleted", "updated"} (lists of tree lines, as
    rewards.parse_sections reads an answer) merged into `observation`. Lines are matched by their [id] (a
    line without one by its whole text): deleted ones go, updated ones take their new line, a new line goes
    before the first line with a larger id (ids follow document order), else at the end. "None" items, and
    deleted or updated items that match no line, are skipped. The inverse of diff_items:
    apply_changes(obs, diff_items(obs, nxt)) has the lines of nxt (for pages whose ids follow document order,
    as ours and WebArena's do)."""
    def real(section):
        return [line for line in items.get(section, []) if line != "None"]
    gone, updates, out = Counter(_key(line) for line in real("deleted")), {}, []
    for line in real("updated"):
        updates.setdefault(_key(line), []).append(line)
    for line in tree_lines(observation):
        key = _key(line)
        if gone[key] > 0:
            gone[key] -= 1
        else:
            out.append(updates[key].pop(0) if updates.get(key) else line)
    for line in real("new"):
        key = _key(line)
        later = [i for i, old in enumerate(out) if key.isdigit() and _key(old).isdigit() and int(_key(old)) > int(key)]
        out.insert(later[0] if later else len(out), line)
    return "\n".join(out)


def check_record(record: dict, where: str) -> dict:
    """The record, its "site" defaulting to "web", once its fields are strings (other keys are kept
    and ignored); else a ValueError naming `where` (file:line)."""
    record.setdefault("site", DEFAULT_SITE)
    wrong = [k for k in ("site",) + REQUIRED_KEYS if not isinstance(record[k], str)]
    if wrong:
        raise ValueError(f"{where}: {wrong} must be string(s)")
    return record


def load_records(path) -> list[dict]:
    """Read a .jsonl file of records; ValueError naming the file and line for anything malformed.
    Blank lines are skipped."""
    return load_jsonl(path, REQUIRED_KEYS, check_record)


def is_changed(record: dict) -> bool:
    """Whether the action changes any line of the page."""
    return any(diff_items(record["observation"], record["next_observation"]).values())


def prompt_text(record: dict) -> str:
    """What the model reads: instruction, site, page, action, then the cue 'changes:'; or the
    paper's own prompt, when the record holds it (docs/engineering.md)."""
    if "prompt" in record:
        return record["prompt"]
    return (f"Predict the page change.\nsite:{record['site']}\n{record['observation']}\n"
            f"action:{record['action']}\nchanges:\n")


def target_text(record: dict) -> str:
    """What the model must write after the prompt (without the end-of-sequence token)."""
    return diff_text(record["observation"], record["next_observation"])
