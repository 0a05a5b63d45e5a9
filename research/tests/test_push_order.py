"""research/push_order.py: the renderer's transpose symmetry it rests on, the push check by direction, and a
small end-to-end run on the shipped model."""
import json
from pathlib import Path

import numpy as np
import pytest

from data.robot import sim
from data.robot.detect import locate_gripper
from research import mirror_data as md
from research import policy_eval as pe
from research import push_order as po

ROOT = Path(__file__).resolve().parents[2]


def swapped(state):
    """The state of the transposed world: every (x, y) position as (y, x)."""
    return dict(state, gripper=state["gripper"][::-1].copy(), blocks=state["blocks"][:, ::-1].copy(),
                goal=state["goal"][::-1].copy())


def test_the_renderer_and_the_dynamics_are_symmetric_under_the_transpose():
    rng = np.random.default_rng(0)
    for i in range(20):
        bg = sim.render_background(rng)
        state = sim.reset(np.random.default_rng([1, i]))
        # the blocks, the gripper, their shadows and shading: exactly the transposed frame (the table's grain aside:
        # the background is transposed too)
        img = sim.render(bg, state)
        assert np.array_equal(po.transpose(img[None])[0], sim.render(po.transpose(bg[None])[0], swapped(state)))
        a = rng.uniform(-1, 1, 2).astype(np.float32)
        nxt, nxt_t = sim.step(state, a), sim.step(swapped(state), a[::-1].copy())
        assert np.allclose(swapped(nxt)["gripper"], nxt_t["gripper"], atol=1e-5)
        assert np.allclose(swapped(nxt)["blocks"], nxt_t["blocks"], atol=1e-5)


def test_push_by_direction_scores_the_truth_and_a_still_world():
    ctx, nxt, _, colors, dirs = po.pushes(pe.real_episodes(0.0, 4, 1, 16, seed=0))
    truth = po.push_by_direction(ctx, nxt, nxt, colors, dirs)
    still = po.push_by_direction(ctx, nxt, ctx, colors, dirs)
    assert truth["all"]["n"] == len(ctx) > 5 and sum(truth[d]["n"] for d in po.DIRECTIONS) == len(ctx)
    for d in ("all", *po.DIRECTIONS):
        if truth[d]["n"]:
            assert truth[d]["response"] == pytest.approx(1.0) and truth[d]["error_px"] == 0
            assert truth[d]["along_px"] == 0 and truth[d]["across_px"] == 0
            assert still[d]["response"] == 0 and still[d]["error_px"] > pe.MOVED_PX
            # a block left in place falls short by its whole move, all of it along the push
            assert still[d]["along_px"] == pytest.approx(-still[d]["error_px"])
            assert still[d]["abs_along_px"] == pytest.approx(still[d]["error_px"])
            assert still[d]["across_px"] == pytest.approx(0, abs=1e-6)
    assert [po.direction(t) for t in ([0, -2], [0, 2], [-2, 1], [2, -1])] == ["up", "down", "left", "right"]


@pytest.mark.slow
def test_main_end_to_end_on_the_shipped_model(tmp_path, capsys):
    out = tmp_path / "p.json"
    po.main([f"--models={ROOT / 'checkpoints' / 'video_mle_4000.safetensors'}", "--limit=1", "--policies=0,0.3",
             f"--json={out}"])
    res = json.loads(out.read_text())
    rec = res["rows"]["tokenizer reconstruction"]
    assert set(rec) == {"as is", "transposed"} and rec["as is"]["all"]["n"] == rec["transposed"]["all"]["n"] > 0
    assert "right" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no such checkpoint"):
        po.main([f"--models={tmp_path / 'none.safetensors'}"])


def test_mirror_data_turns_every_move_right_and_down(tmp_path):
    ep = sim.policy_episode(np.random.default_rng([0, 3, 2]), np.random.default_rng(2), 16, "random")
    ep = dict(ep, background=ep["image"][0], noise=np.float32(1.0))
    plain, mirrored = md.cut(ep, 0), md.cut(ep, 1)
    assert len(plain) == len(mirrored) == 15
    for t, (p, m) in enumerate(zip(plain, mirrored)):
        assert np.array_equal(p["image"], ep["image"][t:t + 2]) and np.array_equal(p["action"][0], ep["action"][t])
        assert np.array_equal(m["action"][0], np.abs(ep["action"][t])) and not m["action"][1].any()
        g0, g1 = locate_gripper(m["image"][0]), locate_gripper(m["image"][1])
        assert (g1 - g0 > -0.5).all()             # the gripper moves right and down (or is stopped)
    with pytest.raises(SystemExit, match="exists"):
        md.main([f"--src={tmp_path}", f"--out={tmp_path}"])


def test_own_context_pairs_the_models_frame_with_the_true_one_after_it(tmp_path, monkeypatch):
    from data.robot import prepare
    from research import own_context as oc
    eps = [dict(ep, background=ep["image"][0], noise=np.float32(0.3)) for ep in (sim.policy_episode(
        np.random.default_rng([0, 3, i]), np.random.default_rng(i), 6, 0.3) for i in range(2))]
    nxt = {f.tobytes(): g for ep in eps for f, g in zip(ep["image"][:-1], ep["image"][1:])}
    seen = []
    # a perfect world model: its frame t + 1 is the true one, so its transitions are the true ones from t + 1 on
    monkeypatch.setattr(oc, "predict_frames", lambda wm, ctx, act, *a: seen.append(act) or np.stack(
        [nxt[c.tobytes()] for c in ctx])[:, None])
    for mirror_it in (0, 1):
        own = oc.own_transitions(None, eps, 1.0, None, 8, mirror_it)
        true = [c for ep in eps for c in md.cut(ep, mirror_it)[1:]]
        assert len(own) == len(true) == 2 * 4
        for o, t in zip(own, true):
            assert np.array_equal(o["image"], t["image"]) and np.array_equal(o["action"], t["action"])
    assert np.array_equal(seen[0][:, 0], np.concatenate([ep["action"][:-2] for ep in eps]))  # action t: frame t + 1
    # end to end on the shipped model: the true transitions beside the model's, val and test true ones only
    monkeypatch.undo()
    prepare.ensure_splits(tmp_path / "d", {"train": 2, "val": 1, "test": 1}, 0)
    oc.main([f"--ckpt={ROOT / 'checkpoints' / 'video_mle_4000.safetensors'}", f"--src={tmp_path / 'd'}",
             f"--out={tmp_path / 'o'}", "--mirror=1"])
    T = len(np.load(next((tmp_path / "d" / "train").iterdir()))["image"])
    counts = [len(list((tmp_path / "o" / s).iterdir())) for s in ("train", "val", "test")]
    assert counts == [2 * (T - 2) + 2 * (T - 1), T - 1, T - 1]
    with pytest.raises(SystemExit, match="exists"):
        oc.main([f"--ckpt={ROOT / 'checkpoints' / 'video_mle_4000.safetensors'}", f"--src={tmp_path / 'd'}",
                 f"--out={tmp_path / 'o'}"])
    with pytest.raises(SystemExit, match="--ckpt=.*none.safetensors: no such checkpoint"):
        oc.main([f"--ckpt={tmp_path / 'none.safetensors'}", f"--src={tmp_path / 'd'}", f"--out={tmp_path / 'o2'}"])
