"""
The extra video reward terms and prompt draws of the action studies (research/README.md, "Paying RLVR
for the action's effect"), as pieces that plug into train_video.py's RLVR (grpo.Env's draw and
reward_fn, in place of data/robot/task.make_draw and make_reward) and MLE (next_batch):

- `gripper_error` and `action_reward`: the core's VideoReward minus action_weight x how far from
  the true gripper the prediction draws it (data/robot/detect.locate_gripper). Finding: paid alone
  it did not make the model follow the action; the push term (the core's single-step default, 0.1)
  beside the object term kept it best.
- `push_windows` and `study_draw`'s n_push: a share of each step's prompts from windows whose
  true step moves a block (--push_frac of old).
- `replay_scenes` / `counterfactual` and `study_draw`'s n_cf: prompts at visited train states with
  a random action, whose true outcome the simulator renders (--counterfactual_frac of old).
- `change_weights`: MLE loss weights where a code that changes from the context weighs
  change_weight (above 1 the model learns more change than the data holds).
- `init_action_embeddings`: the action tokens' embeddings set to Fourier features of their bin's
  value before MLE (the shipped GPTs had learnt them nearly alike).
The commands and findings of these runs are in research/README.md (commit a76ad68 ran them as
flags of train_video.py).
"""
import itertools
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from data.robot import sim  # noqa: E402
from data.robot.detect import blocks_moved, locate_gripper  # noqa: E402
from data.robot.prepare import split_episodes  # noqa: E402
from data.robot.task import N_BINS, action_bins, window_batch, windows  # noqa: E402
from video_rewards import WORST_VIDEO_REWARD, _check_frames, to_uint8, video_reward  # noqa: E402

# gripper_error's scale in pixels: twice the embedded robot's step (sim.SPEED, 3 px per unit
# action), so a gripper left where it was scores about 0.5, one moved a whole step the wrong way
# about 1, as bad as none at all
GRIPPER_SCALE = 6.0


def gripper_error(pred, true, locate=locate_gripper, scale=GRIPPER_SCALE):
    """How far from the true gripper the prediction draws it, per frame, in [0, 1]: the distance
    between the centres `locate` finds, over `scale` pixels, capped at 1; 1 where the prediction
    shows none, 0 where the truth shows none. -> (N,)"""
    _check_frames(pred, true)
    p, t = (to_uint8(x.nan_to_num(0.0)) for x in (pred, true))
    err = []
    for pf, tf in zip(p, t):
        at, ap = locate(tf), locate(pf)
        err.append(0.0 if at is None else 1.0 if ap is None
                   else min(math.dist(ap, at) / scale, 1.0))
    return torch.tensor(err)


def action_reward(cfg, action_weight, pred, true, lpips_net=None, context=None, background=None):
    """The core's video_reward under VideoReward `cfg` minus action_weight x gripper_error, with
    the floor lowered by the weight (the old --action_weight). -> (N,)"""
    r = video_reward(cfg, pred, true, lpips_net, context, background)
    floor = WORST_VIDEO_REWARD - cfg.moving - cfg.object - cfg.push
    bad = r <= floor
    r = r - action_weight * gripper_error(pred.float().clamp(0, 1).nan_to_num(0.0), true.float())
    return r.masked_fill(bad, floor - action_weight)


def push_windows(episodes, pool, context, horizon):
    """The windows of `pool` ((clip, first frame) each) where a block moves in a predicted
    frame (data/robot/detect.blocks_moved)."""
    moved = [blocks_moved(ep["image"]) for ep in episodes]   # (T,) per clip
    return [(e, t) for e, t in pool if moved[e][t + context:t + context + horizon].any()]


def replay_scenes(episodes, length, rank=0, world=1):
    """The simulator's scene behind each train clip, replaying the random stream
    data/robot/prepare.py drew the train split from (a clip is a whole episode)
    -> [(background, the state of each frame, the actions)]; a replayed frame that differs from
    the stored one raises ValueError (other data, size or clip length)."""
    scenes = []
    drawn = itertools.islice(split_episodes("train", length=length), rank, None, world)
    for i, (ep, (start, again)) in enumerate(zip(episodes, drawn)):
        if again["image"].shape != ep["image"].shape or (again["image"] != ep["image"]).any():
            raise ValueError(f"train clip {rank + i * world} is not the simulator's")
        scenes.append((*sim.replay(start, again["action"]), again["action"]))
    return scenes


def counterfactual(seq, truths, picks, n_cf, scenes, layout, lo, hi, context, g):
    """The last n_cf windows get a random action, uniform in [lo, hi] per dimension, in place of
    the true one after their last context frame, and the frames it truly leads to (the simulator
    steps the state by it, then by the window's later true actions). seq and truths are changed in
    place."""
    P, D = layout.prompt_len(context), layout.D
    actions = lo + (hi - lo) * torch.rand(n_cf, D, generator=g).numpy()
    for i, a in zip(range(len(picks) - n_cf, len(picks)), actions):
        e, t = picks[i]
        background, states, true_actions = scenes[e]
        seq[i, P - D:P] = torch.as_tensor(layout.action_tokens(action_bins(a, lo, hi)))
        state, frames = states[t + context - 1], []
        for k in range(len(truths[i])):           # frame k follows a, then k true actions
            state = sim.step(state, a if k == 0 else true_actions[t + context - 1 + k])
            frames.append(sim.render(background, state))
        truths[i] = np.stack(frames)


def study_draw(clips, pool, n, pushes=(), n_push=0, scenes=None, n_cf=0, lo=None, hi=None):
    """The old draw with --push_frac and --counterfactual_frac: n - n_cf - n_push windows of
    `pool`, n_push of `pushes`, and n_cf repeats of the first with a random action -> draw(g) ->
    (prompts, items), as data/robot/task.make_draw's (the core's draw: n windows of pool)."""
    context = clips.context
    def draw(g):
        picks = [pool[i] for i in torch.randint(len(pool), (n - n_cf - n_push,), generator=g)]
        if n_push:
            picks += [pushes[i] for i in torch.randint(len(pushes), (n_push,), generator=g)]
        picks += picks[:n_cf]
        seq = windows(clips.tokens, clips.layout, [e for e, _ in picks], [t for _, t in picks],
                      context, clips.horizon)
        truths = [clips.episodes[e]["image"][t + context:t + context + clips.horizon]
                  for e, t in picks]
        if n_cf:
            counterfactual(seq, truths, picks, n_cf, scenes, clips.layout, lo, hi, context, g)
        return window_batch(clips, picks, seq, truths)
    return draw


def change_weights(tokens, ids, starts, tgt, layout, context, horizon, change_weight):
    """MLE loss weights (B, n - 1): each predicted code that differs from the last context frame's
    code in its cell weighs change_weight, every other scored token 1."""
    last = tokens["context"][ids, starts + context - 1]                             # (B, L)
    future = tokens["future"][ids, starts + context - 1, :horizon]                  # (B, h, L)
    changed = (future != last[:, None]).flatten(1).float()                          # (B, h * L)
    weight = torch.ones(tgt.shape)
    weight[:, layout.code_positions(context, horizon) - 1] = 1 + (change_weight - 1) * changed
    return weight


@torch.no_grad()
def init_action_embeddings(model, layout, n_freq=8):
    """The embedding of action token (dimension d, bin b) becomes Fourier features of the bin's
    value v in [-1, 1], cos and sin of k * pi * v / 2 for k = 1 .. n_freq, in channels of its own
    per dimension, scaled to the mean norm of the code embeddings."""
    w = model.wte.weight
    v = torch.linspace(-1, 1, N_BINS)[:, None] * torch.arange(1, n_freq + 1) * torch.pi / 2
    feats = torch.cat([v.cos(), v.sin()], 1)                                   # (256, 2 * n_freq)
    feats = feats * w[:layout.A].norm(dim=1).mean() / feats.norm(dim=1, keepdim=True)
    for d in range(layout.D):
        rows = w[layout.A + N_BINS * d:layout.A + N_BINS * (d + 1)]
        rows.zero_()
        rows[:, 2 * n_freq * d:2 * n_freq * (d + 1)] = feats.to(w.dtype)
