"""research/chain_rlvr.py: GRPO over imagined chains of frames."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from data.robot import prepare, sim
from research import chain_rlvr as cr
from research import policy_eval as pe

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "checkpoints" / "video_mle_4000.safetensors"
WEIGHTS = dict(moving=1.0, object=0.5, push=0.1)


def episodes(n, length=6):
    return [dict(ep, background=ep["image"][0]) for ep in (sim.policy_episode(
        np.random.default_rng([0, 3, i]), np.random.default_rng(i), length, 0.0) for i in range(n))]


@pytest.mark.parametrize("mirrored", [False, True])
def test_a_sampled_step_is_the_world_models_own_sample(mirrored):
    # the same draws as policy_eval.predict_frames at T = 1: the rows trained on are the frames imagined
    wm = pe.load_world_model(SHIPPED, copy_gate=1, mirrored=mirrored)[0]
    eps = episodes(3)
    ctx, act = np.stack([ep["image"][2] for ep in eps]), np.stack([ep["action"][2] for ep in eps])
    prompts, tok, lp, frames = cr.sample_frame(wm, ctx, act, 1.0, torch.Generator().manual_seed(5))
    want = pe.predict_frames(wm, ctx, act[:, None], 1.0, torch.Generator().manual_seed(5))[:, 0]
    assert np.array_equal(frames, want) and tok.shape == lp.shape == (3, 64) and (lp <= 0).all()
    assert [len(p) for p in prompts] == [64 + 2] * 3


def test_chains_start_at_the_true_frame_and_go_on_from_their_own(monkeypatch):
    eps, seen = episodes(2), []

    def fake(wm, ctx, act, temperature, gen):   # a world that draws the true next frame, plus one grey level
        seen.append(ctx.copy())
        nxt = np.stack([ep["image"][t + 1 + len(seen) - 1] for ep, t in zip(eps, (1, 3))])
        return [[0]] * len(ctx), torch.zeros(len(ctx), 64, dtype=torch.long), torch.zeros(len(ctx), 64), nxt
    monkeypatch.setattr(cr, "sample_frame", fake)
    (prompts, tok, lp), reward, last = cr.imagine_chains(None, eps, [1, 3], 2, 1.0, None, WEIGHTS)
    assert np.array_equal(seen[0], np.stack([eps[0]["image"][1], eps[1]["image"][3]]))   # the true start
    assert np.array_equal(seen[1], np.stack([eps[0]["image"][2], eps[1]["image"][4]]))   # its own last frame
    assert len(prompts) == len(tok) == 2 * 2                  # k steps x N chains, step by step
    assert np.array_equal(last, np.stack([eps[0]["image"][3], eps[1]["image"][5]]))    # the chain's last frame
    # the true frames: the reward's best, the same as a one-step prediction of the truth
    best = cr.chain_reward(eps[0]["image"][2:3], eps[0]["image"][2:3], eps[0]["image"][1:2],
                           eps[0]["image"][0:1], WEIGHTS)
    assert reward.shape == (2,) and reward[0].item() == pytest.approx(best.item())


@pytest.mark.slow
def test_end_to_end_writes_a_world_model_policy_eval_loads(tmp_path, capsys):
    prepare.ensure_splits(tmp_path / "d", {"train": 2, "val": 2, "test": 1}, 0)
    flags = [f"--init={SHIPPED}", "--mirror=0", f"--data={tmp_path / 'd'}", "--steps=2", "--prompts=2",
             "--group=2", "--chain=2", "--val_episodes=2", "--eval_every=1"]
    cr.main([*flags, f"--out_dir={tmp_path / 'o'}"])
    wm, args = pe.load_world_model(tmp_path / "o" / "video_rlvr.safetensors")
    start = pe.load_world_model(SHIPPED)[0]
    moved = [(a - b).abs().max().item() for a, b in zip(wm.gpt.parameters(), start.gpt.parameters())]
    assert max(moved) > 0 and args["action_lo"] == pe.load_world_model(SHIPPED)[1]["action_lo"]
    log = [json.loads(line) for line in (tmp_path / "o" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "val_reward" in r] == [0, 1, 2]
    assert "val chain reward" in capsys.readouterr().out
    cr.main([*flags, "--placebo=1", f"--out_dir={tmp_path / 'p'}"])   # the placebo runs too
    with pytest.raises(SystemExit, match="finished run"):
        cr.main([*flags, f"--out_dir={tmp_path / 'o'}"])
    with pytest.raises(SystemExit, match="--chain=2 and --val_chain=99 need episodes longer"):
        cr.main([*flags, "--val_chain=99", f"--out_dir={tmp_path / 'q'}"])
    # --steps=0: the start's validation chains only, the same as a run's step 0; longer ones differ
    cr.main([*flags, "--steps=0", f"--out_dir={tmp_path / 'v'}"])
    assert sorted(p.name for p in (tmp_path / "v").iterdir()) == ["log.jsonl"]
    (row,) = [json.loads(line) for line in (tmp_path / "v" / "log.jsonl").read_text().splitlines()]
    assert row["val_rewards"] == log[0]["val_rewards"] and len(row["val_rewards"]) == 2
    assert row["val_reward"] == pytest.approx(np.mean(row["val_rewards"]))
    cr.main([*flags, "--steps=0", "--val_chain=4", f"--out_dir={tmp_path / 'w'}"])
    longer = json.loads((tmp_path / "w" / "log.jsonl").read_text())
    assert longer["val_rewards"] != row["val_rewards"]
    # --eval_split=test: the test split's episodes (1 here), for a finished model only
    cr.main([*flags, "--steps=0", "--eval_split=test", f"--out_dir={tmp_path / 't'}"])
    assert len(json.loads((tmp_path / "t" / "log.jsonl").read_text())["val_rewards"]) == 1
    with pytest.raises(SystemExit, match="--eval_split=test scores a finished model only"):
        cr.main([*flags, "--eval_split=test", f"--out_dir={tmp_path / 'u'}"])
