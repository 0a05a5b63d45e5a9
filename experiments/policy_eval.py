"""
Policy evaluation inside the video world model: does the world model tell good robot policies from bad ones, and how
close are its success estimates to reality? MLE world model against its RLVR post-trained version.

    python experiments/policy_eval.py                      # 5 policies x 50 held-out scenes, MLE and RLVR; 8 min on one CPU core
    python experiments/policy_eval.py --episodes=10 --policies=0,1.0                   # a quick look
    python experiments/policy_eval.py --mle= --rlvr=out/video_multi/video_rlvr.safetensors \
        --json=out/policy_eval/policy_eval_multi.json                     # the multi-step RLVR model
    python experiments/policy_eval.py --temperature=1      # sampled rollouts instead of greedy
    python experiments/policy_eval.py --device=cuda --batch_size=256                   # 1 GPU
The RLVR model is made by `python train_video.py` (out/video/video_rlvr.safetensors); the MLE one is shipped. Writes
out/policy_eval/policy_eval.json (--json).

Protocol. For each policy (the scripted expert plus Gaussian action noise of std 0, 0.3, 0.6, 1.0, and uniformly
random actions; data/robot/sim.py) and each of --episodes scenes:
  1. real: roll the policy out in the simulator for --length frames (16, the clip length the models were trained on)
     from a held-out scene. Scene i is drawn from the random stream (seed, 3, i); data/robot/prepare.py's train, val
     and test splits come from the streams (seed, 0), (seed, 1), (seed, 2), so no evaluation scene was trained on.
     Every policy meets the same scenes. Real success = `sim.success` of the state the last frame shows.
  2. imagined: give the world model the same first frame and the same actions (open loop) and let it predict frames
     1 .. T-1. The models were trained on windows of 1 context frame + 7 predicted ones (528 tokens), so longer
     episodes roll out in chunks: each chunk starts from the last frame predicted so far (its codes, never re-encoded)
     and predicts up to --horizon frames with the true actions injected between them (data/robot/task.rollout). Chunks of
     7 (the default) are the models' own training windows and restart least often; --horizon=1 re-prompts every frame.
  3. judge: the same pixel success detector on the last real frame and on the last imagined frame.
Greedy decoding (--temperature=0) by default, as in eval.py --task=video.

Success detector (`judge`), on pixels only, given the task ("push the block of this colour into the goal"):
  - goal: in the first real frame, pixels greener than the table (green minus red above the frame's median by 0.09,
    and green above blue); the goal is the 15x15 window holding most of them; its centre is the centre of the box of
    those pixels (stray pixels elsewhere, e.g. on the dark gripper, do not move it);
  - block: the pixels within RGB distance 0.25 of the target block's colour (at least 12 of them, else "no block":
    a model that erased the block fails); its centre is their mean position;
  - success: the block centre lies within GOAL_HALF - 1 of the goal centre on both axes, the test `sim.success` makes
    on the true state. The colour tolerance was chosen on scenes of another seed, real frames and the tokenizer's
    reconstructions of them; its agreement with `sim.success` on the evaluation's real frames is printed.

Reported per policy: real success, the detector's success on the real frames, each world model's estimate and its
absolute gap to the real success, per-episode agreement (the imagined outcome equals the real one), and progress:
the mean decrease of the block-goal distance in pixels over the episode, real and imagined (a finer signal than
success; an imagined frame that lost the block counts as no progress). Across policies: the Spearman rank
correlation of estimates and real success (and of progress), the mean absolute gap, and the gap of a world model
that predicts no motion (every scene starts with the block outside the goal, so it estimates 0 everywhere).
The world model replays each real episode, so a gap is the model's error, not sampling noise between two sets.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root
from checkpoint import write_json  # noqa: E402
from data.robot import sim  # noqa: E402
from data.robot.evaluate import load_video_model  # noqa: E402
from data.robot.task import Layout, action_bins, frame_codes, rollout  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GREEN_TOL, COLOR_TOL, MIN_PIXELS = 0.09, 0.25, 12
SCENE_STREAM, POLICY_STREAM = 3, 4   # random streams of the evaluation (prepare.py's splits use 0, 1, 2)


# -----------------------------------------------------------------------------
# success detector on pixels

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


def judge(frame, rgb, goal):
    """Does the frame show the block of colour rgb inside the goal centred at `goal` (None: no goal found)?"""
    block = locate_block(frame, rgb)
    return block is not None and goal is not None and bool((np.abs(block - goal) < sim.GOAL_HALF - 1).all())


# -----------------------------------------------------------------------------
# real rollouts and imagined ones

def parse_policy(name):
    if name == "random":
        return name
    try:
        return float(name)
    except ValueError:
        raise ValueError(f"--policies: {name!r} is neither a noise level nor 'random'") from None


def real_episodes(policy, n, length, seed):
    """n episodes of a policy in the held-out scenes 0 .. n-1 (the same scenes for every policy)."""
    return [sim.policy_episode(np.random.default_rng([seed, SCENE_STREAM, i]),
                               np.random.default_rng([seed, POLICY_STREAM, i]), length, policy) for i in range(n)]


@torch.no_grad()
def imagine(model, vq, first, actions, lo, hi, horizon, temperature=0.0, generator=None, batch_size=64):
    """Open-loop rollout in the world model. first (N, H, W, 3) uint8 true first frames, actions (N, T, D) float.
    -> (N, T - 1, L) codes of the predicted frames 1 .. T-1, in chunks of at most `horizon` frames, each chunk starting
    from the last frame predicted so far and its action."""
    model.eval()
    N, T, D = actions.shape
    layout = Layout.of(vq, D)
    act = torch.from_numpy(layout.action_tokens(action_bins(actions, lo, hi)))                    # (N, T, D) ids
    out = []
    for s in range(0, N, batch_size):
        last = vq.tokenize(first[s:s + batch_size]).cpu()                                         # (B, L)
        chunks, t = [], 0
        while t < T - 1:
            h = min(horizon, T - 1 - t)
            prompts = torch.cat([last, act[s:s + len(last), t]], 1).tolist()
            tok, _, _ = rollout(model, prompts, act[s:s + len(last), t + 1:t + h], h, layout.L, temperature, generator)
            codes = frame_codes(tok, layout, h).cpu()                                            # (B, h, L)
            chunks.append(codes)
            last, t = codes[:, -1], t + h
        out.append(torch.cat(chunks, 1))
    return torch.cat(out)


@torch.no_grad()
def decode(vq, codes):
    """(N, L) codes -> (N, H, W, 3) uint8 frames."""
    x = torch.cat([vq.detokenize(codes[i:i + 256].to(vq_device(vq))).cpu() for i in range(0, len(codes), 256)])
    return (x.clamp(0, 1).permute(0, 2, 3, 1).numpy() * 255 + 0.5).astype(np.uint8)


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


# -----------------------------------------------------------------------------
# the evaluation

def evaluate(models, policies, episodes, length, horizon, temperature, seed, batch_size, log=print):
    """models: name -> (GPT, VQ, action lo, action hi). -> results dict (see the module docstring)."""
    rows, frames_agree, frames_pos, frames_pos_agree, goals_found = [], 0, 0, 0, 0
    recon_agree = {}
    for policy in policies:
        t0 = time.time()
        eps = real_episodes(policy, episodes, length, seed)
        goals = [locate_goal(ep["image"][0]) for ep in eps]
        goals_found += sum(g is not None for g in goals)
        real = np.array([ep["success"][-1] for ep in eps])
        detected = np.array([judge(ep["image"][-1], ep["color"], g) for ep, g in zip(eps, goals)])
        for ep, g in zip(eps, goals):                                  # the detector on every real frame
            hits = np.array([judge(f, ep["color"], g) for f in ep["image"]])
            frames_agree += int((hits == ep["success"]).sum())
            frames_pos += int(ep["success"].sum())
            frames_pos_agree += int((hits & ep["success"]).sum())
        start = [locate_block(ep["image"][0], ep["color"]) for ep in eps]
        row = dict(policy=str(policy), real=float(real.mean()), detector_on_real=float(detected.mean()),
                   progress_real=progress([ep["image"][-1] for ep in eps], eps, start, goals), models={})
        first = np.stack([ep["image"][0] for ep in eps])
        actions = np.stack([ep["action"] for ep in eps])
        for name, (model, vq, lo, hi) in models.items():
            g = torch.Generator().manual_seed(seed)
            codes = imagine(model, vq, first, actions, lo, hi, horizon, temperature, g, batch_size)
            last = decode(vq, codes[:, -1])
            est = np.array([judge(f, ep["color"], gl) for f, ep, gl in zip(last, eps, goals)])
            blocks = [locate_block(f, ep["color"]) for f, ep in zip(last, eps)]
            err = [float(np.abs(b - ep["block"][-1]).max()) for b, ep in zip(blocks, eps) if b is not None]
            row["models"][name] = dict(estimate=float(est.mean()), gap=float(abs(est.mean() - real.mean())),
                                       episode_agreement=float((est == real).mean()),
                                       progress=progress(last, eps, start, goals),
                                       block_found=float(np.mean([b is not None for b in blocks])),
                                       block_error_px=float(np.mean(err)) if err else None)
            rec = decode(vq, vq.tokenize(np.stack([ep["image"][-1] for ep in eps])).cpu())
            ok = np.array([judge(f, ep["color"], gl) for f, ep, gl in zip(rec, eps, goals)]) == real
            recon_agree.setdefault(name, []).extend(ok.tolist())
        rows.append(row)
        log(f"policy {policy}: real {row['real']:.2f} " + " ".join(
            f"{k} {v['estimate']:.2f}" for k, v in row["models"].items()) + f" ({time.time() - t0:.0f}s)")
    real = [r["real"] for r in rows]
    n_frames = len(policies) * episodes * length
    summary = dict(static_world_gap=float(np.mean(real)), models={})
    for name in models:
        est = [r["models"][name]["estimate"] for r in rows]
        prog = [r["models"][name]["progress"] for r in rows]
        summary["models"][name] = dict(spearman=spearman(real, est),
                                       spearman_progress=spearman([r["progress_real"] for r in rows], prog),
                                       mean_gap=float(np.mean([r["models"][name]["gap"] for r in rows])),
                                       detector_agreement_on_tokenizer_reconstructions=float(
                                           np.mean(recon_agree[name])))
    detector = dict(frame_agreement=frames_agree / n_frames, frames=n_frames, positive_frames=frames_pos,
                    positive_frame_recall=frames_pos_agree / max(frames_pos, 1),
                    goal_found=goals_found / (len(policies) * episodes))
    return dict(policies=rows, summary=summary, detector=detector, episodes=episodes, length=length, horizon=horizon,
                temperature=temperature, seed=seed)


def fmt_rho(rho):
    return "undefined (constant estimates)" if rho is None else f"{rho:.3f}"


def print_ranking(res, file=None):
    names = list(res["summary"]["models"])
    cols = [("est", "estimate"), ("|gap|", "gap"), ("agree", "episode_agreement"), ("prog", "progress")]
    print(f"{'policy':<8}{'real':>6}{'det.real':>9}{'prog real':>10}"
          + "".join(f"{c + ' ' + n:>11}" for c, _ in cols for n in names), file=file)
    for r in res["policies"]:
        print(f"{r['policy']:<8}{r['real']:>6.2f}{r['detector_on_real']:>9.2f}{r['progress_real']:>10.1f}"
              + "".join(f"{r['models'][n][k]:>11.{1 if k == 'progress' else 2}f}" for _, k in cols for n in names),
              file=file)
    for n, s in res["summary"]["models"].items():
        found = [r["models"][n]["block_found"] for r in res["policies"]]
        err = [e for e in (r["models"][n]["block_error_px"] for r in res["policies"]) if e is not None]
        print(f"{n}: Spearman (success) {fmt_rho(s['spearman'])}, mean |gap| {s['mean_gap']:.3f}, "
              f"Spearman (progress) {fmt_rho(s['spearman_progress'])}; the last imagined frame shows the block in "
              f"{np.mean(found):.0%} of episodes, {np.mean(err) if err else float('nan'):.1f} px from its true place",
              file=file)
    d = res["detector"]
    print(f"a world model that predicts no motion: mean |gap| {res['summary']['static_world_gap']:.3f}", file=file)
    print(f"detector vs sim.success on {d['frames']} real frames: agreement {d['frame_agreement']:.4f}, "
          f"recall on the {d['positive_frames']} success frames {d['positive_frame_recall']:.4f}, goal found in "
          f"{d['goal_found']:.0%} of scenes; on tokenizer reconstructions of the last real frames: " + ", ".join(
              f"{n} {s['detector_agreement_on_tokenizer_reconstructions']:.3f}"
              for n, s in res["summary"]["models"].items()), file=file)


def main(argv=None):
    p = argparse.ArgumentParser(description="estimate robot policies' success inside video world models")
    # world models
    p.add_argument("--mle", default=str(ROOT / "checkpoints" / "video_mle.safetensors"))
    p.add_argument("--rlvr", default=str(ROOT / "out" / "video" / "video_rlvr.safetensors"),
                   help="made by `python train_video.py`; '' to evaluate the MLE model only")
    # protocol
    p.add_argument("--policies", default="0,0.3,0.6,1.0,random", help="expert action-noise stds and/or 'random'")
    p.add_argument("--episodes", type=int, default=50, help="held-out scenes per policy")
    p.add_argument("--length", type=int, default=16, help="frames per episode")
    p.add_argument("--horizon", type=int, default=7, help="frames predicted per chunk (the models' training window)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    # system
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--json", default="out/policy_eval/policy_eval.json")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        policies = [parse_policy(x.strip()) for x in args.policies.split(",") if x.strip()]
        if not policies or args.episodes < 1 or args.length < 2 or args.horizon < 1:
            raise ValueError("need --policies, --episodes >= 1, --length >= 2 and --horizon >= 1")
        models = {}
        for name, path in (("mle", args.mle), ("rlvr", args.rlvr)):
            if not path:
                continue
            if not Path(path).is_file():
                raise ValueError(f"--{name} {path}: no such checkpoint" + (" (run `python train_video.py`)"
                                                                            if name == "rlvr" else ""))
            model, vq, meta = load_video_model(path, args.device)
            a = meta["args"]
            if len(a["action_lo"]) != 2 or vq.config.size != sim.H:
                raise ValueError(f"--{name} {path}: not a model of the embedded robot data (2-dim actions, 64x64)")
            if (1 + args.horizon) * (vq.config.codes_per_frame + 2) - 2 > model.config.block_size:
                raise ValueError(f"--horizon {args.horizon}: 1 + {args.horizon} frames exceed {path}'s block size")
            models[name] = (model, vq, np.array(a["action_lo"], np.float32), np.array(a["action_hi"], np.float32))
        if not models:
            raise ValueError("no world model: give --mle and/or --rlvr")
    except ValueError as e:
        sys.exit(f"error: {e}")
    t0 = time.time()
    res = evaluate(models, policies, args.episodes, args.length, args.horizon, args.temperature, args.seed,
                   args.batch_size)
    res["checkpoints"] = {n: p for n, p in (("mle", args.mle), ("rlvr", args.rlvr)) if p}
    print(f"\n{args.episodes} held-out scenes per policy, {args.length} frames, world-model chunks of "
          f"{args.horizon} frames, temperature {args.temperature} ({(time.time() - t0) / 60:.1f} min)")
    print_ranking(res)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, res)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
