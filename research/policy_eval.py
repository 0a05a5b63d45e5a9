"""
Policy evaluation inside the video world model: does the world model tell good robot policies from bad ones, and how
close are its success estimates to reality? One or two world models (e.g. MLE and its RLVR post-trained version).

    python research/policy_eval.py                   # the shipped MLE model, 5 policies x 50 scenes x 2 samples
    python research/policy_eval.py --episodes=10 --policies=0,1.0 --gate=0               # a quick look
    python research/policy_eval.py --rlvr=out/video/video_rlvr.safetensors  # MLE and its RLVR (python train_video.py)
    python research/policy_eval.py --mle=out/vmulti/video_mle.safetensors --horizon=7    # a multi-step model
    python research/policy_eval.py --device=cuda --batch_size=256                        # 1 GPU
Writes out/policy_eval/policy_eval.json (--json), with every episode's outcome, real and imagined; --strip=PATH.png
also draws the first policy's first 4 episodes, real frames over imagined ones.

World model: a checkpoint of train_video.py and the tokenizer its metadata names, per-frame (video_vq) or
context-conditioned (video_cvq, whose future codes are relative to a true context frame). The default model is the
start of `python train_video.py`, checkpoints/video_mle_4000.safetensors (per-frame; --copy_gate=1 decodes it as that
run does). A prediction always starts from a context frame in pixels: the context gets its context codes
(tokenize_context), the GPT writes the next frames' codes with the actions injected between them
(data/robot/task.rollout), and each predicted frame is decoded against that context frame. A longer rollout is
chained in chunks of at most --horizon frames, each chunk's context being the last frame predicted so far, decoded
and re-encoded (a cond code means nothing without its context frame). --horizon=1 (the default) re-prompts at every
frame, the setting of a single-step model; a model trained multi-step can take chunks of its training window.

One-step checks first (`one_step_checks`, greedy, on the real episodes of the first --check_episodes scenes of every
policy): from each true frame and action, predict the next frame, and compare what the pixel detectors see move with
what truly moved: the gripper (every step the simulator moved it by > 0.5 px) and the pushed target block (every step
it moved by > 0.5 px). Each check passes when the mean error of the predicted end position is at most half the mean
true displacement; `response` is the predicted displacement projected on the true one, over the true (1: right, 0:
no motion or a wrong direction). With --gate=1 (default) a failed check stops the run before the policy evaluation.

Protocol. For each policy (the scripted expert plus Gaussian action noise of std 0, 0.3, 0.6, 1.0, and uniformly
random actions; data/robot/sim.py), each of --episodes scenes and each of --samples samples:
  1. real: roll the policy out in the simulator for --length frames (16, the clip length the models were trained on)
     from a held-out scene. Scene i is drawn from the random stream (seed, 3, i) (data/robot/prepare.py's train, val
     and test splits come from the streams (seed, 0), (seed, 1), (seed, 2), so no evaluation scene was trained on),
     the policy's noise of sample s from (seed, 4, i, s). Every policy meets the same scenes. Real success =
     `sim.success` of the state the last frame shows.
  2. imagined, --loops:
     open: the world model gets the same first frame and the same actions and predicts frames 1 .. T-1;
     closed: the policy acts on the imagined frames: at every frame, the detectors read the gripper, the target block
       and the goal (found once, in the first real frame) from pixels (`perceive`; a part the frame no longer shows
       keeps its last place), the scripted policy picks its action from them with the same noise stream as the real
       sample s, and the world model predicts the next frame. With the random policy both loops replay the real
       actions; with a perfect world model the closed loop is the real episode (tests).
     Sampled at --temperature (1 by default; 0: greedy), one seeded generator per model and loop.
  3. judge: the same pixel success detector on the last real frame and on the last imagined frame.

Success detector (`judge`, data/robot/detect.py), on pixels only, given the task ("push the block of this colour into
the goal"):
  - goal: in the first real frame, pixels greener than the table (green minus red above the frame's median by 0.09,
    and green above blue); the goal is the 15x15 window holding most of them; its centre is the centre of the box of
    those pixels (stray pixels elsewhere, e.g. on the dark gripper, do not move it);
  - block: the pixels within RGB distance 0.25 of the target block's colour (at least 12 of them, else "no block":
    a model that erased the block fails); its centre is their mean position;
  - success: the block centre lies within GOAL_HALF - 1 of the goal centre on both axes, the test `sim.success` makes
    on the true state. The colour tolerance was chosen on scenes of another seed, real frames and the tokenizer's
    reconstructions of them; its agreement with `sim.success` on the evaluation's real frames is printed.
  - gripper (for the checks and the closed loop): the box of the pixels within RGB distance 0.1 of the gripper's
    colour near their median; its error on the real frames is printed.

Reported per policy and loop: real success, the detector's success on the real frames, each world model's estimate and
its absolute gap to the real success, per-episode agreement (the imagined outcome equals the real one), and progress:
the mean decrease of the block-goal distance in pixels over the episode, real and imagined (a finer signal than
success; an imagined frame that lost the block counts as no progress), and `found`, the share of episodes whose last
imagined frame still shows the target block. Across policies: the Spearman rank correlation of estimates and real
success (and of progress), with a 95% bootstrap interval over the scenes for success (`spearman_interval`: a
ranking that rests on a few imagined successes is wide), the mean absolute gap, and the gap of a world model that
predicts no motion (every scene starts with the block outside the goal, so it estimates 0 everywhere).

--mirror=1: models trained on research/mirror_data.py's transitions, whose actions all point right and down, so
that a pushed block is drawn after its gripper; every step's context is mirrored by its action, the model predicts
there, and its frame is mirrored back (predict_frames; one frame at a time).
"""
import argparse
import sys
import time
from pathlib import Path
from typing import NamedTuple

import imageio.v2 as imageio
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root
from checkpoint import write_json  # noqa: E402
from data.robot import sim  # noqa: E402
from data.robot.detect import MOVED_PX, judge, locate_block, locate_goal, locate_gripper  # noqa: E402
from data.robot.task import Layout, action_bins, frame_codes, rollout  # noqa: E402
import research.cond_tokenizer  # noqa: E402,F401  (load_vq reads the cond tokenizer)
from research.mirror_data import mirror  # noqa: E402
from runtime import check_device  # noqa: E402
from video_eval import load_video_model  # noqa: E402
from video_rewards import to_uint8  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCENE_STREAM, POLICY_STREAM = 3, 4   # random streams of the evaluation (prepare.py's splits use 0, 1, 2)
GATE = 0.5                          # one-step checks: pass when the end error <= GATE x the true move
STRIP_EPISODES = 4                  # --strip: the episodes it shows


class WorldModel(NamedTuple):
    """A video world model of the embedded robot: its GPT, its tokenizer, the range of its action bins, and whether
    the GPT was trained on research/mirror_data.py's mirrored transitions (predict_frames)."""
    gpt: torch.nn.Module
    vq: torch.nn.Module
    lo: np.ndarray                  # (2,) the action bins' range (train_video.py's action_lo, action_hi)
    hi: np.ndarray
    mirrored: bool


def load_world_model(path, device="cpu", copy_gate=-1, mirrored=False):
    """A train_video.py checkpoint of the embedded robot -> (WorldModel, its run's args); a ValueError naming the file
    when it is missing or a model of other data. copy_gate 0 / 1 turns the tokenizer's copy gate off / on (-1: as the
    model was trained)."""
    if not Path(path).is_file():
        raise ValueError(f"{path}: no such checkpoint")
    model, vq, meta = load_video_model(path, device, copy_gate)
    a = meta["args"]
    if len(a["action_lo"]) != 2 or vq.config.size != sim.H:
        raise ValueError(f"{path}: not a model of the embedded robot data (2-dim actions, 64x64)")
    lo, hi = np.array(a["action_lo"], np.float32), np.array(a["action_hi"], np.float32)
    return WorldModel(model.eval(), vq.eval(), lo, hi, bool(mirrored)), a


# -----------------------------------------------------------------------------
# real rollouts and imagined ones

def parse_policy(name):
    if name == "random":
        return name
    try:
        return float(name)
    except ValueError:
        raise ValueError(f"--policies: {name!r} is neither a noise level nor 'random'") from None


def real_episodes(policy, n, samples, length, seed):
    """n scenes x `samples` episodes of a policy, scene by scene: scene i (the same for every policy) from the random
    stream (seed, 3, i), sample s's policy noise from (seed, 4, i, s) (closed-loop imagination draws the same)."""
    return [sim.policy_episode(np.random.default_rng([seed, SCENE_STREAM, i]), policy_rng(seed, i, s), length, policy)
            for i in range(n) for s in range(samples)]


def policy_rng(seed, scene, sample):
    return np.random.default_rng([seed, POLICY_STREAM, scene, sample])


def predict_frames(wm, ctx, actions, temperature=0.0, generator=None, batch_size=64):
    """One chunk in the world model wm (WorldModel, or the same 5 fields as a tuple): context frames ctx (N, H, W, 3)
    uint8 and actions (N, h, D) float (action k takes frame k to k + 1; frame 0 is the context) -> the h predicted
    frames (N, h, H, W, 3) uint8 (sample_chunk's frames)."""
    return sample_chunk(wm, ctx, actions, temperature, generator, batch_size)[0]


@torch.no_grad()
def sample_chunk(wm, ctx, actions, temperature=0.0, generator=None, batch_size=64):
    """predict_frames with what the GPT wrote -> (frames (N, h, H, W, 3) uint8, prompts (N token-id lists: context
    codes, first action), tokens (N, T) and their log-probs (N, T), data/robot/task.rollout's). The context gets its
    context codes (tokenize_context), the GPT writes h frames with the actions injected between them (rollout), and
    every predicted frame is decoded against the context frame: the cond tokenizer codes a future frame relative to it
    (the per-frame one ignores it). mirrored: a GPT trained on research/mirror_data.py's transitions, whose actions
    all point right and down; it predicts one frame (h = 1) from the context mirrored by its action, and the frame is
    mirrored back (prompts and tokens are the mirrored view's)."""
    model, vq, lo, hi, mirrored = wm
    N, h, D = actions.shape
    if mirrored:
        if h != 1:
            raise ValueError(f"a mirrored world model predicts one frame at a time, not {h}")
        a = actions[:, 0]
        pred, *rows = sample_chunk((model, vq, lo, hi, False), mirror_each(ctx, a), np.abs(actions), temperature,
                                   generator, batch_size)
        return (mirror_each(pred[:, 0], a)[:, None], *rows)        # a mirror undoes itself
    layout = Layout.of(vq, D)
    act = torch.from_numpy(layout.action_tokens(action_bins(actions, lo, hi)))                    # (N, h, D) ids
    frames, prompts, toks, lps = [], [], [], []
    for s in range(0, N, batch_size):
        c, a = ctx[s:s + batch_size], act[s:s + batch_size]
        p = torch.cat([vq.tokenize_context(c).cpu(), a[:, 0]], 1).tolist()
        tok, lp, _ = rollout(model, p, a[:, 1:], h, layout.L, temperature, generator)
        codes = frame_codes(tok, layout, h).flatten(0, 1)                                        # (B * h, L)
        frames.append(decode(vq, codes, np.repeat(c, h, 0)).reshape(len(c), h, *c.shape[1:]))
        prompts += p
        toks.append(tok.cpu())
        lps.append(lp.float().cpu())
    return np.concatenate(frames), prompts, torch.cat(toks), torch.cat(lps)


def mirror_each(frames, actions):
    """(N, H, W, 3) frames, frame i mirrored by action i (N, D) as research/mirror_data.mirror does."""
    return np.stack([mirror(f, a) for f, a in zip(frames, actions)])


def imagine(wm, first, actions, horizon, temperature=0.0, generator=None, batch_size=64):
    """Open-loop rollout: first (N, H, W, 3) uint8 true first frames, actions (N, T, D) float -> (N, T - 1, H, W, 3)
    uint8 predicted frames 1 .. T-1, in chunks of at most `horizon` frames; each chunk's context is the last frame
    predicted so far, decoded to pixels (its cond codes are relative to the previous chunk's context, so they cannot
    be a context themselves) and re-encoded by tokenize_context."""
    T, frames, t = actions.shape[1], [], 0
    ctx = first
    while t < T - 1:
        h = min(horizon, T - 1 - t)
        frames.append(predict_frames(wm, ctx, actions[:, t:t + h], temperature, generator, batch_size))
        ctx, t = frames[-1][:, -1], t + h
    return np.concatenate(frames, 1)


def perceive(frame, color, goal, last):
    """The state the scripted policy needs, read from pixels by the detectors: gripper, target block (blocks[0]) and
    goal (located once in the first real frame: the table is static). A part the frame no longer shows keeps its
    last known place (`last`, the previous perceived state)."""
    g, b = locate_gripper(frame), locate_block(frame, color)
    return dict(gripper=last["gripper"] if g is None else g, blocks=(last["blocks"][0] if b is None else b)[None],
                goal=goal)


def imagine_closed(wm, first, colors, goals, policy, rngs, T, temperature=0.0, generator=None, batch_size=64):
    """Closed-loop rollout: the policy acts on the frames the world model imagines, one frame at a time (the next
    action depends on the frame). first (N, H, W, 3) uint8, colors and goals per episode (a goal the detector did not
    find is the frame's centre), rngs: each episode's policy random stream. -> (N, T - 1, H, W, 3) uint8 frames."""
    goals = [np.full(2, (sim.W - 1) / 2, np.float32) if g is None else g for g in goals]
    states = [dict(gripper=np.full(2, (sim.W - 1) / 2, np.float32), blocks=goals[i][None]) for i in range(len(first))]
    frames = [first]
    for _ in range(T - 1):
        states = [perceive(f, c, g, s) for f, c, g, s in zip(frames[-1], colors, goals, states)]
        acts = np.stack([sim.policy_action(s, policy, r) for s, r in zip(states, rngs)])[:, None]   # (N, 1, D)
        frames.append(predict_frames(wm, frames[-1], acts, temperature, generator, batch_size)[:, 0])
    return np.stack(frames[1:], 1)


@torch.no_grad()
def decode(vq, codes, context):
    """(N, L) codes and their context frames (N, H, W, 3) uint8 -> (N, H, W, 3) uint8 frames."""
    x = torch.cat([vq.detokenize(codes[i:i + 256].to(vq_device(vq)), context[i:i + 256]).cpu()
                   for i in range(0, len(codes), 256)])
    return to_uint8(x)


def vq_device(vq):
    return next(vq.parameters()).device


def progress(frames, eps, start, goals):
    """Mean decrease (pixels) of the block-goal distance from the first real frame to these last frames, located by
    the detector; a block the frame no longer shows counts as no progress."""
    out = []
    for f, ep, b0, g in zip(frames, eps, start, goals):
        b = locate_block(f, ep["color"])
        ok = b is not None and b0 is not None and g is not None
        out.append(float(np.hypot(*(b0 - g)) - np.hypot(*(b - g))) if ok else 0.0)
    return float(np.mean(out))


# -----------------------------------------------------------------------------
# statistics

def ranks(x):
    """Ranks 1..n of the values of x, ties sharing their average rank."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        r[x == v] = r[x == v].mean()
    return r


def spearman(x, y):
    """Spearman's rank correlation (Pearson's on tie-averaged ranks); None (undefined) when a side is constant."""
    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = np.sqrt((rx ** 2).sum() * (ry ** 2).sum())
    return float((rx * ry).sum() / den) if den > 0 else None


def spearman_interval(real, imagined, samples, seed=0, n_boot=1000):
    """95% bootstrap interval of the Spearman correlation of real and imagined success rates across policies,
    resampling scenes (every policy meets the same scenes; a scene's samples stay together). real, imagined:
    (policies, scenes x samples) 0/1 outcomes, scene by scene. A resample whose rates are constant on a side (the
    correlation is undefined) counts as 0: it ranks nothing."""
    P = len(real)
    r = np.asarray(real, np.float64).reshape(P, -1, samples).mean(2)                   # (policies, scenes)
    m = np.asarray(imagined, np.float64).reshape(P, -1, samples).mean(2)
    rng, rhos = np.random.default_rng(seed), []
    for _ in range(n_boot):
        idx = rng.integers(0, r.shape[1], r.shape[1])
        rho = spearman(r[:, idx].mean(1), m[:, idx].mean(1))
        rhos.append(0.0 if rho is None else rho)
    return [float(np.percentile(rhos, 2.5)), float(np.percentile(rhos, 97.5))]


# -----------------------------------------------------------------------------
# one-step checks: does the world model move the gripper as commanded, and push the block?

def one_step_checks(wm, eps, batch_size=64):
    """Predict every next frame of the real episodes eps from its true frame and action (greedy) and compare what
    the detectors see move: the gripper on steps where the simulator moved it, the target block on steps where it was
    pushed (true centres moving by more than MOVED_PX). Per check: transitions n, mean true and predicted displacement
    (px), response (the predicted displacement projected on the true one, over the true: 1 is right, 0 no motion),
    mean error of the predicted end position (px), passed = error <= GATE * true displacement; and where the simulator
    leaves the object still, their count still_n and how far the prediction moves it anyway, false_px."""
    ctx = np.concatenate([ep["image"][:-1] for ep in eps])
    pred = predict_frames(wm, ctx, np.concatenate([ep["action"][:-1] for ep in eps])[:, None],
                          batch_size=batch_size)[:, 0]
    return move_checks(eps, pred)


def move_checks(eps, pred):
    """The checks of `one_step_checks` on any next frames pred (N, H, W, 3) uint8, one per transition of the real
    episodes eps in order (frame t and its action -> frame t + 1): a world model's predictions, the true frames
    themselves (the detectors' own ceiling) or a tokenizer's reconstructions of them."""
    ctx = np.concatenate([ep["image"][:-1] for ep in eps])
    nxt = np.concatenate([ep["image"][1:] for ep in eps])
    colors = [ep["color"] for ep in eps for _ in ep["image"][1:]]
    out = {}
    for check, key, locate in (("gripper", "gripper", lambda f, c: locate_gripper(f)), ("push", "block", locate_block)):
        moved = np.concatenate([np.hypot(*(ep[key][1:] - ep[key][:-1]).T) > MOVED_PX for ep in eps])
        # where the simulator leaves the object still: how far the prediction moves it anyway (px)
        false = []
        for k in np.nonzero(~moved)[0]:
            p0, q = locate(ctx[k], colors[k]), locate(pred[k], colors[k])
            if p0 is not None and q is not None:
                false.append(np.hypot(*(q - p0)))
        true_d, pred_d, err = [], [], []
        for k in np.nonzero(moved)[0]:
            p0, p1, q = locate(ctx[k], colors[k]), locate(nxt[k], colors[k]), locate(pred[k], colors[k])
            if p0 is None or p1 is None:
                continue
            q = p0 if q is None else q                  # a predicted frame that lost the object: no motion
            true_d.append(p1 - p0)
            pred_d.append(q - p0)
            err.append(float(np.hypot(*(q - p1))))
        t, d = np.array(true_d).reshape(-1, 2), np.array(pred_d).reshape(-1, 2)
        true_px = float(np.hypot(*t.T).mean()) if len(t) else 0.0
        proj = (d * t).sum(1) / np.maximum(np.hypot(*t.T), 1e-6)
        out[check] = dict(n=len(t), true_px=true_px, pred_px=float(np.hypot(*d.T).mean()) if len(d) else 0.0,
                          response=float(proj.mean()) / true_px if true_px else 0.0,
                          error_px=float(np.mean(err)) if err else 0.0,
                          passed=bool(len(t)) and float(np.mean(err)) <= GATE * true_px,
                          still_n=len(false), false_px=float(np.mean(false)) if false else 0.0)
    return out


# -----------------------------------------------------------------------------
# the evaluation

def evaluate(models, policies, episodes, samples, length, horizon, loops, temperature, seed, batch_size, log=print,
             strip=""):
    """models: name -> WorldModel. loops: "open" (replay the real actions)
    and/or "closed" (the policy acts on imagined frames). strip: a .png path for `write_strip` of the first policy's
    first episodes in the first model and loop. -> results dict (see the module docstring)."""
    rows, frames_agree, frames_pos, frames_pos_agree, goals_found, grip_err = [], 0, 0, 0, 0, []
    recon_agree = {}
    for policy in policies:
        t0 = time.time()
        eps = real_episodes(policy, episodes, samples, length, seed)
        goals = [locate_goal(ep["image"][0]) for ep in eps]
        goals_found += sum(g is not None for g in goals)
        real = np.array([ep["success"][-1] for ep in eps])
        detected = np.array([judge(ep["image"][-1], ep["color"], g) for ep, g in zip(eps, goals)])
        for ep, g in zip(eps, goals):                                  # the detectors on every real frame
            hits = np.array([judge(f, ep["color"], g) for f in ep["image"]])
            frames_agree += int((hits == ep["success"]).sum())
            frames_pos += int(ep["success"].sum())
            frames_pos_agree += int((hits & ep["success"]).sum())
            grip_err += [float(np.abs(q - x).max()) for f, x in zip(ep["image"], ep["gripper"])
                         if (q := locate_gripper(f)) is not None]
        start = [locate_block(ep["image"][0], ep["color"]) for ep in eps]
        row = dict(policy=str(policy), real=float(real.mean()), detector_on_real=float(detected.mean()),
                   progress_real=progress([ep["image"][-1] for ep in eps], eps, start, goals), models={},
                   episodes=dict(real=real.tolist()))
        first = np.stack([ep["image"][0] for ep in eps])
        colors = [ep["color"] for ep in eps]
        for name, wm in models.items():
            row["models"][name], row["episodes"][name] = {}, {}
            for loop in loops:
                g = torch.Generator().manual_seed(seed)
                if loop == "open":
                    frames = imagine(wm, first, np.stack([ep["action"] for ep in eps]), horizon, temperature, g,
                                     batch_size)
                else:
                    rngs = [policy_rng(seed, i, s) for i in range(episodes) for s in range(samples)]
                    frames = imagine_closed(wm, first, colors, goals, policy, rngs, length, temperature, g,
                                            batch_size)
                if strip and not rows and name == next(iter(models)) and loop == loops[0]:
                    write_strip(strip, [ep["image"] for ep in eps[:STRIP_EPISODES]], frames[:STRIP_EPISODES])
                last = frames[:, -1]
                est = np.array([judge(f, ep["color"], gl) for f, ep, gl in zip(last, eps, goals)])
                blocks = [locate_block(f, ep["color"]) for f, ep in zip(last, eps)]
                row["models"][name][loop] = dict(estimate=float(est.mean()), gap=float(abs(est.mean() - real.mean())),
                                                 episode_agreement=float((est == real).mean()),
                                                 progress=progress(last, eps, start, goals),
                                                 block_found=float(np.mean([b is not None for b in blocks])))
                row["episodes"][name][loop] = est.tolist()
            rec = decode(wm[1], wm[1].tokenize(np.stack([ep["image"][-1] for ep in eps]), np.stack(
                [ep["image"][-2] for ep in eps])).cpu(), np.stack([ep["image"][-2] for ep in eps]))
            ok = np.array([judge(f, ep["color"], gl) for f, ep, gl in zip(rec, eps, goals)]) == real
            recon_agree.setdefault(name, []).extend(ok.tolist())
        rows.append(row)
        log(f"policy {policy}: real {row['real']:.2f} " + " ".join(
            f"{k} {loop} {v[loop]['estimate']:.2f}" for k, v in row["models"].items() for loop in loops)
            + f" ({time.time() - t0:.0f}s)")
    real = [r["real"] for r in rows]
    n_frames = len(policies) * episodes * samples * length
    summary = dict(static_world_gap=float(np.mean(real)), models={})
    for name in models:
        summary["models"][name] = dict(detector_agreement_on_tokenizer_reconstructions=float(
            np.mean(recon_agree[name])))
        for loop in loops:
            est = [r["models"][name][loop]["estimate"] for r in rows]
            prog = [r["models"][name][loop]["progress"] for r in rows]
            summary["models"][name][loop] = dict(
                spearman=spearman(real, est), spearman_progress=spearman([r["progress_real"] for r in rows], prog),
                spearman_interval=spearman_interval([r["episodes"]["real"] for r in rows],
                                                    [r["episodes"][name][loop] for r in rows], samples, seed),
                mean_gap=float(np.mean([r["models"][name][loop]["gap"] for r in rows])))
    detector = dict(frame_agreement=frames_agree / n_frames, frames=n_frames, positive_frames=frames_pos,
                    positive_frame_recall=frames_pos_agree / max(frames_pos, 1),
                    goal_found=goals_found / (len(policies) * episodes * samples),
                    gripper_error_px=float(np.mean(grip_err)))
    return dict(policies=rows, summary=summary, detector=detector, episodes=episodes, samples=samples, length=length,
                horizon=horizon, loops=list(loops), temperature=temperature, seed=seed)


def write_strip(path, real, imagined, every=3):
    """A .png of episodes, each a row of its real frames (every `every`-th, from the first) over a row of the same
    frames imagined (the first is the shared real frame)."""
    rows = []
    for r, m in zip(real, imagined):
        m = np.concatenate([r[:1], m])
        rows += [np.concatenate(list(r[::every]), 1), np.concatenate(list(m[::every]), 1)]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    imageio.imwrite(path, np.concatenate(rows, 0).repeat(2, 0).repeat(2, 1))


def fmt_rho(rho):
    return "undefined (constant estimates)" if rho is None else f"{rho:.3f}"


def print_checks(checks, file=None):
    for name, c in checks.items():
        for check, x in c.items():
            print(f"{name} one-step {check} check: {'passed' if x['passed'] else 'FAILED'} on {x['n']} moving steps: "
                  f"true {x['true_px']:.2f} px, predicted {x['pred_px']:.2f} px, response {x['response']:.2f}, "
                  f"end-position error {x['error_px']:.2f} px (pass: <= {GATE} x true)", file=file)


def print_ranking(res, file=None):
    names = list(res["summary"]["models"])
    cols = [("est", "estimate"), ("|gap|", "gap"), ("agree", "episode_agreement"), ("prog", "progress"),
            ("found", "block_found")]
    for loop in res["loops"]:
        print(f"\n{loop} loop", file=file)
        print(f"{'policy':<8}{'real':>6}{'det.real':>9}{'prog real':>10}"
              + "".join(f"{c + ' ' + n:>11}" for c, _ in cols for n in names), file=file)
        for r in res["policies"]:
            print(f"{r['policy']:<8}{r['real']:>6.2f}{r['detector_on_real']:>9.2f}{r['progress_real']:>10.1f}"
                  + "".join(f"{r['models'][n][loop][k]:>11.{1 if k == 'progress' else 2}f}" for _, k in cols
                            for n in names), file=file)
        for n in names:
            s = res["summary"]["models"][n][loop]
            found = [r["models"][n][loop]["block_found"] for r in res["policies"]]
            lo, hi = s["spearman_interval"]
            print(f"{n} {loop}: Spearman (success) {fmt_rho(s['spearman'])} [{lo:.2f}, {hi:.2f}] (95%, scenes "
                  f"resampled), mean |gap| {s['mean_gap']:.3f}, "
                  f"Spearman (progress) {fmt_rho(s['spearman_progress'])}; the last imagined frame shows the block in "
                  f"{np.mean(found):.0%} of episodes", file=file)
    d = res["detector"]
    print(f"\na world model that predicts no motion: mean |gap| {res['summary']['static_world_gap']:.3f}", file=file)
    print(f"detector vs sim.success on {d['frames']} real frames: agreement {d['frame_agreement']:.4f}, "
          f"recall on the {d['positive_frames']} success frames {d['positive_frame_recall']:.4f}, goal found in "
          f"{d['goal_found']:.0%} of scenes, gripper {d['gripper_error_px']:.2f} px from its true centre; on tokenizer "
          f"reconstructions of the last real frames: " + ", ".join(
              f"{n} {s['detector_agreement_on_tokenizer_reconstructions']:.3f}"
              for n, s in res["summary"]["models"].items()), file=file)


def main(argv=None):
    p = argparse.ArgumentParser(description="estimate robot policies' success inside video world models",
                                allow_abbrev=False)
    # world models
    p.add_argument("--mle", default=str(ROOT / "checkpoints" / "video_mle_4000.safetensors"),
                   help="a world model of train_video.py (its tokenizer is named in its metadata)")
    p.add_argument("--rlvr", default="", help="its RLVR version, e.g. out/video/video_rlvr.safetensors of "
                                              "`python train_video.py`")
    p.add_argument("--mirror", type=int, default=0, choices=[0, 1],
                   help="1: models trained on research/mirror_data.py's mirrored transitions; each step's "
                        "context is mirrored so its action points right and down, and the prediction back")
    p.add_argument("--copy_gate", type=int, default=-1, choices=[-1, 0, 1],
                   help="-1: decode as each checkpoint records; 1: with the copy gate (e.g. the shipped per-frame "
                        "checkpoints/video_mle.safetensors, the start of a --copy_gate=1 run); 0: without")
    # protocol
    p.add_argument("--policies", default="0,0.3,0.6,1.0,random", help="expert action-noise stds and/or 'random'")
    p.add_argument("--episodes", type=int, default=50, help="held-out scenes per policy")
    p.add_argument("--samples", type=int, default=2, help="episodes per scene (policy noise and model sampling)")
    p.add_argument("--length", type=int, default=16, help="frames per episode")
    p.add_argument("--loops", default="open,closed",
                   help="open: replay the real actions; closed: the policy acts on the imagined frames")
    p.add_argument("--horizon", type=int, default=1,
                   help="open loop: frames predicted per chunk (1 for a single-step model, up to its training window)")
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    p.add_argument("--check_episodes", type=int, default=10, help="scenes per policy of the one-step checks")
    p.add_argument("--gate", type=int, default=1, help="1: stop after the one-step checks if one fails")
    p.add_argument("--seed", type=int, default=0)
    # system
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--json", default="out/policy_eval/policy_eval.json")
    p.add_argument("--strip", default="", help="a .png of the first policy's first episodes, real over imagined "
                                               "(the first model, the first loop)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        check_device(args.device)
        policies = [parse_policy(x.strip()) for x in args.policies.split(",") if x.strip()]
        loops = [x.strip() for x in args.loops.split(",") if x.strip()]
        if not policies or args.episodes < 1 or args.samples < 1 or args.length < 2 or args.horizon < 1:
            raise ValueError("need --policies, --episodes >= 1, --samples >= 1, --length >= 2 and --horizon >= 1")
        if args.mirror and args.horizon != 1:
            raise ValueError(f"--mirror=1 predicts one frame at a time: give --horizon=1, not {args.horizon}")
        if not loops or not set(loops) <= {"open", "closed"}:
            raise ValueError(f"--loops {args.loops!r}: give open and/or closed")
        models = {}
        for name, path in (("mle", args.mle), ("rlvr", args.rlvr)):
            if not path:
                continue
            try:
                wm, _ = load_world_model(path, args.device, args.copy_gate, args.mirror)
            except ValueError as e:
                raise ValueError(f"--{name} {e}") from None
            if Layout.of(wm.vq, 2).window_len(1, args.horizon) > wm.gpt.config.block_size:
                raise ValueError(f"--horizon {args.horizon}: 1 + {args.horizon} frames exceed {path}'s block size")
            models[name] = wm
        if not models:
            raise ValueError("no world model: give --mle and/or --rlvr")
    except ValueError as e:
        sys.exit(f"error: {e}")
    t0 = time.time()
    check_eps = [ep for pol in policies for ep in real_episodes(pol, min(args.check_episodes, args.episodes), 1,
                                                                 args.length, args.seed)]
    checks = {name: one_step_checks(wm, check_eps, args.batch_size) for name, wm in models.items()}
    print_checks(checks)
    res = dict(checks=checks, checkpoints={n: p for n, p in (("mle", args.mle), ("rlvr", args.rlvr)) if p},
               copy_gate=args.copy_gate, mirror=args.mirror)
    failed = [f"{n} {c}" for n, x in checks.items() for c, v in x.items() if not v["passed"]]
    if failed and args.gate:
        print(f"gate: the one-step checks failed ({', '.join(failed)}): no policy evaluation (--gate=0 runs it anyway)")
    else:
        res.update(evaluate(models, policies, args.episodes, args.samples, args.length, args.horizon, loops,
                            args.temperature, args.seed, args.batch_size, strip=args.strip), gate_failed=failed)
        print(f"\n{args.episodes} held-out scenes x {args.samples} samples per policy, {args.length} frames, open-loop "
              f"chunks of {args.horizon} frames, temperature {args.temperature} ({(time.time() - t0) / 60:.1f} min)"
              + (f"; the one-step checks FAILED ({', '.join(failed)})" if failed else ""))
        print_ranking(res)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, res)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
