"""A procedural robot-pushing world rendered with numpy: the embedded data of the video world model.

Why our own world? RT-1 episodes (the paper's data) are 256x320 camera frames of a real robot, tens of GB, and a
world model of them needs a GPU. This world keeps what makes the task a *world model* task — an agent moves by a
continuous action, objects move only when pushed, most of the frame stays still — at 64x64 pixels, so a VQ tokenizer
(8x8 codes per frame) and a GPT of ~1M parameters learn it on a laptop CPU.

The scene (coordinates in pixels, x to the right, y down, pixel centres at integers 0..63):
    table    a warm wood colour with a faint grain, lit by a soft light from a random side (a brightness gradient)
             plus a vignette, so frames are not flat and the tokenizer must model texture;
    goal     a green square region on the table (part of the static background);
    blocks   two coloured 8x8 squares with a soft shadow; block 0 is the target to push into the goal;
    gripper  a dark disc of radius 4 with a highlight, seen from above, with its shadow.
Edges are anti-aliased (coverage = clip(distance to edge + 0.5, 0, 1)), so sub-pixel motion shows in the pixels.

Dynamics (`step`): the action a in [-1, 1]^2 moves the gripper by SPEED * a (clipped to the table); a block that the
gripper disc overlaps is pushed out of it along the contact normal; a block pushed into the other block pushes it along
the axis of least overlap; blocks stay on the table, and if a wall stops a block the gripper is pushed back instead.
There is no momentum: the next frame is a function of this frame and the action, so one context frame suffices.

Policies (`expert_action`): the expert goes to the point behind the target block (seen from the goal), walking around
the block when it is on the wrong side, then pushes toward the goal. Graded quality = the expert plus Gaussian action
noise of std NOISE_LEVELS[i] (1.0 is nearly random). `success` tests the target block's centre inside the goal.
"""
import numpy as np

H = W = 64
SPEED = 3.0           # pixels per unit action
GRIP_R = 4.0          # gripper radius
HALF = 4.0            # block half side
GOAL_HALF = 8.0       # goal square half side
NOISE_LEVELS = (0.0, 0.2, 0.5, 1.0)
PALETTE = np.array([[0.85, 0.18, 0.15], [0.15, 0.35, 0.85], [0.95, 0.80, 0.15], [0.60, 0.25, 0.75]], np.float32)
GRIPPER_RGB = np.array([0.18, 0.18, 0.20], np.float32)
YY, XX = np.mgrid[0:H, 0:W].astype(np.float32)


# -----------------------------------------------------------------------------
# rendering

def render_background(rng):
    """The static part of a scene: textured, lit table with the goal region drawn on it. -> (H, W, 3) float32."""
    base = np.array([0.62, 0.50, 0.36], np.float32) + rng.uniform(-0.05, 0.05, 3).astype(np.float32)
    freq, phase, wob = rng.uniform(0.35, 0.6), rng.uniform(0, 2 * np.pi), rng.uniform(0.05, 0.15)
    grain = 0.03 * np.sin(freq * YY + 2.0 * np.sin(wob * XX + phase))
    angle = rng.uniform(0, 2 * np.pi)
    light = 1.0 + 0.12 * ((XX - 31.5) * np.cos(angle) + (YY - 31.5) * np.sin(angle)) / 32
    vignette = 1.0 - 0.08 * (((XX - 31.5) ** 2 + (YY - 31.5) ** 2) / (2 * 32 ** 2))
    img = base[None, None] * (1 + grain[..., None]) * (light * vignette)[..., None]
    return img.astype(np.float32)


def square_coverage(cx, cy, half):
    return np.clip(half + 0.5 - np.abs(XX - cx), 0, 1) * np.clip(half + 0.5 - np.abs(YY - cy), 0, 1)


def disc_coverage(cx, cy, r):
    return np.clip(r + 0.5 - np.sqrt((XX - cx) ** 2 + (YY - cy) ** 2), 0, 1)


def paint(img, cov, rgb):
    return img * (1 - cov[..., None]) + cov[..., None] * rgb


def draw_goal(img, goal):
    inner = square_coverage(goal[0], goal[1], GOAL_HALF - 1)
    outer = square_coverage(goal[0], goal[1], GOAL_HALF)
    img = img * (1 - 0.45 * (outer - inner)[..., None])                     # a dark 1-pixel border
    return img * (1 - 0.4 * inner[..., None]) + 0.4 * inner[..., None] * np.array([0.30, 0.75, 0.35], np.float32)


def render(background, state):
    """Draw blocks and gripper (with soft shadows) over the background. -> (H, W, 3) uint8."""
    img = background.copy()
    g, blocks, colors = state["gripper"], state["blocks"], state["colors"]
    shadow = np.zeros((H, W), np.float32)
    for b in blocks:
        shadow = np.maximum(shadow, square_coverage(b[0] + 1.5, b[1] + 1.5, HALF))
    shadow = np.maximum(shadow, disc_coverage(g[0] + 2.0, g[1] + 2.0, GRIP_R))
    img = img * (1 - 0.3 * shadow[..., None])
    for b, c in zip(blocks, colors):
        shade = 1.0 + 0.12 * ((b[0] - XX) + (b[1] - YY)) / (2 * HALF)     # lit from the top left
        img = paint(img, square_coverage(b[0], b[1], HALF), c * shade[..., None])
    img = paint(img, disc_coverage(g[0], g[1], GRIP_R), GRIPPER_RGB)
    img = paint(img, disc_coverage(g[0] - 1.2, g[1] - 1.2, 1.5), np.float32(0.55))
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


# -----------------------------------------------------------------------------
# dynamics

def _push_out_of_gripper(block, g):
    """Move a block so that the gripper disc no longer overlaps it. -> (new block centre, was pushed?)"""
    nearest = np.clip(g, block - HALF, block + HALF)
    d = g - nearest
    dist = float(np.hypot(*d))
    if dist >= GRIP_R:
        return block, False
    if dist > 1e-6:
        return block - d / dist * (GRIP_R - dist), True
    off = block - g                                    # gripper centre inside the block: leave by the nearest side
    axis = int(np.argmax(np.abs(off)))
    step = np.zeros(2, np.float32)
    step[axis] = np.sign(off[axis] or 1.0) * (HALF + GRIP_R - abs(off[axis]))
    return block + step, True


def _separate(mover, other):
    """Push `other` out of `mover` along the axis of least overlap (two axis-aligned squares)."""
    d = other - mover
    overlap = 2 * HALF - np.abs(d)
    if (overlap <= 0).any():
        return other
    axis = int(np.argmin(overlap))
    other = other.copy()
    other[axis] += np.sign(d[axis] or 1.0) * overlap[axis]
    return other


def step(state, action):
    """Apply a continuous action to a state (dict of arrays); returns the next state (the input is not modified)."""
    a = np.clip(np.asarray(action, np.float32), -1, 1)
    g = np.clip(state["gripper"] + SPEED * a, GRIP_R, W - 1 - GRIP_R)
    blocks = state["blocks"].copy()
    lo, hi = HALF, W - 1 - HALF
    for _ in range(2):
        for i in range(len(blocks)):
            blocks[i], pushed = _push_out_of_gripper(blocks[i], g)
            if pushed:
                for j in range(len(blocks)):
                    if j != i:
                        blocks[j] = np.clip(_separate(blocks[i], blocks[j]), lo, hi)
            blocks[i] = np.clip(blocks[i], lo, hi)
        for b in blocks:                               # a wall stopped a block: the gripper yields instead
            nearest = np.clip(g, b - HALF, b + HALF)
            d = g - nearest
            dist = float(np.hypot(*d))
            if 1e-6 < dist < GRIP_R:
                g = g + d / dist * (GRIP_R - dist)
        g = np.clip(g, GRIP_R, W - 1 - GRIP_R)
    return dict(state, gripper=g.astype(np.float32), blocks=blocks.astype(np.float32))


def success(state):
    return bool((np.abs(state["blocks"][0] - state["goal"]) < GOAL_HALF - 1).all())


# -----------------------------------------------------------------------------
# scenes, policies, episodes

def reset(rng):
    """A random scene: goal, two non-overlapping blocks away from the goal and the walls, the gripper near block 0."""
    goal = rng.uniform(GOAL_HALF + 2, W - 1 - GOAL_HALF - 2, 2).astype(np.float32)
    while True:
        margin = HALF + 2 * GRIP_R + 2                 # room to get behind a block on every side
        blocks = rng.uniform(margin, W - 1 - margin, (2, 2)).astype(np.float32)
        far_from_goal = np.abs(blocks[0] - goal).max() > GOAL_HALF + HALF + 4
        apart = np.abs(blocks[0] - blocks[1]).max() > 2 * HALF + 4
        if far_from_goal and apart:
            break
    while True:
        angle, r = rng.uniform(0, 2 * np.pi), rng.uniform(HALF + GRIP_R + 2, 18)
        g = np.clip(blocks[0] + r * np.array([np.cos(angle), np.sin(angle)], np.float32), GRIP_R, W - 1 - GRIP_R)
        if all(np.abs(g - b).max() > HALF + GRIP_R + 1 for b in blocks):
            break
    colors = PALETTE[rng.choice(len(PALETTE), 2, replace=False)]
    return dict(gripper=g.astype(np.float32), blocks=blocks, goal=goal, colors=colors)


def expert_action(state):
    """Walk behind the target block (as seen from the goal), around it if needed, then push it toward the goal."""
    g, c, goal = state["gripper"], state["blocks"][0], state["goal"]
    to_goal = goal - c
    u = to_goal / max(float(np.hypot(*to_goal)), 1e-6)
    behind = c - u * (HALF + GRIP_R + 1)
    if float(np.dot(g - c, u)) > -HALF:                 # on the goal side: go around via the nearer flank
        perp = np.array([-u[1], u[0]], np.float32)
        side = 1.0 if float(np.dot(g - c, perp)) >= 0 else -1.0
        target = c + side * perp * (HALF + GRIP_R + 3) - u * (HALF + GRIP_R)
    elif np.hypot(*(g - behind)) > 2.0:
        target = behind
    else:
        target = g + u * SPEED
    return np.clip((target - g) / SPEED, -1, 1).astype(np.float32)


def episode(rng, length, noise):
    """Roll out the noisy expert. -> dict(image (T, H, W, 3) uint8, action (T, 2) float32, background, success, noise).

    action[t] is applied to frame t and produces frame t + 1 (the last action has no next frame in the episode)."""
    state = reset(rng)
    background = draw_goal(render_background(rng), state["goal"])
    frames, actions = [], []
    for _ in range(length):
        frames.append(render(background, state))
        shown = state
        a = np.clip(expert_action(state) + noise * rng.standard_normal(2).astype(np.float32), -1, 1)
        actions.append(a)
        state = step(state, a)
    bg = (np.clip(background, 0, 1) * 255 + 0.5).astype(np.uint8)
    return dict(image=np.stack(frames), action=np.stack(actions).astype(np.float32), background=bg,
                success=np.bool_(success(shown)), noise=np.float32(noise))


def policy_action(state, policy, rng):
    """A policy of graded quality: a float is the expert plus Gaussian action noise of that std (as in `episode`),
    "random" draws uniform actions in [-1, 1]^2 (no knowledge of the scene at all)."""
    if policy == "random":
        return rng.uniform(-1, 1, 2).astype(np.float32)
    return np.clip(expert_action(state) + float(policy) * rng.standard_normal(2).astype(np.float32), -1, 1)


def policy_episode(scene_rng, policy_rng, length, policy):
    """Roll out a policy in a scene drawn from scene_rng (the same draws as `episode`, so one scene seed gives the same
    scene whatever the policy); the policy's randomness comes from policy_rng.
    -> dict(image (T, H, W, 3) uint8, action (T, 2) float32, success (T,) bool (`success` of the state each frame
    shows), block (T, 2) float32 (target block centre per frame), gripper (T, 2) float32 (gripper centre per frame),
    goal (2,), color (3,) the target block's colour)."""
    state = reset(scene_rng)
    background = draw_goal(render_background(scene_rng), state["goal"])
    frames, actions, wins, blocks, grippers = [], [], [], [], []
    for _ in range(length):
        frames.append(render(background, state))
        wins.append(success(state))
        blocks.append(state["blocks"][0])
        grippers.append(state["gripper"])
        a = policy_action(state, policy, policy_rng)
        actions.append(a)
        state = step(state, a)
    return dict(image=np.stack(frames), action=np.stack(actions).astype(np.float32), success=np.array(wins),
                block=np.stack(blocks), gripper=np.stack(grippers), goal=state["goal"], color=state["colors"][0])


def replay(scene_rng, actions):
    """The scene of `policy_episode` drawn from the same scene_rng, stepped by its actions: -> (background (H, W, 3)
    float32, the states of frames 0 .. T-1). The states hold everything `step` and `render` need, so any action can be
    tried from any of them: render(background, step(states[t], a)) is the true next frame of action a at frame t."""
    state = reset(scene_rng)
    background = draw_goal(render_background(scene_rng), state["goal"])
    states = [state]
    for a in actions[:-1]:
        states.append(step(states[-1], a))
    return background, states
