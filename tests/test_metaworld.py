"""data/metaworld/generate.py: the episode format, the scripted expert in real physics, and train_video.py reading the
episodes unchanged. Skipped where Meta-World is not installed (it lives in its own venv; .ci/run installs it there and
runs this file with that venv's python)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("metaworld")
from data.metaworld import generate  # noqa: E402
from data.robot.task import (Layout, action_bins, clips, episode_files, load_split,  # noqa: E402
                             read_action_stats, windows)

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore:Constant")   # the scripted experts' gain warning


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("mw")
    generate.main([f"--out={out}", "--train=2", "--val=1", "--test=1", "--length=6", "--size=32"])
    return out


def test_episodes_have_the_robot_format(data):
    for split, n in (("train", 2), ("val", 1), ("test", 1)):
        files = episode_files(data, split)
        assert len(files) == n
        for f in files:
            with np.load(f) as z:
                assert z["image"].shape == (6, 32, 32, 3) and z["image"].dtype == np.uint8
                assert z["action"].shape == (6, 4) and z["action"].dtype == np.float32
                assert z["success"].shape == (6,) and z["success"].dtype == bool
                assert np.abs(z["action"]).max() <= 1 and z["image"].std() > 10     # a rendered scene, not blank
                assert np.abs(np.diff(z["image"].astype(int), axis=0)).max() > 0     # the arm moves
    stats = json.loads((data / "action_stats.json").read_text())
    assert len(stats["min"]) == len(stats["max"]) == 4
    # the same seed writes the same episodes (physics and CPU rendering are deterministic)
    again = data / "again"
    generate.main([f"--out={again}", "--train=1", "--val=0", "--test=0", "--length=6", "--size=32"])
    a, b = np.load(data / "train" / "00000.npz"), np.load(again / "train" / "00000.npz")
    assert all(np.array_equal(a[k], b[k]) for k in ("image", "action", "success"))


def test_scripted_expert_succeeds_and_success_is_per_frame():
    env, policy = generate.make_env("push-v3", 0)
    camera = generate.Camera(env, 16)
    ep = generate.episode(env, policy, camera, np.random.default_rng(0), 50, 0.0, 3)
    camera.close()
    assert not ep["success"][0] and ep["success"].any()        # starts away from the goal, pushes the puck into it
    with pytest.raises(ValueError, match="--env nonsense"):
        generate.make_env("nonsense", 0)


def test_task_loader_and_train_video_read_the_episodes(data, tmp_path):
    eps = clips(load_split(data, "train", 64), 4)
    assert len(eps) == 2 and eps[0]["image"].shape == (4, 64, 64, 3)
    lo, hi = read_action_stats(data)
    lay = Layout(16, 64, 4)
    tokens = dict(context=torch.zeros(1, 4, 64, dtype=torch.long), future=torch.zeros(1, 4, 3, 64, dtype=torch.long),
                  actions=torch.from_numpy(lay.action_tokens(action_bins(eps[0]["action"][:4], lo, hi)))[None])
    idx, tgt = lay.training_pair(windows(tokens, lay, [0], [0], 1, 3), 1)
    assert idx.shape[1] == 4 * 64 + 3 * 4 - 1 and (tgt >= 0).sum() == 3 * 64
    res = subprocess.run([sys.executable, "train_vq.py", f"--data={data}", f"--out_dir={tmp_path / 'vq'}", "--steps=2",
                          "--batch=4", "--n_codes=16", "--clip_len=6", "--threads=1"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    tiny = ["--mle_steps=2", "--batch_size=2", "--n_layer=1", "--n_embd=32", "--rl_steps=1", "--prompts_per_step=1",
            "--group_size=2", "--micro_batch=4", "--clip_len=6", "--threads=1", f"--vq={tmp_path / 'vq' / 'video_vq.safetensors'}"]
    res = subprocess.run([sys.executable, "train_video.py", f"--data={data}", f"--out_dir={tmp_path / 'out'}", "--init=scratch",
                          *tiny], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "4-dim actions" in res.stdout and (tmp_path / "out" / "video_rlvr.safetensors").is_file()
