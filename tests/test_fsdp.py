"""--fsdp=1 on two gloo ranks (CPU): two GRPO steps sharded by FSDP end with DDP's weights, the checkpoints are the
files DDP writes (checkpoint.load_model reads them), and a run resumed from the step-1 checkpoint ends with the
step-2 weights. The ranks draw different prompts, so their kept groups, micro-batches and sampling rounds differ."""
import argparse
import os
import shutil
import socket

import torch

import grpo
from checkpoint import load_model, read_checkpoint
from model import GPT, GPTConfig
from runtime import Run

STEPS = 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def count_threes(items, completions):
    return [sum(t == 3 for t in c) / 6 for c in completions]


def worker(rank, world, port, fsdp, out, copy_to):
    """One rank of a torchrun-like group: the RL stage of a tiny GPT for STEPS steps, checkpointed every step into
    out/rl.safetensors; rank 0 copies the step-1 checkpoint to copy_to (the watch before step 2's save)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    args = argparse.Namespace(device="cpu", threads=1, seed=0, dtype="float32", resume=1, ckpt_every=1, fsdp=fsdp)
    run = Run(args, out)
    torch.manual_seed(0)   # the same start on every rank and in every group
    model = GPT(GPTConfig.llama(vocab_size=8, block_size=32, n_layer=2, n_head=2, n_embd=16))
    # one round of 3 prompts per step, 3-row micro-batches; rank 0 has 2 chunks per minibatch, rank 1 rewards
    # only its first prompt's samples at step 1 (1 chunk) and nothing at step 2 (no rows: it joins with zeros)
    cfg = grpo.GRPOConfig(group_size=4, max_new_tokens=6, prompts_per_step=3, max_rounds=1, beta=0.01, lr=3e-3,
                          micro_batch=3, warmup=0)
    policy = grpo.make_policy(run, model, cfg)
    g = torch.Generator().manual_seed(1 + rank)   # each rank its own prompts and samples

    def draw(n):   # -> n prompts of 1-3 tokens, and their places in the round
        return [torch.randint(1, 8, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g).tolist()
                for _ in range(n)], list(range(n))

    def reward(items, completions):   # step 1: before the first checkpoint (a resumed run is at step 2)
        first = not (out / "rl.safetensors").exists()
        return [r * (rank == 0 or (i == 0 and first)) for i, r in zip(items, count_threes(items, completions))]

    def watch(step, stats):
        if step == 2 and copy_to:
            shutil.copy(out / "rl.safetensors", copy_to)   # still the step-1 checkpoint
        return {}
    grpo.train_loop(run, policy, grpo.Source(draw, reward), cfg, g, out / "rl.safetensors", STEPS,
                    watch=watch, every=2)
    run.finish()


def group(fsdp, out, copy_to=None):
    out.mkdir(parents=True, exist_ok=True)
    torch.multiprocessing.spawn(worker, args=(2, free_port(), fsdp, out, copy_to), nprocs=2)
    return read_checkpoint(out / "rl.safetensors")[0]


def test_fsdp_matches_ddp_and_resumes_exactly(tmp_path):
    step1 = tmp_path / "step1.safetensors"
    ddp, fsdp = group(0, tmp_path / "ddp"), group(1, tmp_path / "fsdp", copy_to=step1)
    assert ddp.keys() == fsdp.keys() and any(k.startswith("model.h.1.") for k in ddp)
    # the gradients are reduced in another order (FSDP's reduce-scatter and sharded norm): equal to 1e-6
    torch.manual_seed(0)
    start = GPT(GPTConfig.llama(vocab_size=8, block_size=32, n_layer=2, n_head=2, n_embd=16)).state_dict()
    moved = max((ddp["model." + k] - t).abs().max().item() for k, t in start.items() if "model." + k in ddp)
    assert moved > 1e-3   # the two steps did move the weights
    for k in ddp:
        torch.testing.assert_close(fsdp[k], ddp[k], atol=1e-6, rtol=0, msg=k)
    # the step-1 checkpoint is resumable (optimizer and every rank's generators in it) and loads as a model
    tensors, meta = read_checkpoint(step1)
    assert meta["step"] == 1 and any(k.startswith("optim.") for k in tensors) and "state.rng1" in tensors
    model, _ = load_model(step1)
    assert not torch.equal(model.state_dict()["h.0.attn.c_attn.weight"], fsdp["model.h.0.attn.c_attn.weight"])
    # resumed from step 1 under FSDP: the uninterrupted run's step-2 weights, bit for bit
    (tmp_path / "again").mkdir()
    shutil.copy(step1, tmp_path / "again" / "rl.safetensors")
    again = group(1, tmp_path / "again")
    assert all(torch.equal(again[k], fsdp[k]) for k in fsdp)
