"""Tests of the web-page data: simulator.py (page rules, splits, statistics), task.py (diffs, prompts,
loading) and prepare.py (CLI, import of your own JSONL, ensure_splits)."""
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from data.webpage.prepare import ensure_splits
from data.webpage.simulator import (HELD_OUT_FIELDS, SPLIT_BUCKETS, STICKY, VIEW, Catalog, CustomerForm, Dashboard,
                                    Forum, action_text, bucket, generate_split)
from data.webpage.task import diff_items, diff_text, is_changed, load_records, prompt_text, target_text
from rewards import parse_sections, web_prf


def web_f1(text, target):
    """The F1 alone, the web page's reward."""
    return web_prf(text, target)[2]


ROOT = Path(__file__).resolve().parents[1]
PREPARE = ROOT / "data" / "webpage" / "prepare.py"
NONE3 = "New items:\nNone\n\nDeleted items:\nNone\n\nUpdated items:\nNone"


@pytest.fixture(scope="module")
def splits():
    return {"train": generate_split("train", 3000), "val": generate_split("val", 500),
            "test": generate_split("test", 1000)}


# ---------------------------------------------------------------------- diffs
def test_diff_text_on_hand_built_trees():
    before = "[1] RootWebArea 'Shop'\n\t[2] link 'SALES' expanded: False\n[7] StaticText 'Hello'\n\n[9] button 'Go'"
    after = "[1] RootWebArea 'Shop'\n  [2] link 'SALES' expanded: True\n[3] link 'Orders'\n[4] link 'Invoices'\n" \
            "\t\t[9] button 'Go'\n"
    assert diff_text(before, after) == ("New items:\n[3] link 'Orders'\n[4] link 'Invoices'\n\n"
                                        "Deleted items:\n[7] StaticText 'Hello'\n\n"
                                        "Updated items:\n[2] link 'SALES' expanded: True")
    assert diff_text(before, "\n".join("\t" + line for line in before.splitlines())) == NONE3
    assert diff_items("StaticText 'a'\n[4] x 'p'\n[4] x 'q'", "StaticText 'b'\n[4] x 'p'\n[4] x 'r'") == \
        {"new": ["StaticText 'b'"], "deleted": ["StaticText 'a'"], "updated": ["[4] x 'r'"]}
    assert diff_text("", "[1] link 'a'") == "New items:\n[1] link 'a'\n\nDeleted items:\nNone\n\nUpdated items:\nNone"


def test_targets_parse_back_and_listing_everything_loses(splits):
    everything, nothing = [], []
    for r in splits["val"]:
        items = diff_items(r["observation"], r["next_observation"])
        assert parse_sections(target_text(r)) == {k: v or ["None"] for k, v in items.items()}
        assert web_f1(target_text(r), target_text(r)) == 1.0
        page = r["next_observation"]
        everything.append(web_f1(f"New items:\n{page}\n\nDeleted items:\n{r['observation']}\n\n"
                                 f"Updated items:\n{page}", target_text(r)))
        nothing.append(web_f1(NONE3, target_text(r)))
    assert statistics.mean(everything) < 0.15 < statistics.mean(nothing)


# ---------------------------------------------------------------------- page rules
def visible_ids(page):
    return {n.id for n in page.visible()}


def step(page, *action):
    before = page.render()
    page.act(action)
    return diff_items(before, page.render())


def page_where(cls, condition, owner="Luma"):
    """The first page of class cls (seeds 0, 1, ...) that satisfies condition."""
    for seed in range(500):
        page = cls(cls.__name__.lower(), owner, "amy", random.Random(seed))
        if condition(page):
            return page
    raise AssertionError("no such page")


def test_menus_open_with_reserved_ids_and_hidden_ids_do_nothing():
    page = page_where(Dashboard, lambda p: True)
    menu = page.menus[0]
    sub = menu.data["items"]
    assert step(page, "click", sub[0].id) == {"new": [], "deleted": [], "updated": []}   # hidden: no-op
    d = step(page, "click", menu.id)
    assert [int(line[1:].split("]")[0]) for line in d["new"]] == [menu.id + i for i in range(1, len(sub) + 1)]
    assert d["updated"] == [f"[{menu.id}] link '{menu.name}' expanded: True"] and not d["deleted"]
    d = step(page, "click", sub[0].id)   # a section link: title and heading change, the menu closes
    assert f"[1] RootWebArea '{sub[0].name} / Luma Admin'" in d["updated"] and len(d["deleted"]) == len(sub)
    assert step(page, "click", 10 ** 6) == {"new": [], "deleted": [], "updated": []}


def test_tooltip_tabs_and_noops():
    page = page_where(Dashboard, lambda p: True)
    tip = page.help.data["tip"]
    assert step(page, "hover", page.help.id)["new"] == [tip.line()]
    assert step(page, "hover", page.help.id) == {"new": [], "deleted": [], "updated": []}
    assert step(page, "press", "enter")["deleted"] == [tip.line()]   # any other action hides it
    for action in (("scroll", "down"), ("go_back",), ("press", "enter"), ("click", page.heading.id),
                   ("type", page.heading.id, "x"), ("click", page.tabs[0].id)):
        assert step(page, *action) == {"new": [], "deleted": [], "updated": []}, action
    other = page.tabs[1]
    d = step(page, "click", other.id)
    assert f"[{other.id}] tab '{other.name}' selected: True" in d["updated"]
    assert [line.split("'")[1] for line in d["new"]] == [row.name for row in other.data["rows"]]


def test_catalog_search_pagination_and_go_back():
    page = page_where(Catalog, lambda p: p.pager is not None and len(p.products) > p.page_size + 1)
    start = page.render()
    d = step(page, "click", page.next.id)
    assert f"[{page.pager.id}] StaticText 'Page 2 of {-(-len(page.products) // page.page_size)}'" in d["updated"]
    assert step(page, "go_back", ) and page.render() == start
    word = page.products[0].name.split()[0]
    d = step(page, "type", page.search.id, word)
    assert d == {"new": [f"[{page.search.id + 1}] StaticText '{word}'"], "deleted": [],
                 "updated": [f"[{page.search.id}] searchbox 'Search by keyword' focused: True"]}
    d = step(page, "press", "enter")
    hits = [p for p in page.products if word in p.name]
    assert f"[{page.count.id}] StaticText '{len(hits)} records found'" in d["updated"]
    assert all(word not in line for line in d["deleted"])
    assert {n.id for n in page.products if n.shown} <= {p.id for p in hits}


def test_form_errors_focus_and_success():
    page = page_where(CustomerForm, lambda p: True)
    required = [f for f in page.fields if f.attrs["required"]]
    d = step(page, "click", page.save.id)
    assert d["new"] == [f"[{f.id + 2}] StaticText 'This is a required entry.'" for f in required]
    d = step(page, "type", required[0].id, "Ava")
    assert d["deleted"] == [f"[{required[0].id + 2}] StaticText 'This is a required entry.'"]
    assert d["new"] == [f"[{required[0].id + 1}] StaticText 'Ava'"]
    assert d["updated"] == [f"[{required[0].id}] textbox '{required[0].name}' focused: True required: True"]
    d = step(page, "type", required[1].id, "Brown")   # focus moves: two textboxes updated
    assert len(d["updated"]) == 2 and "focused" not in d["updated"][0]
    d = step(page, "press", "enter")
    assert d["new"] == [f"[{page.saved.id}] StaticText 'You saved the customer.'"]
    d = step(page, "click", page.combo.id)
    assert [line.split("'")[1] for line in d["new"]] == ["General", "Wholesale", "Retailer"]
    d = step(page, "click", page.options[2].id)
    assert f"[{page.combo.id}] combobox 'Group: Retailer' expanded: False" in d["updated"] and len(d["deleted"]) == 3


def test_forum_upvote_reply_and_post():
    page = page_where(Forum, lambda p: True)
    start = page.render()
    up, reply = page.posts[0]
    score = int(up.data["score"].name)
    d = step(page, "click", up.id)
    assert d["updated"] == [f"[{up.id}] button 'Upvote' pressed: True", f"[{up.id + 1}] StaticText '{score + 1}'"]
    step(page, "click", up.id)
    assert page.render() == start
    box, post = reply.data["box"], reply.data["post"]
    assert step(page, "click", post.id) == {"new": [], "deleted": [], "updated": []}   # hidden
    assert step(page, "click", reply.id)["new"] == [box.line(), post.line()]
    step(page, "type", box.id, "I agree")
    assert step(page, "press", "enter") == {"new": [], "deleted": [], "updated": []}   # no form button
    count = int(reply.data["count"].name.split()[0])
    d = step(page, "click", post.id)
    assert d["new"] == [f"[{reply.data['comment'].id}] StaticText 'amy: I agree'"]
    assert d["updated"] == [f"[{reply.data['count'].id}] StaticText '{count + 1} comments'"]
    assert len(d["deleted"]) == 3 and page.focus is None


def test_scrolling_long_pages():
    page = page_where(Forum, lambda p: len(p.body()) > VIEW + 5)
    start, first = page.render(), page.body()[:5]
    assert step(page, "scroll", "up") == {"new": [], "deleted": [], "updated": []}
    d = step(page, "scroll", "down")
    assert d["deleted"] == [n.line() for n in first] and len(d["new"]) == 5 and not d["updated"]
    assert page.visible()[:STICKY] == page.nodes[:STICKY]
    step(page, "scroll", "up")
    assert page.render() == start


def test_action_text():
    assert [action_text(a) for a in (("click", 5), ("type", 12, "yoga mat"), ("hover", 3), ("scroll", "down"),
                                      ("go_back",), ("press", "enter"))] == \
        ["click [5]", "type [12] [yoga mat]", "hover [3]", "scroll [down]", "go_back", "press [enter]"]


# ---------------------------------------------------------------------- splits and statistics
def test_generation_is_deterministic():
    assert generate_split("val", 200, seed=3) == generate_split("val", 200, seed=3)
    assert generate_split("val", 200, seed=3) != generate_split("val", 200, seed=4)
    with pytest.raises(ValueError, match="split"):
        generate_split("dev", 10)


def sticky_key(record):
    root, account = record["observation"].splitlines()[:STICKY]
    title = root.split("'")[1]
    owner = title.split("/f/")[1].split(" ")[0] if record["site"] == "forum" else title.split(" / ")[1][:-6]
    return record["site"], owner, account.split("'")[1].split(" ")[-1]


def test_splits_are_disjoint(splits):
    for name, records in splits.items():
        assert all(bucket(*sticky_key(r)) in SPLIT_BUCKETS[name] for r in records)
    prompts = {name: {prompt_text(r) for r in records} for name, records in splits.items()}
    assert not prompts["train"] & prompts["val"] and not prompts["train"] & prompts["test"]
    assert not prompts["val"] & prompts["test"]


def test_unchanged_share_sizes_and_held_out(splits):
    for name, records in splits.items():
        assert 0.25 <= 1 - sum(map(is_changed, records)) / len(records) <= 0.35, name
        assert {r["site"] for r in records} == {"dashboard", "catalog", "form", "forum"}
    train = splits["train"]
    lines = [len(r["observation"].splitlines()) for r in train]
    assert 8 <= min(lines) and max(lines) == STICKY + VIEW and 14 <= statistics.mean(lines) <= 24
    assert sum(n > 30 for n in lines) / len(lines) > 0.02
    assert statistics.mean(len(prompt_text(r)) for r in train) <= 900
    assert statistics.mean(len(target_text(r)) for r in train) <= 250
    held = [f"textbox '{f}'" for f in HELD_OUT_FIELDS]
    assert not any(h in r["observation"] for r in splits["train"] + splits["val"] for h in held)
    assert any(h in r["observation"] for r in splits["test"] for h in held)


# ---------------------------------------------------------------------- records and prompts
def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_load_records_errors_name_file_and_line(tmp_path):
    good = json.dumps({"observation": "[1] a 'b'", "action": "click [1]", "next_observation": "[1] a 'c'"})
    cases = {"invalid JSON": ["{not json"], "missing key": [json.dumps({"observation": "", "action": ""})],
             "JSON object": ["[1, 2]"], "must be string": [json.dumps({**json.loads(good), "action": 3})]}
    for message, lines in cases.items():
        path = write(tmp_path / "bad.jsonl", [good, ""] + lines)
        with pytest.raises(ValueError, match=message) as e:
            load_records(path)
        assert f"{path}:3" in str(e.value)
    with pytest.raises(ValueError, match="empty file"):
        load_records(write(tmp_path / "empty.jsonl", ["", "  "]))
    records = load_records(write(tmp_path / "ok.jsonl", [good, "", good]))
    assert len(records) == 2 and records[0]["site"] == "web" and is_changed(records[0])


def test_prompt_and_target(splits):
    r = splits["val"][0]
    prompt = prompt_text(r)
    assert r["observation"] in prompt and f"action:{r['action']}\n" in prompt and prompt.endswith("changes:\n")
    assert target_text(r) == diff_text(r["observation"], r["next_observation"])
    unchanged = next(r for r in splits["val"] if not is_changed(r))
    assert target_text(unchanged) == NONE3


# ---------------------------------------------------------------------- prepare.py
def run_prepare(*args, cwd):
    return subprocess.run([sys.executable, str(PREPARE), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_prepare_cli_writes_splits(tmp_path):
    out = tmp_path / "web"
    result = run_prepare(f"--out_dir={out}", "--n_train=200", "--n_val=30", "--n_test=40", "--seed=2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "unchanged" in result.stdout
    assert load_records(out / "train.jsonl") == generate_split("train", 200, seed=2)
    assert [len(load_records(out / f"{s}.jsonl")) for s in ("val", "test")] == [30, 40]
    assert not list(out.glob("*.tmp"))
    stamp = (out / "train.jsonl").stat().st_mtime_ns
    assert ensure_splits(out) == {s: out / f"{s}.jsonl" for s in ("train", "val", "test")}
    assert (out / "train.jsonl").stat().st_mtime_ns == stamp
    (out / "val.jsonl").unlink()
    with pytest.raises(ValueError, match="val.jsonl"):
        ensure_splits(out)
    paths = ensure_splits(tmp_path / "fresh", n_train=50, n_val=10, n_test=10, verbose=False)
    assert len(load_records(paths["test"])) == 10


def test_prepare_cli_imports_user_jsonl(tmp_path):
    src, dst = tmp_path / "mine.jsonl", tmp_path / "out" / "train.jsonl"
    obs = "[1] RootWebArea 'Shop'\r\n\r\n\t[5] button 'Go'  \r\n"
    rows = [{"observation": obs, "action": "click  [5]", "next_observation": obs.replace("Go", "Gone")},
            {"site": "gitlab", "observation": obs, "action": "scroll [down]", "next_observation": obs}]
    write(src, [json.dumps(r) for r in rows])
    result = run_prepare(f"--import={src}", f"--out={dst}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    records = load_records(dst)
    assert [r["site"] for r in records] == ["web", "gitlab"] and records[0]["action"] == "click [5]"
    assert records[0]["observation"] == "[1] RootWebArea 'Shop'\n\t[5] button 'Go'"
    assert target_text(records[0]) == "New items:\nNone\n\nDeleted items:\nNone\n\nUpdated items:\n[5] button 'Gone'"
    assert not is_changed(records[1])
    write(src, [json.dumps(rows[0]), json.dumps({"observation": "x"})])
    result = run_prepare(f"--import={src}", f"--out={dst}", cwd=tmp_path)
    assert result.returncode != 0 and f"{src}:2" in result.stderr and "missing key" in result.stderr
    assert run_prepare(f"--import={src}", cwd=tmp_path).returncode == 2
