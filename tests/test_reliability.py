"""Reliability of the training scripts on tiny CPU runs (subprocesses, marked slow), and of every file loader:

- exact resume: a seeded run of each stage (train_lang.py MLE and RLVR; train_video.py tokenizer, MLE and RLVR) is
  killed with SIGKILL at a random point after some checkpoint, re-run with the same command, and must end with
  bit-identical weights, the same checkpoint metadata, eval.json and logged metrics as an uninterrupted run;
- torchrun --max-restarts=1: one rank of a 2-process (gloo) RLVR run is SIGKILLed; the restarted group resumes from the
  last checkpoint, finishes, and both ranks end with bit-identical weights;
- bad input: the scripts given a corrupt data file, an image of the wrong dtype, a changed flag for an existing
  out_dir, an HF directory with a missing tensor, wrong flag values or a pickle exit with status != 0, the last
  stderr line names the file or flag and what was expected, and no file in --out_dir changes (with --resume=0
  too); the other broken data files (truncated, empty, not UTF-8, images of the wrong shape, missing folders, bad
  action statistics) are checked on the loaders the scripts call, for the same one-line messages;
- numerical faults: a NaN/inf loss or weight stops MLE, RLVR and the tokenizer with the stage and step named, before
  it reaches a checkpoint; --on_nan=skip skips steps and still stops after MAX_SKIPS in a row;
- no code execution from files: pickles whose unpickling would create a marker file, saved under every name a loader
  reads (checkpoint, tokenizer, VQ, LPIPS, HF weights, episode .npz), are refused with a clear error by the loaders
  and by both scripts, and the marker never appears; a scan of the repository finds no pickle, no torch.load without
  weights_only=True and no np.load allowing pickles (this file alone builds pickles, to make the payloads).
"""
import hashlib
import json
import os
import pickle
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoint import load_model, read_checkpoint, resume, save_checkpoint
from data.robot.prepare import generate_split
from data.robot.task import load_episode, load_split, read_action_stats, read_npz, write_action_stats
from data.textgame.prepare import ensure_splits
from data.textgame.task import load_records
from eval import load_lang_model
from grpo import Env, GRPOConfig, grpo_step
from tokenizer_text import load_tokenizer
from model import GPT, GPTConfig
from tokenizer_text import Tokenizer
from tokenizer_vq import load_vq
from video_eval import load_video_model
from video_rewards import load_lpips

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "checkpoints" / "textgame" / "mle.safetensors"
LANG = ["train_lang.py", "--n_layer=1", "--n_embd=32", "--batch_size=8",
        "--eval_limit=2", "--max_new_tokens=64", "--group_size=4", "--prompts_per_step=4",
        "--control=0"]   # the control: its compute budget is tested in test_mle
VIDEO = ["train_video.py", "--batch_size=2", "--n_layer=1", "--n_embd=32", "--prompts_per_step=2", "--group_size=2",
         "--horizon=3", "--micro_batch=4", "--threads=1", "--clip_len=8", "--mode=multi"]   # as in LANG
VQ = ["train_vq.py", "--batch=4", "--n_codes=32", "--clip_len=8", "--threads=1"]   # a tiny tokenizer
TIMING = {"minutes", "t_rollout", "t_step", "rl_seconds"}   # wall-clock fields: the only ones a resumed run may change
TAG = f"nanorlvr-test-{uuid.uuid4()}"   # marks the processes this module starts (to find a torchrun worker)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "NANORLVR_TEST_TAG": TAG}


def run(args, ok=True, timeout=300):
    p = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=timeout)
    assert (p.returncode == 0) == ok, f"{args}\nrc={p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def run_killed(args, sidecar, at_step):
    """Start the command, SIGKILL it once `sidecar` (a checkpoint's .json, written after the checkpoint) shows a step
    >= at_step, after a random extra pause of up to 0.3 s (so the kill lands anywhere in the steps that follow).
    -> what the command printed until then."""
    log = Path(sidecar).parent.with_name(Path(sidecar).parent.name + f"-{at_step}.out")
    with open(log, "w") as f:
        p = subprocess.Popen([sys.executable, *map(str, args)], cwd=ROOT, env=ENV, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            step = checkpoint_step(sidecar)
            if step is not None and step >= at_step:
                time.sleep(random.Random(at_step).uniform(0, 0.3))
                assert p.poll() is None, f"{args} finished before it could be killed:\n{log.read_text()[-2000:]}"
                p.send_signal(signal.SIGKILL)
                p.wait()
                return log.read_text()
            assert p.poll() is None, f"{args} ended before step {at_step}:\n{log.read_text()[-2000:]}"
            time.sleep(0.02)
        raise AssertionError(f"{args}: no checkpoint at step {at_step} within 300 s")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def checkpoint_step(sidecar):
    try:
        meta = json.loads(Path(sidecar).read_text())
    except (OSError, ValueError):   # not written yet (or being replaced)
        return None
    return None if meta["metrics"].get("done") else meta["step"]


def assert_same_tensors(a, b):
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys(), (a, b)
    for k in ta:   # bitwise: equal bytes, not just equal values
        assert ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape, k
        assert torch.equal(ta[k].contiguous().view(torch.uint8), tb[k].contiguous().view(torch.uint8)), (a, k)


def logged(path):
    """log.jsonl as {(stage, step): row without timing fields}; a resumed run logs some steps twice, the last wins."""
    rows = {}
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        rows[(row.get("stage"), row.get("step", row.get("steps")))] = {k: v for k, v in row.items() if k not in TIMING}
    return rows


def without_timing(meta):
    return {**meta, "metrics": {k: v for k, v in meta["metrics"].items() if k not in TIMING}}


def assert_same_run(a, b, files):
    """Two out_dirs ended identically: weights bit for bit, checkpoint metadata, eval.json, logged metrics."""
    for f in files:
        assert_same_tensors(a / f, b / f)
        if f != "video_vq.safetensors":
            ma, mb = (json.loads((d / f).with_suffix(".json").read_text()) for d in (a, b))
            assert without_timing(ma) | {"args": None} == without_timing(mb) | {"args": None}, f   # args: out_dir
    if (a / "eval.json").is_file():   # the same numbers (the paths of the checkpoints evaluated differ)
        ea, eb = ({k: {**r, "checkpoint": None} for k, r in json.loads((d / "eval.json").read_text()).items()}
                  for d in (a, b))
        assert ea == eb
    la, lb = logged(a / "log.jsonl"), logged(b / "log.jsonl")
    assert la == lb


def snapshot(folder):
    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(Path(folder).rglob("*")) if f.is_file()}


@pytest.fixture(scope="module")
def lang_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("lang_data")
    ensure_splits(d, n_train=400, n_val=20, n_test=20, verbose=False)
    return d


@pytest.fixture(scope="module")
def video_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("video_data")
    for split, n in (("train", 6), ("val", 2), ("test", 2)):
        generate_split(d, split, n, length=8)
    write_action_stats(d)
    return d


# -----------------------------------------------------------------------------
# exact resume after SIGKILL

@pytest.fixture(scope="module")
def lang_mle(lang_data, tmp_path_factory):
    """An uninterrupted tiny MLE run from scratch (also the starting point of the bad-input cases)."""
    out = tmp_path_factory.mktemp("lang_mle")
    cmd = [*LANG, "--stage=mle", "--init=scratch", f"--data_dir={lang_data}", "--mle_steps=40",
           "--ckpt_every=5"]
    run([*cmd, f"--out_dir={out}"])
    return out, cmd


@pytest.mark.slow
def test_lang_mle_resumes_exactly_after_sigkill(lang_mle, tmp_path):
    ref, cmd = lang_mle
    out = tmp_path / "b"
    run_killed([*cmd, f"--out_dir={out}"], out / "mle.json", at_step=random.Random(1).choice([5, 10, 15, 20]))
    assert "mle: resuming from step" in run([*cmd, f"--out_dir={out}"]).stdout
    assert_same_run(ref, out, ["mle.safetensors"])


@pytest.mark.slow
def test_lang_rlvr_resumes_exactly_after_sigkill(lang_data, tmp_path):
    # the partial-credit reward: the shipped model is so peaked that at T=1 all its groups can lack spread in the
    # binary reward, and then nothing updates
    cmd = [*LANG, "--stage=rlvr", f"--init={SHIPPED}", f"--data_dir={lang_data}", "--rl_steps=5", "--ckpt_every=2",
           "--reward=task_specific"]
    run([*cmd, f"--out_dir={tmp_path / 'a'}"])
    run_killed([*cmd, f"--out_dir={tmp_path / 'b'}"], tmp_path / "b" / "rlvr.json", at_step=2)
    assert "rlvr: resuming from step" in run([*cmd, f"--out_dir={tmp_path / 'b'}"]).stdout
    assert_same_run(tmp_path / "a", tmp_path / "b", ["rlvr.safetensors"])
    start, end = load_file(str(SHIPPED)), load_file(str(tmp_path / "a" / "rlvr.safetensors"))
    assert any(not torch.equal(start[k], end[k]) for k in start)      # RLVR did update the weights


@pytest.fixture(scope="module")
def video_run(video_data, tmp_path_factory):
    """A tiny tokenizer (train_vq.py), then MLE and RLVR from scratch on it, in one out_dir."""
    out = tmp_path_factory.mktemp("video")
    vq_cmd = [*VQ, "--data", video_data, "--steps=40", "--ckpt_every=4"]
    run([*vq_cmd, "--out_dir", out])
    cmd = [*VIDEO, "--data", video_data, "--init=scratch", "--mle_steps=40", "--rl_steps=8", "--ckpt_every=4"]
    run([*cmd, "--vq", out / "video_vq.safetensors", "--out_dir", out])
    return out, cmd, vq_cmd


@pytest.mark.slow
def test_video_stages_resume_exactly_after_sigkill(video_run, tmp_path):
    ref, cmd, vq_cmd = video_run
    out = tmp_path / "b"
    vq_cmd = [*vq_cmd, "--out_dir", out]
    cmd = [*cmd, "--vq", out / "video_vq.safetensors", "--out_dir", out]
    rng = random.Random(3)
    run_killed(vq_cmd, out / "video_vq_train.json", at_step=rng.choice([4, 8, 12, 16]))       # in the tokenizer
    assert "tokenizer: resuming from step" in run(vq_cmd).stdout
    run_killed(cmd, out / "video_mle.json", at_step=rng.choice([4, 8, 12, 16]))              # in MLE
    printed = run_killed(cmd, out / "video_rlvr.json", at_step=4)                             # in RLVR
    assert "mle: resuming from step" in printed
    assert "rlvr: resuming from step 4" in run(cmd).stdout
    assert not (out / "video_vq_train.safetensors").exists()
    assert_same_run(ref, out, ["video_vq.safetensors", "video_mle.safetensors", "video_rlvr.safetensors"])


def test_stale_partial_checkpoint_from_a_crash_is_ignored(tmp_path):
    """A crash while saving leaves `<ckpt>.tmp` behind: the previous checkpoint is still what loads."""
    torch.manual_seed(0)
    m = GPT(GPTConfig.llama(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16))
    path = tmp_path / "mle.safetensors"
    save_checkpoint(path, m, step=5)
    good = path.read_bytes()
    path.with_name(path.name + ".tmp").write_bytes(good[:len(good) // 2])   # half of the next save
    assert read_checkpoint(path)[1]["step"] == 5
    save_checkpoint(path, m, step=10)                                       # the next save replaces the debris
    assert read_checkpoint(path)[1]["step"] == 10 and not path.with_name(path.name + ".tmp").exists()


# -----------------------------------------------------------------------------
# torchrun --max-restarts=1 after one rank is killed

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_pid(rank):
    """The pid of this module's torchrun worker of the given rank (found by its environment), or None."""
    for proc in Path("/proc").iterdir():
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if f"NANORLVR_TEST_TAG={TAG}".encode() in env and f"RANK={rank}".encode() in env:
            return int(proc.name)
    return None


@pytest.mark.slow
def test_torchrun_restart_resumes_from_the_last_checkpoint(lang_data, tmp_path):
    out = tmp_path / "ddp"
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "--max-restarts=1", *LANG, "--stage=rlvr", f"--init={SHIPPED}",
                          f"--data_dir={lang_data}", "--rl_steps=4", "--ckpt_every=2", "--prompts_per_step=2",
                          "--reward=task_specific", f"--out_dir={out}"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        while checkpoint_step(out / "rlvr.json") is None:   # the step-2 checkpoint is written
            assert p.poll() is None, p.stdout.read()[-3000:]
            time.sleep(0.02)
        pid = worker_pid(1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)                        # rank 1 dies; torchrun restarts both ranks, once
        printed, _ = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, printed[-3000:]
    assert printed.count("rlvr: resuming from step 2") == 1, printed[-3000:]
    sums = [row["rank_checksums"] for row in map(json.loads, (out / "log.jsonl").read_text().splitlines())
            if "rank_checksums" in row]
    assert len(sums) == 1 and sums[0][0] == sums[0][1]      # the restarted ranks ended with identical weights
    meta = json.loads((out / "rlvr.json").read_text())
    assert meta["step"] == 4 and meta["metrics"]["done"] and (out / "eval.json").is_file()


# -----------------------------------------------------------------------------
# bad input: one clear line, exit status != 0, nothing in --out_dir overwritten

def assert_refused(args, expected, out_dir):
    before = snapshot(out_dir)
    p = run(args, ok=False)
    last = p.stderr.strip().splitlines()[-1]
    assert re.search(expected, last), f"last stderr line {last!r} does not match {expected!r}\n{p.stderr[-2000:]}"
    assert "Traceback" not in p.stderr
    assert snapshot(out_dir) == before


@pytest.fixture
def lang_out(lang_mle, tmp_path):
    """A copy of a finished MLE run's out_dir, which a bad run must leave untouched."""
    out = tmp_path / "out"
    shutil.copytree(lang_mle[0], out)
    (out / "eval.json").write_text('{"mle": {}}\n')
    return out


def lang_bad_args(case, data, tmp_path):
    """train_lang.py arguments for one bad-input case (files made in tmp_path)."""
    if case == "corrupt data":
        d = tmp_path / "data"
        shutil.copytree(data, d)
        (d / "train.jsonl").write_bytes(b'{"game": 1}\n')
        return ["--stage=mle", "--init=scratch", f"--data_dir={d}", "--resume=0"]   # starting over: nothing written
    if case == "other config":
        return ["--stage=mle", "--init=scratch", f"--data_dir={data}", "--mle_steps=40", "--n_embd=64"]
    return ["--stage=mle", "--init=scratch", f"--data_dir={data}", "--ckpt_every=0"]


LANG_BAD = {   # case -> what the last line of stderr must say
    "corrupt data": r"^error: .*/train\.jsonl:1: record is missing key\(s\) \['state', 'action', 'next_state'\]$",
    "other config": r"^error: .* holds a run with other flags: --n_embd 32 -> 64; use a new --out_dir, or --resume=0 "
                    r"to start over in .*$",
    "flag value": r"train_lang\.py: error: --ckpt_every must be >= 1, got 0$",
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(LANG_BAD))
def test_train_lang_bad_input_is_one_clear_line(case, lang_data, lang_out, tmp_path):
    assert_refused([*LANG, *lang_bad_args(case, lang_data, tmp_path), f"--out_dir={lang_out}"], LANG_BAD[case],
                   lang_out)


@pytest.mark.parametrize("content, expected", [
    (b'{"game": 1}\n', r"train\.jsonl:1: record is missing key\(s\) \['state', 'action', 'next_state'\]$"),
    (None, r"train\.jsonl:1: invalid JSON \(Unterminated string"),                        # truncated
    (b"", r"train\.jsonl: no records \(empty file\)$"),
    (b"\n \n", r"train\.jsonl: no records \(empty file\)$"),
    (bytes(range(256)), r"train\.jsonl: not UTF-8 text \(invalid start byte\); expected JSON lines$"),
    (b'[1, 2]\n', r"train\.jsonl:1: a record must be a JSON object$"),
])
def test_data_file_errors_name_file_and_line(lang_data, tmp_path, content, expected):
    """What train_lang.py prints for each broken split file (the script itself is run on the first case above)."""
    path = tmp_path / "train.jsonl"
    path.write_bytes(content if content is not None else (lang_data / "train.jsonl").read_bytes()[:300])
    with pytest.raises(ValueError, match=expected) as e:
        load_records(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    with pytest.raises(OSError, match="nowhere.jsonl"):                  # train_lang.py reports OSErrors the same way
        load_records(tmp_path / "nowhere.jsonl")


@pytest.mark.slow
def test_hf_directory_with_a_missing_tensor(lang_data, lang_out, tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    config = dict(model_type="llama", vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512, rms_norm_eps=1e-6,
                  tie_word_embeddings=True)
    (hf / "config.json").write_text(json.dumps(config))
    shapes = {"model.embed_tokens.weight": (300, 32), "model.norm.weight": (32,),
              "model.layers.0.input_layernorm.weight": (32,), "model.layers.0.post_attention_layernorm.weight": (32,),
              "model.layers.0.self_attn.q_proj.weight": (32, 32), "model.layers.0.self_attn.k_proj.weight": (16, 32),
              "model.layers.0.self_attn.v_proj.weight": (16, 32), "model.layers.0.self_attn.o_proj.weight": (32, 32),
              "model.layers.0.mlp.gate_proj.weight": (64, 32), "model.layers.0.mlp.up_proj.weight": (64, 32)}
    save_file({k: torch.zeros(s) for k, s in shapes.items()}, str(hf / "model.safetensors"))   # no mlp.down_proj
    assert_refused([*LANG, "--stage=rlvr", f"--init={hf}", f"--data_dir={lang_data}", f"--out_dir={lang_out}",
                    "--resume=0"], r"^error: .*/hf: missing tensor 'model\.layers\.0\.mlp\.down_proj\.weight'",
                   lang_out)


@pytest.fixture
def video_out(video_run, tmp_path):
    out = tmp_path / "vout"
    shutil.copytree(video_run[0], out)
    return out


VIDEO_BAD = {
    "image dtype": r"^error: .*/train/00003\.npz: 'image' must be \(T, H, W, 3\) uint8, got \(8, 64, 64, 3\) float32$",
    "flag value": r"train_video\.py: error: need --clip_len >= 2 and --n_embd a multiple of 32 \(got 8, 40\)",
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(VIDEO_BAD))
def test_train_video_bad_input_is_one_clear_line(case, video_data, video_out, tmp_path):
    d = tmp_path / "vdata"
    shutil.copytree(video_data, d)
    np.savez(d / "train" / "00003.npz", image=np.zeros((8, 64, 64, 3), np.float32), action=np.zeros((8, 2)))
    args = ["--data", d, "--resume=0"] + (["--n_embd=40"] if case == "flag value" else [])
    assert_refused([*VIDEO, *args, "--init=scratch", "--out_dir", video_out], VIDEO_BAD[case], video_out)


def test_episode_errors_name_the_file(video_data, tmp_path):
    """What train_video.py prints for other broken episode folders (the script is run on a wrong dtype above)."""
    d = tmp_path / "vdata"
    shutil.copytree(video_data, d)
    bad = d / "train" / "00003.npz"
    cases = [(dict(image=np.zeros((8, 64, 64), np.uint8), action=np.zeros((8, 2))),
              r"'image' must be \(T, H, W, 3\) uint8, got \(8, 64, 64\) uint8"),
             (dict(image=np.zeros((8, 64, 64, 3), np.uint8), action=np.zeros((7, 2))), r"'action' must be numbers"),
             (dict(image=np.zeros((8, 64, 64, 3), np.uint8), action=np.full((8, 2), np.nan)), r"NaN or inf"),
             (dict(image=np.zeros((8, 64, 64, 3), np.uint8), action=np.zeros((8, 3))), r"3-dim actions, but"),
             (dict(image=np.zeros((8, 64, 64, 3), np.uint8)), r"needs 'image' and 'action' arrays, found \['image'\]")]
    for arrays, expected in cases:
        np.savez(bad, **arrays)
        with pytest.raises(ValueError, match=expected) as e:
            load_split(d, "train", 64)
        assert "\n" not in str(e.value) and str(bad) in str(e.value)
    bad.write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(ValueError, match=r"00003\.npz: cannot read the \.npz episode"):
        load_split(d, "train", 64)
    with pytest.raises(ValueError, match=r"nowhere: no \.npz episodes for the train split"):   # missing or empty
        load_split(tmp_path / "nowhere", "train", 64)
    (d / "action_stats.json").write_text('{"min": [0, 0], "max": ')
    with pytest.raises(ValueError, match=r"action_stats\.json: not action statistics"):
        read_action_stats(d)


# -----------------------------------------------------------------------------
# numerical faults: detected, reported with the step, and nothing non-finite reaches a checkpoint

def poisoned_copy(src, dst_dir, *neighbours):
    """A copy of checkpoint `src` with one NaN weight, beside copies of the files it names (tokenizer, VQ)."""
    dst_dir.mkdir()
    for name in neighbours:
        shutil.copy(src.parent / name, dst_dir / name)
    from safetensors import safe_open
    with safe_open(str(src), framework="pt") as f:
        tensors, header = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    name = next(k for k in tensors if k.startswith("model.h.0."))
    tensors[name][0, 0] = float("nan")
    save_file(tensors, str(dst_dir / src.name), metadata=header)
    return dst_dir / src.name


def all_finite(folder):
    return all(torch.isfinite(t).all() for f in Path(folder).glob("*.safetensors")
               for t in load_file(str(f)).values() if t.is_floating_point())


@pytest.mark.slow
def test_nan_weights_stop_train_lang_rlvr(lang_mle, lang_data, tmp_path):
    """(train_lang.py's MLE check is run by the --on_nan=skip test below, which ends the same way once it stops.)"""
    bad = poisoned_copy(lang_mle[0] / "mle.safetensors", tmp_path / "bad", "tokenizer.tiktoken")
    p = run([*LANG, "--stage=rlvr", f"--init={bad}", f"--data_dir={lang_data}", f"--out_dir={tmp_path / 'out'}"],
            ok=False)
    assert p.stderr.strip().splitlines()[-1] == ("error: rlvr: non-finite weights in the policy at step 0: the weights "
                                                 "are non-finite; stopping (the last checkpoint is intact)")
    assert not (tmp_path / "out" / "rlvr.safetensors").exists()


@pytest.mark.slow
def test_on_nan_skip_skips_steps_but_stops_after_max_skips_in_a_row(lang_data, tmp_path):
    p = run([*LANG, "--stage=mle", "--init=scratch", f"--data_dir={lang_data}", "--mle_steps=40", "--ckpt_every=5",
             "--mle_lr=1e30", "--on_nan=skip", f"--out_dir={tmp_path}"], ok=False)
    skipped = [row["step"] for row in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines())
               if "skipped" in row]
    assert len(skipped) == 10 and skipped == list(range(skipped[0], skipped[0] + 10))
    assert re.fullmatch(rf"error: mle: .* at step {skipped[-1] + 1} \(10 steps in a row already skipped\).*",
                        p.stderr.strip().splitlines()[-1])
    assert all_finite(tmp_path)


@pytest.mark.slow
def test_nan_stops_train_video_tokenizer_mle_and_rlvr(video_run, video_data, tmp_path):
    base = [*VIDEO, "--data", video_data, "--ckpt_every=1"]   # three runs, each in its own out_dir
    p = run([*VQ, "--data", video_data, "--ckpt_every=1", "--out_dir", tmp_path / "tok", "--steps=20", "--lr=1e30"],
            ok=False)
    assert re.fullmatch(r"error: tokenizer: non-finite loss \(nan\) at step \d+(: the weights are non-finite|; "
                        r"stopping before it reaches the weights).*", p.stderr.strip().splitlines()[-1])
    p = run([*base, "--out_dir", tmp_path / "mle", "--stage=mle", "--vq", video_run[0] / "video_vq.safetensors",
             "--mle_lr=1e30"], ok=False)
    assert re.fullmatch(r"error: mle: non-finite (loss|gradient norm) \(nan\) at step [1-9].*",
                        p.stderr.strip().splitlines()[-1])
    assert all_finite(tmp_path / "tok") and all_finite(tmp_path / "mle")
    bad = poisoned_copy(video_run[0] / "video_mle.safetensors", tmp_path / "bad", "video_vq.safetensors")
    p = run([*base, "--out_dir", tmp_path / "rl", "--stage=rlvr", "--init", bad], ok=False)
    assert p.stderr.strip().splitlines()[-1].startswith("error: rlvr: non-finite weights in the policy at step 0")
    assert not (tmp_path / "rl" / "video_rlvr.safetensors").exists()


def tiny_policy():
    torch.manual_seed(0)
    return GPT(GPTConfig.llama(vocab_size=16, block_size=32, n_layer=1, n_head=2, n_embd=16))


def test_grpo_step_refuses_nan_rewards_and_weights_before_any_update():
    policy = tiny_policy()
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    cfg = GRPOConfig(group_size=4, max_new_tokens=4, beta=0.0)
    nan_rewards = lambda items, completions: [float("nan") if i == 2 else float(i) for i in range(len(completions))]
    with pytest.raises(FloatingPointError, match="non-finite reward"):
        grpo_step(policy, None, opt, [[1, 2]], [None], Env(nan_rewards), cfg, torch.Generator().manual_seed(0), 3)
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())
    with torch.no_grad():
        policy.h[0].attn.c_attn.weight[0, 0] = float("inf")
    with pytest.raises(FloatingPointError, match="non-finite weights in the policy at step 7"):
        grpo_step(policy, None, opt, [[1, 2]], [None], Env(lambda i, c: [0.0] * len(c)), cfg, torch.Generator(), 7)


# -----------------------------------------------------------------------------
# no code execution from files

class Payload:
    """Unpickling this creates `marker`: proof that a loader ran code from a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def payload_files(folder, marker):
    """The payload as a raw pickle, as torch.save writes it (a zip holding a pickle), and as an .npz object array."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "raw.pkl").write_bytes(pickle.dumps(Payload(marker)))
    torch.save(Payload(marker), folder / "torch.pt")
    np.savez(folder / "objects.npz", image=np.array([Payload(marker)], dtype=object), action=np.zeros((1, 2)))
    return [folder / "raw.pkl", folder / "torch.pt", folder / "objects.npz"]


def test_payloads_are_live(tmp_path):
    """The payloads below really run code when unpickled (else the tests that they never run prove nothing)."""
    raw, pt, npz = payload_files(tmp_path, tmp_path / "marker")
    for load in (lambda: pickle.loads(raw.read_bytes()), lambda: torch.load(pt, weights_only=False),
                 lambda: np.load(npz, allow_pickle=True)["image"]):
        load()
        assert (tmp_path / "marker").exists()
        (tmp_path / "marker").unlink()


def test_no_loader_runs_code_from_a_file(tmp_path):
    marker = tmp_path / "PWNED"
    model = tiny_policy()
    loaders = {   # file name each loader is given -> the loader
        "ckpt.safetensors": [read_checkpoint, load_model, lambda p: resume(p, model), load_lang_model,
                             load_video_model, load_vq, load_lpips],
        "ep.npz": [read_npz, lambda p: load_episode(p, 64)],
        "tokenizer.tiktoken": [Tokenizer.from_tiktoken_file, load_tokenizer],
        "tokenizer.json": [load_tokenizer],
        "model.safetensors": [lambda p: load_model(p.parent)],
    }
    (tmp_path / "config.json").write_text(json.dumps(dict(
        model_type="gpt2", vocab_size=16, n_positions=32, n_layer=1, n_head=2, n_embd=16, layer_norm_epsilon=1e-5)))
    refused = 0
    for payload in payload_files(tmp_path / "payloads", marker):
        for name, fns in loaders.items():
            path = tmp_path / name
            shutil.copy(payload, path)
            for load in fns:
                with pytest.raises(ValueError) as e:
                    load(path)
                assert name in str(e.value) or str(tmp_path) in str(e.value), (name, e.value)
                refused += 1
    assert refused == 3 * 13 and not marker.exists()


@pytest.mark.slow
def test_scripts_refuse_pickled_checkpoints_and_episodes(lang_data, lang_out, video_data, video_out, tmp_path):
    marker = tmp_path / "PWNED"
    raw, pt, npz = payload_files(tmp_path / "payloads", marker)
    shutil.copy(pt, tmp_path / "evil.safetensors")
    assert_refused([*LANG, "--stage=rlvr", f"--init={tmp_path / 'evil.safetensors'}", f"--data_dir={lang_data}",
                    f"--out_dir={lang_out}", "--resume=0"], r"^error: .*evil\.safetensors: not a readable safetensors "
                   r"checkpoint",
                   lang_out)
    data = tmp_path / "vdata"
    shutil.copytree(video_data, data)
    shutil.copy(npz, data / "val" / "00001.npz")
    assert_refused([*VIDEO, "--data", data, "--init=scratch", "--out_dir", video_out, "--resume=0"],
                   r"^error: .*val/00001\.npz: cannot read the \.npz episode \(Object arrays cannot be loaded when "
                   r"allow_pickle=False\)$", video_out)
    assert not marker.exists()


def unsafe_loads(source, test_file=False):
    """Calls in Python source that could unpickle: -> list of offending snippets."""
    found = re.findall(r"^\s*(?:import|from)\s+(?:c?pickle|dill|joblib|shelve|marshal)\b.*", source, re.M)
    found += re.findall(r"\b(?:c?pickle|dill|joblib|marshal)\.loads?\(", source)
    for m in re.finditer(r"\b(torch|np|numpy)\.load\(", source):
        depth, end = 0, m.end() - 1
        for end in range(m.end() - 1, len(source)):
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            if depth == 0:
                break
        call = source[m.start():end + 1]
        if m.group(1) == "torch" and "weights_only=True" not in call or "allow_pickle=True" in call \
                or m.group(1) != "torch" and not test_file and "allow_pickle=False" not in call:
            found.append(call)
    return found


def test_no_unpickling_code_in_the_repository():
    assert unsafe_loads("import pickle\nx = torch.load(f)\ny = np.load(p)\nz = np.load(q, allow_pickle=True)") == \
        ["import pickle", "torch.load(f)", "np.load(p)", "np.load(q, allow_pickle=True)"]
    assert unsafe_loads("torch.load(f, weights_only=True)\nwith np.load(p, allow_pickle=False):") == []
    files = [f for f in ROOT.rglob("*.py") if f != Path(__file__)
             and not any(part in ("out", "__pycache__") or part.startswith(".") for part in f.relative_to(ROOT).parts)]
    assert len(files) > 30
    offending = {str(f.relative_to(ROOT)): unsafe_loads(f.read_text(), f.parent.name == "tests") for f in files}
    assert {f: calls for f, calls in offending.items() if calls} == {}
