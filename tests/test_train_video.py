"""End-to-end runs of train_video.py on tiny settings (subprocesses, ~1 min in all): every stage in
both modes from a tiny train_vq.py tokenizer, the evaluation CLI, RT-1-shaped episodes, the flag
count, and a 2-process torchrun
(gloo) RLVR run that must end with equal weights; and a static check that the functions of
train_video.py and train_vq.py read no module variable."""
import ast
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import mle
from data.robot.prepare import generate_split
from data.robot.task import write_action_stats

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--mle_steps=3", "--batch_size=2", "--n_layer=1", "--n_embd=32", "--rl_steps=2", "--prompts_per_step=2",
        "--group_size=2", "--horizon=3", "--micro_batch=4", "--threads=1", "--clip_len=8"]
TINY_VQ = ["--steps=3", "--batch=4", "--n_codes=32", "--threads=1", "--clip_len=8"]   # train_vq.py's
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run(cmd, timeout=120):
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=ENV)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout + r.stderr


def train(*args, timeout=120):
    return run([sys.executable, "train_video.py", *map(str, args), *TINY], timeout)


def tokenizer(data, out):
    """A tiny tokenizer of train_vq.py on `data` -> its file."""
    run([sys.executable, "train_vq.py", "--data", data, "--out_dir", out, *TINY_VQ])
    return out / "video_vq.safetensors"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Tiny embedded-format data, a tiny tokenizer (train_vq.py) and a full --stage=all run from scratch in
    multi-step mode."""
    tmp = tmp_path_factory.mktemp("video")
    for split, n in (("train", 6), ("val", 2), ("test", 2)):
        generate_split(tmp / "data", split, n, length=8)
    write_action_stats(tmp / "data")
    vq = tokenizer(tmp / "data", tmp / "vq")
    out = train("--data", tmp / "data", "--out_dir", tmp / "out", "--init=scratch", "--mode=multi", "--vq", vq)
    return tmp, out


@pytest.mark.slow
def test_all_stages_from_scratch_multi_step(trained):
    tmp, out = trained
    o = tmp / "out"
    for f in ("video_vq", "video_mle", "video_rlvr"):
        assert (o / f"{f}.safetensors").is_file()
    assert "reward: mae+ssim - 1 x moving MAE - 0.5 x object miss (no LPIPS" in out
    rows = json.loads((o / "eval.json").read_text())
    assert set(rows) == {"mle", "rlvr", "mle_more"}
    for r in rows.values():
        assert r["horizon"] == 3 and r["n"] == 2 * 2 * 3 and r["lpips"] is None
        assert {"mae", "mse", "psnr", "ssim", "repetition_rate", "mae_moving", "copy_last_frame",
                "tokenizer_ceiling", "objects", "per_record", "sampled"} <= set(r)
        # one entry per test window (2 clips x 2 windows of 3 frames), the same windows in every row
        assert r["per_record"]["windows"] == [[0, 0], [0, 3], [1, 0], [1, 3]]     # (clip, first frame)
        assert [len(r["per_record"][k]) for k in ("mae", "ssim", "repetition")] == [4, 4, 4]
        assert r["per_record"]["windows"] == rows["mle"]["per_record"]["windows"]
        assert len(r["copy_last_frame"]["per_record"]["mae"]) == 4
        assert r["sampled"]["temperature"] == 1.0 and r["sampled"]["top_k"] == 100
        assert len(r["sampled"]["per_record"]["mae"]) == 4
    # the control trained for RLVR's compute, from the same start
    rl_meta = json.loads((o / "video_rlvr.json").read_text())
    assert rl_meta["metrics"]["rl_seconds"] > 0
    control = json.loads((o / "video_mle_more.json").read_text())["metrics"]
    assert 0 < rl_meta["metrics"]["rl_compute"] <= control["compute"]
    assert rows["mle_more"]["checkpoint"].endswith("video_mle_more.safetensors")
    stages = [json.loads(line)["stage"] for line in (o / "log.jsonl").read_text().splitlines()]
    assert {"mle", "rlvr", "mle_more"} <= set(stages)
    assert re.search(r"rlvr - mle_more +mae +all +[-+]\d\.\d{5}  \[", out), out[-3000:]
    assert re.search(r"rlvr - copy +ssim +all", out) and "sampled at T=1 top-k 100:" in out
    # the run on one page (tools/report.py): its curves, every model's rollout drawn, step by step
    page = (o / "report.md").read_text()
    assert "![curves per GRPO step](curves.svg)" in page and "Not drawn" not in page
    assert all((o / f).is_file() for f in ("curves.svg", "strip.png", "rollout.gif"))


@pytest.mark.slow
def test_single_step_rlvr_from_a_checkpoint_and_eval_cli(trained):
    tmp, _ = trained
    o = tmp / "single"
    train("--data", tmp / "data", "--out_dir", o, "--stage=rlvr", "--init", tmp / "out" / "video_mle.safetensors",
          "--mode=single")
    rows = json.loads((o / "eval.json").read_text())
    assert rows["rlvr"]["horizon"] == 1 and set(rows) == {"mle", "rlvr", "mle_more"}
    out = run([sys.executable, "eval.py", "--task=video", "--ckpt", o / "video_rlvr.safetensors", "--data",
               tmp / "data", "--json", o / "e.json", "--grid", o / "g.png", "--official=1", "--mode=single",
               "--compare", tmp / "out" / "video_mle.safetensors"])     # the multi-step MLE model, used single-step
    res = json.loads((o / "e.json").read_text())
    ck = str(o / "video_rlvr.safetensors")
    assert res[ck]["n"] == 2 * 7 and len(res[ck]["per_record"]["mae"]) == 14 and (o / "g.png").is_file()
    assert res[ck]["sampled"]["top_k"] == 100 and res[ck]["top_k"] is None       # greedy row, official row
    assert "0:video_rlvr.safetensors T=1 top-k 100" in out and "0:video_rlvr.safetensors - 1:video_mle." in out
    # a complete stage is reused, not retrained
    assert "is complete, reusing it" in train("--data", tmp / "data", "--out_dir", o, "--stage=rlvr", "--init",
                                              tmp / "out" / "video_mle.safetensors", "--mode=single")


@pytest.mark.slow
def test_stage_control_alone_reproduces_the_runs_control(trained):
    """--stage=control (the lr sweep's control alone, for a given compute) trains the weights the
    full run's control trained beside RLVR, and evaluates it against its start."""
    tmp, _ = trained
    o, full = tmp / "control", tmp / "out"
    compute = json.loads((full / "video_rlvr.json").read_text())["metrics"]["rl_compute"]
    common = ["--data", tmp / "data", "--out_dir", o, "--init", full / "video_mle.safetensors",
              "--mode=multi"]
    r = subprocess.run([sys.executable, "train_video.py", "--stage=control", *map(str, common), *TINY],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, env=ENV)
    assert r.returncode != 0 and "--stage=control needs --control_compute" in r.stderr
    out = train(*common, "--stage=control", f"--control_compute={compute}")
    a, b = load_file(o / "video_mle_more.safetensors"), load_file(full / "video_mle_more.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert set(json.loads((o / "eval.json").read_text())) == {"mle", "mle_more"}
    assert re.search(r"mle_more - mle +mae +all", out)
    # its rate: the mode's scale x the start's final MLE rate (multi-step: 1)
    final = mle.final_lr(full / "video_mle.safetensors")
    assert f"at lr {final:.3g} for RLVR's compute" in out


@pytest.mark.slow
def test_rt1_format_episodes_train(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(12):                                   # flat folder: 10 train, 1 val, 1 test
        img = np.zeros((10, 256, 320, 3), np.uint8)       # clips of 8 frames; the last 2 are dropped
        img[:] = rng.integers(0, 255, 3, dtype=np.uint8)
        for t in range(10):
            img[t, 100:160, 25 * t:25 * t + 60] = 255                            # something that moves
        np.savez(tmp_path / f"rt1_{i:02d}.npz", image=img, action=rng.normal(size=(10, 13)).astype(np.float32))
    # the default --init (the shipped model, 2-dim actions) does not fit 13-dim actions: one line, then from scratch
    out = train("--data", tmp_path, "--out_dir", tmp_path / "out", "--mode=single", "--vq",
                tokenizer(tmp_path, tmp_path / "vq"))
    assert "10 train / 1 val / 1 test clips of 8 frames, 13-dim actions, frames resized to 64x64" in out
    assert "--init=auto: the shipped model's vocabulary is for 2-dim actions" in out and "training from scratch" in out
    # the default's object and push terms need the robot's backgrounds and detectors: dropped, in one line
    assert "has no background images, so no object term or push term" in out
    rows = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert rows["rlvr"]["n"] == 7 and "objects" not in rows["rlvr"]      # no background in RT-1 files


def test_help_lists_at_most_35_flags_and_train_vq_its_own():
    out = run([sys.executable, "train_video.py", "--help"])
    assert len(re.findall(r"^  --", out, re.M)) <= 35 and "--still_code" not in out
    # --recipe=paper's values, those of vid_wm/verl's run_ctx_msp_vgpt.sh over its trainer yaml
    text = " ".join(out.split())
    for official in ("multi-step, 128 prompts in all x 5 samples", "lr 5e-05 constant (the first update at 0)",
                     "4 minibatches, micro-batch 8", "KL 0.001 (k3 clamped at 10), entropy 0",
                     "clip 0.2, dual-clip 3, std N - 1, AdamW (0.9, 0.999), weight decay 0.01, T 1"):
        assert official in text, official
    out = run([sys.executable, "train_vq.py", "--help"])
    assert all(flag in out for flag in ("--steps", "--n_codes", "--crop", "--lr"))


def test_functions_take_what_they_need_as_arguments():
    """No function of train_video.py or train_vq.py reads a module variable (constants, in
    capitals, aside): what it needs comes in as arguments."""
    for script in ("train_video.py", "train_vq.py"):
        tree = ast.parse((ROOT / script).read_text())
        assigned = {sub.id for node in tree.body if not isinstance(node, ast.FunctionDef)
                    for sub in ast.walk(node) if isinstance(sub, ast.Name)
                    and isinstance(sub.ctx, ast.Store)}
        for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
            own = {a.arg for a in ast.walk(fn) if isinstance(a, ast.arg)}
            own |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Store)}
            own |= {n.name for n in ast.walk(fn) if isinstance(n, ast.FunctionDef)}
            read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Load)}
            globals_read = {name for name in read - own if name in assigned and not name.isupper()}
            assert not globals_read, f"{script}: {fn.name} reads {sorted(globals_read)}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_torchrun_two_ranks_rlvr_identical_weights(trained):
    """Two ranks update one model: the same weights on both, and updated. The start is a per-frame model (the tiny
    conditioned tokenizer decodes every sample alike, so its groups have no reward spread and nothing would move)."""
    tmp, _ = trained
    start = tmp / "ddp_start"
    train("--data", tmp / "data", "--out_dir", start, "--stage=mle", "--init=scratch",
          "--vq", tmp / "out" / "video_vq.safetensors", "--mode=multi")
    out = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
               "train_video.py", "--data", str(tmp / "data"), "--out_dir", str(tmp / "ddp"), "--stage=rlvr",
               "--init", str(start / "video_mle.safetensors"), "--mode=multi", *TINY, "--prompts_per_step=4"],
              timeout=180)   # 4 prompts in all: 2 a rank
    sums = re.search(r"weight checksums per rank \[(\d+), (\d+)\]", out)
    assert sums and sums.group(1) == sums.group(2), out[-2000:]
    assert (tmp / "ddp" / "eval.json").is_file()
    steps = [json.loads(line) for line in (tmp / "ddp" / "log.jsonl").read_text().splitlines()]
    assert sum(d.get("groups_kept", 0) for d in steps if d["stage"] == "rlvr") > 0     # a real update
    new, old = (load_file(str(f)) for f in (tmp / "ddp" / "video_rlvr.safetensors", start / "video_mle.safetensors"))
    assert any(not torch.equal(new[k], old[k]) for k in old)
    assert "frames decoded with the copy gate" in out


@pytest.mark.slow
def test_torchrun_shards_train_clips_and_final_eval_equals_one_process(trained):
    """Under torchrun each rank reads and tokenizes its share of the train clips (every other one), cached in a file
    of its own, and the ranks share the final evaluation (greedy: batch by batch; sampled: a job each): eval.json is
    the one process's, here the same command again in a copy of the run (the trained stage reused)."""
    tmp, _ = trained
    data = tmp / "data12"                                   # 12 test clips: 84 single-step windows, two batches
    for split, n in (("train", 6), ("val", 2), ("test", 12)):
        generate_split(data, split, n, length=8)
    write_action_stats(data)
    flags = ["train_video.py", "--data", str(data), "--stage=rlvr", "--init", str(tmp / "out" / "video_mle.safetensors"),
             "--mode=single", *TINY]
    out = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
               *flags, "--out_dir", str(tmp / "ddp12")], timeout=180)
    assert "data: 3 train / 2 val / 12 test clips" in out and "rank 0's share; each of 2 ranks" in out
    shutil.copytree(tmp / "ddp12", tmp / "one12")
    assert "is complete, reusing it" in run([sys.executable, *flags, "--out_dir", str(tmp / "one12")])
    shared, alone = (json.loads((tmp / d / "eval.json").read_text()) for d in ("ddp12", "one12"))
    for r in (*shared.values(), *alone.values()):          # the checkpoints' paths name their folders
        r.pop("checkpoint")
    assert shared["rlvr"]["n_windows"] == 84 and shared == alone
    # the ranks' train tokens: every other clip of the one process's
    whole = load_file(str(tmp / "one12" / "tokens_train.safetensors"))
    for r in (0, 1):
        part = load_file(str(tmp / "ddp12" / f"tokens_train_rank{r}of2.safetensors"))
        assert all(torch.equal(part[k], whole[k][r::2]) for k in whole)


@pytest.mark.slow
def test_recipe_paper_two_ranks_and_its_first_update_at_lr_0(trained):
    """--recipe=paper under torchrun (small overrides win): 2 steps, the same weights on both ranks, moved from the
    start; on one process its first update runs at lr 0 (verl's schedule): one step leaves the start's weights
    exactly as they were (AdamW's decay too is lr x 0.01)."""
    tmp, _ = trained
    start = tmp / "out" / "video_mle.safetensors"
    common = ["--data", str(tmp / "data"), "--stage=rlvr", "--init", str(start), "--recipe=paper", *TINY]
    out = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
               "train_video.py", *common, "--out_dir", str(tmp / "paper2")], timeout=180)
    assert "rlvr (paper): " in out and "per step 1 prompts x 2 samples x 2 ranks, 3 predicted frame(s)" in out
    sums = re.search(r"weight checksums per rank \[(\d+), (\d+)\]", out)
    assert sums and sums.group(1) == sums.group(2), out[-2000:]
    steps = [json.loads(line) for line in (tmp / "paper2" / "log.jsonl").read_text().splitlines()]
    assert [d["step"] for d in steps if d["stage"] == "rlvr" and "step" in d] == [1, 2]
    old = load_file(str(start))
    two = load_file(str(tmp / "paper2" / "video_rlvr.safetensors"))
    assert any(not torch.equal(two[k], old[k]) for k in old)
    run([sys.executable, "train_video.py", *common, "--out_dir", str(tmp / "paper1"), "--rl_steps=1"])
    one = load_file(str(tmp / "paper1" / "video_rlvr.safetensors"))
    assert all(torch.equal(one[k], old[k]) for k in old)
