"""The reading path's shape, checked rather than promised: no line over 100 columns in the files a
student reads first, and no function in grpo.py over 40 lines (each is one of the README's seven
steps or a helper of one)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NARROW = ["model.py", "load_hf.py", "engine.py", "grpo.py", "rewards.py", "rewards_video.py",
          "tokenizer_text.py", "bpe.py", "train_lang.py", "tasks.py", "mle.py",
          "data/textgame/task.py"]


@pytest.mark.parametrize("name", NARROW)
def test_lines_fit_100_columns(name):
    lines = (ROOT / name).read_text().splitlines()
    wide = [i + 1 for i, line in enumerate(lines) if len(line) > 100]
    assert not wide, f"{name}: lines over 100 columns: {wide[:10]}"


def test_grpo_functions_are_short():
    tree = ast.parse((ROOT / "grpo.py").read_text())
    long = [(f.name, f.end_lineno - f.lineno + 1) for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and f.end_lineno - f.lineno + 1 > 40]
    assert not long, f"grpo.py: functions over 40 lines: {long}"
