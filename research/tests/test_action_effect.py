"""The action-effect checks: the simulator replay, the gripper response of a predicted window, the per-window
object recall and response of eval_video with their paired differences, and the layer diagnosis's pieces."""
from dataclasses import asdict

import numpy as np
import pytest
import torch

from data.robot import sim
from data.robot.detect import gripper_response
from data.robot.task import (EFFECTS, Layout, add_effects, find_still_code, still_cells, summarize_effects,
                             tokenize_split)
from stats import paired_diffs
from research import action_diagnosis as ad
from research import policy_eval as pe
from model import GPT, GPTConfig
from research.cond_tokenizer import CondVQConfig, CondVQVAE
from tokenizer_vq import VQConfig, VQVAE
from video_eval import EvalSpec, eval_video


def test_replay_renders_the_policy_episode():
    for policy in (0.0, "random"):
        ep = sim.policy_episode(np.random.default_rng([0, 3, 2]), np.random.default_rng(5), 10, policy)
        bg, states = sim.replay(np.random.default_rng([0, 3, 2]), ep["action"])
        assert len(states) == 10
        assert all(np.array_equal(sim.render(bg, s), f) for s, f in zip(states, ep["image"]))


def test_gripper_response_of_the_truth_a_still_frame_and_no_move():
    ep = pe.real_episodes(0.0, 1, 1, 6, seed=0)[0]
    img = ep["image"]
    assert gripper_response(img[0], img[1:3], img[1:3]) == pytest.approx(1.0)
    assert gripper_response(img[0], img[1:3], img[[0, 0]]) == 0.0                  # predicted: nothing moves
    assert gripper_response(img[0], img[:1], img[1:2]) is None                   # the truth does not move


def episodes(n, length, seed):
    rng = np.random.default_rng(seed)
    return [dict(sim.episode(rng, length, 0.0)) for _ in range(n)]


def test_add_effects_of_a_perfect_prediction_and_the_summary():
    eps = episodes(2, 5, 0)
    batch = [(0, 0), (1, 2)]
    true = torch.stack([torch.from_numpy(eps[e]["image"][t + 1:t + 3]).permute(0, 3, 1, 2).float() / 255
                        for e, t in batch])                                       # (B, 2, 3, H, W)
    bg = torch.stack([torch.from_numpy(eps[e]["background"]).permute(2, 0, 1).float() / 255 for e, _ in batch])
    objects = ((true - bg[:, None]).abs().amax(2) > 0.15).flatten(1)             # (B, 2 * H * W)
    effects = {k: [] for k in EFFECTS}
    add_effects(effects, eps, batch, 1, 2, objects, objects, true)
    assert effects["object_recall"] == [1.0, 1.0]
    assert all(r is None or r == pytest.approx(1.0, abs=0.02) for r in effects["action_response"])
    s = summarize_effects(dict(object_recall=[0.5, None, 1.0], action_response=[None, None, 0.2]))
    assert s == dict(object_recall=0.75, action_response=0.2, response_windows=1)


def test_eval_video_keeps_per_window_effects_and_their_paired_differences():
    torch.manual_seed(0)
    vq = VQVAE(VQConfig(channels=(4, 4, 8), n_codes=16)).eval()
    lay = Layout(16, 64, 2)
    gpt = GPT(GPTConfig.llama(vocab_size=lay.vocab_size, block_size=4 * lay.frame_len, n_layer=1, n_head=2,
                              n_embd=16))
    eps = episodes(2, 5, 1)
    lo, hi = np.full(2, -1, np.float32), np.ones(2, np.float32)
    res = eval_video(gpt, vq, eps, None, EvalSpec(lo, hi, 1, 2), desc=None)
    pr = res["per_record"]
    assert all(len(pr[k]) == res["n_windows"] == 4 for k in EFFECTS)
    assert all(x is None or 0 <= x <= 1 for x in pr["object_recall"])
    assert res["action_effect"] == summarize_effects({k: pr[k] for k in EFFECTS})
    better = dict(res, per_record=dict(pr, object_recall=[None if x is None else x + 0.1
                                                          for x in pr["object_recall"]]))
    diffs = {(a, b, m): (mean, lo_, hi_) for a, b, m, _, mean, lo_, hi_ in
             paired_diffs({"m": res, "better": better}, [("better", "m")], EFFECTS, ("all",))}
    assert diffs[("better", "m", "object_recall")] == pytest.approx((0.1, 0.1, 0.1))
    # without the robot data's background there are no effects, and nothing to pair
    plain = eval_video(gpt, vq, [dict(ep, background=None) for ep in eps], None, EvalSpec(lo, hi, 1, 2), desc=None)
    assert "action_effect" not in plain and paired_diffs({"a": plain, "b": plain}, [("a", "b")], EFFECTS) == []


def test_diagnosis_follow_and_loss(monkeypatch):
    eps, bgs, states = ad.transitions([0.0, "random"], 1, 4, seed=0)
    ctx = np.concatenate([ep["image"][:-1] for ep in eps])
    assert len(bgs) == len(states) == len(ctx) == 6
    truth = ad.follow(ctx, ad.simulate_commands(bgs, states))
    assert truth["cos"] > 0.8 and truth["distinct"] > 6
    still = ad.follow(ctx, np.repeat(ctx[:, None], ad.N_DIRECTIONS, 1))            # a world that ignores commands
    assert still["cos"] == 0 and still["moved"] == 0 and still["distinct"] == 1
    torch.manual_seed(0)
    vq = VQVAE(VQConfig(channels=(4, 4, 8), n_codes=16)).eval()
    lay = Layout.of(vq, 2)
    gpt = GPT(GPTConfig.llama(vocab_size=lay.vocab_size, block_size=2 * lay.frame_len, n_layer=1, n_head=2,
                              n_embd=16)).eval()
    wm = (gpt, vq, np.full(2, -1, np.float32), np.ones(2, np.float32), False)
    loss = ad.action_loss(wm, eps, seed=0, batch_size=4)
    assert loss["low"] <= loss["increase"] <= loss["high"]
    assert loss["increase"] == pytest.approx(loss["shuffled"] - loss["true"], abs=1e-5)
    assert set(loss["changed"]) == set(loss["unchanged"]) == {"true", "shuffled"}
    codes = ad.code_stats(vq, ctx, np.concatenate([ep["image"][1:] for ep in eps]))
    assert 0 < codes["unchanged"] < 1 and 0 <= codes["still_match"] <= 1
    pred = ad.predict_commands(wm, ctx[:2], batch_size=8)
    assert pred.shape == (2, ad.N_DIRECTIONS, *ctx.shape[1:])
    # sampled (--temperature): the same seed, the same frames; not the greedy ones
    sampled = [ad.predict_commands(wm, ctx[:2], 8, 1.0, torch.Generator().manual_seed(0)) for _ in range(2)]
    assert np.array_equal(*sampled) and not np.array_equal(sampled[0], pred)
    # --guidance: weight 0 gives the greedy frame; against the zero action itself every weight does
    acts = np.concatenate([ep["action"][:-1] for ep in eps])
    for a in (acts, np.zeros_like(acts)):
        greedy = pe.predict_frames(wm, ctx, a[:, None], batch_size=4)[:, 0]
        assert np.array_equal(ad.guided_frames(wm, ctx, a, 0.0, 4), greedy)
    assert np.array_equal(ad.guided_frames(wm, ctx, np.zeros_like(acts), 5.0, 4), greedy)
    # a large weight writes other codes than greedy's (a GPT whose logits only frame codes can win)
    gpt = GPT(GPTConfig.llama(vocab_size=lay.vocab_size, block_size=2 * lay.frame_len, n_layer=1, n_head=2,
                              n_embd=16, tie_embeddings=False)).eval()
    with torch.no_grad():
        gpt.lm_head.weight[lay.K:] = 0
    codes = []
    monkeypatch.setattr(ad, "decode", lambda vq, c, context: codes.append(c) or context)
    for w in (0.0, 50.0):
        ad.guided_frames((gpt, *wm[1:]), ctx, acts, w, 8)
    assert not torch.equal(*codes)


def test_still_code_marks_every_unchanged_cell():
    eps = episodes(2, 4, 2)
    img = eps[0]["image"]
    cells = still_cells(img[1:], img[:-1], 8)
    diff = np.abs(img[1:].astype(int) - img[:-1].astype(int)).max(-1) > 25.5          # (T - 1, 64, 64)
    assert cells.shape == (3, 64) and not cells.all() and cells.any()
    assert (cells.view(3, 8, 8).numpy() == ~diff.reshape(3, 8, 8, 8, 8).any(axis=(2, 4))).all()
    torch.manual_seed(0)
    vq = CondVQVAE(CondVQConfig(channels=(4, 4, 8, 8), n_codes=16,
                                frame=asdict(VQConfig(channels=(4, 4, 8), n_codes=8)))).eval()
    code = find_still_code(vq, img[:1])
    assert 0 <= code < 16
    lay = Layout.of(vq, 2)
    lo, hi = np.full(2, -1, np.float32), np.ones(2, np.float32)
    plain, still = (tokenize_split(vq, eps, 2, lay, lo, hi, c) for c in (None, code))
    assert torch.equal(plain["context"], still["context"]) and torch.equal(plain["actions"], still["actions"])
    f = still["future"][0, :3, 0]                                                        # frame t + 1 against t
    cells = still_cells(img[1:], img[:-1], vq.config.grid)                               # a 4 x 4 grid here
    assert (f[cells] == code).all() and torch.equal(f[~cells], plain["future"][0, :3, 0][~cells])


@pytest.mark.slow
def test_the_diagnosis_runs_on_its_default_checkpoints(tmp_path):
    # the usage line with every default: the tokenizers and world models it names are shipped
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "research/action_diagnosis.py", "--limit=1",
                        f"--json={tmp_path / 'd.json'}"], cwd=root, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "d.json").is_file()
