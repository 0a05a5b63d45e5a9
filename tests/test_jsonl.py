"""data/jsonl.py: the one JSON-lines reader behind every task's load_records."""
import json

import pytest

from data.jsonl import load_jsonl
from data.textgame import task as tg_task
from data.webpage import task as web_task


def test_to_record_decides_what_is_kept_and_errors_name_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2, "b": 3}\n')
    assert load_jsonl(path, ("a",), lambda obj, where: obj) == [{"a": 1}, {"a": 2, "b": 3}]
    # a conversion: what to_record returns is kept, and it learns each record's file and line
    assert load_jsonl(path, (), lambda obj, where: (obj["a"], where)) == [(1, f"{path}:1"), (2, f"{path}:3")]
    with pytest.raises(ValueError, match=r"r\.jsonl:1: record is missing key\(s\) \['b'\]"):
        load_jsonl(path, ("b",), lambda obj, where: obj)


@pytest.mark.parametrize("task,keys", [(tg_task, tg_task.RECORD_KEYS), (web_task, web_task.REQUIRED_KEYS)])
def test_every_task_reads_through_it(tmp_path, task, keys):
    for name, content, error in [("latin.jsonl", "caf\xe9\n".encode("latin-1"), r"latin\.jsonl: not UTF-8"),
                                 ("list.jsonl", b"[1, 2]\n", r"list\.jsonl:1: a record must be a JSON object"),
                                 ("bad.jsonl", b"\n{no\n", r"bad\.jsonl:2: invalid JSON"),
                                 ("empty.jsonl", b"\n \n", r"empty\.jsonl: no records")]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=error):
            task.load_records(tmp_path / name)
    # every key present, each of the wrong type: the task's own check rejects it
    (tmp_path / "typed.jsonl").write_text(json.dumps({k: 1 for k in keys}) + "\n")
    with pytest.raises(ValueError, match=r"typed\.jsonl:1: "):
        task.load_records(tmp_path / "typed.jsonl")
