"""End-to-end runs of train_video.py on tiny settings (subprocesses, ~1 min in all): every stage in
both modes, the evaluation CLI, RT-1-shaped episodes, train_vq.py alone, and a 2-process torchrun
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
TINY = ["--vq_steps=3", "--vq_batch=4", "--cvq_steps=3", "--cvq_batch=4", "--n_codes=32", "--mle_steps=3",
        "--batch_size=2", "--n_layer=1", "--n_head=2", "--n_embd=32", "--rl_steps=2", "--prompts_per_step=2",
        "--group_size=2", "--horizon=3",
        "--micro_batch=4", "--threads=1", "--clip_len=8"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run(cmd, timeout=120):
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=ENV)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout + r.stderr


def train(*args, timeout=120):
    return run([sys.executable, "train_video.py", *map(str, args), *TINY], timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Tiny embedded-format data and a full --stage=all run from scratch in multi-step mode."""
    tmp = tmp_path_factory.mktemp("video")
    for split, n in (("train", 6), ("val", 2), ("test", 2)):
        generate_split(tmp / "data", split, n, length=8)
    write_action_stats(tmp / "data")
    out = train("--data", tmp / "data", "--out_dir", tmp / "out", "--init=scratch", "--mode=multi")
    return tmp, out


@pytest.mark.slow
def test_all_stages_from_scratch_multi_step(trained):
    tmp, out = trained
    o = tmp / "out"
    for f in ("video_vq", "video_mle", "video_rlvr"):
        assert (o / f"{f}.safetensors").is_file()
    assert "reward: mae+ssim" in out and "held-out PSNR" in out
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
    assert {"tokenizer", "mle", "rlvr", "mle_more"} <= set(stages)
    assert re.search(r"rlvr - mle_more +mae +all +[-+]\d\.\d{5}  \[", out), out[-3000:]
    assert re.search(r"rlvr - copy +ssim +all", out) and "sampled at T=1, top-k 100" in out


@pytest.mark.slow
def test_single_step_rlvr_from_a_checkpoint_and_eval_cli(trained):
    tmp, _ = trained
    o = tmp / "single"
    train("--data", tmp / "data", "--out_dir", o, "--stage=rlvr", "--init", tmp / "out" / "video_mle.safetensors",
          "--mode=single", "--control=0")
    rows = json.loads((o / "eval.json").read_text())
    assert rows["rlvr"]["horizon"] == 1 and set(rows) == {"mle", "rlvr"}          # --control=0: no control
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
    # the placebo (--placebo=1, grpo.GRPOConfig.shuffle_rewards; its permutation is tested in test_grpo.py): the
    # same prompts and samples as RLVR, so step 0's rewards equal RLVR's
    p = tmp / "placebo"
    out = train("--data", tmp / "data", "--out_dir", p, "--stage=rlvr", "--init", tmp / "out" / "video_mle.safetensors",
                "--mode=single", "--control=0", "--placebo=1")
    assert "PLACEBO: rewards permuted within each kept group" in out
    assert json.loads((p / "config.json").read_text())["placebo"] == 1
    first = [json.loads((f / "log.jsonl").read_text().splitlines()[0]) for f in (o, p)]
    assert first[0]["step"] == first[1]["step"] == 0 and first[0]["reward_mean"] == first[1]["reward_mean"]


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
    # its rate: --control_scale x the start's final MLE rate (multi-step's default scale: 1)
    final = mle.final_lr(full / "video_mle.safetensors")
    assert f"at lr {final:.3g} for RLVR's compute" in out
    out = train("--data", tmp / "data", "--out_dir", tmp / "control_03", "--init",
                full / "video_mle.safetensors", "--mode=multi", "--stage=control",
                f"--control_compute={compute}", "--control_scale=0.3")
    assert f"at lr {0.3 * final:.3g} for RLVR's compute" in out


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
    out = train("--data", tmp_path, "--out_dir", tmp_path / "out", "--mode=single")
    assert "10 train / 1 val / 1 test clips of 8 frames, 13-dim actions, frames resized to 64x64" in out
    assert "--init=auto: the shipped model's vocabulary is for 2-dim actions" in out and "training from scratch" in out
    # the single-step default's object and push terms need the robot's backgrounds and detectors: dropped, one line each
    assert "has no background images, so no object term" in out and "so no push term (the default --push_weight)" in out
    rows = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert rows["rlvr"]["n"] == 7 and "objects" not in rows["rlvr"]      # no background in RT-1 files
    # the reward's object term needs backgrounds: the multi-step default's is dropped with one line; asked for, it
    # is refused with one line
    args = ["--data", tmp_path, "--out_dir", tmp_path / "out", "--stage=rlvr", "--init",
            tmp_path / "out" / "video_mle.safetensors", "--control=0", "--test_limit=1"]
    assert "has no background images, so no object term" in train(*args, "--mode=multi", "--out_dir", tmp_path / "m")
    r = subprocess.run([sys.executable, "train_video.py", *map(str, args), "--object_weight=0.5", *TINY,
                        "--out_dir", tmp_path / "w"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == (
        f"error: --object_weight needs episodes with a background image; {tmp_path} has none")
    # so do the gripper and push terms (their detectors know the embedded robot's gripper and blocks only)
    for flag in ("action_weight", "push_weight", "push_frac"):
        r = subprocess.run([sys.executable, "train_video.py", *map(str, args), f"--{flag}=0.5", *TINY,
                            "--out_dir", tmp_path / flag], cwd=ROOT,
                           capture_output=True, text=True, timeout=120, env=ENV)
        assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == (
            f"error: --{flag} needs the embedded robot's episodes (its detectors); {tmp_path} has other ones")


@pytest.mark.slow
def test_cond_tokenizer_from_scratch_single_step(trained):
    tmp, _ = trained
    o = tmp / "cond"
    out = train("--data", tmp / "data", "--out_dir", o, "--init=scratch", "--tokenizer=cond", "--mode=single")
    assert "cond tokenizer: next val frame reconstructed" in out
    assert (o / "video_cvq.safetensors").is_file() and (o / "video_vq.safetensors").is_file()
    meta = json.loads((o / "video_mle.json").read_text())
    assert meta["args"]["vq"] == "video_cvq.safetensors"
    rows = json.loads((o / "eval.json").read_text())
    assert rows["rlvr"]["horizon"] == 1 and rows["rlvr"]["n"] == 2 * 7
    stages = [json.loads(line)["stage"] for line in (o / "log.jsonl").read_text().splitlines()]
    assert {"tokenizer", "cond_tokenizer", "mle", "rlvr"} <= set(stages)


TOKENIZER_FLAGS = [f for f in TINY if f.split("=")[0] in (
    "--vq_steps", "--vq_batch", "--cvq_steps", "--cvq_batch", "--n_codes", "--horizon", "--threads",
    "--clip_len")]


def test_train_vq_help_lists_the_tokenizer_flags():
    out = run([sys.executable, "train_vq.py", "--help"])
    assert all(flag in out for flag in ("--vq_steps", "--cvq_crop", "--move_weight", "--horizon"))


@pytest.mark.slow
def test_train_vq_alone_writes_the_tokenizers_train_video_trains(trained):
    """train_vq.py run alone with the same flags writes the same tokenizers, bit for bit, as the
    run from scratch of train_video.py; train_video.py --stage=mle then finds them in out_dir."""
    tmp, _ = trained
    o = tmp / "vq_alone"
    out = run([sys.executable, "train_vq.py", "--data", tmp / "data", "--out_dir", o,
               *TOKENIZER_FLAGS])
    assert "cond tokenizer: next val frame reconstructed" in out
    for name in ("video_vq", "video_cvq"):
        a, b = (load_file(str(d / f"{name}.safetensors")) for d in (tmp / "out", o))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
        assert not (o / f"{name}_train.safetensors").exists()
    train("--data", tmp / "data", "--out_dir", o, "--stage=mle", "--init=scratch", "--mode=multi")
    assert json.loads((o / "video_mle.json").read_text())["args"]["vq"] == "video_cvq.safetensors"


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
    train("--data", tmp / "data", "--out_dir", start, "--stage=mle", "--init=scratch", "--tokenizer=frame",
          "--vq", tmp / "out" / "video_vq.safetensors", "--mode=multi")
    out = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
               "train_video.py", "--data", str(tmp / "data"), "--out_dir", str(tmp / "ddp"), "--stage=rlvr",
               "--init", str(start / "video_mle.safetensors"), "--mode=multi", *TINY], timeout=180)
    sums = re.search(r"weight checksums per rank \[(\d+), (\d+)\]", out)
    assert sums and sums.group(1) == sums.group(2), out[-2000:]
    assert (tmp / "ddp" / "eval.json").is_file()
    steps = [json.loads(line) for line in (tmp / "ddp" / "log.jsonl").read_text().splitlines()]
    assert sum(d.get("groups_kept", 0) for d in steps if d["stage"] == "rlvr") > 0     # a real update
    new, old = (load_file(str(f)) for f in (tmp / "ddp" / "video_rlvr.safetensors", start / "video_mle.safetensors"))
    assert any(not torch.equal(new[k], old[k]) for k in old)
    # --copy_gate's default: off for an MLE stage alone (it decodes nothing), on where a per-frame run decodes
    assert "frames decoded with the copy gate" in out
    gate = {f: json.loads((f.parent / f"{f.stem}.json").read_text())["args"]["copy_gate"]
            for f in (start / "video_mle.safetensors", tmp / "ddp" / "video_rlvr.safetensors")}
    assert list(gate.values()) == [0, 1]


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
             "--mode=single", "--control=0", *TINY]
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
def test_still_code_and_action_embeddings_mle(trained):
    tmp, _ = trained
    o = tmp / "still"
    train("--data", tmp / "data", "--out_dir", o, "--init=scratch", "--stage=mle", "--mode=single",
          "--vq", ROOT / "checkpoints" / "video_cvq.safetensors", "--still_code=9", "--action_embed=1")
    meta = json.loads((o / "video_mle.json").read_text())
    assert meta["args"]["still_code"] == 9 and meta["args"]["action_embed"] == 1
    r = subprocess.run([sys.executable, "train_video.py", "--data", tmp / "data", "--out_dir", tmp / "still_vq",
                        "--init=scratch", "--stage=mle", "--vq", tmp / "out" / "video_vq.safetensors",
                        "--still_code=9", *TINY], cwd=ROOT, capture_output=True, text=True, env=ENV)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith("error: --still_code 9: needs the")
    # --change_weight weighs the changing cells' codes (per-frame tokenizer only)
    o = tmp / "change"
    out = train("--data", tmp / "data", "--out_dir", o, "--init=scratch", "--stage=mle", "--mode=multi",
                "--vq", tmp / "out" / "video_vq.safetensors", "--change_weight=4")
    assert json.loads((o / "video_mle.json").read_text())["args"]["change_weight"] == 4
    r = subprocess.run([sys.executable, "train_video.py", "--data", tmp / "data", "--out_dir", tmp / "change_c",
                        "--init=scratch", "--stage=mle", "--vq", ROOT / "checkpoints" / "video_cvq.safetensors",
                        "--change_weight=4", *TINY], cwd=ROOT, capture_output=True, text=True, env=ENV)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith("error: --change_weight 4.0: needs")


@pytest.mark.slow
def test_action_reward_and_counterfactual_prompts(trained):
    """--action_weight, --push_weight, --counterfactual_frac and --push_frac from a checkpoint (the simulator replays
    the tiny train split, as prepare.py drew it), compared on the val split (--final_eval=val); data the simulator did
    not draw stops the run in one line."""
    tmp, _ = trained
    o = tmp / "action"
    args = ["--data", tmp / "data", "--stage=rlvr", "--init", tmp / "out" / "video_mle.safetensors",
            "--mode=single", "--control=0"]
    out = train(*args, "--out_dir", o, "--action_weight=0.5", "--push_weight=0.3", "--counterfactual_frac=0.5",
                "--push_frac=0.5", "--final_eval=val")
    assert "- 0.5 x gripper error - 0.3 x push error" in out
    assert "1 of each step's prompts from the" in out and "windows where a block moves" in out and "held-out val episodes" in out
    rows = json.loads((o / "eval.json").read_text())
    assert rows["rlvr"]["n_windows"] == 2 * 7 and "action_response" in rows["rlvr"]["per_record"]   # 2 val clips
    # other scenes (seed 1) under the same file names: the replay does not match them
    for split, n in (("train", 6), ("val", 2), ("test", 2)):
        generate_split(tmp / "other", split, n, seed=1, length=8)
    write_action_stats(tmp / "other")
    r = subprocess.run([sys.executable, "train_video.py", *map(str, args[2:]), "--data", tmp / "other",
                        "--out_dir", tmp / "other_out", "--counterfactual_frac=0.5", *TINY],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode != 0 and "error: --counterfactual_frac needs the embedded robot data" in r.stderr
