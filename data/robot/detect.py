"""Pixel detectors of the embedded robot world (data/robot/sim.py): where the goal, a block of a given colour and the
gripper are in a frame, and whether the frame shows the task solved. They read pixels only, so they score real
frames, a tokenizer's reconstructions and a world model's predictions alike (experiments/policy_eval.py's success
judge and one-step checks, evaluate_video.py's action response). How well they agree with the simulator's truth is
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
