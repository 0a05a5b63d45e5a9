"""Smoke test of the bench/ scripts and research/rl_headroom.py: each runs in its tiniest mode and prints its table. Not a timing test: the
numbers are not checked, only that every script still runs against the current code (TRL's is skipped without trl).
And the bandwidth bounds' traffic model (bench/common.py's decode_traffic) against what the sampler reads."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import engine
import engine_static
from model import GPT, GPTConfig, KVCache

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {"bench/bench_rollout.py": "ours / HF", "bench/bench_grpo.py": "TRL / ours", "bench/bench_mle.py": "MFU",
           "bench/bench_rewards.py": "ours / scikit-image", "bench/bench_e2e.py": "live tensors",
           "research/rl_headroom.py": "best-of-G"}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_bench_script_runs_tiny(script):
    if script == "bench/bench_grpo.py" and importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed (pip install -r requirements-dev.txt)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([sys.executable, str(ROOT / script), "--tiny"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert SCRIPTS[script] in p.stdout and ("machine:" in p.stdout or script.startswith("research")), p.stdout[-3000:]


def bench_common():
    spec = importlib.util.spec_from_file_location("bench_common", ROOT / "bench" / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONFIGS = {"gpt2": dict(norm="layernorm", pos="learned", mlp="gelu", bias=True),
           "qwen2": dict(qkv_bias=True, tie_embeddings=False, n_kv_head=2),
           "llama_tied": dict(n_kv_head=1)}


@pytest.mark.parametrize("family", sorted(CONFIGS))
@pytest.mark.parametrize("static", [False, True])
def test_decode_traffic_counts_the_weights_and_cache_engine_reads(family, static, monkeypatch):
    """bench/common.py's decode_traffic, pure arithmetic on the config, against the model's
    parameters and the keys and values engine's decode steps actually read (a wrapped write)."""
    config = GPTConfig(vocab_size=96, block_size=64, n_layer=2, n_head=4, n_embd=32,
                       **CONFIGS[family])
    model = GPT(config).eval()
    prompts, S, new = [[1, 2, 3], [4, 5, 6, 7, 8]], 3, 6
    R, P = len(prompts) * S, 5
    parts = bench_common().decode_traffic(config, 4, len(prompts), P, S, new, static=static)
    # weights: every parameter once (tied: one matrix), of the embeddings the R rows looked up
    unique = {id(p): p for p in model.parameters()}.values()
    lookups = [model.wte.weight] + ([model.wpe.weight] if model.wpe is not None else [])
    untied = sum(w.numel() for w in lookups) - (model.wte.weight.numel() if config.tie_embeddings
                                                 else 0)
    expect = sum(p.numel() for p in unique) - untied + R * config.n_embd * len(lookups)
    assert parts["weights"] == 4 * expect
    read = []   # bytes of keys and values per decode_attention call: prompt's, row's, written

    def recorded(cls):
        def write(self, layer, k, v, _write=cls.write):
            kn, vn = _write(self, layer, k, v)
            prompt = self.prompt_k[layer].nbytes + self.prompt_v[layer].nbytes
            read.append(prompt + kn.nbytes + vn.nbytes + k.nbytes + v.nbytes)
            return kn, vn
        return write
    for cls in (KVCache, engine_static.StaticCache):
        monkeypatch.setattr(cls, "write", recorded(cls))
    toks, _ = engine.generate(model, prompts, new, generator=torch.Generator().manual_seed(0),
                              num_samples=S, graphs=static)
    assert toks.shape == (R, new) and len(read) == config.n_layer * (new - 1)
    assert parts["cache"] == pytest.approx(sum(read) / (new - 1))
