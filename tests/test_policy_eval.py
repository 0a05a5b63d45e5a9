"""policy_eval.py: policies in the simulator, the pixel success detector, Spearman, chunked world-model rollouts, and
one tiny end-to-end run on the shipped MLE checkpoint."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments import policy_eval as pe
from data.robot import sim
from data.robot.task import Layout
from model import GPT, GPTConfig
from tokenizer_vq import VQConfig, VQVAE

ROOT = Path(__file__).resolve().parents[1]


def test_policy_episode_replays_in_the_simulator():
    eps = {p: sim.policy_episode(np.random.default_rng([0, 3, 1]), np.random.default_rng(7), 12, p)
           for p in (0.0, 0.6, "random")}
    assert all(np.array_equal(e["image"][0], eps[0.0]["image"][0]) for e in eps.values())   # one scene per seed
    for e in eps.values():
        state = sim.reset(np.random.default_rng([0, 3, 1]))
        for t in range(12):                          # frames, block positions and success follow the recorded actions
            assert np.allclose(e["block"][t], state["blocks"][0]) and e["success"][t] == sim.success(state)
            state = sim.step(state, e["action"][t])
    r = eps["random"]["action"]
    assert np.abs(r).max() <= 1 and not np.allclose(r, eps[0.0]["action"])


def test_detector_agrees_with_sim_success_on_real_frames():
    agree, hits, pos = 0, 0, 0
    for i in range(6):
        ep = sim.policy_episode(np.random.default_rng([5, 3, i]), np.random.default_rng(i), 30, 0.0)
        goal = pe.locate_goal(ep["image"][0])
        assert np.abs(goal - ep["goal"]).max() < 1.5
        for f, ok, b in zip(ep["image"], ep["success"], ep["block"]):
            assert np.abs(pe.locate_block(f, ep["color"]) - b).max() < 1.0
            agree += pe.judge(f, ep["color"], goal) == ok
            hits += pe.judge(f, ep["color"], goal) and ok
            pos += ok
    assert pos > 10 and agree / 180 > 0.97 and hits / pos > 0.9
    # a block placed on the goal counts, an erased block or a missing goal does not
    rng = np.random.default_rng(3)
    state = sim.reset(rng)
    bg = sim.draw_goal(sim.render_background(rng), state["goal"])
    on_goal = sim.render(bg, dict(state, blocks=np.stack([state["goal"], state["blocks"][1]])))
    goal = pe.locate_goal(on_goal)
    assert pe.judge(on_goal, state["colors"][0], goal)
    assert not pe.judge(sim.render(bg, state), state["colors"][0], goal)
    empty = (np.clip(bg, 0, 1) * 255 + 0.5).astype(np.uint8)
    assert pe.locate_block(empty, state["colors"][0]) is None and not pe.judge(empty, state["colors"][0], goal)
    assert not pe.judge(on_goal, state["colors"][0], None)


def test_spearman_with_ties():
    assert pe.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert pe.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pe.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / np.sqrt(22.5))   # ranks 1, 2.5, 2.5, 4
    assert pe.spearman([0.5, 0.1, 0.0], [0, 0, 0]) is None                                 # undefined
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 4, 12), rng.integers(0, 5, 12)
    assert pe.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])


def tiny_world(frames_per_window=4):
    torch.manual_seed(0)
    vq = VQVAE(VQConfig(channels=(4, 4, 8), n_codes=16)).eval()
    lay = Layout(16, 64, 2)
    gpt = GPT(GPTConfig.llama(vocab_size=lay.vocab_size, block_size=frames_per_window * lay.frame_len, n_layer=1,
                              n_head=2, n_embd=16))
    return vq, lay, gpt


def test_imagine_rolls_out_in_chunks_from_the_last_predicted_frame(monkeypatch):
    vq, lay, gpt = tiny_world(4)                             # room for 1 context + 3 predicted frames
    eps = [sim.policy_episode(np.random.default_rng([0, 3, i]), np.random.default_rng(i), 7, 0.3) for i in range(3)]
    first, actions = np.stack([e["image"][0] for e in eps]), np.stack([e["action"] for e in eps])
    lo, hi = np.full(2, -1, np.float32), np.ones(2, np.float32)
    calls = []
    real_rollout = pe.rollout
    monkeypatch.setattr(pe, "rollout", lambda *a: calls.append(a) or real_rollout(*a))
    codes = pe.imagine(gpt, vq, first, actions, lo, hi, horizon=3, batch_size=2)
    assert codes.shape == (3, 6, 64) and codes.max() < 16
    assert [c[3] for c in calls] == [3, 3, 3, 3]             # frames 1-3 and 4-6, for 2 batches
    bins = lay.action_tokens(pe.action_bins(actions, lo, hi))
    assert calls[1][1][0] == codes[0, 2].tolist() + bins[0, 3].tolist()   # chunk 2 starts from predicted frame 3
    assert calls[1][2][0].tolist() == bins[0, 4:6].tolist()                # and injects actions 4 and 5
    again = pe.imagine(gpt, vq, first, actions, lo, hi, horizon=3, batch_size=3)
    assert torch.equal(codes, again)                          # greedy, independent of batching
    one = pe.imagine(gpt, vq, first, actions[:, :4], lo, hi, horizon=3)
    assert torch.equal(one, codes[:, :3])                     # a single chunk is the plain rollout


@pytest.mark.slow
def test_main_end_to_end_on_the_shipped_model(tmp_path, capsys):
    mle = ROOT / "checkpoints" / "video_mle.safetensors"
    out = tmp_path / "r.json"
    pe.main([f"--mle={mle}", f"--rlvr={mle}", "--episodes=2", "--policies=0,random", "--length=4", "--horizon=2",
             f"--json={out}"])
    res = json.loads(out.read_text())
    assert [r["policy"] for r in res["policies"]] == ["0.0", "random"]
    for r in res["policies"]:
        assert r["models"]["mle"] == r["models"]["rlvr"]      # the same checkpoint twice: deterministic
        m = r["models"]["mle"]
        assert m["gap"] == pytest.approx(abs(m["estimate"] - r["real"])) and 0 <= m["episode_agreement"] <= 1
    assert res["detector"]["frames"] == 16 and "Spearman" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--rlvr .*train_video.py"):
        pe.main([f"--mle={mle}", f"--rlvr={tmp_path / 'none.safetensors'}"])
    with pytest.raises(SystemExit, match="block size"):
        pe.main([f"--mle={mle}", "--rlvr=", "--horizon=8"])
