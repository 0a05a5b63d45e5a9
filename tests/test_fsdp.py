"""--fsdp=1 on two gloo ranks (CPU): three GRPO steps sharded by FSDP, a unit per block (the KL's reference too),
end with DDP's weights (with activation checkpointing too; in bf16 FSDP gathers bf16 weights, its shards stay
float32), the checkpoints are the files DDP writes (checkpoint.load_model reads them), and a run resumed from the
step-1 checkpoint ends with the step-3 weights (DDP, FSDP in float32 and bf16; so does one resumed under FSDP from
DDP's step-1 checkpoint), rank 0 deciding: rank 1's own folder holds another run's finished checkpoint. The ranks
draw different prompts, so their kept groups and micro-batches differ: rank 1 has fewer chunks in a minibatch (FSDP's
padding chunks) or none (at step 3). The FSDP groups run under TORCH_DISTRIBUTED_DEBUG=DETAIL: gloo raises on a
collective the ranks disagree on (torch 2.13's DDP crashes under it on a CPU: the DDP groups run without)."""
import argparse
import os
import shutil
import socket

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import grpo
from checkpoint import load_model, read_checkpoint
from model import GPT, GPTConfig, is_fsdp
from research import common  # train_lang.py's RL loop as a function
from runtime import Run, no_sync_unless_last, unsharded

STEPS = 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def count_threes(items, completions):
    return [sum(t == 3 for t in c) / 6 for c in completions]


def worker(rank, world, runs):
    """One rank of torchrun-like groups, one after the other: for each (port, fsdp, out, start) of `runs`, the RL stage
    of a tiny GPT for STEPS steps, checkpointed every step into out/rl.safetensors (first copied from `start`, to
    resume); rank 0 keeps the step-1 checkpoint as out/step1.safetensors (the watch before step 2's save). A resumed
    group's rank 1 works in a folder of its own, out/rank1, holding the first run's finished checkpoint."""
    for port, fsdp, out, start, dtype, *grad_ckpt in runs:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                          WORLD_SIZE=str(world), TORCH_DISTRIBUTED_DEBUG="DETAIL" if fsdp else "OFF")
        dist.set_debug_level_from_env()
        own = out / "rank1" if start and rank == 1 else out
        own.mkdir(parents=True, exist_ok=True)
        if start:   # before the group forms: rank 1 waits for rank 0 there
            shutil.copy(start if rank == 0 else runs[0][2] / "rl.safetensors", own / "rl.safetensors")
        train(Run(argparse.Namespace(device="cpu", threads=1, seed=0, dtype=dtype, resume=1, ckpt_every=1,
                                     fsdp=fsdp, grad_ckpt=int(bool(grad_ckpt))), own), rank, own, bool(grad_ckpt))


def train(run, rank, out, grad_ckpt):
    torch.manual_seed(0)   # the same start on every rank and in every group
    model = GPT(GPTConfig.llama(vocab_size=8, block_size=32, n_layer=2, n_head=2, n_embd=16))
    # one round of 3 prompts per step, 3-row micro-batches: rank 0 has 2 chunks per minibatch, rank 1 keeps at most
    # its first prompt's group (1 chunk, or none: then it joins the others' collectives with zeros)
    cfg = grpo.GRPOConfig(group_size=4, max_new_tokens=6, prompts_per_step=3, max_rounds=1, beta=0.01, lr=3e-3,
                          micro_batch=3, warmup=0)
    parts = common.policy(run, model, cfg, grad_ckpt)   # research/common.py: train_lang.py's RL loop
    model, ref = parts[0], parts[2]   # the policy and its reference: DTensor shards (FSDP), a block a unit
    sharded = [isinstance(p, DTensor) for m in (model, ref) for p in (m.wte.weight, m.h[0].attn.c_attn.weight)]
    with unsharded(model):   # the weights FSDP gathers for the forwards, then those AdamW steps
        dtypes = [model.h[0].attn.c_attn.weight.dtype]
    dtypes.append(model.h[0].attn.c_attn.weight.dtype)
    (out / f"sharded{rank}.txt").write_text(f"{sharded} {is_fsdp(model.h[0])} {is_fsdp(ref.h[0])} {dtypes}")
    g = torch.Generator().manual_seed(2 + rank)   # each rank its own prompts and samples

    def draw(n):   # -> n prompts of 2-4 tokens, their places in the round
        return [torch.randint(1, 8, (int(torch.randint(2, 5, (1,), generator=g)),), generator=g).tolist()
                for _ in range(n)], list(range(n))

    def reward(items, completions):   # rank 1: 1 for its first prompt's samples that start with a 3
        if rank == 0:
            return count_threes(items, completions)
        r = [float(i == 0 and c[:1] == [3]) for i, c in zip(items, completions)]
        with open(out / "rank1_kept.txt", "a") as f:   # the group has spread: it is kept
            f.write(str(int(len(set(r)) > 1)))
        return r

    def probe():   # before step 1, after step 2 (and the last)
        probes.append(1)
        if len(probes) == 2:
            shutil.copy(out / "rl.safetensors", out / "step1.safetensors")   # not yet step 2's
        return {}
    probes = []
    pads, join = [], grpo.join_passes   # the passes without rows a rank runs (fewer micro-batches than another's)
    grpo.join_passes = lambda policy, n, autocast: (n and pads.append(n)) or join(policy, n, autocast)
    common.rl_loop(run, parts, grpo.Env(reward, draw=draw), cfg, g, out / "rl.safetensors", STEPS,
                   probe=probe, every=2)
    grpo.join_passes = join
    (out / f"pads{rank}.txt").write_text(str(pads))
    if run.fsdp and out.name == "fsdp":
        one_token_chunk(run, parts[1], rank, out)
    run.finish()


def one_token_chunk(run, policy, rank, out):
    """Rank 0's chunk holds only 1-token prompts (an empty prompt pass), rank 1's longer ones: both run every block
    twice, and the sharded gradients are those of the whole model on both chunks."""
    def logp_sum(model, r):
        prompts = [[3], [5]] if r == 0 else [[1, 2, 3], [4, 5]]
        tokens = torch.randint(0, 8, (4, 5), generator=torch.Generator().manual_seed(r))
        b = grpo.Batch(*grpo.pack(prompts, tokens), torch.tensor([0, 0, 1, 1]), None, None, None, None)
        return grpo.logprobs_shared_prompts(model, b, [0, 1, 2, 3], grpo.GRPOConfig())[0].sum()
    whole = GPT(policy.config)
    whole.load_state_dict({k: v.full_tensor() for k, v in policy.state_dict().items()})
    for r in (0, 1):
        logp_sum(whole, r).backward()
    policy.zero_grad(set_to_none=True)
    with no_sync_unless_last(policy, True):
        logp_sum(policy, rank).backward()
    equal = all(torch.allclose(2 * p.grad.full_tensor(), q.grad, atol=1e-5)   # FSDP: the mean over 2 ranks
                for p, q in zip(policy.parameters(), whole.parameters()))
    (out / f"one_token{rank}.txt").write_text(str(equal))


def test_fsdp_matches_ddp_and_resumes_exactly(tmp_path):
    names = ("ddp", "fsdp", "again", "switched", "bf16", "bf16_again", "ckpt", "bf16_ckpt", "ddp_again")
    ddp, fsdp, again, switched, bf16, bf16_again, ckpt, bf16_ckpt, ddp_again = (tmp_path / name for name in names)
    runs = [(free_port(), 0, ddp, None, "float32"), (free_port(), 0, ddp_again, ddp / "step1.safetensors", "float32"),
            (free_port(), 1, fsdp, None, "float32"),
            (free_port(), 1, again, fsdp / "step1.safetensors", "float32"),
            (free_port(), 1, switched, ddp / "step1.safetensors", "float32"),   # --fsdp may change on resume
            (free_port(), 1, bf16, None, "bfloat16"),   # bf16 autocast: the sampler's cast copy is not taken
            (free_port(), 1, bf16_again, bf16 / "step1.safetensors", "bfloat16"),
            (free_port(), 1, ckpt, None, "float32", True),   # activation checkpointing: its blocks recomputed
            (free_port(), 1, bf16_ckpt, None, "bfloat16", True)]   # and recast (no autocast cache)
    torch.multiprocessing.spawn(worker, args=(2, runs), nprocs=2)
    sharded = [(out / f"sharded{r}.txt").read_text() for out in (ddp, fsdp, bf16_ckpt) for r in (0, 1)]
    # DDP's whole weights; FSDP's DTensor shards, the root's and each block's (a unit of its own), the reference's too;
    # the weights the forwards see (DDP's module's, FSDP's gathered ones), then those AdamW steps
    f32, bf16_gathered = "[torch.float32, torch.float32]", "[torch.bfloat16, torch.float32]"
    assert sharded == ([f"[False, False, False, False] False False {f32}"] * 2
                       + [f"[True, True, True, True] True True {f32}"] * 2
                       + [f"[True, True, True, True] True True {bf16_gathered}"] * 2)
    # rank 1 keeps one group at steps 1 and 2 (a chunk a minibatch; rank 0 has 2: one padding chunk), none at 3
    assert (fsdp / "rank1_kept.txt").read_text() == "110"
    # (passes without rows only on the rank with fewer micro-batches: rank 0 never)
    assert [(fsdp / f"pads{r}.txt").read_text() for r in (0, 1)] == ["[]", "[1, 1, 1, 1, 2, 2]"]
    assert [(fsdp / f"one_token{r}.txt").read_text() for r in (0, 1)] == ["True", "True"]
    step1 = fsdp / "step1.safetensors"
    ddp, fsdp, again, switched, bf16, bf16_again, ckpt, bf16_ckpt, ddp_again = (
        read_checkpoint(out / "rl.safetensors")[0]
        for out in (ddp, fsdp, again, switched, bf16, bf16_again, ckpt, bf16_ckpt, ddp_again))
    assert ddp.keys() == fsdp.keys() and any(k.startswith("model.h.1.") for k in ddp)
    torch.manual_seed(0)
    start = GPT(GPTConfig.llama(vocab_size=8, block_size=32, n_layer=2, n_head=2, n_embd=16)).state_dict()
    assert max((ddp["model." + k] - t).abs().max().item() for k, t in start.items() if "model." + k in ddp) > 1e-3
    # DDP's weights (FSDP reduces each chunk's gradients and their norm in another order: equal within 1e-5)
    for k in ddp:
        torch.testing.assert_close(fsdp[k], ddp[k], atol=1e-5, rtol=0, msg=k)
        torch.testing.assert_close(switched[k], ddp[k], atol=1e-5, rtol=0, msg=k)   # DDP's step 1, then FSDP
        torch.testing.assert_close(ckpt[k], ddp[k], atol=1e-5, rtol=0, msg=k)
    # the step-1 checkpoint is resumable (optimizer and every rank's generators in it) and loads as a model
    tensors, meta = read_checkpoint(step1)
    assert meta["step"] == 1 and any(k.startswith("optim.") for k in tensors) and "state.rng1" in tensors
    model, _ = load_model(step1)
    assert not torch.equal(model.state_dict()["h.0.attn.c_attn.weight"], fsdp["model.h.0.attn.c_attn.weight"])
    # resumed from step 1 (rank 0's checkpoint, not rank 1's finished one): the uninterrupted run's step-3 weights, bit
    # for bit (DDP, FSDP, bf16 too)
    assert all(torch.equal(ddp_again[k], ddp[k]) for k in ddp) and all(torch.equal(again[k], fsdp[k]) for k in fsdp)
    assert all(torch.equal(bf16_again[k], bf16[k]) for k in bf16) and not torch.equal(bf16[k], fsdp[k])
    # bf16 with checkpointing (no autocast cache) runs; its weights differ from bf16's by rounding: uncached, a
    # weight's gradient sums its two passes' (prompts, rows) in float32, not in one shared bf16 cast
    assert bf16_ckpt.keys() == bf16.keys() and all(torch.isfinite(t).all() for t in bf16_ckpt.values())
