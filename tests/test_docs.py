"""The docs against the code and results/: the generated tables equal what tools/results_table.py computes from
results/ (so a figure is typed by no one and cannot drift), every relative link and #anchor resolves, no page but
research/README.md narrates history, the docs stay within their line budget, and every command's flags exist."""
import json
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from tools import results_table

ROOT = Path(__file__).resolve().parents[1]

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "results" / "README.md",
         ROOT / "research" / "README.md"]
HISTORY_PAGE = ROOT / "research" / "README.md"   # the studies, dated: the one page that tells history


def test_readme_results_table_is_the_scripts_output():
    readme = (ROOT / "README.md").read_text()
    assert results_table.in_page(readme, "readme") == results_table.readme(), \
        "README.md: the results block differs from results/; run python tools/results_table.py --write"


def test_the_script_prints_the_readme_block(capsys):
    results_table.main([])
    printed = capsys.readouterr().out.strip("\n")
    assert printed == results_table.in_page((ROOT / "README.md").read_text(), "readme")


@pytest.mark.slow
def test_every_generated_table_is_the_scripts_output(capsys):
    results_table.main(["--check"])   # exits 1, naming the block, when one differs
    assert "differs" not in capsys.readouterr().out


def test_every_block_has_its_markers_once():
    for name, (page, _) in results_table.BLOCKS.items():
        text = (ROOT / page).read_text()
        begin, end = results_table.markers(name)
        assert text.count(begin) == text.count(end) == 1, f"{page}: the {name} block's markers"


# -----------------------------------------------------------------------------
# links and anchors


def without_code(text):
    """The text with its fenced code blocks blanked (their '#' lines are no headings, their brackets no links)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped (not - and _), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path):
    """The #anchors of a markdown file's headings (a repeated heading gets -1, -2, ...)."""
    seen, out = {}, set()
    for h in re.findall(r"^#{1,6} (.+)$", without_code(path.read_text()), re.M):
        s = slug(h)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def test_relative_links_and_anchors_resolve():
    bad = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", without_code(page.read_text())):
            if re.match(r"[a-z]+:", target):   # http(s), mailto: not checked here
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_slug_follows_github():
    assert slug("The regime study (one table, one figure)") == "the-regime-study-one-table-one-figure"
    assert slug("Single-step: `python train_video.py` (the default)") == "single-step-python-train_videopy-the-default"


# -----------------------------------------------------------------------------
# history lives in research/README.md; the line budget

HISTORY = re.compile(r"\bround[- ]?\d\b|\b(this|previous|last) (session|round)\b|\bissues? #?\d+|\bthe issue\b"
                     r"|\bissue's\b|\bearlier\b", re.I)


def test_no_page_but_the_research_readme_narrates_history():
    found = [f"{page.relative_to(ROOT)}:{i}: {line.strip()[:100]}"
             for page in PAGES if page != HISTORY_PAGE
             for i, line in enumerate(page.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not found, "history words outside research/README.md:\n" + "\n".join(found)


def test_the_studies_are_dated():
    text = HISTORY_PAGE.read_text()
    studies = re.findall(r"^### ", text, re.M)
    dates = re.findall(r"^\*\d{4}-\d{2}-\d{2}[^*]*\.\*", text, re.M)
    assert studies and len(dates) >= len(studies), "research/README.md: each study opens with its date"


def test_the_docs_fit_their_budget():
    lines = lambda p: len(p.read_text().splitlines())
    readme, docs = ROOT / "README.md", sorted((ROOT / "docs").glob("*.md"))
    assert lines(readme) <= 180, "README.md: at most 180 lines"
    assert lines(readme) + sum(map(lines, docs)) <= 1500, "README.md and docs/: at most 1,500 lines"
    assert lines(HISTORY_PAGE) <= 600, "research/README.md: at most 600 lines"


# -----------------------------------------------------------------------------
# commands


def commands():
    """(page, script, flags) of every `python SCRIPT.py ...` or `torchrun ... SCRIPT.py ...` in the code blocks
    (continuation lines joined) and in inline code."""
    out = []
    for page in PAGES:
        text = page.read_text()
        blocks = re.findall(r"^```(?:bash)?\n(.*?)^```", text, re.M | re.S)
        inline = re.findall(r"`((?:python|torchrun) [^`]+)`", without_code(text).replace("\n", " "))
        for block in blocks + inline:
            text = re.sub(r"\\\n\s*", " ", block)
            for line in text.splitlines():
                for cmd in re.split(r"&&|;", line.split("  #")[0]):
                    m = re.search(r"(?:python|torchrun(?: --\S+)*) (\S+\.py)\b(.*)", cmd)
                    if m and (ROOT / m[1]).exists():
                        task = re.search(r"--task=(\w+)", m[2])   # eval.py: --task=video has flags of its own
                        out.append((page.relative_to(ROOT), m[1] + (f" --task={task[1]}" if task and m[1] == "eval.py" else ""),
                                    re.findall(r"(?<!\S)(--[a-z_]+)", m[2])))
    return out


@lru_cache(maxsize=None)
def script_flags(script):
    """The flags a script's --help names (script: its path, and a --task=... that selects its flags)."""
    p = subprocess.run([sys.executable, *script.split(), "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, f"{script} --help: {p.stderr[-500:]}"
    return set(re.findall(r"(?<![\w-])(--[a-z_]+)", p.stdout))


def test_commands_are_found():
    scripts = {s.split()[0] for _, s, _ in commands()}
    assert {"train_lang.py", "train_video.py", "eval.py", "tools/results_table.py"} <= scripts


def test_flag_budget():
    """Fork, don't flag: a study's knobs live in its research/ script, not in the core's --help."""
    for script, most in (("train_lang.py", 30), ("train_video.py", 35)):
        n = len(script_flags(script) - {"--help"})
        assert n <= most, f"{script} has {n} flags (at most {most})"


def test_results_and_docs_stay_small():
    """Issue 45's sizes: results/ at most 15 MB (what the tables cite), README + docs/ 1,500 lines."""
    size = sum(p.stat().st_size for p in (ROOT / "results").rglob("*") if p.is_file())
    assert size <= 15e6, f"results/ holds {size / 1e6:.1f} MB (at most 15)"
    lines = sum(len(p.read_text().splitlines())
                for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    assert lines <= 1500, f"README.md + docs/ are {lines} lines (at most 1,500)"


@pytest.mark.slow
def test_every_documented_flag_exists():
    bad = [f"{page}: {script} {flag}" for page, script, flags in commands() for flag in flags
           if flag not in script_flags(script) and flag != "--help"]
    assert not bad, "flags that the scripts do not take:\n" + "\n".join(sorted(set(bad)))
