"""tools/report.py: a run's one page from its files (its links exist, its SVG holds one polyline per
curve on labelled axes, its four records follow the stated rule, a rebuild keeps what only the run
knew); the shipped default runs have theirs; the README's pictures exist and docs/img has no
orphan."""
import json
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from data.lights import task as lights
from eval import summarize
from tasks import TASKS
from tools.report import write_report

ROOT = Path(__file__).resolve().parents[1]
SVG = "{http://www.w3.org/2000/svg}"
PAGES = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "research" / "README.md",
         ROOT / "results" / "README.md"]


def links(page):
    """The targets of a markdown page's links and images that are files, not web addresses."""
    targets = re.findall(r"\]\(([^)#\s]+)", page.read_text())
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


def check_links(page):
    missing = [t for t in links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page}: links to missing files {missing}"


# the charts of every run's curves.svg and their curves (besides the probe's, or video's MAE)
CHARTS = {"on-policy reward (the step's samples)": 1, "KL to the start (k3, per token)": 1,
          "entropy of the samples, per token": 1, "groups kept (with reward spread)": 2}


def check_curves(path, charts):
    """curves.svg parses as XML; each chart has its title, labelled axes and one polyline per
    curve, as many as its legend names -> {title: number of curves}."""
    found = {}
    for g in ET.parse(path).getroot().iter(f"{SVG}g"):
        title = g.find(f"{SVG}title").text
        texts = {t.get("class"): t.text for t in g.iter(f"{SVG}text") if t.get("class")}
        assert texts.get("xlabel") == "GRPO step" and texts.get("ylabel"), title
        legend = [t for t in g.iter(f"{SVG}text") if t.get("fill")]
        lines = g.findall(f"{SVG}polyline")
        assert len(lines) == len(legend) >= 1, title
        assert all(len(p.get("points").split()) >= 2 for p in lines), title
        found[title] = len(lines)
    assert found == charts
    return found


def result(task, records, answers, head=None):
    """An eval.json row as eval.evaluate writes it, for `answers` to `records`."""
    T = TASKS[task]
    scores = [T.score(a, r) for a, r in zip(answers, records)]
    changed = [T.data.is_changed(r) for r in records]
    row = dict(summarize(scores, changed), n=len(records), n_changed=sum(changed), n_cropped=0,
               baseline_no_change=summarize([T.score(T.no_change, r) for r in records], changed),
               answers=answers,
               per_record={k: [m[k] for m in scores] for k in scores[0]} | {"changed": changed})
    return row | ({"headroom": head} if head else {})


def test_the_report_of_a_tiny_text_run(tmp_path):
    data, out = tmp_path / "data", tmp_path / "run"
    lights.ensure_splits(data, n_train=12, n_val=10, n_test=16, verbose=False)
    out.mkdir()
    recs = lights.load_records(data / "test.jsonl")
    T = TASKS["lights"]
    truth = [T.data.target_text(r) for r in recs]
    # the start right on even records, RLVR on the records not 2 mod 3, the control everywhere
    answers = {"mle": [t if i % 2 == 0 else "1=1 2=1" for i, t in enumerate(truth)],
               "rlvr": [t if i % 3 != 2 else "1=1 2=1" for i, t in enumerate(truth)],
               "mle_more": truth}
    head = dict(n=8, G=8, temperature=1.0, greedy=0.5, best=0.75, fixed=0.25, spread=0.5)
    rows = {k: result("lights", recs, a, head if k != "mle_more" else None)
            for k, a in answers.items()}
    (out / "eval.json").write_text(json.dumps(rows))
    val = lights.load_records(data / "val.jsonl")
    (out / "eval_val.json").write_text(json.dumps(
        {k: result("lights", val, [T.data.target_text(r) for r in val]) for k in answers}))
    (out / "config.json").write_text(json.dumps({"task": "lights", "data_dir": "../data"}))
    log = [{"stage": "rlvr", "step": 0, "probe_greedy": 0.5, "probe_reward": 0.4}]
    log += [{"stage": "rlvr", "step": s, "reward_mean": 0.1 * s, "kl": 0.01 * s, "entropy": 1 - s / 10,
             "groups": 8, "groups_kept": s, "rl_seconds": 6.0 * s, "rl_compute": 100 * s}
            for s in (1, 2, 3)]
    log[-1] |= {"probe_greedy": 0.6, "probe_reward": 0.5}
    log += [{"stage": "rlvr", "rank_checksums": [1, 1]},                  # torchrun's: no step
            {"stage": "rlvr", "step": 4, "reward_mean": 0.4, "kl": float("nan"), "groups": 8,
             "groups_kept": 0, "rl_seconds": 24.0, "rl_compute": 400}]   # a step of no spread
    log += [{"stage": "mle_more", "step": 5, "minutes": 0.3, "compute": 320}]
    (out / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))

    t0 = time.time()
    page = write_report(out, ["train_lang.py", "--task=lights"], 90.0)
    assert time.time() - t0 < 5, "a text run's report takes at most 5 seconds"
    text = page.read_text()
    check_links(page)
    check_curves(out / "curves.svg", {**CHARTS, "probe: reward on fixed train prompts": 2})
    # the rule, checked from the scores: the first record RLVR fixed, broke, both right, both wrong
    a, b = rows["mle"]["per_record"]["exact"], rows["rlvr"]["per_record"]["exact"]
    firsts = [next(i for i in range(len(a)) if ok(a[i], b[i])) for ok in (
        lambda x, y: y > x, lambda x, y: y < x, lambda x, y: x == y == 1, lambda x, y: x == y == 0)]
    shown = [int(i) for i in re.findall(r"^\*\*the first record .*\*\*: test record (\d+)", text, re.M)]
    assert shown == firsts
    i = firsts[0]   # its action, true change and the three answers side by side
    assert f"<code>{recs[i]['action']}</code>" in text and f"<code>{truth[i]}</code>" in text
    assert "| MLE start | <code>1=1 2=1</code> | 0.00 |" in text
    assert "python train_lang.py --task=lights" in text and "1.5 min in all" in text
    assert "RLVR's 4 steps 0.4 min, the control's 5 MLE steps 0.3 min" in text
    assert "| RLVR | 50.00 | 75.00 | 8, 1 | 25.0% | 50.0% |" in text   # the headroom line
    assert "rlvr - mle_more" in text and "val split" in text      # the paired tables, both splits
    # a rebuild from the files alone keeps the command, commit and wall time the run wrote
    commit = re.search(r"^- commit: (.+)$", text, re.M)[1]
    rebuilt = write_report(out).read_text()
    assert f"- commit: {commit}" in rebuilt and "1.5 min in all" in rebuilt
    assert rebuilt.split("- data")[1] == text.split("- data")[1]


def test_the_report_of_a_video_run(tmp_path):
    """A video run's page from the files of the shipped multi-step run, its checkpoints not at
    hand: the curves (greedy MAE on validation in place of the probe), the paired tables."""
    src = ROOT / "results" / "video_multi4000"
    rows = json.loads((src / "eval.json").read_text())
    for r in rows.values():
        r.pop("checkpoint")
    (tmp_path / "eval.json").write_text(json.dumps(rows))
    (tmp_path / "log.jsonl").write_text((src / "log.jsonl").read_text())
    page = write_report(tmp_path, command="python train_video.py --mode=multi")
    text = page.read_text()
    check_links(page)
    check_curves(tmp_path / "curves.svg", {**CHARTS, "greedy MAE on the validation split": 1})
    assert "rlvr - mle_more" in text and "No checkpoint of this run is at hand" in text


@pytest.mark.parametrize("run", ["textgame_s1337", "webpage_s1337", "video_default"])
def test_the_shipped_default_runs_have_their_report(run):
    page = ROOT / "results" / run / "report.md"
    assert page.is_file(), f"python tools/report.py results/{run} --command=..."
    check_links(page)
    assert "curves.svg" in links(page)


def test_readme_pictures_exist_and_docs_img_has_no_orphan():
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
    assert images and all((ROOT / i).is_file() for i in images), images
    assert any(i.endswith(".svg") for i in images) and any(i.endswith((".png", ".gif")) for i in images)
    linked = {(p.parent / t).resolve() for p in PAGES for t in links(p)}
    orphans = [f.name for f in (ROOT / "docs" / "img").iterdir() if f.resolve() not in linked]
    assert not orphans, f"docs/img: files no page links: {orphans}"
