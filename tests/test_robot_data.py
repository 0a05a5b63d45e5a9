import json
import multiprocessing
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from data.robot import sim
from data.robot.prepare import ensure_splits
from data.robot.task import (N_BINS, Layout, action_bins, episode_files, frame_codes, load_episode, load_split,
                             read_action_stats, resize_frames, windows)


def scene(gripper, block, other=(50.0, 50.0)):
    return dict(gripper=np.array(gripper, np.float32), blocks=np.array([block, other], np.float32),
                goal=np.array([10.0, 50.0], np.float32), colors=sim.PALETTE[:2])


def test_gripper_moves_by_the_action_and_pushes_blocks():
    s = sim.step(scene((20, 20), (40, 40)), [1.0, -0.5])
    assert np.allclose(s["gripper"], [20 + sim.SPEED, 20 - 0.5 * sim.SPEED])
    assert np.allclose(s["blocks"][0], [40, 40])                  # no contact: the block stays
    s = scene((30, 40), (30 + sim.GRIP_R + sim.HALF + 1, 40))     # block 1 pixel to the right of the gripper
    s2 = sim.step(s, [1.0, 0.0])
    assert s2["blocks"][0][0] > s["blocks"][0][0] and np.isclose(s2["blocks"][0][1], 40)
    # after the push the disc touches the block's side but does not overlap it
    assert s2["blocks"][0][0] - sim.HALF - s2["gripper"][0] == pytest.approx(sim.GRIP_R, abs=1e-4)


def test_walls_and_block_block_contacts():
    s = scene((62 - sim.GRIP_R - 2 * sim.HALF, 30), (63 - sim.HALF, 30))   # block against the right wall
    s2 = sim.step(s, [1.0, 0.0])
    assert s2["blocks"][0][0] <= 63 - sim.HALF + 1e-5
    assert s2["blocks"][0][0] - sim.HALF - s2["gripper"][0] >= sim.GRIP_R - 1e-4   # gripper yields
    s = scene((20, 30), (20 + sim.GRIP_R + sim.HALF + 0.5, 30), other=(20 + sim.GRIP_R + 3 * sim.HALF + 1, 30))
    s2 = sim.step(s, [1.0, 0.0])
    assert s2["blocks"][1][0] - s2["blocks"][0][0] >= 2 * sim.HALF - 1e-4   # the pushed block pushes the other


def test_expert_reaches_the_goal_more_often_than_random_actions():
    rng = np.random.default_rng(0)
    expert = np.mean([sim.episode(rng, 40, 0.0)["success"] for _ in range(12)])
    rng = np.random.default_rng(0)
    wins = 0
    for _ in range(12):
        s = sim.reset(rng)
        for _ in range(40):
            s = sim.step(s, rng.uniform(-1, 1, 2))
        wins += sim.success(s)
    assert expert >= 0.5 and expert > wins / 12


def test_episode_format_and_determinism():
    a = sim.episode(np.random.default_rng(3), 6, 0.2)
    b = sim.episode(np.random.default_rng(3), 6, 0.2)
    assert a["image"].shape == (6, 64, 64, 3) and a["image"].dtype == np.uint8
    assert a["action"].shape == (6, 2) and a["action"].dtype == np.float32 and np.abs(a["action"]).max() <= 1
    assert np.array_equal(a["image"], b["image"])
    assert a["image"].std() > 5                                   # textured, not flat
    # the gripper moves between frames: the frames change
    assert np.abs(a["image"][1:].astype(int) - a["image"][:-1]).max() > 50


def test_prepare_writes_held_out_splits(tmp_path):
    ensure_splits(tmp_path, {"train": 4, "val": 1, "test": 2}, verbose=False)
    for split, n in (("train", 4), ("val", 1), ("test", 2)):
        assert len(episode_files(tmp_path, split)) == n
    with np.load(episode_files(tmp_path, "train")[0]) as z:
        assert {"image", "action", "background", "success", "noise"} <= set(z.files)
    train = {f.read_bytes() for f in episode_files(tmp_path, "train")}
    assert not train & {f.read_bytes() for f in episode_files(tmp_path, "test")}
    stats = json.loads((tmp_path / "action_stats.json").read_text())
    assert len(stats["min"]) == 2 and all(lo < hi for lo, hi in zip(stats["min"], stats["max"]))
    eps = load_split(tmp_path, "test", 32)
    assert eps[0]["image"].shape == (16, 32, 32, 3) and eps[0]["background"].shape == (32, 32, 3)


def test_two_runs_generating_at_once_both_finish(tmp_path):
    # two trainings started together on a fresh checkout generate the same data side by side:
    # neither may find the other's half-written files
    sizes = {"train": 30, "val": 2, "test": 2}
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=ensure_splits, args=(tmp_path, sizes), kwargs=dict(verbose=False))
             for _ in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0, 0]
    assert [len(episode_files(tmp_path, s)) for s in sizes] == [30, 2, 2]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["action_stats.json", "test", "train", "val"]


@pytest.mark.skipif(os.name != "posix", reason="process lookup is POSIX only")
def test_folders_of_killed_generations_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()                                              # a pid whose process is gone
    old = time.time() - 3600
    sizes, folders = {"train": 2, "val": 1, "test": 1}, {}
    ensure_splits(tmp_path / "killed_beside_data", sizes, verbose=False)   # found by any later run
    for name, pid, age in (("killed", dead.pid, old), ("killed_beside_data", dead.pid, old),
                           ("killed_just_now", dead.pid, None), ("live", os.getppid(), old),
                           ("not_ours", "x", old)):
        folders[name] = tmp_path / name / f".partial-{pid}"
        (folders[name] / "train").mkdir(parents=True)
        if age:
            for f in (folders[name] / "train", folders[name]):
                os.utime(f, (age, age))
        ensure_splits(tmp_path / name, sizes, verbose=False)
    assert [name for name, f in folders.items() if f.is_dir()] == ["killed_just_now", "live", "not_ours"]


def test_flat_directory_split_and_rt1_shapes(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(20):
        np.savez(tmp_path / f"ep{i:02d}.npz", image=rng.integers(0, 255, (3, 256, 320, 3), dtype=np.uint8),
                 action=rng.normal(size=(3, 13)).astype(np.float32))
    splits = {s: set(episode_files(tmp_path, s)) for s in ("train", "val", "test")}
    assert [len(splits[s]) for s in ("train", "val", "test")] == [17, 1, 2]
    assert not (splits["train"] & splits["test"]) and not (splits["train"] & splits["val"])
    ep = load_episode(sorted(splits["train"])[0], 64)
    assert ep["image"].shape == (3, 64, 64, 3) and ep["action"].shape == (3, 13) and ep["background"] is None
    lo, hi = read_action_stats(tmp_path)
    assert lo.shape == (13,) and (tmp_path / "action_stats.json").is_file()


def test_resize_and_bad_files(tmp_path):
    frames = np.zeros((2, 256, 320, 3), np.uint8)
    frames[:, :, 160:] = 200
    small = resize_frames(frames, 64)
    assert small.shape == (2, 64, 64, 3) and small[0, 0, 0, 0] == 0 and small[0, 0, -1, 0] == 200
    np.savez(tmp_path / "bad.npz", image=np.zeros((3, 8, 8), np.uint8), action=np.zeros((3, 2)))
    with pytest.raises(ValueError, match="bad.npz"):
        load_episode(tmp_path / "bad.npz", 64)
    np.savez(tmp_path / "noact.npz", image=np.zeros((3, 8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match="action"):
        load_episode(tmp_path / "noact.npz", 64)


def test_action_bins_and_layout():
    lo, hi = np.array([-1.0, 0.0], np.float32), np.array([1.0, 10.0], np.float32)
    b = action_bins(np.array([[-1.0, 0.0], [1.0, 10.0], [0.0, 20.0]], np.float32), lo, hi)
    assert b.tolist() == [[0, 0], [N_BINS - 1, N_BINS - 1], [128, N_BINS - 1]]
    lay = Layout(n_codes=16, codes_per_frame=4, action_dim=2)
    assert lay.vocab_size == 16 + 2 * N_BINS and lay.frame_len == 6 and lay.offset == 0
    ctx = torch.arange(12).view(1, 3, 4)                                   # one clip of 3 frames, 4 codes each
    tokens = dict(context=ctx, actions=torch.from_numpy(lay.action_tokens(np.array([[0, 1], [2, 3], [4, 5]])))[None])
    tokens["future"] = torch.stack([torch.stack([ctx[0, 1], ctx[0, 2]]), torch.stack([ctx[0, 2], ctx[0, 2]]),
                                    torch.zeros(2, 4, dtype=torch.long)])[None]     # (1, T=3, horizon=2, L=4)
    seq = windows(tokens, lay, [0], [0], context=1, horizon=2)[0]
    assert seq.tolist() == [0, 1, 2, 3, 16, 16 + 256 + 1, 4, 5, 6, 7, 18, 16 + 256 + 3, 8, 9, 10, 11]
    idx, tgt = lay.training_pair(seq[None], context=1)
    assert idx[0].tolist() == seq[:-1].tolist()
    assert tgt[0].tolist() == [-1] * 5 + [4, 5, 6, 7] + [-1, -1] + [8, 9, 10, 11]   # predicted frames' codes only
    idx, tgt = lay.training_pair(windows(tokens, lay, [0], [0], context=2, horizon=1), context=2)
    assert tgt[0].tolist() == [-1] * 11 + [8, 9, 10, 11]
    # context-conditioned layout: a context frame of 4 codes in [0, 16), predicted frames of 2 codes shifted by 16
    cond = Layout(n_codes=8, codes_per_frame=2, action_dim=2, context_codes=16, context_len=4, code_offset=16)
    assert cond.A == 24 and cond.vocab_size == 24 + 2 * N_BINS and cond.window_len(1, 2) == 6 + 2 + 2 + 2
    tokens = dict(context=ctx, actions=tokens["actions"] - 16 + 24,
                  future=torch.tensor([[[[1, 2], [3, 4]], [[5, 6], [7, 0]], [[0, 0], [0, 0]]]]))   # (1, 3, 2, 2)
    seq = windows(tokens, cond, [0], [1], context=1, horizon=1)[0]             # context frame 1, then frame 2
    assert seq.tolist() == [4, 5, 6, 7, 24 + 2, 24 + 256 + 3, 16 + 5, 16 + 6]
    assert cond.training_pair(seq[None], 1)[1][0].tolist() == [-1] * 5 + [21, 22]
    assert frame_codes(torch.tensor([[21, 22, 3, 24]]), cond, 1).tolist() == [[[5, 6]]]   # no future code -> 0
    assert frame_codes(torch.tensor([[3, 24]]), cond, 1).tolist() == [[[0, 0]]]


