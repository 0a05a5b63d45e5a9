"""tools.memory.memory_estimate against the measured peak of one RLVR step on the CPU, at a mid-size shape where the
model, its optimizer, activations and logits dwarf the interpreter: within 25%. The process's peak resident memory
(VmHWM, reset after the imports) is what the step adds."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

MEASURE = """
import copy, json, sys, torch
from grpo import Env, GRPOConfig, grpo_step
from model import GPT, GPTConfig
from tools.memory import memory_estimate
torch.set_num_threads(1)
def rss(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
L, new, B, G, mb, ckpt = 600, 64, 2, 4, 8, int(sys.argv[1])
config = GPTConfig.llama(vocab_size=32768, block_size=L + new + 8, n_layer=4, n_head=8, n_kv_head=2, n_embd=512,
                         mlp_hidden=1376, tie_embeddings=False)
base = rss("VmRSS")
open("/proc/self/clear_refs", "w").write("5")   # the peak counts from here
torch.manual_seed(0)
model = GPT(config)
model.grad_ckpt = bool(ckpt)
ref = copy.deepcopy(model).eval().requires_grad_(False)
cfg = GRPOConfig(prompts_per_step=0, group_size=G, max_new_tokens=new, minibatches=1, micro_batch=mb)
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(1, 32768, (L,), generator=g).tolist() for _ in range(B)]
opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
stats = grpo_step(model, ref, opt, prompts, [None] * B,
                  Env(lambda items, comps: [float(i % 2) for i in range(len(comps))]), cfg, g)
assert stats["groups_kept"] == B and len(stats) > 0
peak = rss("VmHWM") - base
est = memory_estimate(config, False, True, bool(ckpt), L, new, B, G, mb, B)
print(json.dumps(dict(peak=peak, est=est["peak"])))
"""


@pytest.mark.parametrize("grad_ckpt", [0, 1])
def test_estimate_is_within_a_quarter_of_the_measured_peak(grad_ckpt):
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc to reset and read the peak resident memory")
    p = subprocess.run([sys.executable, "-c", MEASURE, str(grad_ckpt)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["peak"] > 5e8, r                                 # the step, not the interpreter, is measured
    assert abs(r["est"] - r["peak"]) <= 0.25 * r["peak"], r


def test_the_readme_scale_command_fits_80_gb():
    """The README's 1-GPU command at R1-Distill-Qwen-1.5B's shape, 3k-token prompts and 1,024 new tokens."""
    from model import GPTConfig
    from tools.memory import memory_estimate
    qwen = GPTConfig.llama(vocab_size=151936, block_size=8192, n_layer=28, n_head=12, n_kv_head=2, n_embd=1536,
                           mlp_hidden=8960, qkv_bias=True, tie_embeddings=False)
    # --dtype=bfloat16 --grad_ckpt=1 --prompts_per_step=16 --group_size=8 --micro_batch=4 (a chunk: 2 prompts)
    est = memory_estimate(qwen, True, True, True, 3000, 1024, 16, 8, 4, 2)
    assert est["weights"] == pytest.approx(4 * 1.777e9, rel=0.01) and est["peak"] < 80e9, est


def test_the_readme_8_gpu_recipe_fits_80_gb_per_rank():
    """--recipe=paper on 8 ranks: 128 prompts in all, 16 a rank x 5 samples, the official longest prompts (7,192) and
    answers (4,096), micro-batches of 2 (a chunk: 2 prompts); 128 prompts on one rank would not fit (rollout chunks)."""
    from model import GPTConfig
    from tools.memory import memory_estimate, prompts_per_chunk
    qwen = GPTConfig.llama(vocab_size=151936, block_size=16384, n_layer=28, n_head=12, n_kv_head=2, n_embd=1536,
                           mlp_hidden=8960, qkv_bias=True, tie_embeddings=False)
    est = memory_estimate(qwen, True, True, True, 7192, 4096, 16, 5, 2, prompts_per_chunk(16, 5, 2, 2))
    assert est["peak"] < 80e9, est
    assert memory_estimate(qwen, True, True, True, 7192, 4096, 128, 5, 2, 2)["peak"] > 80e9


def test_a_7b_model_on_8_ranks_with_fsdp():
    """Qwen2-7B's shape on 8 ranks, the README's 8-GPU command with --fsdp=1 (--dtype=bfloat16 --grad_ckpt=1
    --recipe=paper: 16 prompts a rank x 5, micro-batches of 2, the longest prompts and answers), all 16 sampled at once
    (what rlvr_memory fixes on an 80 GB GPU). Each rank holds 1/8 of the weights, gradients, AdamW state and bf16
    reference; FSDP gathers the weights in bf16 (Run.shard's MixedPrecisionPolicy: no autocast casts, a bf16
    residual) and what it gathers whole takes turns: the sampler's weights (+ KV cache; then bf16's old log-probs),
    the reference (its log-probs), the update's root and block (+ activations and logits: the peak). Under 70 GB a
    rank (DDP: over 190)."""
    from model import GPTConfig
    from tools.memory import memory_estimate, prompts_per_chunk
    qwen = GPTConfig.llama(vocab_size=152064, block_size=16384, n_layer=28, n_head=28, n_kv_head=4, n_embd=3584,
                           mlp_hidden=18944, qkv_bias=True, tie_embeddings=False)
    args = (qwen, True, True, True, 7192, 4096, 16, 5, 2, prompts_per_chunk(16, 5, 2, 2))
    ddp, fsdp = memory_estimate(*args), memory_estimate(*args, world=8, fsdp=True)
    assert ddp["weights"] == pytest.approx(4 * 7.616e9, rel=0.01) and ddp["peak"] > 190e9, ddp
    assert all(fsdp[k] == ddp[k] / 8 for k in ("weights", "grads", "adamw", "reference")), fsdp
    assert fsdp["sampler_weights"] == fsdp["reference_gathered"] == ddp["reference"] and not fsdp["autocast_copy"]
    update = sum(fsdp[k] for k in ("weights", "grads", "adamw", "reference", "units", "activations", "logits"))
    assert fsdp["peak"] == pytest.approx(update) and 60e9 < fsdp["peak"] <= 70e9, fsdp


def test_rollout_prompts_are_fixed_by_the_flags_and_the_gpus_size(monkeypatch):
    """On a GPU, tools.memory.rlvr_memory fixes the prompts a rollout samples at once (GRPOConfig.rollout_prompts 0):
    the most whose rollout (what a step holds throughout, the sampler's weights, their KV cache) fits 80% of the GPU by
    the estimate, from its size alone: torch.cuda.mem_get_info, whose free memory counts PyTorch's cached blocks as
    taken (less after an update, more in a resumed process), is never read. Recorded in the checkpoints; the CPU's:
    all at once."""
    from dataclasses import replace
    from types import SimpleNamespace

    import torch

    from grpo import GRPOConfig
    from model import GPTConfig
    from tools.memory import HELD, memory_estimate, prompts_per_chunk, rlvr_memory

    def unused(*a):
        raise AssertionError("free memory read")
    monkeypatch.setattr(torch.cuda, "mem_get_info", unused)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=80e9))
    qwen = GPTConfig.llama(vocab_size=151936, block_size=16384, n_layer=28, n_head=12, n_kv_head=2, n_embd=1536,
                           mlp_hidden=8960, qkv_bias=True, tie_embeddings=False)
    cfg = GRPOConfig(group_size=5, micro_batch=2, max_new_tokens=4096)   # 128 prompts on one GPU, bf16

    def rollout(n):   # the rollout's memory, n prompts at once
        e = memory_estimate(qwen, True, True, True, 7192, 4096, n, 5, 2, prompts_per_chunk(128, 5, 2, 2))
        return e, sum(e[k] for k in (*HELD, "sampler_weights", "kv_cache"))
    run = SimpleNamespace(args=SimpleNamespace(dtype="bfloat16"), device="cuda:0", world=1, fsdp=False, recorded={})
    parts, fixed = rlvr_memory(run, qwen, cfg, 128, 7192, True)
    n = fixed.rollout_prompts
    assert 1 < n < 128 and rollout(n)[1] <= 0.8 * 80e9 < rollout(n + 1)[1] and parts == rollout(n)[0], n
    assert run.recorded == {"rollout_prompts": n} and fixed == replace(cfg, rollout_prompts=n)
    # all that fit: all at once; a given number: kept; the CPU: all at once, nothing recorded
    assert rlvr_memory(run, qwen, cfg, 16, 7192, True)[1].rollout_prompts == 16
    assert rlvr_memory(run, qwen, replace(cfg, rollout_prompts=3), 128, 7192, True)[1].rollout_prompts == 3
    cpu = SimpleNamespace(args=SimpleNamespace(dtype="float32"), device="cpu", world=1, fsdp=False, recorded={})
    assert rlvr_memory(cpu, qwen, cfg, 128, 7192, True)[1] == cfg and cpu.recorded == {}
