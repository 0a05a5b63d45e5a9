"""
What a student reads to follow one RLVR step: runs train_lang.py with the given flags and records,
from the script's first line to its first optimizer step, every function of the top-level files
that runs (each counted whole, from its `def` or first decorator to its end; a nested function
once, inside the function that holds it), plus the whole script; and the functions of the
top-level files on the stack between the script's top level and that step. The README's reading
order comes from it (`--write`); tests/test_reading_order.py checks it.

    python tools/trace_step.py --stage=rlvr --rl_steps=1 --control=0 --eval_limit=2
    python tools/trace_step.py --write --stage=rlvr --rl_steps=1 --control=0 --eval_limit=2
"""
import ast
import json
import os
import re
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "train_lang.py"
TOP = {p.resolve() for p in ROOT.glob("*.py")}   # the top-level files: the core


def outer_functions(path):
    """A file's functions that no other function holds (methods included) -> [(first, last)]
    line ranges, from the first decorator to the end."""
    spans, tree = [], ast.parse(path.read_text())

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                spans.append((first, child.end_lineno))   # its nested functions: inside it
            else:
                visit(child)   # a class's methods, a function defined under an `if`
    visit(tree)
    return spans


SPANS = {p: outer_functions(p) for p in TOP}
ran = set()      # (file, first, last) of the outer functions that ran
stack = None     # the top-level files' functions between the script's top level and the step
core = {}        # a code object's file name -> its path if a top-level file, else None


def top_file(name):
    """The top-level file named `name` (a code object's co_filename), or None (cached)."""
    if name not in core:
        path = Path(name).resolve() if name.endswith(".py") else None
        core[name] = path if path in TOP else None
    return core[name]


def holder(path, line):
    """The outer function of `path` holding `line`, or None (module or class level)."""
    return next(((path, a, b) for a, b in SPANS[path] if a <= line <= b), None)


def record(frame, event, arg):
    """sys.setprofile hook: note each top-level file's function that runs; at the first
    optimizer step, the stack, and stop recording."""
    global stack
    if event != "call":
        return
    code = frame.f_code
    if code.co_name == "step" and Path(code.co_filename).parts[-3:-1] == ("torch", "optim"):
        names, f = [], frame.f_back
        while f is not None:   # innermost first, up to the script's top level
            p = top_file(f.f_code.co_filename)
            if p and f.f_code.co_name != "<module>":
                names.append(f"{p.name}:{f.f_code.co_name}")
            f = f.f_back
        stack = names[::-1]
        sys.setprofile(None)
        return
    path = top_file(code.co_filename)
    if path and (fn := holder(path, code.co_firstlineno)):
        ran.add(fn)


def counts():
    """-> {file: lines}: the script whole, and the other files' functions that ran."""
    lines = {SCRIPT.name: len(SCRIPT.read_text().splitlines())}
    for path, a, b in sorted(ran):
        if path != SCRIPT:
            lines[path.name] = lines.get(path.name, 0) + b - a + 1
    return lines


def write_readme(lines, readme=ROOT / "README.md"):
    """Rewrite the lines of the README's reading-order rows and its total row."""
    text = readme.read_text()

    def row(m):   # | n | [file](file) | lines |
        if m[2] not in lines:
            raise SystemExit(f"README.md lists {m[2]}, which the step does not run")
        return f"| {m[1]} | [{m[2]}]({m[3]}) | {lines[m[2]]} |"
    text = re.sub(r"^\| (\d+) \| \[([^\]]+)\]\(([^)]+)\) \| \d+ \|", row, text, flags=re.M)
    text = re.sub(r"^\| \| all \| \d+ files, \d+ lines \|",
                  f"| | all | {len(lines)} files, {sum(lines.values())} lines |", text, flags=re.M)
    readme.write_text(text)


write = "--write" in sys.argv
helping = bool({"-h", "--help"} & set(sys.argv[1:]))
if helping:   # this tool's one flag, then train_lang.py's, which it passes on
    print(f"{__doc__.strip()}\n\n--write: rewrite README.md's reading-order table from the trace; every "
          f"other flag is train_lang.py's:\n")
sys.argv = [str(SCRIPT), *[a for a in sys.argv[1:] if a != "--write"]]
sys.path.insert(0, str(ROOT))
sys.setprofile(record)
try:
    runpy.run_path(str(SCRIPT), run_name="__main__")
finally:
    sys.setprofile(None)
if not helping and stack is None:   # e.g. a finished run in --out_dir, resumed: nothing to count
    raise SystemExit("error: no optimizer step ran (a finished run in --out_dir is resumed, not "
                     "trained: pass a new one); README.md is left as it is")
if not helping:
    lines = counts()
    print(f"from {SCRIPT.name}'s first line to its first optimizer step:")
    for f, n in sorted(lines.items(), key=lambda kv: -kv[1]):
        print(f"  {f:20s} {n:5d} lines")
    print(f"  {len(lines)} files, {sum(lines.values())} lines; on the stack at the step: "
          f"{' -> '.join(stack or ['(no step)'])}")
    if write:
        write_readme(lines)
    if os.environ.get("TRACE_JSON"):   # machine-readable, for the test
        functions = sorted(f"{p.name}:{a}-{b}" for p, a, b in ran)
        Path(os.environ["TRACE_JSON"]).write_text(json.dumps(dict(lines=lines, stack=stack,
                                                                   functions=functions)))
