"""The reward terms for the action's effect (research/video_terms.gripper_error and action_reward, and the core's
video_rewards.push_error, VideoReward.push): checked by hand on frames the simulator renders, on garbage
predictions, and for leaving the default reward untouched."""
import numpy as np
import pytest
import torch

from data.robot import sim
from data.robot.detect import blocks_moved, locate_blocks, locate_gripper
from research.video_terms import GRIPPER_SCALE, action_reward, gripper_error
from video_rewards import PUSH_SCALE, WORST_VIDEO_REWARD, VideoReward, push_error, video_reward


def scene(gripper, blocks=((12, 12), (52, 52))):
    """A rendered frame (1, 3, 64, 64) in [0, 1] with the gripper at `gripper` and two blocks (by default away from
    it); and the bare table (1, 3, 64, 64)."""
    bg = sim.render_background(np.random.default_rng(0))
    state = dict(gripper=np.array(gripper, np.float32), blocks=np.array(blocks, np.float32),
                 goal=np.array([50, 14], np.float32), colors=sim.PALETTE[:2])

    def as_float(img):
        return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None].float() / 255

    return as_float(sim.render(bg, state)), as_float((np.clip(bg, 0, 1) * 255 + 0.5).astype(np.uint8))


def test_gripper_error_by_hand():
    """Context: the gripper at x = 32; the action takes it 3 px right (one sim step). A prediction that draws it there
    scores ~0, one that leaves it still ~0.5 (3 px of GRIPPER_SCALE's 6), one that moves it left ~1 (6 px off), one
    that draws no gripper 1."""
    ctx, table = scene((32, 32))
    true, _ = scene((32 + sim.SPEED, 32))
    left, _ = scene((32 - sim.SPEED, 32))
    pred = torch.cat([true, ctx, left, table])
    err = gripper_error(pred, true.expand_as(pred), locate_gripper)
    assert err.shape == (4,) and err.dtype == torch.float32
    assert err[0].item() < 0.05
    assert err[1].item() == pytest.approx(sim.SPEED / GRIPPER_SCALE, abs=0.05)
    assert err[2].item() == pytest.approx(2 * sim.SPEED / GRIPPER_SCALE, abs=0.05)
    assert err[3].item() == 1.0
    # a true frame without a gripper: nothing to check, 0 whatever is drawn
    assert gripper_error(pred, table.expand_as(pred), locate_gripper).tolist() == [0.0] * 4
    # in the reward: the term ranks the samples by where they draw the gripper
    r0 = video_reward(VideoReward(moving=1.0), pred, true.expand_as(pred), context=ctx.expand_as(pred))
    r = action_reward(VideoReward(moving=1.0), 2.0, pred, true.expand_as(pred), context=ctx.expand_as(pred))
    assert torch.allclose(r, r0 - 2.0 * err)
    assert r.argsort(descending=True).tolist() == [0, 1, 2, 3]


def test_gripper_error_never_raises_on_garbage():
    """NaN, infinite, huge, negative and random predictions: finite errors in [0, 1]; in the reward, a non-finite
    prediction gets the floor lowered by the term's weight."""
    true, _ = scene((20, 40))
    g = torch.Generator().manual_seed(0)
    pred = torch.rand(8, 3, 64, 64, generator=g)
    pred[1] = float("nan")
    pred[2] = float("inf")
    pred[3] = -float("inf")
    pred[4] = 1e30
    pred[5] = -1e30
    pred[6] = torch.randn(3, 64, 64, generator=g) * 1e6
    pred[7, :, ::2] = float("nan")
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        p = pred.to(dtype)
        err = gripper_error(p, true.expand(8, -1, -1, -1).to(dtype), locate_gripper)
        assert torch.isfinite(err).all() and (err >= 0).all() and (err <= 1).all()
        r = action_reward(VideoReward(moving=1.0), 0.5, p, true.expand(8, -1, -1, -1).to(dtype),
                          context=true.expand(8, -1, -1, -1))
        assert torch.isfinite(r).all() and (r >= WORST_VIDEO_REWARD - 1.5 - 1e-5).all() and (r <= 1e-5).all()
        assert (r[1:4] == WORST_VIDEO_REWARD - 1.5).all()


def test_default_reward_is_unchanged():
    """action_reward with weight 0 gives the same bits as the core's reward."""
    ctx, table = scene((32, 32))
    true, _ = scene((35, 32))
    g = torch.Generator().manual_seed(1)
    pred = (true + 0.2 * torch.randn(6, 3, 64, 64, generator=g)).clamp(0, 1)
    pred[0, :, 0, 0] = float("nan")

    cfg, kw = VideoReward(moving=1.0, object=0.5), dict(context=ctx.expand_as(pred), background=table.expand_as(pred))
    base = video_reward(cfg, pred, true.expand_as(pred), **kw)
    same = action_reward(cfg, 0.0, pred, true.expand_as(pred), **kw)
    assert torch.equal(base, same)


def test_push_error_by_hand():
    """Context: the first block at x = 24; the true step moves it 3 px right (the gripper drawn away from it, so as
    not to hide a part of it), the second block stays. A prediction that draws the push scores ~0, one that leaves
    the block where it was ~1 (3 px of PUSH_SCALE's 3), one pushed 2 of the 3 px ~1/3, one that draws no blocks 1;
    moving the block that did not move costs nothing (only pushed blocks are checked); a step that pushes nothing
    scores 0 whatever is drawn."""
    ctx, table = scene((40, 10), blocks=((24, 32), (52, 52)))
    true, _ = scene((40, 10), blocks=((27, 32), (52, 52)))
    short, _ = scene((40, 10), blocks=((26, 32), (52, 52)))
    other, _ = scene((40, 10), blocks=((27, 32), (49, 52)))
    pred = torch.cat([true, ctx, short, table, other])
    n = len(pred)
    err = push_error(pred, true.expand(n, -1, -1, -1), ctx.expand(n, -1, -1, -1), locate_blocks)
    assert err.shape == (n,) and err.dtype == torch.float32
    assert err[0].item() < 0.05 and err[4].item() < 0.05
    assert err[1].item() == pytest.approx(3.0 / PUSH_SCALE, abs=0.05)
    assert err[2].item() == pytest.approx(1.0 / PUSH_SCALE, abs=0.05)
    assert err[3].item() == 1.0
    # nothing pushed (the context is the truth): 0
    assert push_error(pred, true.expand(n, -1, -1, -1), true.expand(n, -1, -1, -1),
                      locate_blocks).tolist() == [0.0] * n
    # in the reward: the term ranks the samples by where they draw the pushed block
    kw = dict(context=ctx.expand(n, -1, -1, -1))
    r0 = video_reward(VideoReward(moving=1.0), pred, true.expand(n, -1, -1, -1), **kw)
    r = video_reward(VideoReward(moving=1.0, push=2.0), pred, true.expand(n, -1, -1, -1), **kw)
    assert torch.allclose(r, r0 - 2.0 * err)
    with pytest.raises(ValueError, match="context"):
        video_reward(VideoReward(push=1.0), pred, true.expand(n, -1, -1, -1))


def test_blocks_moved_by_hand():
    """A clip whose first block is pushed 3 px right at frame 1, then stays, while the gripper moves away: only frame
    1 moves a block (the first frame has no frame before it)."""
    frames = [scene((40, 10), blocks=((24, 32), (52, 52)))[0], scene((40, 10), blocks=((27, 32), (52, 52)))[0],
              scene((44, 12), blocks=((27, 32), (52, 52)))[0]]
    clip = (torch.cat(frames).permute(0, 2, 3, 1) * 255 + 0.5).to(torch.uint8).numpy()   # (T, H, W, 3)
    assert blocks_moved(clip).tolist() == [False, True, False]
    assert blocks_moved(clip[:1]).tolist() == [False]


def test_push_error_never_raises_on_garbage():
    """NaN, infinite, huge and random predictions: finite errors in [0, 1]; a non-finite prediction gets the floor
    lowered by the term's weight."""
    ctx, _ = scene((40, 10), blocks=((24, 32), (52, 52)))
    true, _ = scene((40, 10), blocks=((27, 32), (52, 52)))
    g = torch.Generator().manual_seed(0)
    pred = torch.rand(6, 3, 64, 64, generator=g)
    pred[1] = float("nan")
    pred[2] = float("inf")
    pred[3] = -1e30
    pred[4] = torch.randn(3, 64, 64, generator=g) * 1e6
    pred[5, :, ::2] = float("nan")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        p, t, c = (x.to(dtype) for x in (pred, true.expand(6, -1, -1, -1), ctx.expand(6, -1, -1, -1)))
        err = push_error(p, t, c, locate_blocks)
        assert torch.isfinite(err).all() and (err >= 0).all() and (err <= 1).all()
        r = video_reward(VideoReward(moving=1.0, push=0.5), p, t, context=c)
        assert torch.isfinite(r).all() and (r >= WORST_VIDEO_REWARD - 1.5 - 1e-5).all()
        assert (r[1:3] == WORST_VIDEO_REWARD - 1.5).all()
