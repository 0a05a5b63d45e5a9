"""Pixel detectors of the embedded robot world (data/robot/sim.py): where the goal, a block of a given colour and the
gripper are in a frame, and whether the frame shows the task solved. They read pixels only, so they score real
frames, a tokenizer's reconstructions and a world model's predictions alike (experiments/policy_eval.py's success
judge and one-step checks, eval.py's action response). How well they agree with the simulator's truth is
printed by policy_eval and tested (tests/test_policy_eval.py).
"""
import numpy as np

from data.robot import sim

GREEN_TOL, COLOR_TOL, GRIPPER_TOL, MIN_PIXELS = 0.09, 0.25, 0.1, 12
MOVED_PX = 0.5                      # an object moved in a step when its centre moved by more than this (pixels)


def locate_goal(frame):
    """Centre (x, y) of the goal square in an (H, W, 3) uint8 frame, or None."""
    f = frame.astype(np.float32) / 255
    green = f[..., 1] - f[..., 0]
    mask = (green > np.median(green) + GREEN_TOL) & (f[..., 1] > f[..., 2])
    if mask.sum() < MIN_PIXELS:
        return None
    k = int(2 * sim.GOAL_HALF - 1)                                 # the goal's inner side, 15 pixels with its edges
    c = np.pad(mask.cumsum(0).cumsum(1), ((1, 0), (1, 0)))
    counts = c[k:, k:] - c[:-k, k:] - c[k:, :-k] + c[:-k, :-k]      # mask pixels in each k x k window
    y0, x0 = np.unravel_index(np.argmax(counts), counts.shape)
    near = np.zeros_like(mask)
    near[max(y0 - 2, 0):y0 + k + 2, max(x0 - 2, 0):x0 + k + 2] = True
    ys, xs = np.nonzero(mask & near)
    return np.array([(xs.min() + xs.max()) / 2, (ys.min() + ys.max()) / 2], np.float32)


def locate_block(frame, rgb):
    """Centre (x, y) of the pixels of colour rgb (floats in [0, 1]) in an (H, W, 3) uint8 frame, or None."""
    mask = np.linalg.norm(frame.astype(np.float32) / 255 - np.asarray(rgb, np.float32), axis=-1) < COLOR_TOL
    if mask.sum() < MIN_PIXELS:
        return None
    ys, xs = np.nonzero(mask)
    return np.array([xs.mean(), ys.mean()], np.float32)


def locate_blocks(frame):
    """Centres of the blocks of every palette colour (sim.PALETTE, in its order) in an (H, W, 3) uint8 frame, each
    (x, y) or None where no block of that colour shows."""
    return [locate_block(frame, rgb) for rgb in sim.PALETTE]


def blocks_moved(frames):
    """Per frame of a (T, H, W, 3) uint8 clip, whether some block's centre moved by more than MOVED_PX from the
    frame before (False for the first frame and for a block not seen in both) -> (T,) bool."""
    centres = [locate_blocks(f) for f in frames]
    moved = np.zeros(len(frames), bool)
    for t in range(1, len(frames)):
        moved[t] = any(a is not None and b is not None and np.linalg.norm(a - b) > MOVED_PX
                       for a, b in zip(centres[t - 1], centres[t]))
    return moved


def locate_gripper(frame):
    """Centre (x, y) of the dark gripper disc in an (H, W, 3) uint8 frame, or None: the box of the pixels within RGB
    distance GRIPPER_TOL of its colour near their median (its highlight and stray dark pixels, e.g. shadowed goal
    edges, move it little); 0.2 px from the true centre on average on real frames (tests)."""
    mask = np.linalg.norm(frame.astype(np.float32) / 255 - sim.GRIPPER_RGB, axis=-1) < GRIPPER_TOL
    if mask.sum() < MIN_PIXELS:
        return None
    ys, xs = np.nonzero(mask)
    near = (np.abs(xs - np.median(xs)) <= sim.GRIP_R + 2) & (np.abs(ys - np.median(ys)) <= sim.GRIP_R + 2)
    if near.sum() < MIN_PIXELS:                         # scattered dark pixels (an imagined frame): no gripper
        return None
    xs, ys = xs[near], ys[near]
    return np.array([(xs.min() + xs.max()) / 2, (ys.min() + ys.max()) / 2], np.float32)


def judge(frame, rgb, goal):
    """Does the frame show the block of colour rgb inside the goal centred at `goal` (None: no goal found)?"""
    block = locate_block(frame, rgb)
    return block is not None and goal is not None and bool((np.abs(block - goal) < sim.GOAL_HALF - 1).all())


def gripper_response(context, true, pred):
    """How far a predicted window moves the gripper the way the true one moved: context (H, W, 3) the last context
    frame, true and pred (K, H, W, 3) the window's true and predicted frames, uint8. Per step k where the detector
    sees the true gripper move from the context frame by more than MOVED_PX: the predicted displacement projected on
    the true one, over the true one (1: right; 0: no motion or a perpendicular one; a predicted frame without a gripper
    is no motion), then the mean over those steps -> float, or None (no such step, or no gripper in the context)."""
    p0 = locate_gripper(context)
    if p0 is None:
        return None
    out = []
    for t, p in zip(true, pred):
        p1 = locate_gripper(t)
        if p1 is None or float(np.hypot(*(p1 - p0))) <= MOVED_PX:
            continue
        q = locate_gripper(p)
        d, D = (p0 if q is None else q) - p0, p1 - p0
        out.append(float(d @ D) / float(D @ D))
    return float(np.mean(out)) if out else None
