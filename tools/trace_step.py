"""
Which of the project's files one RLVR step runs through: runs train_lang.py with the given flags and records every
project file whose Python code executes inside `grpo.grpo_step` (rollout, reward, refill, update), plus the script
that calls it. The README's reading order is checked against this list by tests/test_reading_order.py.

    python tools/trace_step.py --stage=rlvr --rl_steps=1 --control=0 --eval_limit=1
    python tools/trace_step.py --counts     # only rewrite the README table's line counts
"""
import json
import os
import re
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import grpo  # noqa: E402  (after the path: the project's module, patched below before train_lang imports it)


def write_counts(readme=ROOT / "README.md"):
    """Rewrite the line counts of the README's reading-order rows and its total row."""
    text, total = readme.read_text(), [0, 0]

    def row(m):   # | n | [file](file) | lines |
        n = len((ROOT / m[2]).read_text().splitlines())
        total[0], total[1] = total[0] + 1, total[1] + n
        return f"| {m[1]} | [{m[2]}]({m[3]}) | {n} |"
    text = re.sub(r"^\| (\d+) \| \[([^\]]+)\]\(([^)]+)\) \| \d+ \|", row, text, flags=re.M)
    text = re.sub(r"^\| \| all \| \d+ files, \d+ lines \|", f"| | all | {total[0]} files, {total[1]} lines |",
                  text, flags=re.M)
    readme.write_text(text)
    print(f"{readme}: {total[0]} files, {total[1]} lines")


if sys.argv[1:] == ["--counts"]:
    write_counts()
    sys.exit()

touched = set()   # paths relative to ROOT


def record(frame, event, arg):
    """sys.setprofile hook: note the file of every Python function called inside the step."""
    if event == "call":
        path = Path(frame.f_code.co_filename).resolve()
        if path.is_relative_to(ROOT) and path.suffix == ".py":
            touched.add(path.relative_to(ROOT).as_posix())


step = grpo.grpo_step


def traced_step(*args, **kwargs):
    """grpo_step with the profile hook on for exactly its duration."""
    sys.setprofile(record)
    try:
        return step(*args, **kwargs)
    finally:
        sys.setprofile(None)


grpo.grpo_step = traced_step
script = ROOT / "train_lang.py"
touched.add(script.name)   # the caller: it draws the prompts and owns the reward function
sys.argv = [str(script), *sys.argv[1:]]
try:
    runpy.run_path(str(script), run_name="__main__")
finally:
    files = sorted(touched)
    lines = {f: len((ROOT / f).read_text().splitlines()) for f in files}
    print("the step ran through:")
    for f in files:
        print(f"  {f:30s} {lines[f]:5d} lines")
    print(f"  {len(files)} files, {sum(lines.values())} lines")
    if os.environ.get("TRACE_JSON"):   # machine-readable copy for the test
        Path(os.environ["TRACE_JSON"]).write_text(json.dumps(lines))
