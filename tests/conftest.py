"""Shared test settings: one torch thread everywhere (tiny models run fastest on one thread, and CI has two cores),
`pair`, a tiny HF model with ours loaded from its files (test_model.py and test_engine.py), and `from_script`, the
definitions of a script that runs when imported (train_lang.py's PromptPool)."""
import ast
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(params=["gpt2", "qwen2", "qwen2_tied"])
def pair(request, tmp_path):
    pytest.importorskip("transformers")
    from checkpoint import load_model
    from test_model import hf_gpt2, hf_qwen2
    if request.param == "gpt2":
        hf = hf_gpt2(tmp_path)
    else:
        hf = hf_qwen2(tmp_path, tie=request.param == "qwen2_tied")
    return hf, load_model(tmp_path)[0].eval()


def from_script(script, *names):
    """The top-level definitions `names` of a script that runs when imported (train_lang.py), executed with the
    script's imports alone, so a test calls them without the run -> a list of them, in the order asked."""
    path = ROOT / script
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) or getattr(n, "name", None) in names]
    namespace = {}
    exec(compile(ast.Module(keep, type_ignores=[]), str(path), "exec"), namespace)
    return [namespace[name] for name in names]
