"""Verifiable rewards of the language tasks: each task's metric, measured on the model's text.

RLVR-World's point is that the reward is the metric itself. A reward takes the model's output and
the ground truth and never raises on model output: unreadable text scores 0. Per language task, the
task registry (tasks.TASKS) calls `reward_<task>(text, record, kind)`, RLVR's reward, and
`score_<task>(text, record)`, the evaluation's metrics. In order: the text game (read the model's
diff, `parse_diff`, the one JSON repair, merge it into the state, compare with the next state) and
the web page (`web_prf`). The video rewards are in video_rewards.py. docs/rewards.md holds where
each formula comes from, where and why it deviates from the official RLVR-World rewards, the text
game's contract on truncated answers, the ranges and the work's bounds.
"""
import itertools
import json
import re
from collections import Counter

from data.webpage import task as webpage_task


# a text reward reads at most this many characters: a longer answer scores 0 unread (bounded work)
MAX_ANSWER_CHARS = 100_000

# ======================================================================================= text game
# The model writes a difference JSON {"modified": [new or changed objects], "removed": [uuids],
# "score": {...}, or {} when the score does not change}. The contract (official): an answer without
# "modified" or "removed" scores 0; one without "score" predicts no score, so it is never exact.

TEXTGAME_KINDS = ("binary", "task_specific")
_ABSENT = object()   # a field that does not exist in a state
_INVALID = object()  # contents that are not a list of names: equal to nothing else


def reward_textgame(text, record, kind):
    """RLVR's reward: exact next state (binary) or the per-object partial credit (task_specific)."""
    return textgame_reward(text, record["state"], record["next_state"], kind)


def score_textgame(text, record):
    """Exact next state (0/1) and the task-specific reward of one decoded prediction."""
    metrics = textgame_metrics(text, record["state"], record["next_state"])
    return {"accuracy": metrics["binary"], "task_specific": metrics["task_specific"]}


def textgame_reward(text, state: dict, next_state: dict, kind: str = "binary") -> float:
    """The reward of the answer `text` on the transition state -> next_state: kind "binary" (1 when
    the predicted next state is exact, else 0) or "task_specific" (partial credit, 0 to 1.3)."""
    if kind not in TEXTGAME_KINDS:
        raise ValueError(f"unknown text-game reward kind {kind!r}; expected {TEXTGAME_KINDS}")
    return textgame_metrics(text, state, next_state)[kind]


def textgame_metrics(text, state: dict, next_state: dict) -> dict:
    """All text-game metrics of one answer: parsed, exact (0/1), object_acc, score_acc, changed_acc
    (None when nothing changed), and the two rewards binary and task_specific (docs/rewards.md)."""
    # a field changed when its value or presence differs between state and next state (score
    # fields, removed objects and keys included: docs/rewards.md, "Where we deliberately differ", 3)
    before, after = _fields(state), _fields(next_state)
    changed = [f for f in before | after if before.get(f, _ABSENT) != after.get(f, _ABSENT)]
    diff = parse_diff(text)
    if diff is None:   # unreadable, the wrong shape, or "modified" / "removed" missing: no credit
        return {"parsed": False, "exact": 0, "object_acc": 0.0, "score_acc": 0.0,
                "changed_acc": 0.0 if changed else None, "binary": 0.0, "task_specific": 0.0}
    pred = apply_diff(state, diff)   # the predicted next state
    # object-property accuracy: the share of the checks on the true objects that the guess passes
    correct, errors = _object_counts(pred, next_state)
    object_acc = correct / (correct + errors) if correct + errors else 1.0
    # score accuracy: the share of the true score keys (score, gameOver, gameWon) predicted equal
    true_score = next_state["score"]
    score_right = sum(pred["score"].get(k, _ABSENT) == v for k, v in true_score.items())
    score_acc = score_right / len(true_score) if true_score else 1.0
    exact = int(errors == 0 and score_right == len(true_score))   # every check right
    # changed-field accuracy: the share of the changed fields that the prediction gets right
    predicted = _fields(pred)
    changed_acc = (sum(1 for f in changed if predicted.get(f, _ABSENT) == after.get(f, _ABSENT))
                   / len(changed)) if changed else None
    # official weights: the truth scores 1.3 on a changed transition, 0.3 on an unchanged one
    task_specific = (9 * object_acc + score_acc + 20 * exact) / 100 + (changed_acc or 0.0)
    return {"parsed": True, "exact": exact, "object_acc": object_acc, "score_acc": score_acc,
            "changed_acc": changed_acc, "binary": float(exact), "task_specific": task_specific}


# --------------------------------------------------------------------------------- parse the diff
# the official extraction: the JSON follows the last "The final answer is:" (or "state is:", ...)
_FINAL_ANSWER = re.compile(r"the final (?:answer|state|game state) is:", re.IGNORECASE)
# models write Python's literals inside the JSON: they are read as JSON's
_PY_LITERAL = re.compile(r"\b(True|False|None)\b")
_JSON_LITERAL = {"True": "true", "False": "false", "None": "null"}
# a comma before a closing bracket, which JSON forbids: the repair drops it
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")
# Skips whole strings and other characters up to the next bracket, or to the opening quote of a
# string that never closes (group 1); possessive (*+), so it runs in C, linear in the length.
_JSON_TOKEN = re.compile(r'(?:"(?:[^"\\]|\\[\s\S])*"|[^"{}\[\]])*+([{}\[\]]|")')
_MAX_STARTS = 8   # how many '{' positions to try: bounds the work on long junk
_MAX_DEPTH = 100  # the repair gives up on deeper nesting (the decoder stops at the recursion limit)


def parse_diff(text) -> dict | None:
    """The model's difference JSON read from its text, as {"modified", "removed", "score"}, or None:
    the first JSON object with the diff's shape from the first _MAX_STARTS '{', as is or repaired
    (the repair only closes strings and brackets: it never adds a key a truncated answer lacks)."""
    if not isinstance(text, str) or len(text) > MAX_ANSWER_CHARS:
        return None
    segment = _PY_LITERAL.sub(lambda m: _JSON_LITERAL[m.group(1)], _answer_segment(text))
    decoder = json.JSONDecoder()
    for brace in itertools.islice(re.finditer(r"\{", segment), _MAX_STARTS):
        for candidate in _variants(segment[brace.start():]):
            try:
                obj, _ = decoder.raw_decode(candidate)   # the first JSON value; the rest is ignored
            except (ValueError, RecursionError):  # bad JSON, too-long integers, too-deep nesting
                continue
            if (diff := _validated(obj)) is not None:
                return diff
    return None


def _answer_segment(text: str) -> str:
    """The part of the text that should hold the JSON (the official extraction): after the last
    "The final answer is:", else the stripped content of the last ```json block (the official
    regex r"```json\\s*([\\s\\S]*?)\\s*```"'s, found by str.find: that regex is quadratic) when it
    has >= 10 characters, else the whole text."""
    finals = list(_FINAL_ANSWER.finditer(text))
    if finals:
        return text[finals[-1].end():]
    fenced, pos = None, 0
    while (start := text.find("```json", pos)) != -1:
        if (end := text.find("```", start + 7)) == -1:   # unclosed: no block, for the regex too
            break
        fenced, pos = text[start + 7:end].strip(), end + 3
    return fenced if fenced is not None and len(fenced) >= 10 else text


def _variants(text: str):
    """The text as is; then repaired (trailing commas dropped, unclosed brackets closed); then, when
    it holds single quotes, repaired with them read as double quotes. Failed repairs (None) go."""
    yield text
    quoted = (text, text.replace("'", '"')) if "'" in text else (text,)
    yield from filter(None, (_close_brackets(_TRAILING_COMMA.sub(r"\1", t)) for t in quoted))


def _close_brackets(text: str) -> str | None:
    """The JSON value that `text` starts with, cut where it ends; or, when the text ends first (a
    truncated answer), closed: an unterminated string gets its quote, a final comma goes, unclosed
    {/[ are closed. None if brackets mismatch or nest deeper than _MAX_DEPTH."""
    closers, pos = [], 0   # the closing brackets owed, innermost last
    while (m := _JSON_TOKEN.match(text, pos)) is not None:
        token, pos = m.group(1), m.end()
        if token == '"':  # a string that never closes runs to the end of the text
            return text + '"' + "".join(reversed(closers))
        if token in "{[":
            closers.append("}" if token == "{" else "]")
            if len(closers) > _MAX_DEPTH:
                return None
        elif not closers or closers.pop() != token:   # nothing open, or a bracket of the other kind
            return None
        elif not closers:  # the first value is complete; what follows is not read
            return text[:pos]
    # the text ended inside the value: close it
    text = text.rstrip()
    return (text[:-1] if text.endswith(",") else text) + "".join(reversed(closers))


def _validated(obj) -> dict | None:
    """The diff that `obj` holds, or None when it lacks "modified" or "removed" or has the wrong
    shape. An absent "score" reads as None; a present one must be an object (null is not)."""
    if not isinstance(obj, dict) or "modified" not in obj or "removed" not in obj:
        return None
    modified, removed, score = obj["modified"], obj["removed"], obj.get("score")
    # a uuid is an int, exactly: JSON's true and false (Python bools, a kind of int) are not
    ok = (isinstance(modified, list) and isinstance(removed, list)
          and ("score" not in obj or isinstance(score, dict))
          and all(isinstance(o, dict) and type(o.get("uuid")) is int for o in modified))
    return {"modified": modified, "removed": removed, "score": score} if ok else None


# --------------------------------------------------------------------------------- merge it
def apply_diff(state: dict, diff: dict) -> dict:
    """The predicted next state: `diff` merged into `state` (neither is modified).
    A modified object replaces the object with its uuid, or is added when the uuid is new (the
    official merge drops new ones; docs/rewards.md); removal wins over modification. The score:
    {} keeps the state's, a non-empty one replaces it, None (no "score" written) predicts none."""
    removed = {u for u in diff["removed"] if type(u) is int}   # an entry not a uuid removes nothing
    changes = {obj["uuid"]: obj for obj in diff["modified"]}
    # the kept objects in the state's order, each replaced by its change; then the new objects
    objects = [changes.pop(obj["uuid"], obj) for obj in state["objects"]
               if obj["uuid"] not in removed]
    objects += [obj for uuid, obj in changes.items() if uuid not in removed]
    score = diff["score"]
    return {"objects": objects,
            "score": state["score"] if score == {} else ({} if score is None else score)}


# --------------------------------------------------------------------------------- compare
def _object_counts(pred: dict, true: dict) -> tuple[int, int]:
    """(correct, errors) of the object-property accuracy: the official `evaluate`, plus the
    predicted objects and properties that the truth lacks, counted as errors (docs/rewards.md)."""
    predicted = {obj["uuid"]: obj for obj in pred["objects"]}
    correct = errors = 0
    for obj in true["objects"]:
        guess = predicted.get(obj["uuid"])
        if guess is None:   # a true object the prediction lost: one error
            errors += 1
            continue
        properties, true_properties = guess.get("properties"), obj["properties"]
        if isinstance(properties, dict):
            # each true property is right or wrong; each property the truth lacks is wrong
            right = sum(properties.get(k, _ABSENT) == v for k, v in true_properties.items())
            correct += right
            errors += len(true_properties) - right + len(properties.keys() - true_properties.keys())
        else:   # no properties to compare: one error
            errors += 1
        # the contents count as one more property
        same_contents = _contents(guess) == _contents(obj)
        correct, errors = correct + same_contents, errors + (not same_contents)
    # each predicted object that the truth lacks: one error
    errors += len(predicted.keys() - {obj["uuid"] for obj in true["objects"]})
    return correct, errors


def _fields(state: dict) -> dict:
    """A state flat: (uuid, "p", key) -> property, (uuid, "contains") -> contents, ("score", k)."""
    fields = {}
    for obj in state["objects"]:
        properties = obj.get("properties")
        for key, value in properties.items() if isinstance(properties, dict) else ():
            fields[(obj["uuid"], "p", key)] = value
        fields[(obj["uuid"], "contains")] = _contents(obj)
    return fields | {("score", key): value for key, value in state["score"].items()}


def _contents(obj: dict):
    """An object's contents as a sorted tuple of names (order does not matter), or _INVALID."""
    contains = obj.get("contains")
    ok = isinstance(contains, list) and all(isinstance(name, str) for name in contains)
    return tuple(sorted(contains)) if ok else _INVALID


# ======================================================================================= web page
# The model writes the items an action adds, deletes and updates on a page, in three sections of
# accessibility-tree lines; the reward is the F1 of its items against the true ones.
SECTION_KEYS = ("new", "deleted", "updated")
# a section header, e.g. "New items:", possibly with the first item on the same line (group 2)
_HEADER = re.compile(r"(new|deleted|updated)\s+items\s*(?::\s*(.*))?", re.IGNORECASE)
_SPACES = re.compile(r"\s+")


def reward_webpage(text, record, kind):
    """RLVR's reward: the F1 of the predicted page changes (the only kind)."""
    return web_prf(text, webpage_task.target_text(record))[2]


def score_webpage(text, record):
    """Precision, recall and F1 of the predicted page changes against the true ones."""
    return dict(zip(("precision", "recall", "f1"), web_prf(text, webpage_task.target_text(record))))


def web_prf(text, target_text) -> tuple[float, float, float]:
    """(precision, recall, f1) of the predicted items against the true ones, pooled over sections:
    per section the multiset intersection of the exact items. No items on either side gives
    (1, 1, 1); a side without items gives 0 for the ratio it divides. Never raises."""
    if not (isinstance(text, str) and isinstance(target_text, str)) or len(text) > MAX_ANSWER_CHARS:
        return 0.0, 0.0, 0.0
    pred, true = parse_sections(text), parse_sections(target_text)
    matched = sum(sum((Counter(pred[k]) & Counter(true[k])).values()) for k in SECTION_KEYS)
    n_pred, n_true = (sum(map(len, sections.values())) for sections in (pred, true))
    if n_pred == 0 and n_true == 0:   # "nothing changes", predicted right
        return 1.0, 1.0, 1.0
    precision = matched / n_pred if n_pred else 0.0
    recall = matched / n_true if n_true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def parse_sections(text) -> dict[str, list[str]]:
    """{"new": [...], "deleted": [...], "updated": [...]} read from a three-section answer: the
    stripped non-blank lines after a header (in any order, possibly repeated); lines before the
    first header are ignored; a missing section (or a non-string) gives empty lists."""
    sections = {key: [] for key in SECTION_KEYS}
    current = None   # the list of the section being read
    for line in text.splitlines() if isinstance(text, str) else ():
        line = _SPACES.sub(" ", line.strip())   # an item as compared: whitespace runs one space
        header = _HEADER.fullmatch(line)
        if header:   # the header line may hold the section's first item
            current, line = sections[header.group(1).lower()], header.group(2) or ""
        if line and current is not None:
            current.append("None" if line.lower() == "none" else line)   # None spelled one way
    return sections
