"""
RLVR over imagined chains: GRPO whose sample is k frames imagined in a row, each from the model's own last frame,
every frame paid for against the simulator's true one.

    python research/chain_rlvr.py --init=out/ft_mirror4k/video_mle.safetensors --mirror=1 \\
        --data=out/robot4000 --out_dir=out/chain_rl                         # 15 minutes on a core

train_video.py's single-step RLVR predicts from true frames only. Policy evaluation in the world model
(policy_eval.py) chains 15 predictions, each from the model's last frame, decoded and encoded again, and the block the
gripper pushes is lost over them (research/README.md). Here a prompt is a true frame t of a train episode with its
next --chain actions; each of its --group samples imagines frames t+1 .. t+k the way policy_eval imagines an episode
(open loop, one frame per step, mirrored by each action with --mirror=1); its reward is the mean over the k frames of
train_video.py's single-step reward (video_rewards.video_reward: MAE + 1 - SSIM, the moving, object and push terms),
each frame against the true one, with the true frame before it as the context. The group's advantages
(grpo.group_advantages) go to every frame of the chain: each frame's codes after its prompt (context codes and
action) are one row of grpo.update, the same PPO-clip + KL step as train_video.py's. --placebo=1 permutes each
group's rewards among its samples (the optimiser's check).

Writes out_dir/video_rlvr.safetensors (with the start's tokenizer beside it, so policy_eval.py --rlvr loads it),
log.jsonl (a row per step; greedy chains of the validation episodes every --eval_every steps, with each chain's
reward) and run.log's lines on stdout. Not resumable: a finished out_dir is refused. --steps=0 --val_chain=15 only
scores --init (any train_video.py checkpoint) on the validation episodes imagined whole, the yardstick on which the
chain length and the control's rate were chosen (research/README.md); with --eval_split=test, on the test episodes.
"""
import argparse
import copy
import shutil
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root
from checkpoint import save_checkpoint, write_jsonl  # noqa: E402
from data.robot.detect import locate_blocks, locate_gripper  # noqa: E402
from data.robot.task import episode_files, read_npz, to_float  # noqa: E402
from research.policy_eval import load_world_model, sample_chunk  # noqa: E402
from grpo import (Batch, GRPOConfig, group_advantages, logprobs_shared_prompts,  # noqa: E402
                  pack, update)
from runtime import plan_update  # noqa: E402
from video_rewards import VideoReward, video_reward  # noqa: E402


# -----------------------------------------------------------------------------
# a chain: k frames imagined one after another

def sample_frame(wm, ctx, actions, temperature, generator):
    """One sampled step of the world model: context frames ctx (N, H, W, 3) uint8, actions (N, D) -> the prompts
    (N lists: context codes, action tokens), the sampled codes (N, L) as token ids, their log-probs (N, L) and the
    frames (N, H, W, 3) uint8 (policy_eval.sample_chunk; with wm.mirrored, prompts and codes in the view where the
    action points right and down)."""
    frames, prompts, tok, lp = sample_chunk(wm, ctx, actions[:, None], temperature, generator)
    return prompts, tok, lp, frames[:, 0]


def chain_reward(pred, truth, before, background, weights):
    """(N, H, W, 3) uint8 imagined frames, the true ones, the true frames before them, the bare scenes -> (N,)
    train_video.py's single-step reward of each frame."""
    cfg = VideoReward(moving=weights["moving"], object=weights["object"], push=weights["push"])
    return video_reward(cfg, to_float(pred), to_float(truth), None, to_float(before), to_float(background))


def at(eps, starts, key, offset=0):
    """Episode i's `key` array at step starts[i] + offset, stacked over the episodes."""
    return np.stack([ep[key][t + offset] for ep, t in zip(eps, starts)])


def imagine_chains(wm, eps, starts, k, temperature, generator, weights):
    """From true frame starts[i] of episode i, k frames imagined in a row under the episode's actions (temperature
    0: greedy) -> the rows (prompts, tokens, log-probs) of every step, step by step, each chain's mean reward (N,)
    and its last frame (N, H, W, 3) uint8."""
    ctx = at(eps, starts, "image")
    bg = np.stack([ep["background"] for ep in eps])
    rows, reward = ([], [], []), 0.0
    for j in range(k):
        act = at(eps, starts, "action", j).astype(np.float32)
        prompts, tok, lp, ctx = sample_frame(wm, ctx, act, temperature, generator)   # from its own last frame
        for r, x in zip(rows, (prompts, list(tok), list(lp))):
            r.extend(x)
        truth, before = at(eps, starts, "image", j + 1), at(eps, starts, "image", j)
        reward = reward + chain_reward(ctx, truth, before, bg, weights) / k
    return rows, reward, ctx


# -----------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip(), allow_abbrev=False,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("model and data")
    g.add_argument("--init", required=True, help="the start: a train_video.py checkpoint of the embedded robot")
    g.add_argument("--mirror", type=int, default=1, choices=[0, 1],
                   help="1: --init was trained on research/mirror_data.py's transitions (policy_eval --mirror)")
    g.add_argument("--copy_gate", type=int, default=1, choices=[0, 1], help="decode with the copy gate")
    g.add_argument("--data", required=True, help="a data/robot/prepare.py folder of whole episodes (train, val)")
    g.add_argument("--out_dir", required=True, help="the new checkpoint, its tokenizer and log.jsonl")
    g = p.add_argument_group("GRPO (train_video.py's video defaults)")
    g.add_argument("--steps", type=int, default=100,
                   help="GRPO steps; 0: only the validation chains of --init (log.jsonl, no checkpoint)")
    g.add_argument("--prompts", type=int, default=8, help="prompts (true frames) per step")
    g.add_argument("--group", type=int, default=8, help="chains per prompt (G)")
    g.add_argument("--chain", type=int, default=3, help="frames imagined in a row (k)")
    g.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (constant)")
    g.add_argument("--beta", type=float, default=0.02, help="KL coefficient to the start")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the chains")
    g.add_argument("--placebo", type=int, default=0, choices=[0, 1], help="1: rewards permuted within each group")
    g = p.add_argument_group("reward (train_video.py's single-step defaults)")
    g.add_argument("--moving_weight", type=float, default=1.0, help="MAE on the pixels the true step changes")
    g.add_argument("--object_weight", type=float, default=0.5, help="share of true object pixels left empty")
    g.add_argument("--push_weight", type=float, default=0.1, help="distance of the pushed blocks from the truth")
    g = p.add_argument_group("run")
    g.add_argument("--eval_every", type=int, default=20, help="greedy validation chains every N steps")
    g.add_argument("--val_episodes", type=int, default=32,
                   help="validation episodes (a chain from a random frame of each)")
    g.add_argument("--eval_split", default="val", choices=["val", "test"],
                   help="the episodes of the greedy chains: val (every choice), or test with --steps=0 (the "
                        "finished models, once per claim)")
    g.add_argument("--val_chain", type=int, default=0,
                   help="frames of the validation chains; 0: --chain (15 with 16-frame episodes: whole "
                        "episodes from their first frame, as policy_eval.py imagines them)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out_dir)
    if (out / "video_rlvr.safetensors").exists():
        sys.exit(f"error: --out_dir={out} holds a finished run")
    if min(args.prompts, args.group, args.chain, args.eval_every, args.val_episodes) < 1:
        sys.exit("error: --prompts, --group, --chain, --eval_every and --val_episodes must be >= 1")
    if min(args.steps, args.val_chain) < 0:
        sys.exit("error: --steps and --val_chain must be >= 0")
    if args.group < 2 or args.temperature <= 0:
        sys.exit("error: GRPO needs --group >= 2 and --temperature > 0")
    if args.eval_split == "test" and args.steps:
        sys.exit("error: --eval_split=test scores a finished model only: it needs --steps=0")
    try:
        wm, margs = load_world_model(args.init, copy_gate=args.copy_gate, mirrored=args.mirror)
        files = {s: episode_files(args.data, s) for s in ("train", args.eval_split)}
        if not files["train"] or not files[args.eval_split]:
            raise ValueError(f"--data={args.data}: no train or {args.eval_split} episodes")
        val = [read_npz(f) for f in files[args.eval_split][:args.val_episodes]]
    except ValueError as e:
        sys.exit(f"error: {e}")
    T, vk = len(val[0]["image"]), args.val_chain or args.chain
    if max(args.chain, vk) >= T:
        sys.exit(f"error: --chain={args.chain} and --val_chain={vk} need episodes longer than {T} frames")
    weights = dict(moving=args.moving_weight, object=args.object_weight, push=args.push_weight)
    val_starts = np.random.default_rng([0, 1]).integers(T - vk, size=len(val))   # the same for every seed

    # --- the policy, its frozen start (the KL anchor) and train_video.py's video GRPO settings
    policy = wm.gpt.train()
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    cfg = GRPOConfig(group_size=args.group, lr=args.lr, beta=args.beta, temperature=args.temperature,
                     prompts_per_step=0, entropy_coef=0.0, warmup=0, betas=(0.9, 0.99), weight_decay=0.0,
                     minibatches=2, micro_batch=32)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    placebo = torch.Generator().manual_seed(args.seed + 7919)
    log, t0 = [], time.time()

    # --- GRPO: chains, group advantages on their rewards, PPO-clip + KL on every frame's codes
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            policy.eval()
            _, r, last = imagine_chains(wm, val, val_starts, vk, 0.0, None, weights)   # greedy
            truth = at(val, val_starts, "image", vk)
            err = np.abs(last.astype(np.float32) - truth.astype(np.float32)).mean(axis=(1, 2, 3)) / 255
            policy.train()
            log.append(dict(step=step, val_reward=r.mean().item(), val_mae_last=float(err.mean()),
                            minutes=(time.time() - t0) / 60, val_rewards=r.tolist()))   # one per chain
            print(f"step {step}: {args.eval_split} chain reward {r.mean():.4f}, MAE of frame {vk} {err.mean():.5f}",
                  flush=True)
        if step == args.steps:
            break
        picks = rng.integers(len(files["train"]), size=args.prompts)
        eps = [ep for i in picks for ep in [read_npz(files["train"][i])] * args.group]
        starts = np.repeat(rng.integers(T - args.chain, size=args.prompts), args.group)
        policy.eval()
        (prompts, tok, lp), reward, _ = imagine_chains(wm, eps, starts, args.chain, args.temperature, gen,
                                                       weights)
        policy.train()
        used = reward.view(args.prompts, args.group)                 # (P, G) one row per prompt
        if args.placebo:
            used = torch.stack([row[torch.randperm(args.group, generator=placebo)] for row in used])
        adv = group_advantages(used, cfg.std_norm, cfg.adv_eps).view(-1)       # (P * G,) one per chain
        N = len(prompts)                                             # k steps x P x G rows
        prompt_idx, prompt_len, idx, targets = pack(prompts, torch.stack(tok))
        b = Batch(prompt_idx, prompt_len, idx, targets, torch.arange(N), torch.stack(lp),
                  adv.repeat(args.chain), targets >= 0, None)
        plan = plan_update(policy, b, cfg, gen)
        once = [c for mb in plan for c in mb.micro] if cfg.beta > 0 else []   # beta 0: the sampler's
        b = b._replace(ref_logp=b.old_logp.clone())
        with torch.no_grad():   # the reference's log-probs, every row once
            for chunk in once:
                b.ref_logp[chunk] = logprobs_shared_prompts(ref, b, chunk, cfg)[0]
        sums = update(policy, opt, b, plan, cfg, step, nullcontext())
        n_mb = sums["steps"]
        row = dict(step=step + 1, reward_mean=reward.mean().item(), kl=sums["kl"] / n_mb,
                   grad_norm=sums["grad_norm"] / n_mb, minutes=(time.time() - t0) / 60)
        log.append(row)
        print(f"\rstep {step + 1}/{args.steps}: reward {row['reward_mean']:.4f} kl {row['kl']:.4f}", end="",
              flush=True)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            print()

    # --- the checkpoint, loadable as the start is (its tokenizer beside it)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "log.jsonl", log)
    if args.steps == 0:                                              # the start's validation chains only
        print(f"wrote {out / 'log.jsonl'}")
        return
    shutil.copyfile(Path(args.init).parent / margs["vq"], out / margs["vq"])
    save_checkpoint(out / "video_rlvr.safetensors", policy, args=margs, step=args.steps,
                    metrics=dict(chain_rlvr=vars(args), **log[-1]))
    print(f"wrote {out / 'video_rlvr.safetensors'} ({(time.time() - t0) / 60:.1f} min)")


if __name__ == "__main__":
    main()
