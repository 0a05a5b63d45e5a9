"""
Train a video world model: a VQ tokenizer (train_vq.py), an action-conditioned GPT by MLE (mle.py),
then RLVR (GRPO whose reward is a metric of the decoded frames against the true ones), and compare
on held-out episodes the MLE start, RLVR, and the control: the MLE start trained further by MLE for
RLVR's compute ("mle_more"), so a gain is not just more compute. CPU, from the shipped world model
checkpoints/video_mle_4000.safetensors (embedded robot-pushing data; research/README.md):
    python train_video.py                      # single-step, 100 GRPO steps (6-9 min on 2 cores)
    python train_video.py --mode=multi --out_dir=out/video_multi   # 7 frames, true actions injected
    python train_video.py --init=scratch       # tokenizer, MLE, RLVR and eval in one go
    torchrun --nproc_per_node=8 train_video.py --data=/path/rt1 --init=scratch --device=cuda \
        --dtype=bfloat16                       # converted RT-1 episodes, on GPUs
--out_dir gets video_vq, video_mle, video_rlvr and video_mle_more .safetensors, cached tokens,
config.json, log.jsonl and eval.json = {"mle", "rlvr", "mle_more"}: each eval.py --task=video's
JSON of the test split (greedy, "per_record" per window, "sampled" at T=1 top-k 100); it prints
paired bootstrap intervals of RLVR - MLE, RLVR - mle_more, ... A re-run resumes where it stopped
(runtime.Run); a NaN/inf stops the run naming the step.

RLVR is a loop of grpo.grpo_step over data/robot/task.py's prompt draw, reward (frames decoded with
tokenizer_vq's copy gate, scored by video_rewards.VideoReward) and multi-step sampler, pieces that a
study may replace (research/video_terms.py).
"""
import argparse
import copy
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

import mle
import train_vq
from checkpoint import (ROOT, atomic_write, check_config, read_meta, recorded_path, resume_stage,
                        save_config, save_stage, write_json)
from data.robot.prepare import DATA_DIR
from data.robot.task import (Clips, Layout, cached_tokens, make_draw, make_reward, make_sampler,
                             moving_windows, read_action_stats, windows)
from grpo import HEADROOM_N, PAPER_RECIPE, Env, GRPOConfig, grpo_step, headroom
from model import GPT, GPTConfig
from runtime import (ComputeBudget, NanPolicy, Run, check_ranges, check_ranks_in_sync,
                     control_after, control_beside, lr_at, rank_map, unsharded)
from tokenizer_vq import load_vq
from video_eval import (EvalSpec, eval_video, evaluate_video_models, load_video_model,
                        print_video_report)
from video_rewards import VideoReward, load_lpips

# the shipped world model both modes start from: the per-frame one trained on 4000 episodes, on
# 7-frame windows (it follows the gripper), and the shipped tokenizer, for --stage=mle
SHIPPED_MLE = ROOT / "checkpoints" / "video_mle_4000.safetensors"
SHIPPED_VQ = ROOT / "checkpoints" / "video_vq.safetensors"
CONTEXT = 1   # true frames before the first predicted one
WATCH_EVERY = 20   # RLVR steps between greedy validation scores


@dataclass
class Mode:
    """Defaults per mode, chosen on the validation split (research/README.md): a multi-step
    completion is 7 frames, so fewer prompts and steps fit the time box; RLVR erased objects unless
    the reward's object term said otherwise; the push term kept the single-step start following the
    gripper; the control is level with its start at 0.3 (single) or 1 x the start's final MLE lr."""
    rl_steps: int
    prompts_per_step: int
    reward: VideoReward
    control_scale: float


MODES = dict(single=Mode(100, 8, VideoReward(moving=1.0, object=0.5, push=0.1), 0.3),
             multi=Mode(40, 4, VideoReward(moving=1.0, object=0.5, push=0.0), 1.0))
# --recipe's RL settings (the rest GRPOConfig's; the prompts: the mode's). default: one round a step
# (no refill), no entropy bonus, AdamW (0.9, 0.99) without decay at a constant rate (no warm-up)
RECIPES = dict(default=dict(beta=0.02, micro_batch=32, max_rounds=1, entropy_coef=0.0, warmup=0,
                            betas=(0.9, 0.99), weight_decay=0.0), paper=PAPER_RECIPE["video"])
DEFAULT, PAPER = (GRPOConfig(**r) for r in RECIPES.values())   # what --help shows


# -----------------------------------------------------------------------------
# flags (allow_abbrev=False: a prefix of a flag is an error, not that flag)
p = argparse.ArgumentParser(description="tokenizer, MLE then RLVR for a video world model",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            allow_abbrev=False)
add = p.add_argument
add("--data", default=str(DATA_DIR), help="episode .npz directory (embedded data: made if empty)")
add("--out_dir", default=train_vq.OUT_DIR, help="checkpoints, caches, logs and eval.json go here")
add("--stage", default="all", choices=["all", "tokenizer", "mle", "rlvr", "control"],
    help="the stages to run (control: the control alone for --control_compute: the lr sweep)")
add("--mode", default=None, choices=["single", "multi"], help="predict 1 frame, or --horizon "
    "frames with the true actions injected between them (single; --recipe=paper: multi)")
add("--init", default="auto", help="auto (the shipped MLE model if it fits the data, else "
    "scratch) | scratch | a video_mle/video_rlvr .safetensors")
add("--vq", default="auto", help="tokenizer file (train_vq.py) of a model from scratch (auto: "
    "train one; --stage=mle: out_dir's, else the shipped one)")
add("--resume", type=int, default=train_vq.RESUME, help="1: continue from out_dir's checkpoints")
add("--clip_len", type=int, default=16, help="episodes are cut into clips of this many frames")
add = p.add_argument_group("world model and MLE").add_argument
add("--horizon", type=int, default=7, help="multi mode's frames (paper: 7)")
add("--n_layer", type=int, default=4, help="GPT layers")
add("--n_embd", type=int, default=128, help="GPT width (heads of 32 channels)")
add("--mle_steps", type=int, default=1150, help="MLE optimizer steps")
add("--batch_size", type=int, default=16, help="MLE windows per step (per rank)")
add("--mle_lr", type=float, default=2e-3, help="MLE peak learning rate (cosine decay)")
add("--warmup", type=int, default=100, help="MLE warmup steps")
add("--weight_decay", type=float, default=0.1, help="AdamW weight decay of MLE")
add("--control_lr", type=float, default=0, help="the control's constant rate (0: the "
    "mode's scale, single 0.3, multi 1, x the start's final MLE rate)")
add("--control_compute", type=float, default=0,
    help="--stage=control: its compute (an RLVR run's rl_compute, in its log.jsonl)")
add = p.add_argument_group("RLVR (grpo.py); a flag not given takes --recipe's value").add_argument
add("--recipe", default="default", choices=list(RECIPES), help="paper: the official video run "
    "(vid_wm/verl run_ctx_msp_vgpt.sh), multi-step, {prompts_per_step} prompts in all x "
    "{group_size} samples, lr {lr:g} constant (the first update at 0), {minibatches} minibatches, "
    "micro-batch {micro_batch}, KL {beta:g} (k3 clamped at {kl_clamp:g}), entropy "
    "{entropy_coef:g}, clip {clip_eps:g}, dual-clip {dual_clip:g}, std N - 1, AdamW {betas}, "
    "weight decay {weight_decay:g}, T {temperature:g}".format_map(vars(PAPER)))
add("--rl_steps", type=int, default=None, help="GRPO steps (default: single 100, multi 40)")
add("--prompts_per_step", type=int, default=None, help="windows per GRPO step, in all under "
    f"torchrun (default: single 8, multi 4; paper {PAPER.prompts_per_step})")
add("--group_size", type=int, default=None,
    help=f"samples per prompt, G ({DEFAULT.group_size}; paper {PAPER.group_size})")
add("--rl_lr", type=float, default=None,
    help=f"GRPO learning rate ({DEFAULT.lr:g}; paper {PAPER.lr:g})")
add("--beta", type=float, default=None,
    help=f"KL coefficient ({DEFAULT.beta:g}; paper {PAPER.beta:g})")
add("--micro_batch", type=int, default=None,
    help=f"sequences per forward/backward ({DEFAULT.micro_batch}; paper {PAPER.micro_batch})")
add("--grad_ckpt", type=int, default=0, help="1: activation checkpointing")
add("--lpips", default=None, help="LPIPS-VGG weights (tools/convert_lpips.py): the "
    "reward is mae+lpips, and the evaluation reports lpips")
add = p.add_argument_group("evaluation and system").add_argument
add("--test_limit", type=int, default=0, help="test episodes in the final eval (0: all)")
add("--final_eval", default="test", choices=["val", "test"],
    help="the split of eval.json: val to choose flags on, test once for the result")
train_vq.add_run_flags(add)   # --train_limit and the system flags: one home
args = p.parse_args()
mode_name = args.mode or ("multi" if args.recipe == "paper" else "single")   # the official's: multi
mode = MODES[mode_name]
rl_steps = mode.rl_steps if args.rl_steps is None else args.rl_steps
# the RL stage's settings, in one object read from here on: the recipe's, then the GRPO flags given
recipe = {"prompts_per_step": mode.prompts_per_step, **RECIPES[args.recipe]}   # paper's: 128
given = dict(prompts_per_step=args.prompts_per_step, group_size=args.group_size, lr=args.rl_lr,
             beta=args.beta, micro_batch=args.micro_batch)
cfg = GRPOConfig(**{**recipe, **{k: v for k, v in given.items() if v is not None}})
# as resolved, the two flags other files read: the checkpoints' mode (eval.py), MLE's micro-batch
args = argparse.Namespace(**{**vars(args), "mode": mode_name, "micro_batch": cfg.micro_batch})
# every bad value stops here with one line naming its flag, before any data is read or file written
check_ranges(p, args, at_least_1=("clip_len", "horizon", "n_layer", "n_embd", "mle_steps",
                                  "batch_size", "micro_batch", "threads", "ckpt_every"),
             at_least_0=("mle_lr", "warmup", "weight_decay", "control_lr", "control_compute",
                         "test_limit", "train_limit"))
check_ranges(p, cfg, at_least_1=("prompts_per_step", "group_size"), at_least_0=("beta",))
if not (rl_steps >= 1 and cfg.lr >= 0):
    p.error(f"need --rl_steps >= 1 and --rl_lr >= 0, got {rl_steps}, {cfg.lr}")
if args.clip_len < 2 or args.n_embd % 32:
    p.error(f"need --clip_len >= 2 and --n_embd a multiple of 32 (got {args.clip_len}, "
            f"{args.n_embd})")

# -----------------------------------------------------------------------------
# setup: torchrun ranks, --device checked, threads, seeds, autocast, log.jsonl (runtime.Run), then
# the data; every input is checked before anything is written to out_dir
out_dir = Path(args.out_dir)
run = Run(args, out_dir, path_flags=("data", "init", "out_dir", "vq", "lpips"))
master, world = run.master, run.world
print0, fail, barrier = run.print0, run.fail, run.barrier   # rank 0 prints / stops; ranks sync
# every file a run writes besides the tokenizer's resumable state (video_vq_train.safetensors)
FILES = dict(vq=out_dir / train_vq.VQ_FILE,
             **{k: out_dir / f"video_{k}.safetensors" for k in ("mle", "rlvr", "mle_more")})
if cfg.prompts_per_step % world:   # torchrun: whole groups on each rank
    fail(f"--prompts_per_step {cfg.prompts_per_step}: a multiple of the {world} ranks")
if args.init not in ("auto", "scratch") and not Path(args.init).is_file():
    fail(f"--init {args.init}: no such checkpoint file")
if args.stage == "control" and not args.control_compute:
    fail("--stage=control needs --control_compute (an RLVR run's rl_compute, in its log.jsonl)")
train_vq.ensure_data(run)                       # the embedded robot data, generated on first use
if master:
    run.or_fail(read_action_stats, args.data)  # writes action_stats.json on first use
barrier()
lo, hi = run.or_fail(read_action_stats, args.data)   # per-dimension action range: 256 bins each

# --init=auto: the shipped MLE model, when this run post-trains and its action dimensions fit
init = "scratch" if args.init == "auto" else args.init   # unless the shipped model fits, below
if args.init == "auto" and SHIPPED_MLE.is_file() and args.stage in ("all", "rlvr", "control"):
    dims = len(read_meta(SHIPPED_MLE)["args"]["action_lo"])   # its vocabulary's action dimensions
    if dims == len(lo):
        init = str(SHIPPED_MLE)
    else:
        print0(f"--init=auto: the shipped model's vocabulary is for {dims}-dim actions, "
               f"{args.data} has {len(lo)}-dim ones; training from scratch (tokenizer, MLE, RLVR)")
if init == "scratch" and args.stage in ("rlvr", "control"):
    fail(f"--stage={args.stage} needs --init=<video_mle checkpoint>: it post-trains a model")
# with --resume=1, out_dir must hold no run with other flags (out_dir/config.json, runtime.py)
record = check_config(run, [FILES["mle"].name, FILES["rlvr"].name, FILES["mle_more"].name])

train_eps, val_eps, test_eps = train_vq.load_clips(run, args.clip_len, args.test_limit)
D, T = train_eps[0]["action"].shape[1], args.clip_len   # action dimensions, frames per clip
if D != len(lo):
    fail(f"{Path(args.data) / 'action_stats.json'}: {len(lo)}-dim actions, the episodes have {D}; "
         f"delete it to recompute")
print0(f"data: {len(train_eps)} train / {len(val_eps)} val / {len(test_eps)} test clips of {T} "
       f"frames, {D}-dim actions, frames resized to {train_vq.SIZE}x{train_vq.SIZE}"
       + (f" (train: rank 0's share; each of {world} ranks reads its own)" if world > 1 else ""))


# -----------------------------------------------------------------------------
# stage 2: MLE on token windows (loss on the predicted frames' codes only)

def run_mle(run, model, name, ckpt, layout, tokens, horizon, steps, lr_of_step, budget=None):
    """mle.train on windows of CONTEXT + horizon frames, for `steps` steps or RLVR's compute
    (`budget`, runtime.ComputeBudget), at lr_of_step(step), checkpointing to `ckpt` -> the trained
    model. "mle" is the MLE stage; "mle_more" the equal-compute control."""
    args = run.args
    C, T = CONTEXT, args.clip_len        # context frames, frames per clip
    n = C + horizon                      # frames per window
    train_tok, val_tok = tokens["train"], tokens["val"]
    run.print0(f"{name}: {model.num_params() / 1e6:.2f}M non-embedding parameters, windows of "
               f"{n} frames ({layout.window_len(C, horizon)} tokens), batch {args.batch_size} x "
               f"{run.world} ranks" + (" (until RLVR's compute)" if budget is not None else ""))
    # the fixed validation set: (clip, first frame) of consecutive windows of every val clip
    val = torch.tensor([(e, t) for e in range(len(val_tok["actions"]))
                        for t in range(0, T - n + 1, n)])

    def pair(tok, ids, starts):
        """The windows of clips `ids` from frames `starts` -> inputs, and targets that are -1
        except where the next token is a predicted frame's code (layout.training_pair)."""
        idx, tgt = layout.training_pair(windows(tok, layout, ids, starts, C, horizon), C)
        return idx.to(run.device), tgt.to(run.device)

    def next_batch(gen):   # random windows: a random clip and first frame each
        ids = torch.randint(len(train_tok["actions"]), (args.batch_size,), generator=gen)
        return pair(train_tok, ids, torch.randint(T - n + 1, (args.batch_size,), generator=gen))

    def val_loss(model):   # the mean cross-entropy of the chunks of 64 validation windows
        return float(np.mean([model(*pair(val_tok, val[i:i + 64, 0], val[i:i + 64, 1]))[1].item()
                              for i in range(0, len(val), 64)]))

    return mle.train(run, model, name, ckpt, steps, next_batch, val_loss, lr_of_step, budget,
                     eval_every=500)   # MLE steps between validation losses


# -----------------------------------------------------------------------------
# run the stages
t_start = time.time()
horizon = args.horizon if args.mode == "multi" else 1   # predicted frames per window
start_model = None                                      # the GPT to train or post-train (None: new)
if init != "scratch":           # a trained world model, loaded before anything is written
    start_model, _, init_meta = run.or_fail(load_video_model, init, run.device)
save_config(run, record)         # out_dir/config.json: the inputs are good; from here on it writes
if init != "scratch":           # the world model's own tokenizer, named in its metadata
    vq_path = recorded_path(init_meta["args"]["vq"], Path(init).parent)
elif args.vq != "auto":         # a given tokenizer
    vq_path = Path(args.vq)
elif args.stage in ("all", "tokenizer"):   # from scratch: train one
    vq_path = train_vq.frame_tokenizer(run, train_vq.TokenizerConfig(), train_eps,
                                       val_eps + test_eps, FILES["vq"])
else:                                      # --stage=mle from scratch: out_dir's, else shipped
    vq_path = FILES["vq"] if FILES["vq"].is_file() else SHIPPED_VQ
if args.stage == "tokenizer":              # the tokenizer file is written: nothing else to do
    run.finish()
    sys.exit(0)
if not Path(vq_path).is_file():
    fail(f"tokenizer {vq_path} not found (run --stage=tokenizer first or pass --vq)")
vq, _ = run.or_fail(load_vq, vq_path, run.device)   # frozen from here on
vq.copy_gate = True   # decoded cells that keep the context frame's code copy its pixels
layout = Layout.of(vq, D)   # token ids: context codes, predicted-frame codes, action bins
# a checkpoint must fit this tokenizer and data: the same vocabulary, and room for a whole window
if start_model is not None and start_model.config.vocab_size != layout.vocab_size:
    fail(f"--init {init}: vocabulary {start_model.config.vocab_size} does not fit this data "
         f"({layout.vocab_size})")
if start_model is not None and start_model.config.block_size < layout.window_len(CONTEXT, horizon):
    fail(f"--init {init}: block size {start_model.config.block_size} is shorter than a window of "
         f"{CONTEXT} + {horizon} frames ({layout.window_len(CONTEXT, horizon)} tokens)")
# checkpoints name their tokenizer in their own folder
if master and Path(vq_path).resolve() != FILES["vq"].resolve():
    atomic_write(FILES["vq"], lambda tmp: shutil.copyfile(vq_path, tmp))
barrier()
# what every world-model checkpoint records beside the flags (config.json keeps them as given):
# its tokenizer (relative, beside it), decoded with the copy gate, and its action bins
run.recorded.update(vq=str(FILES["vq"]), copy_gate=1, action_lo=lo.tolist(), action_hi=hi.tolist())
splits = {"train": train_eps, "val": val_eps, "test": test_eps}
# every split tokenized once (cached): per clip the context codes, future codes and action tokens
tokens = cached_tokens(run, FILES["vq"], vq, layout, splits, horizon, lo, hi, train_vq.SIZE)
# the greedy evaluation of these windows (the final comparison's sampled run draws from --seed)
spec = EvalSpec(lo, hi, CONTEXT, horizon, seed=args.seed)

# MLE: on its own (--stage=mle, from scratch or continuing --init), or a run from scratch's first
if args.stage == "mle" or (args.stage == "all" and start_model is None):
    if CONTEXT + horizon > T:
        fail(f"a window of {CONTEXT + horizon} frames does not fit clips of {T}")
    # a new GPT whose block fits a multi-step window
    start_model = start_model or GPT(GPTConfig.llama(
        vocab_size=layout.vocab_size, block_size=layout.window_len(CONTEXT, args.horizon),
        n_layer=args.n_layer, n_head=args.n_embd // 32, n_embd=args.n_embd))
    start_model = run_mle(run, start_model, "mle", FILES["mle"], layout, tokens, horizon,
                          args.mle_steps,
                          lambda s: lr_at(s, args.mle_steps, args.mle_lr, args.warmup))   # cosine
    mle_path = FILES["mle"]
else:                                            # RLVR starts from --init as it is
    mle_path = Path(init)

heads = {}   # the headroom lines' numbers (grpo.headroom), kept in eval.json
if args.stage in ("all", "rlvr", "control"):
    lpips_net = run.or_fail(load_lpips, args.lpips, run.device)   # the eval's (and reward's)
    models = {"mle": (start_model, mle_path)}   # name -> (model, checkpoint file), evaluated below

    def mle_more(budget):
        """The equal-compute control: MLE on a copy of the start at a constant rate, --control_lr
        or the mode's control_scale x the start's own final MLE rate (mle.final_lr; a start that
        records no MLE schedule: the RL rate), until `budget` (RLVR's compute) is spent."""
        final = mle.final_lr(mle_path)
        lr = args.control_lr or (cfg.lr if final is None else mode.control_scale * final)
        print0(f"control: MLE continued from the start at lr {lr:.3g} for RLVR's compute")
        return run_mle(run, copy.deepcopy(start_model), "mle_more", FILES["mle_more"], layout,
                       tokens, horizon, 10 ** 9, mle.control_lr(lr), budget), FILES["mle_more"]
if args.stage == "control":   # the control alone, for a given compute (the lr sweep)
    models["mle_more"] = mle_more(ComputeBudget(args.control_compute))
# RLVR, then the equal-compute control, then the held-out comparison of the three
if args.stage in ("all", "rlvr"):
    # the mode's reward, or --recipe=paper's: the metric alone (its yaml's loss_weight: mae, lpips)
    reward = replace(VideoReward() if args.recipe == "paper" else mode.reward,
                     name="mae+lpips" if lpips_net is not None else "mae+ssim")
    if train_eps[0]["background"] is None:   # not the embedded robot's: e.g. Meta-World or RT-1
        print0(f"reward: {args.data} has no background images, so no object term or push term")
        reward = replace(reward, object=0.0, push=0.0)
    terms = ((reward.moving, "moving MAE"), (reward.object, "object miss"),
             (reward.push, "push error"))
    print0(f"reward: {reward.name}" + "".join(f" - {w:g} x {what}" for w, what in terms if w)
           + ("" if lpips_net else " (no LPIPS weights: --lpips=FILE enables mae+lpips)")
           + "; frames decoded with the copy gate")

    # the control, MLE continued from the start for RLVR's compute (mle_more): beside RLVR on a
    # CPU, else after it (runtime.control_beside); RLVR adds each step's compute to the budget
    budget, child = control_beside(run, mle_more, FILES["rlvr"])

    # stage 3: RLVR with GRPO (grpo.py) over the pieces of data/robot/task.py (as tasks.py's for
    # text; a study replaces them, research/video_terms.py): the prompt draw (train windows where
    # the scene moves), the reward of the decoded frames and the multi-step sampler
    clips = Clips(train_eps, tokens["train"], layout, horizon, CONTEXT)
    pool = moving_windows(clips)
    # a rank's prompts; a completion: the predicted frames' codes with the true actions injected
    cfg = replace(cfg, prompts_per_step=cfg.prompts_per_step // world,
                  max_new_tokens=horizon * layout.L + (horizon - 1) * D)
    print0(f"rlvr ({args.recipe}): {len(pool)} train windows; per step {cfg.prompts_per_step} "
           f"prompts x {cfg.group_size} samples x {world} ranks, {horizon} predicted frame(s) each")
    if run.device != "cpu":   # a GPU step's memory by part, per rank; it fixes the rollout chunks
        from tools.memory import print_memory, rlvr_memory
        parts, cfg = rlvr_memory(run, start_model.config, cfg, cfg.prompts_per_step,
                                 layout.prompt_len(CONTEXT), args.grad_ckpt)
        print_memory("rlvr", parts, print0)   # (cfg.rollout_prompts: the most that fit)
    # the policy, a copy of the start (the comparison's "mle" stays as it is), its frozen start as
    # the KL's reference, AdamW
    raw_model = copy.deepcopy(start_model)   # the GPT itself
    ref_model = run.reference(raw_model) if cfg.beta > 0 else None   # FSDP: sharded too
    raw_model, model = run.wrap(raw_model, grad_ckpt=args.grad_ckpt)   # model: DDP or FSDP's
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas,
                            weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(args.seed + 1000 + run.rank)   # prompts and samples
    draw = make_draw(clips, pool, cfg.prompts_per_step, bool(reward.object))   # draw(gen): a step's
    env = Env(make_reward(vq, clips, reward, lpips_net, run.device),
              sampler=make_sampler(horizon, layout.L))
    nan = NanPolicy(run, "rlvr")   # --on_nan: a NaN/inf stops the run, or skips the step
    nan.check_start(raw_model)   # a poisoned start stops before anything samples from it
    # the headroom line (grpo.headroom), of the start here and of RLVR after the loop: on fixed
    # validation windows where the scene moves, the greedy prediction's MAE against the best of G
    held_clips = Clips(val_eps, tokens["val"], layout, horizon, CONTEXT)
    held = moving_windows(held_clips)   # none (a tiny split): no headroom line
    held = held and make_draw(held_clips, held, HEADROOM_N, False)(torch.Generator().manual_seed(0))
    by_mae = Env(make_reward(vq, held_clips, VideoReward("mae"), None, run.device),
                 sampler=env.sampler)

    def head(name):   # every rank gathers FSDP's weights; rank 0 samples and prints
        with unsharded(raw_model):
            return headroom(raw_model, *held, by_mae, cfg, run.autocast, name, "MAE x 1e-3",
                            -1000) if master and held else {}
    heads = {"mle": head("the start")}   # RLVR can only sharpen what its samples already find

    # a re-run continues a stopped RLVR exactly; its compute so far counts for the control
    step, rl_done = resume_stage(run, FILES["rlvr"], raw_model, opt, gen, "rlvr")
    prev = read_meta(FILES["rlvr"])["metrics"] if step else {}
    totals = dict(rl_seconds=prev.get("rl_seconds", 0.0), rl_compute=prev.get("rl_compute", 0))
    budget.add(totals["rl_compute"])
    bar = tqdm(total=rl_steps, initial=step, desc="rlvr", disable=not master or rl_done)
    while step < rl_steps and not rl_done:
        for group in opt.param_groups:   # the recipe's schedule (paper: the first update at 0)
            group["lr"] = cfg.lr_at(step)
        try:   # rollout -> reward -> advantages -> PPO-clip + KL updates
            stats = grpo_step(model, ref_model, opt, *draw(gen), env, cfg, gen, step, run.autocast)
        except FloatingPointError as e:   # a NaN/inf reward, loss, gradient norm or weight
            nan.nonfinite(step, raw_model, str(e))   # stops, or logs a skipped step
            stats = {}
        step += 1
        bar.update(1)
        if stats:   # steps done
            stats["step"] = step
            totals["rl_seconds"] += stats["t_step"]
            totals["rl_compute"] += stats["compute"]
            budget.add(stats["compute"])
            bar.set_postfix(reward=f"{stats['reward_mean']:.3f}", kept=stats["groups_kept"],
                            kl=f"{stats['kl']:.4f}")
            if step % WATCH_EVERY == 0 or step == rl_steps:   # greedy on val, rank 0
                with unsharded(raw_model):   # FSDP: every rank gathers the weights
                    r = eval_video(raw_model, vq, val_eps, tokens["val"], spec,
                                   desc=None) if master else None
                if master:
                    print0(f"\nrlvr step {step}: reward {stats['reward_mean']:.4f} kl "
                           f"{stats['kl']:.4f} val mae {r['mae']:.4f} ssim {r['ssim']:.4f} "
                           f"mae_moving {r['mae_moving']:.4f}")
                    stats.update({f"val_{k}": r[k] for k in ("mae", "ssim", "mae_moving")})
            run.log({"stage": "rlvr", **stats, **totals})
        # every --ckpt_every steps the resumable state; at the end the weights alone
        save_stage(run, FILES["rlvr"], raw_model, opt, step, {**stats, **totals}, gen,
                   done=step == rl_steps)
    bar.close()
    budget.close()   # RLVR's compute is final: the control stops once it has used as much
    check_ranks_in_sync(run, raw_model, "rlvr")   # under torchrun: the same weights on every rank
    barrier()
    heads["rlvr"] = head("RLVR")
    control_after(run, child, mle_more, FILES["rlvr"])
    models["rlvr"] = raw_model, FILES["rlvr"]
    models["mle_more"] = load_video_model(FILES["mle_more"], run.device)[0], FILES["mle_more"]
if args.stage in ("all", "rlvr", "control"):
    # the held-out comparison on the --final_eval split, greedy and sampled with the paper's
    # protocol, paired over the same windows: on a CPU two forked processes share the models' jobs,
    # under torchrun the ranks do (video_eval.evaluate_video_models); every rank gets every result
    workers = 2 if run.forks else 1
    print0(f"evaluating {len(models)} models greedy and sampled on the {args.final_eval} windows "
           f"({world if run.ddp else workers} processes)")
    ext = "gif" if horizon > 1 else "png"   # rank 0 draws each model's greedy predictions
    rows = evaluate_video_models(
        {name: (m, vq, splits[args.final_eval], tokens[args.final_eval], spec,
                out_dir / f"grid_{name}.{ext}" if master else None)
         for name, (m, _) in models.items()},
        lpips_net, True, workers, rank_map if run.ddp else None, run.autocast)
    if master:   # rank 0 writes eval.json and prints the comparison
        # a model's row: its greedy result, the sampled run's summaries and per-window values under
        # "sampled" (its baselines are the greedy run's), and its checkpoint
        keep = ("mae", "mse", "psnr", "ssim", "lpips", "mae_moving", "repetition_rate",
                "temperature", "top_k", "per_record", "action_effect")
        rows = {name: dict(r, sampled={k: r["sampled"][k] for k in keep if k in r["sampled"]},
                           checkpoint=str(models[name][1]),
                           **({"headroom": heads[name]} if name in heads else {}))
                for name, r in rows.items()}
        write_json(out_dir / "eval.json", rows)
        print0(f"\nheld-out {args.final_eval} episodes ({rows['mle']['n']} predicted frames, "
               f"{args.mode}-step):")
        # RLVR against its start, the equal-compute control and copying; the start against copying
        print_video_report(rows, [(a, b) for a, b in (
            ("rlvr", "mle"), ("rlvr", "mle_more"), ("rlvr", "copy"), ("mle", "copy"),
            ("mle_more", "mle")) if a in rows and b in {*rows, "copy"}])
        print0(f"wrote {out_dir / 'eval.json'}")
    print0(f"total {(time.time() - t_start) / 60:.1f} min")
if master:   # out_dir/report.md: the run on one page, with its pictures
    from tools.report import write_report
    write_report(out_dir, sys.argv, time.time() - t_start)
run.finish()
