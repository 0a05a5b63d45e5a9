"""Reading the records of a JSON-lines file (one JSON object per line), the format of every
language task's splits. Each task's load_records (data/textgame/task.py, data/webpage/task.py)
names the keys a record needs and checks the rest itself."""
import json
from pathlib import Path


def utf8_lines(f, path):
    """The lines of a text file opened as UTF-8; a file that is not UTF-8 is a ValueError naming
    it."""
    try:
        yield from f
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason}); expected JSON lines") from None


def load_jsonl(path, required, to_record):
    """The records of a .jsonl file, blank lines skipped. Every line must be a JSON object with the
    keys `required`; then to_record(obj, where) returns the record to keep: it validates the rest,
    and may fill in defaults or convert (`where` is "file:line", for its error messages).
    -> list of records; ValueError naming the file and line for anything malformed, and for a file
    without records."""
    path = Path(path)
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(utf8_lines(f, path), start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: invalid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{where}: a record must be a JSON object")
            missing = [k for k in required if k not in obj]
            if missing:
                raise ValueError(f"{where}: record is missing key(s) {missing}")
            records.append(to_record(obj, where))
    if not records:
        raise ValueError(f"{path}: no records (empty file)")
    return records
