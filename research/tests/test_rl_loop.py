"""research/common.rl_loop, train_lang.py's RL loop as a function for the studies: it logs the probe, counts the
compute into the control's budget, resumes exactly, and keeps the totals after a skipped step."""
import argparse
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from checkpoint import read_meta  # noqa: E402
from grpo import Env, GRPOConfig  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from research import common  # noqa: E402
from runtime import ComputeBudget, Run  # noqa: E402

torch.set_num_threads(1)


def count_threes(items, completions):
    return [float(sum(t == 3 for t in c)) for c in completions]


def loop_run(tmp_path):
    """A runtime.Run in tmp_path and the loop's pieces: a tiny policy, a draw, a reward."""
    args = argparse.Namespace(device="cpu", threads=1, seed=0, dtype="float32", resume=1, ckpt_every=2)
    tmp_path.mkdir(exist_ok=True)
    run = Run(args, tmp_path)
    cfg = GRPOConfig(group_size=4, max_new_tokens=6, prompts_per_step=2, beta=0.01, lr=3e-3, entropy_coef=0.0,
                     minibatches=1)
    torch.manual_seed(1)
    model = GPT(GPTConfig.gpt2(vocab_size=8, block_size=16, n_layer=1, n_head=2, n_embd=16))
    parts = common.policy(run, model, cfg)

    def draw(n):
        return [[1 + i % 5] for i in range(n)], [None] * n
    return run, parts, Env(count_threes, draw=draw), cfg


def test_rl_loop_logs_probes_counts_compute_and_resumes_exactly(tmp_path):
    seen = []

    def probe():
        seen.append(len(seen))
        return {"probe": float(len(seen))}
    run, parts, source, cfg = loop_run(tmp_path / "a")
    budget = ComputeBudget()
    last = common.rl_loop(run, parts, source, cfg, torch.Generator().manual_seed(1), tmp_path / "a" / "rl.safetensors",
                          5, budget, probe, every=2)
    rows = [json.loads(line) for line in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    assert len(seen) == 4 and [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]   # before step 1, after 2, 4, 5
    assert rows[0] == {"stage": "rlvr", "step": 0, "probe": 1.0} and rows[2]["probe"] == 2.0
    assert budget.closed.is_set() and budget.rl.value == last["rl_compute"] == sum(r.get("compute", 0) for r in rows)
    # the same loop stopped during step 4 (its last checkpoint: step 2) and re-run ends with the same weights
    calls = []

    def stop_at_4():
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {}
    ckpt = tmp_path / "b" / "rl.safetensors"
    with pytest.raises(KeyboardInterrupt):
        common.rl_loop(*loop_run(tmp_path / "b"), torch.Generator().manual_seed(1), ckpt, 5, probe=stop_at_4,
                       every=2)
    run, parts, source, cfg = loop_run(tmp_path / "b")
    common.rl_loop(run, parts, source, cfg, torch.Generator().manual_seed(1), ckpt, 5)
    # a probe with nothing to say before the first step: no row
    assert json.loads((tmp_path / "b" / "log.jsonl").read_text().splitlines()[0])["step"] == 1
    a, b = load_file(str(tmp_path / "a" / "rl.safetensors")), load_file(str(ckpt))
    assert a.keys() == b.keys() and all(torch.equal(t, a[k]) for k, t in b.items())


def test_rl_loop_checkpoint_keeps_the_totals_after_a_skipped_step(tmp_path):
    """--on_nan=skip: the last step's reward is NaN, so it is skipped, and the finished stage's checkpoint still
    records the run's time and compute (the control's budget, a resume's start)."""
    run, parts, source, cfg = loop_run(tmp_path)
    run.args.on_nan = "skip"
    calls = []

    def nan_on_second_step(items, completions):
        calls.append(1)
        return [float("nan")] * len(completions) if len(calls) > 1 else count_threes(items, completions)
    source.reward_fn = nan_on_second_step
    cfg.max_rounds = 1   # a step: one call of the reward
    common.rl_loop(run, parts, source, cfg, torch.Generator().manual_seed(1), tmp_path / "rl.safetensors", 2)
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r.get("skipped") is not None for r in rows] == [False, True]
    meta = read_meta(tmp_path / "rl.safetensors")
    assert meta["metrics"]["done"] and meta["metrics"]["rl_compute"] == rows[0]["rl_compute"] > 0
