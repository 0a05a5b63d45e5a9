"""Shared test settings: one torch thread everywhere (tiny models run fastest on one thread, and CI has two cores),
and `pair`, a tiny HF model with ours loaded from its files (test_model.py and test_engine.py)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(params=["gpt2", "qwen2", "qwen2_tied"])
def pair(request, tmp_path):
    pytest.importorskip("transformers")
    from model import GPT
    from test_model import hf_gpt2, hf_qwen2
    if request.param == "gpt2":
        hf = hf_gpt2(tmp_path)
    else:
        hf = hf_qwen2(tmp_path, tie=request.param == "qwen2_tied")
    return hf, GPT.from_pretrained(tmp_path).eval()
