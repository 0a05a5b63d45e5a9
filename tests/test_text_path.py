"""The text path loads nothing of video (issue 56): train_lang.py's module-level imports, and every
module the text path builds on, leave no video module in a fresh interpreter's sys.modules (the
video tokenizer, the video metrics and evaluator, the robot data, image I/O)."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VIDEO = ["tokenizer_vq", "train_vq", "video_eval", "video_rewards", "imageio", "skimage", "data.robot"]
# the modules a text run may import (train_lang.py's imports may change; these must stay clean)
TEXT = ["eval", "rewards", "tasks", "grpo", "mle", "runtime", "checkpoint", "model", "engine",
        "tokenizer_text", "data.textgame.prepare", "data.webpage.prepare", "data.lights.task"]

# in a fresh interpreter: the import statements (stdin, JSON (where, source) pairs) run one by one
# from the repository root (argv[1]); prints {video module: the first statement that loaded it},
# a package's submodules left out
PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
video, found = json.loads(sys.argv[2]), {}
for where, statement in json.load(sys.stdin):
    exec(statement, {})
    for name in list(sys.modules):
        if name not in found and any(name == v or name.startswith(v + ".") for v in video):
            found[name] = where + statement
print(json.dumps({name: by for name, by in found.items()
                  if not any(name.startswith(package + ".") for package in found)}))
"""


def module_imports(path):
    """The module-level import statements of a file -> [("FILE line N: ", source)]."""
    return [(f"{path.name} line {node.lineno}: ", ast.unparse(node))
            for node in ast.parse(path.read_text()).body
            if isinstance(node, (ast.Import, ast.ImportFrom))]


@pytest.mark.parametrize("what", ["train_lang.py", "text modules"])
def test_the_text_path_imports_no_video_module(what):
    statements = (module_imports(ROOT / what) if what.endswith(".py")
                  else [("", f"import {name}") for name in TEXT])
    assert statements, f"{what}: no module-level import found"
    p = subprocess.run([sys.executable, "-c", PROBE, str(ROOT), json.dumps(VIDEO)], cwd=ROOT,
                       input=json.dumps(statements), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{what}: the imports fail: {p.stderr[-2000:]}"
    found = json.loads(p.stdout)
    assert not found, f"{what} loads video modules:\n" + "\n".join(
        f"  {name} (pulled in by {by})" for name, by in sorted(found.items()))
