"""What a newcomer meets first: every bad input fails in seconds with one `error:` line, no traceback, and writes
nothing; a re-run into the same out_dir with other flags stops naming them, and the same command resumes; every
script's --help works with the runtime requirements alone (requirements.txt), the dev packages blocked."""
import hashlib
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import video_eval
from data.robot.prepare import ensure_splits as robot_splits, generate_split
from data.robot.task import write_action_stats
from data.textgame.prepare import ensure_splits

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# a tiny text-game run: 4 MLE steps from scratch on 60 records (a few seconds)
TINY = ["train_lang.py", "--stage=mle", "--init=scratch", "--n_layer=1", "--n_embd=32",
        "--batch_size=4", "--mle_steps=4", "--max_new_tokens=16"]
SHIPPED = "checkpoints/textgame/mle.safetensors"


def script(*args, cwd=ROOT, env=ENV):
    """Run a script of the repository -> the finished process (and how long it took, in .seconds)."""
    t0 = time.time()
    p = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=120)
    p.seconds = time.time() - t0
    return p


def snapshot(*folders):
    """Every file under the folders (that exist) -> its hash: `nothing written` compares two of these."""
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for d in folders if Path(d).exists()
            for f in sorted(Path(d).rglob("*")) if f.is_file()}


def refused(p, expected):
    """A failure as a newcomer should meet it: exit status != 0 in well under a minute, no traceback, and one
    `error:` line (argparse's usage lines may stand above it), the last, containing `expected`."""
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert p.returncode != 0 and p.seconds < 60, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and len(errors) == 1, p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1] == errors[0] and expected in errors[0], errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("text") / "data"
    ensure_splits(d, n_train=60, n_val=8, n_test=8, verbose=False)
    return d


@pytest.fixture(scope="module")
def video_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("video") / "data"
    for split, n in (("train", 3), ("val", 1), ("test", 1)):
        generate_split(d, split, n, length=8)
    write_action_stats(d)
    return d


# -----------------------------------------------------------------------------
# bad input: one line, in seconds, nothing written

@pytest.mark.parametrize("device, expected", [
    ("gpu", "error: --device gpu: not a device; use cpu, cuda or cuda:N"),
    pytest.param("cuda", "sees no CUDA GPU; use --device=cpu",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA")),
])
def test_a_device_this_torch_cannot_use(device, expected, text_data, tmp_path):
    refused(script(*TINY, f"--data_dir={text_data}", f"--out_dir={tmp_path / 'out'}", f"--device={device}"),
            expected)
    assert not (tmp_path / "out").exists()
    refused(script("eval.py", f"--ckpt={SHIPPED}", f"--data={text_data / 'val.jsonl'}", f"--device={device}"),
            expected)


def test_a_prefix_of_a_flag_is_not_that_flag(text_data, tmp_path):
    """--data is not --data_dir (argparse's prefix matching is off): a typo is an error, not a folder of data."""
    refused(script(*TINY, f"--data={tmp_path / 'typo'}", f"--out_dir={tmp_path / 'out'}"),
            "unrecognized arguments: --data=")
    assert not (tmp_path / "typo").exists() and not (tmp_path / "out").exists()


def test_a_data_dir_without_the_splits(text_data, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "test.jsonl").write_bytes((text_data / "test.jsonl").read_bytes())   # one split of your own
    before = snapshot(mine)
    line = refused(script(*TINY, f"--data_dir={mine}", f"--out_dir={tmp_path / 'out'}"),
                   f"error: --data_dir {mine}: missing train.jsonl, val.jsonl")
    assert "test.jsonl" not in line.split("(")[0]                  # the one present is not named missing
    assert snapshot(mine) == before and not (tmp_path / "out").exists()   # never topped up with simulator data
    refused(script("train_video.py", f"--data={tmp_path / 'nowhere'}", f"--out_dir={tmp_path / 'out'}"),
            f"error: --data {tmp_path / 'nowhere'}: no .npz episodes for train, val, test")
    assert not (tmp_path / "out").exists()


def test_the_embedded_robot_data_is_generated_whole_or_not_at_all(tmp_path):
    robot_splits(tmp_path, {"train": 2, "val": 1, "test": 1}, verbose=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["action_stats.json", "test", "train", "val"]
    for split in ("val", "test"):
        for f in (tmp_path / split).iterdir():
            f.unlink()
        (tmp_path / split).rmdir()
    with pytest.raises(ValueError, match=r"has train/ but not val/, test/; delete the others"):
        robot_splits(tmp_path, {"train": 2, "val": 1, "test": 1}, verbose=False)


@pytest.mark.parametrize("content, expected", [
    (None, "bytesized32.jsonl: no such file"),                      # no file
    ('{"game": "x"\n', "bytesized32.jsonl:1: invalid JSON"),
    ('{"game": "x"}\n', "bytesized32.jsonl:1: not a ByteSized32 state-prediction record (missing key"),
    ("", "--bytesized32 needs a ByteSized32 .jsonl file and --out"),   # an empty flag: not the simulator's data
])
def test_bytesized32_conversion_of_a_bad_file(content, expected, tmp_path):
    src = tmp_path / "bytesized32.jsonl"
    if content:
        src.write_text(content)
    flag = "--bytesized32=" + (str(src) if content != "" else "")
    refused(script("data/textgame/prepare.py", flag, f"--out={tmp_path / 'out.jsonl'}",
                   f"--out_dir={tmp_path / 'simulated'}"), expected)
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "simulated").exists()   # nor simulator data


def test_eval_limit_must_not_be_negative():
    refused(script("eval.py", f"--ckpt={SHIPPED}", "--limit=-1"), "eval.py: error: --limit must be >= 0, got -1")


def test_eval_video_with_a_missing_checkpoint_generates_no_data(tmp_path, monkeypatch, capsys):
    """In-process (eval.py run as the command, dispatching to video_eval.py), with the embedded robot data's folder
    moved to an empty tmp_path: the checkpoint is checked before any episode is generated."""
    robot = tmp_path / "robot"
    monkeypatch.setattr(video_eval, "DATA_DIR", robot)
    monkeypatch.setattr(sys, "argv", ["eval.py", "--task=video", f"--ckpt={tmp_path / 'nope.safetensors'}",
                                      f"--data={robot}"])
    t0 = time.time()
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(ROOT / "eval.py"), run_name="__main__")
    assert e.value.code == f"error: {tmp_path / 'nope.safetensors'}: checkpoint file not found"
    assert time.time() - t0 < 60 and not robot.exists()


def test_a_video_checkpoint_is_not_a_language_init(text_data, tmp_path):
    video = "checkpoints/video_cond_mle.safetensors"
    refused(script("train_lang.py", f"--init={video}", f"--data_dir={text_data}", f"--out_dir={tmp_path / 'out'}"),
            f"error: --init {video}: a video world model of train_video.py")
    assert not (tmp_path / "out").exists()
    refused(script("eval.py", f"--ckpt={video}", f"--data={text_data / 'val.jsonl'}"),
            f"error: {video}: a video world model of train_video.py; evaluate it with python eval.py --task=video")


def test_a_corrupt_episode_file(video_data, tmp_path):
    data = tmp_path / "data"
    subprocess.run(["cp", "-r", str(video_data), str(data)], check=True)
    (data / "val" / "00000.npz").write_bytes(b"not a zip archive at all")
    line = refused(script("train_video.py", f"--data={data}", f"--out_dir={tmp_path / 'out'}", "--init=scratch"),
                   f"error: {data / 'val' / '00000.npz'}: ")
    assert "pickle" not in line
    assert not (tmp_path / "out").exists()


# -----------------------------------------------------------------------------
# re-runs: the same command resumes, other flags are refused

@pytest.mark.slow   # seven script runs
def test_rerun_with_other_flags_is_refused_and_the_same_command_resumes(text_data, tmp_path):
    out = tmp_path / "out"
    cmd = [*TINY, f"--data_dir={text_data}", f"--out_dir={out}"]
    p = script(*cmd)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (out / "config.json").is_file()
    before = snapshot(out)
    ways_out = f"use a new --out_dir, or --resume=0 to start over in {out}"
    line = refused(script(*cmd, "--mle_lr=1e-3"), f"error: {out} holds a run with other flags: --mle_lr 0.003 -> 0.001")
    assert line.endswith(ways_out)
    # --init=auto is resolved before comparing: --stage=all (the default) post-trains the shipped model
    refused(script(*[a for a in cmd if a not in ("--stage=mle", "--init=scratch")]), f"--init scratch -> {SHIPPED}")
    assert snapshot(out) == before                                    # nothing written by the refused runs
    p = script(*cmd, "--control=0", "--ckpt_every=2")                 # flags that cannot change the result
    assert p.returncode == 0 and f"mle: {out / 'mle.safetensors'} is complete, reusing it" in p.stdout
    p = script(*cmd, "--mle_lr=1e-3", "--resume=0")                   # starting over
    assert p.returncode == 0 and "is complete" not in p.stdout
    assert '"mle_lr": 0.001' in (out / "config.json").read_text()
    (out / "config.json").unlink()                                    # an out_dir of unknown flags
    refused(script(*cmd, "--mle_lr=1e-3"), f"error: {out} holds mle.safetensors but no config.json")


@pytest.mark.slow   # four script runs
def test_video_rerun_with_other_flags_is_refused(video_data, tmp_path):
    out = tmp_path / "out"
    p = script("train_vq.py", f"--data={video_data}", f"--out_dir={tmp_path / 'vq'}", "--clip_len=8", "--n_codes=16",
               "--steps=2", "--batch=2", "--threads=1")
    assert p.returncode == 0, p.stderr[-2000:]
    cmd = ["train_video.py", f"--data={video_data}", f"--out_dir={out}", "--stage=mle", "--init=scratch",
           f"--vq={tmp_path / 'vq' / 'video_vq.safetensors'}", "--clip_len=8", "--mle_steps=2", "--batch_size=2",
           "--n_layer=1", "--n_embd=32", "--threads=1"]
    p = script(*cmd)
    assert p.returncode == 0, p.stderr[-2000:]
    before = snapshot(out)
    refused(script(*cmd, "--n_layer=2"), f"error: {out} holds a run with other flags: --n_layer 1 -> 2; use a new "
                                         f"--out_dir")
    assert snapshot(out) == before
    assert "is complete, reusing it" in script(*cmd).stdout


# -----------------------------------------------------------------------------
# --help needs the runtime requirements alone

# every script a user runs (tools/trace_step.py passes its flags to train_lang.py)
PATTERNS = ("experiments/*.py", "research/*.py", "tools/*.py", "bench/*.py", "data/*/prepare.py")
SCRIPTS = ["train_lang.py", "train_video.py", "train_vq.py", "eval.py", "video_eval.py",
           *(str(f.relative_to(ROOT)) for pattern in PATTERNS for f in sorted(ROOT.glob(pattern))
             if f.name not in ("__init__.py", "envs.py", "common.py", "memory.py", "trace_step.py",
                                "video_terms.py"))]


# one fresh interpreter runs every script's --help (run_path, as `python SCRIPT --help` would), the packages that
# requirements.txt leaves out made unimportable from the start; prints the scripts whose --help failed
HELP_ALL = """
import contextlib, io, runpy, sys
for m in ("matplotlib", "trl", "transformers", "datasets", "accelerate", "tokenizers", "pytest", "hypothesis",
          "lpips"):
    sys.modules[m] = None
failed = []
for script in sys.argv[1:]:
    sys.argv, sys.path[0], out = [script, "--help"], str(Path(script).resolve().parent), io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
        failed.append(f"{script}: no usage printed")
    except SystemExit as e:
        if e.code not in (0, None) or not out.getvalue().startswith("usage:"):
            failed.append(f"{script}: exit {e.code}")
    except Exception as e:
        failed.append(f"{script}: {type(e).__name__}: {e}")
print(failed)
"""


def test_help_of_every_script_without_the_dev_packages():
    assert len(SCRIPTS) >= 19
    p = script("-c", "from pathlib import Path\n" + HELP_ALL, *SCRIPTS)
    assert p.returncode == 0 and p.stdout.strip().splitlines()[-1] == "[]", p.stdout[-2000:] + p.stderr[-2000:]
