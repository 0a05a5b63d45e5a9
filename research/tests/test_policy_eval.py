"""policy_eval.py: policies in the simulator, the pixel success detector, Spearman, chunked world-model rollouts, and
one tiny end-to-end run on the shipped MLE checkpoint."""
import json
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import pytest
import torch

from research import policy_eval as pe
from data.robot import sim
from data.robot.task import Layout
from model import GPT, GPTConfig
from tokenizer_vq import VQConfig, VQVAE

ROOT = Path(__file__).resolve().parents[2]


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


def test_spearman_interval_resamples_scenes():
    rng = np.random.default_rng(1)
    rates = [0.9, 0.6, 0.3, 0.0]                                        # 4 policies x 40 scenes x 2 samples
    real = [(rng.random(80) < p).astype(int) for p in rates]
    assert pe.spearman_interval(real, real, 2) == [1.0, 1.0]             # a perfect world model
    assert pe.spearman_interval(real, [np.zeros(80)] * 4, 2) == [0.0, 0.0]   # one that imagines no success
    # one imagined success in 80 episodes per policy ranks them by chance: the interval is wide
    few = [np.eye(80, dtype=int)[i * 20] for i in range(4)]
    lo, hi = pe.spearman_interval(real, few, 2)
    assert lo <= 0 and hi >= 0.5


def tiny_world(frames_per_window=4):
    torch.manual_seed(0)
    vq = VQVAE(VQConfig(channels=(4, 4, 8), n_codes=16)).eval()
    lay = Layout(16, 64, 2)
    gpt = GPT(GPTConfig.llama(vocab_size=lay.vocab_size, block_size=frames_per_window * lay.frame_len, n_layer=1,
                              n_head=2, n_embd=16))
    return vq, lay, gpt


def test_gripper_detector_on_real_frames():
    errs = []
    for i in range(4):
        ep = sim.policy_episode(np.random.default_rng([5, 3, i]), np.random.default_rng(i), 16, 0.6)
        errs += [np.abs(pe.locate_gripper(f) - g).max() for f, g in zip(ep["image"], ep["gripper"])]
    assert np.mean(errs) < 0.4 and max(errs) < 1.0
    rng = np.random.default_rng(3)
    bg = sim.draw_goal(sim.render_background(rng), sim.reset(rng)["goal"])
    empty = (np.clip(bg, 0, 1) * 255 + 0.5).astype(np.uint8)
    assert pe.locate_gripper(empty) is None                  # no gripper, no centre
    scattered = empty.copy()
    scattered[:4, :4] = scattered[-4:, -4:] = (sim.GRIPPER_RGB * 255).astype(np.uint8)   # two far dark corners
    assert pe.locate_gripper(scattered) is None


def test_imagine_rolls_out_in_chunks_from_the_last_predicted_frame(monkeypatch):
    vq, lay, gpt = tiny_world(4)                             # room for 1 context + 3 predicted frames
    eps = [sim.policy_episode(np.random.default_rng([0, 3, i]), np.random.default_rng(i), 7, 0.3) for i in range(3)]
    first, actions = np.stack([e["image"][0] for e in eps]), np.stack([e["action"] for e in eps])
    lo, hi = np.full(2, -1, np.float32), np.ones(2, np.float32)
    wm = (gpt, vq, lo, hi, False)
    calls = []
    real_rollout = pe.rollout
    monkeypatch.setattr(pe, "rollout", lambda *a: calls.append(a) or real_rollout(*a))
    frames = pe.imagine(wm, first, actions, horizon=3, batch_size=2)
    assert frames.shape == (3, 6, 64, 64, 3) and frames.dtype == np.uint8
    assert [c[3] for c in calls] == [3, 3, 3, 3]             # frames 1-3 for 2 batches, then 4-6 for 2 batches
    bins = lay.action_tokens(pe.action_bins(actions, lo, hi))
    ctx = vq.tokenize_context(frames[:, 2]).tolist()         # chunk 2 starts from predicted frame 3, re-encoded
    assert calls[2][1][0] == ctx[0] + bins[0, 3].tolist()
    assert calls[2][2][0].tolist() == bins[0, 4:6].tolist()                # and injects actions 4 and 5
    assert np.array_equal(frames, pe.imagine(wm, first, actions, horizon=3, batch_size=3))   # greedy, any batching
    assert np.array_equal(pe.imagine(wm, first, actions[:, :4], horizon=3), frames[:, :3])   # one chunk: a rollout


def test_a_mirrored_world_model_predicts_in_the_view_its_action_points_right_and_down():
    vq, lay, gpt = tiny_world(2)
    eps = [sim.policy_episode(np.random.default_rng([0, 3, i]), np.random.default_rng(i), 2, 1.0) for i in range(4)]
    ctx = np.stack([e["image"][0] for e in eps])
    lo, hi = np.full(2, -1, np.float32), np.ones(2, np.float32)
    plain, mirrored = (gpt, vq, lo, hi, False), (gpt, vq, lo, hi, True)
    a = np.array([[[0.5, 0.5]], [[-0.5, 0.2]], [[0.3, -0.7]], [[-0.4, -0.4]]], np.float32)    # (N, 1, D)
    pred = pe.predict_frames(mirrored, ctx, a)
    assert np.array_equal(pred[0], pe.predict_frames(plain, ctx[:1], a[:1])[0])   # right and down: as drawn
    # in that view, with the action's signs turned: the plain model on the mirrored context, mirrored back
    assert np.array_equal(pred[1:, 0], pe.mirror_each(pe.predict_frames(
        plain, pe.mirror_each(ctx[1:], a[1:, 0]), np.abs(a[1:]))[:, 0], a[1:, 0]))
    # so it is equivariant under the mirrors, as the world is but for its light: a world mirrored left-right, its
    # action too, gets the mirrored prediction
    flipped = np.ascontiguousarray(ctx[:, :, ::-1])
    b = a * np.array([-1, 1], np.float32)
    assert np.array_equal(pe.predict_frames(mirrored, flipped, b), pred[:, :, :, ::-1])
    with pytest.raises(ValueError, match="one frame at a time"):
        pe.predict_frames(mirrored, ctx, np.repeat(a, 2, 1))


class CondStub:
    """A context-conditioned tokenizer's interface, recording what each call got: its future codes are frame-sized
    offsets that mean nothing without their context frame."""
    def __init__(self):
        self.decoded_with, self.context_of = [], []

    def vocab(self):
        return dict(context_codes=16, context_len=64, n_codes=16, codes_per_frame=64, code_offset=16)

    def tokenize_context(self, frames):
        self.context_of.append(np.array(frames))
        return torch.zeros(len(frames), 64, dtype=torch.long)

    def detokenize(self, codes, context):
        self.decoded_with.append(np.array(context))
        return torch.from_numpy(np.array(context)).permute(0, 3, 1, 2).float() / 255 + 0.1 * codes[:, :1, None, None]

    def parameters(self):
        yield torch.zeros(1)


def test_cond_chunks_decode_against_their_context_and_chain_decoded_frames(monkeypatch):
    vq = CondStub()
    lay = Layout.of(vq, 2)
    monkeypatch.setattr(pe, "rollout", lambda model, prompts, acts, h, L, *a: (torch.full(
        (len(prompts), h * L + (h - 1) * 2), lay.offset + 1), torch.zeros(len(prompts), h * L + (h - 1) * 2),
        None))                                                                 # every predicted code: 1
    first = np.zeros((2, 64, 64, 3), np.uint8)
    frames = pe.imagine((None, vq, -np.ones(2), np.ones(2), False), first, np.zeros((2, 5, 2), np.float32), horizon=2)
    assert frames.shape == (2, 4, 64, 64, 3)
    assert (frames[:, :2] == 26).all() and (frames[:, 2:] == 52).all()   # chunk 2 adds its change to chunk 1's frame
    assert [c.max() for c in vq.context_of] == [0, 26]                     # chunk 2's context: the decoded frame 2
    assert [d.max() for d in vq.decoded_with] == [0, 26]                   # each chunk decoded against its context


def oracle_world(monkeypatch, eps):
    """A world model that knows the simulator: each frame it is shown maps to its true state (the episodes' first
    frames, then every frame it predicts), and it predicts the rendered next state."""
    states = {}
    for i, ep in enumerate(eps):
        rng = np.random.default_rng([0, pe.SCENE_STREAM, i])
        state = sim.reset(rng)
        bg = sim.draw_goal(sim.render_background(rng), state["goal"])
        states[ep["image"][0].tobytes()] = (state, bg)

    def predict(wm, ctx, actions, *a, **k):
        out = []
        for f, act in zip(ctx, actions[:, 0]):
            state, bg = states[f.tobytes()]
            nxt = sim.step(state, act)
            img = sim.render(bg, nxt)
            states[img.tobytes()] = (nxt, bg)
            out.append(img[None])
        return np.stack(out)
    monkeypatch.setattr(pe, "predict_frames", predict)


def test_closed_loop_with_a_perfect_world_is_the_real_episode(monkeypatch):
    for policy in ("random", 0.0):
        eps = pe.real_episodes(policy, 4, 2, 16, seed=0)
        scenes = [i for i in range(4) for _ in range(2)]
        oracle_world(monkeypatch, [eps[2 * i] for i in range(4)])
        rngs = [pe.policy_rng(0, i, s) for i in range(4) for s in range(2)]
        goals = [pe.locate_goal(ep["image"][0]) for ep in eps]
        frames = pe.imagine_closed(None, np.stack([ep["image"][0] for ep in eps]), [ep["color"] for ep in eps], goals,
                                   policy, rngs, 16)
        assert frames.shape == (8, 15, 64, 64, 3) and len(set(scenes)) == 4
        if policy == "random":        # the policy ignores the frame and draws the real episode's actions
            assert np.array_equal(frames, np.stack([ep["image"][1:] for ep in eps]))
        else:                         # the expert acts on perceived positions (0.2 px off): about the same pushes
            end = [pe.locate_block(f, ep["color"]) for f, ep in zip(frames[:, -1], eps)]
            assert max(np.abs(b - ep["block"][-1]).max() for b, ep in zip(end, eps)) < 3
            assert [pe.judge(f, ep["color"], g) for f, ep, g in zip(frames[:, -1], eps, goals)] == \
                [bool(ep["success"][-1]) for ep in eps]


def test_one_step_checks_pass_a_perfect_world_and_fail_a_still_one(monkeypatch):
    eps = pe.real_episodes(0.0, 3, 1, 16, seed=0)
    oracle_world(monkeypatch, eps)
    good = pe.one_step_checks(None, eps)
    assert good["gripper"]["passed"] and good["push"]["passed"] and good["push"]["n"] > 3
    assert good["gripper"]["response"] == pytest.approx(1.0) and good["gripper"]["error_px"] == 0
    monkeypatch.setattr(pe, "predict_frames", lambda wm, ctx, actions, **k: ctx[:, None])   # nothing moves
    still = pe.one_step_checks(None, eps)
    assert not still["gripper"]["passed"] and not still["push"]["passed"]
    assert still["push"]["response"] == 0 and still["push"]["error_px"] == pytest.approx(still["push"]["true_px"])
    # where the simulator leaves the block still, the oracle moves it as little (under 0.5 px), a still world not at all
    assert good["push"]["still_n"] > 10 and good["push"]["false_px"] <= 0.5 and still["push"]["false_px"] == 0


def test_load_world_model_reads_the_action_bins_and_refuses_other_data(tmp_path, monkeypatch):
    ck = ROOT / "checkpoints" / "video_mle_4000.safetensors"
    wm, args = pe.load_world_model(ck, copy_gate=1, mirrored=True)
    assert wm.mirrored and wm.vq.copy_gate and not wm.gpt.training
    assert wm.lo.tolist() == pytest.approx(args["action_lo"]) and wm.hi.shape == (2,)
    assert pe.load_world_model(ck, copy_gate=0)[0].vq.copy_gate is False
    with pytest.raises(ValueError, match="none.safetensors: no such checkpoint"):
        pe.load_world_model(tmp_path / "none.safetensors")
    model, vq, meta = pe.load_video_model(ck)
    meta["args"]["action_lo"] = [0.0] * 4                  # a model of 4-dim actions: not the embedded robot's
    monkeypatch.setattr(pe, "load_video_model", lambda *a: (model, vq, meta))
    with pytest.raises(ValueError, match="not a model of the embedded robot"):
        pe.load_world_model(ck)


@pytest.mark.slow
def test_main_end_to_end_on_the_shipped_model(tmp_path, capsys, monkeypatch):
    mle = ROOT / "checkpoints" / "video_cond_mle.safetensors"
    out = tmp_path / "r.json"
    pe.main([f"--mle={mle}", f"--rlvr={mle}", "--episodes=2", "--samples=2", "--policies=0,random", "--length=4",
             "--check_episodes=1", "--gate=0", f"--json={out}", f"--strip={tmp_path / 's.png'}"])
    res = json.loads(out.read_text())
    # policy 0's 4 episodes (2 scenes x 2 samples): real over imagined frames 0 and 3 (of 4), 2x upscaled
    assert imageio.imread(tmp_path / "s.png").shape == (4 * 2 * 2 * 64, 2 * 2 * 64, 3)
    assert [r["policy"] for r in res["policies"]] == ["0.0", "random"] and set(res["checks"]) == {"mle", "rlvr"}
    assert res["checks"]["mle"] == res["checks"]["rlvr"]
    for r in res["policies"]:
        assert r["models"]["mle"] == r["models"]["rlvr"]      # the same checkpoint twice: one seeded generator each
        assert len(r["episodes"]["real"]) == 4 and len(r["episodes"]["mle"]["closed"]) == 4
        m = r["models"]["mle"]["closed"]
        assert m["gap"] == pytest.approx(abs(m["estimate"] - r["real"])) and 0 <= m["episode_agreement"] <= 1
    assert res["detector"]["frames"] == 32 and "Spearman" in capsys.readouterr().out
    failed = dict(n=1, true_px=1.0, pred_px=0.0, response=0.0, error_px=1.0, passed=False)
    monkeypatch.setattr(pe, "one_step_checks", lambda *a: dict(gripper=failed, push=failed))
    pe.main([f"--mle={mle}", "--episodes=1", f"--json={out}"])   # the gate: checks only
    assert "policies" not in json.loads(out.read_text()) and "gate: " in capsys.readouterr().out
    # --copy_gate=1 decodes both models with the copy gate; by default, as each checkpoint records
    seen = []
    monkeypatch.setattr(pe, "one_step_checks",
                        lambda wm, *a: seen.append(wm[1].copy_gate) or dict(gripper=failed, push=failed))
    pf = ROOT / "checkpoints" / "video_mle.safetensors"
    pe.main([f"--mle={pf}", f"--rlvr={pf}", "--episodes=1", "--copy_gate=1", f"--json={out}"])
    assert seen == [True, True] and json.loads(out.read_text())["copy_gate"] == 1
    pe.main([f"--mle={pf}", "--episodes=1", f"--json={out}"])
    assert seen[2:] == [False]
    with pytest.raises(SystemExit, match="--rlvr .*no such checkpoint"):
        pe.main([f"--mle={mle}", f"--rlvr={tmp_path / 'none.safetensors'}"])
    with pytest.raises(SystemExit, match="block size"):
        pe.main([f"--mle={mle}", "--horizon=8"])
    with pytest.raises(SystemExit, match="--loops"):
        pe.main([f"--mle={mle}", "--loops=dream"])
    with pytest.raises(SystemExit, match="--mirror=1 .*--horizon=1"):
        pe.main([f"--mle={mle}", "--mirror=1", "--horizon=2"])
