"""
Train a language world model: MLE (supervised next-state prediction), then RLVR (GRPO with the
task's own metric as the reward), then compare the MLE start, RLVR and the control (MLE continued
for RLVR's compute) on held-out records, paired. Tasks: textgame (exact next state, the default),
webpage (F1 of the page changes), and any task registered in tasks.py (docs/tasks.md).

    python train_lang.py                 # CPU: RLVR from the shipped MLE checkpoint, control, eval
    python train_lang.py --init=scratch  # everything from scratch: data, tokenizer, MLE, RLVR
GPUs (an HF directory, torchrun, --recipe=paper): the README. Writes to --out_dir (out/<task>):
mle / rlvr / mle_more (the control) checkpoints, the tokenizer, config.json (the flags), log.jsonl,
eval.json (test), eval_val.json (val). The same command again resumes (torchrun --max-restarts=N
too); other flags there stop it, naming them; bad input is one "error:" line, before any write.
"""
import argparse
import dataclasses
import sys
import time
from itertools import islice
from pathlib import Path

import torch
from tqdm import tqdm

from checkpoint import ROOT, check_config, read_meta, resume_stage, save_config, save_stage
from eval import compare_checkpoints
from grpo import HEADROOM_N, PAPER_RECIPE, GRPOConfig, Source, grpo_step, headroom
import mle
from model import GPT, GPTConfig, finite_weights
from runtime import (NanPolicy, Run, add_flags, check_ranges, check_ranks_in_sync, control_after,
                     control_beside, from_flags, lr_at, print_estimates, unsharded)
from tasks import (PAPER_EPOCHS, PAPER_UNCHANGED, PROBE_EVERY, PROBE_N, TASKS, UNCHANGED_FRAC,
                   EpochSampler, PromptPool, encode, keep_tokenizer, load_lang_model, load_splits,
                   probe_rewards, reward_fn, scratch_tokenizer, train_control, train_mle)

# settings a user rarely changes, in one place
VOCAB_SIZE = 448        # BPE ranks trained on the train split (--init=scratch)

# -----------------------------------------------------------------------------
# flags; the RL stage's come from grpo.GRPOConfig (`runtime.add_flags`), the home of their defaults
# allow_abbrev=False: a prefix of a flag (--data for --data_dir) is an error, not that flag
p = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            allow_abbrev=False, description="MLE then RLVR for a language world "
                                                            "model, against equal-compute MLE")
g = p.add_argument_group("task and data")
g.add_argument("--task", default="textgame", choices=sorted(TASKS), help="which world to model")
g.add_argument("--data_dir", default=None, help="holds train/val/test.jsonl; default "
                                                "data/<task> (generated when it holds none)")
g.add_argument("--out_dir", default=None,
               help="checkpoints, logs and eval JSON; default out/<task>")
g = p.add_argument_group("stages and initialisation")
g.add_argument("--stage", default="all", choices=["all", "mle", "rlvr", "memory"],
               help="all: MLE (unless --init is a checkpoint), RLVR, the control, evaluation; "
                    "mle: MLE only; rlvr: RLVR, the control and evaluation from --init; "
                    "memory: print each step's memory estimate by part, write nothing")
g.add_argument("--init", default="auto",
               help="auto (shipped MLE checkpoint if present, else scratch) | scratch | "
                    "our .safetensors | HF dir")
g.add_argument("--resume", type=int, default=1,
               help="1: continue each stage from its checkpoint in out_dir (with the same flags); "
                    "0: start over there")
g.add_argument("--control", type=int, default=1,
               help="1: train the control, MLE continued for RLVR's compute (counted in tokens)")
g = p.add_argument_group("model, when training from scratch")
g.add_argument("--n_layer", type=int, default=4, help="transformer blocks")
g.add_argument("--n_embd", type=int, default=128,
               help="width of the residual stream, a multiple of 32: heads of 32 channels")
g.add_argument("--block_size", type=int, default=512, help="longest prompt + answer in tokens")
g = p.add_argument_group("MLE")
g.add_argument("--mle_steps", type=int, default=2000,
               help="optimizer steps (cosine schedule over them)")
g.add_argument("--batch_size", type=int, default=32, help="(prompt, answer) pairs per step")
g.add_argument("--mle_lr", type=float, default=3e-3, help="peak learning rate (decays to a tenth)")
g = p.add_argument_group("RLVR (GRPO, grpo.py); defaults follow the official RLVR-World recipe "
                         "where they fit a CPU")
g.add_argument("--rl_steps", type=int, default=30, help="GRPO steps (0: the recipe's epochs)")
g.add_argument("--recipe", default="default", choices=["default", "paper"],
               help="paper: the official RLVR-World recipe (textgame, webpage): 128 prompts x 5 "
                    "samples (webpage 64 x 5), lr 1e-6 constant, answers up to 4096 tokens "
                    "(webpage 7288), KL 0.001 (k3 clamped to 10), entropy 0.001, clip 0.2, T 1.0, "
                    "2 (webpage 4) optimizer steps per batch, every group kept, std N-1, micro-"
                    "batch token-means, its prompt filter and epochs; explicit flags win")
add_flags(g, GRPOConfig)   # --prompts_per_step ... --max_new_tokens: GRPOConfig's knobs
g.add_argument("--reward", default=None,
               help="textgame: binary | task_specific; webpage: f1 (default: the first)")
g = p.add_argument_group("evaluation")
g.add_argument("--eval_limit", type=int, default=0,
               help="the first N validation and test records in the final eval (0 = all)")
g = p.add_argument_group("system")
g.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
               help="autocast dtype")
g.add_argument("--grad_ckpt", type=int, default=0,
               help="1: activation checkpointing, each block's activations recomputed in the "
                    "backward pass (a large model's memory for about a third more compute)")
g.add_argument("--fsdp", type=int, default=0,
               help="1 under torchrun: shard weights, gradients and AdamW state across the GPUs "
                    "(PyTorch FSDP), for a model whose full copy per GPU (DDP) does not fit")
g.add_argument("--seed", type=int, default=1337, help="seeds data order, sampling and the probe")
g.add_argument("--ckpt_every", type=int, default=50, help="steps between resumable checkpoints")
g.add_argument("--on_nan", default="stop", choices=["stop", "skip"],
               help="on a NaN/inf loss, reward or gradient: stop the run, or skip that step "
                    "(single process only)")
# --recipe=paper: its values become the flags' defaults (what --help shows; explicit flags win)
known, _ = p.parse_known_args([a for a in sys.argv[1:] if a not in ("-h", "--help")])
recipe = PAPER_RECIPE.get(known.task, {}) if known.recipe == "paper" else {}
knobs = {f.name: f.metadata["flag"] or f.name for f in dataclasses.fields(GRPOConfig) if f.metadata}
p.set_defaults(**{knobs[k]: v for k, v in recipe.items() if k in knobs}, **(
    {"rl_steps": 0} if recipe else {}))   # 0: from the epochs
flags = p.parse_args()
if flags.n_embd % 32:
    p.error(f"--n_embd must be a multiple of 32 (heads of 32 channels), got {flags.n_embd}")
if flags.recipe == "paper" and not recipe:
    p.error(f"--recipe=paper: the paper has recipes for {sorted(PAPER_RECIPE)}, not {flags.task}")
steps = ("rl_steps",)   # >= 1, or 0 under a recipe
check_ranges(p, flags, at_least_0=("mle_lr", "rl_lr", "eval_limit") + steps * bool(recipe),
             at_least_1=("n_layer", "n_embd", "block_size", "mle_steps", "batch_size",
                         "prompts_per_step", "group_size", "micro_batch", "max_new_tokens",
                         "ckpt_every") + steps * (not recipe))
task = TASKS[flags.task]   # data module, per-record scores, rewards (tasks.py)
data = task.data           # load_records, prompt_text, target_text, is_changed
# the defaults that depend on the task and the shipped checkpoints, resolved once: --init=auto is
# the shipped MLE checkpoint for RLVR (MLE alone starts from scratch)
shipped = ROOT / "checkpoints" / flags.task / "mle.safetensors"
auto = str(shipped) if shipped.is_file() and flags.stage != "mle" else "scratch"
args = argparse.Namespace(**{**vars(flags), "reward": flags.reward or task.rewards[0],
                             "data_dir": flags.data_dir or str(ROOT / "data" / flags.task),
                             "init": auto if flags.init == "auto" else flags.init})
# the RL stage's settings (the recipe's fields that are no flag, too); its vocab is set once known
cfg = dataclasses.replace(from_flags(args, GRPOConfig),
                          **{k: v for k, v in recipe.items() if k not in knobs})

# -----------------------------------------------------------------------------
# setup (runtime.Run): one process or a torchrun rank; checks --device, seeds torch, sets
# autocast (1 thread). Every input is checked before anything is written
out_dir = Path(args.out_dir or f"out/{args.task}")
run = Run(args, out_dir, path_flags=("data_dir", "init", "out_dir", "tokenizer"))
master, print0, fail = run.master, run.print0, run.fail
if cfg.prompts_per_step % run.world:   # torchrun: the global count, whole groups on each rank
    fail(f"--prompts_per_step {cfg.prompts_per_step}: a multiple of the {run.world} ranks")
cfg = dataclasses.replace(cfg, prompts_per_step=cfg.prompts_per_step // run.world)   # per rank
if args.reward not in task.rewards:
    fail(f"--reward {args.reward}: the {args.task} task has rewards {task.rewards}")
init_is_ckpt = args.init != "scratch" and Path(args.init).is_file()   # else scratch or HF dir
if args.init != "scratch" and not Path(args.init).exists():
    fail(f"--init {args.init}: no such checkpoint file or HF directory")
if args.stage == "rlvr" and args.init == "scratch":
    fail("--stage=rlvr needs --init=<checkpoint or HF dir> (it post-trains a trained model)")
if init_is_ckpt:   # its header only: a readable checkpoint of a language model
    init_args = run.or_fail(read_meta, args.init)["args"]
    if "vq" in init_args:   # train_video.py's checkpoints name their frame tokenizer (vq)
        fail(f"--init {args.init}: a video world model of train_video.py (its tokens are frame "
             f"codes, not text); start from a train_lang.py checkpoint or an HF directory")
# with --resume=1, out_dir must hold no run with other flags (out_dir/config.json, runtime.py)
writes = args.stage != "memory"   # --stage=memory only reads
record = writes and check_config(run, [f"{n}.safetensors" for n in ("mle", "rlvr", "mle_more")])

# -----------------------------------------------------------------------------
# data: generated on first run, like nanoGPT's prepare.py
train_recs, val_recs, test_recs = load_splits(run, args.task, Path(args.data_dir))
print0(f"data: {len(train_recs)} train / {len(val_recs)} val / {len(test_recs)} test records "
       f"({sum(map(data.is_changed, train_recs)) / len(train_recs):.0%} of train change something)")

# -----------------------------------------------------------------------------
# tokenizer and model: from a checkpoint, an HF directory, or trained here from scratch
if args.init != "scratch":   # loaded before anything is written
    try:
        start_model, tok, start_meta = load_lang_model(args.init, run.device)
    except ValueError as e:
        fail(str(e))
    except (OSError, KeyError, TypeError) as e:   # e.g. an HF config.json without a key we need
        fail(f"--init {args.init}: cannot load ({type(e).__name__}: {e})")
save_config(run, record)   # out_dir/config.json: the inputs are good; from here on it writes
if args.init == "scratch":   # BPE on the train split (--stage=memory: not saved); the model below
    texts = [data.prompt_text(r) + data.target_text(r) for r in train_recs]
    start_model, tok = None, scratch_tokenizer(run, texts, VOCAB_SIZE, writes)
else:   # HF: its directory; ours: a copy beside the run's checkpoints
    run.recorded["tokenizer"] = str(out_dir / keep_tokenizer(args.init, start_meta, out_dir,
                                                             write=master and writes))
    print0(f"init: {args.init} ({start_model.num_params() / 1e6:.2f}M non-embedding parameters)")
cfg = dataclasses.replace(cfg, vocab=tok.n_vocab)   # only ids the tokenizer decodes are sampled


# -----------------------------------------------------------------------------
# the stages (tasks.py): MLE on (prompt -> state difference) pairs, loss on the answer tokens only;
# RLVR with GRPO on the prompt pool's prompts, the reward the task metric of the decoded prediction
# (rewards.py); the control, MLE continued from the RLVR start for RLVR's compute.
# Run them: MLE (from scratch) -> RLVR -> the equal-compute MLE control -> paired evaluation
t0 = time.time()
# every train record as (prompt ids, answer ids + EOS): what MLE and the control learn from
all_pairs = [encode(args.task, tok, r) for r in train_recs]
config = start_model.config if start_model else GPTConfig.llama(
    vocab_size=tok.n_vocab, block_size=args.block_size, n_layer=args.n_layer,
    n_head=args.n_embd // 32, n_embd=args.n_embd)
# RLVR's prompts: those that leave room for the longest answer, at most --recipe=paper's longest
room = min(config.block_size - cfg.max_new_tokens, cfg.max_prompt or config.block_size)
do_mle = args.stage == "mle" or (args.stage in ("all", "memory") and not init_is_ckpt)
if args.stage == "memory" or run.device != "cpu":   # a GPU step's memory by part, per rank
    print_estimates(config, cfg, all_pairs, do_mle, room if args.stage != "mle" else None,
                    args.dtype != "float32", args.grad_ckpt, args.batch_size, run)
if not writes:
    run.finish()
    raise SystemExit(0)
start = args.init   # the checkpoint RLVR and the control start from
if do_mle:
    start = str(train_mle(run, args.task, tok, start_model or GPT(config), "mle", all_pairs,
                          val_recs, args.mle_steps,
                          lambda s: lr_at(s, args.mle_steps, args.mle_lr, mle.WARMUP),
                          cfg.max_new_tokens))
    start_model = None   # RLVR and the control start from the checkpoint: free its memory
if args.stage in ("all", "rlvr"):
    rl_file = out_dir / "rlvr.safetensors"
    # the control, MLE continued from the start for RLVR's compute: beside RLVR on a CPU, else
    # after it (runtime.control_beside); RLVR adds each step's compute to the budget

    def control(budget):
        return train_control(run, args.task, tok, start, all_pairs, val_recs, budget,
                             cfg.max_new_tokens)
    budget, child = control_beside(run, control if args.control else None, rl_file)

    # RLVR (grpo.py): the policy from --init (or a copy of the MLE checkpoint), its frozen start as
    # the KL's reference (in the forwards' dtype), AdamW, and the prompt pool: every train prompt
    # that leaves room for the longest answer, a share from records where nothing changes
    model = start_model or load_lang_model(start, run.device)[0]
    ref = run.reference(model) if cfg.beta > 0 else None   # FSDP: sharded too
    model, trained = run.wrap(model, grad_ckpt=args.grad_ckpt)   # on the device; DDP or FSDP
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas,
                            weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(args.seed + 1000 + run.rank)   # prompts and samples
    pool = PromptPool(train_recs, data.prompt_text, data.is_changed, tok, room, UNCHANGED_FRAC,
                      gen)
    # the probe: fixed train prompts whose greedy and T=1 reward is logged every PROBE_EVERY steps
    probe_prompts, probe_recs = pool(PROBE_N)
    source = Source(reward_fn(args.task, tok, args.reward), tok.eos_id, draw=pool)
    print0(f"rlvr: {len(pool.changed)} changed + {len(pool.unchanged)} unchanged train prompts "
           f"({pool.dropped} over {room} tokens left out); per step "
           f"{cfg.prompts_per_step * run.world} prompts in all, {cfg.prompts_per_step} per rank, "
           f"groups with reward spread (up to {cfg.max_rounds} rounds) x {cfg.group_size} "
           f"samples; reward {args.reward}")
    draw, rl_steps = pool, args.rl_steps   # draws with replacement, --rl_steps steps
    if recipe:   # the official schedule: epochs of the changed records and N unchanged ones
        draw = EpochSampler(pool, PAPER_UNCHANGED.get(args.reward), args.seed, run.rank, run.world)
        if not (per_epoch := draw.steps_per_epoch(cfg.prompts_per_step)):
            fail(f"--recipe=paper: {len(draw)} prompts, fewer than a step's")
        rl_steps = rl_steps or PAPER_EPOCHS * per_epoch   # --rl_steps=0: the recipe's epochs
        print0(f"--recipe=paper: epochs of {len(draw)} prompts, {len(pool.changed)} changed + "
               f"{draw.n_unch} unchanged (verl's text-game dataset), reshuffled; {rl_steps} "
               f"steps ({PAPER_EPOCHS} epochs)")

    def probe():   # every rank gathers FSDP's weights; rank 0 scores the probe prompts
        with unsharded(model), run.autocast:
            return probe_rewards(args.task, model, tok, probe_prompts, probe_recs, args.reward,
                                 cfg.max_new_tokens) if master else {}

    nan = NanPolicy(run, "rlvr")   # --on_nan: a NaN/inf stops the run, or skips the step
    if not finite_weights(model):   # a poisoned start stops before anything samples from it
        nan.nonfinite(0, model, "non-finite weights in the policy")
    # the headroom line (grpo.headroom), of the start here and of RLVR after the loop: on the first
    # HEADROOM_N validation prompts that fit, the greedy answer against the best of G samples
    fits = ((p, r) for r in val_recs if len(p := tok.prompt(data.prompt_text(r))) <= room)
    held = [list(x) for x in zip(*islice(fits, HEADROOM_N))]   # [prompts, records], or none

    def head(name):   # every rank gathers FSDP's weights; rank 0 samples and prints
        with unsharded(model):
            return headroom(model, *held, source, cfg, run.autocast, name,
                            f"{args.reward} reward x 100") if master and held else {}
    heads = {"mle": head("the start")}   # RLVR can only sharpen what its samples already find

    # a re-run continues a stopped RLVR exactly; its compute so far counts for the control
    step, rl_done = resume_stage(run, rl_file, model, opt, gen, "rlvr")
    draw.drawn = step   # the epoch sampler's place (the pool draws with `gen`, resumed)
    prev = read_meta(rl_file)["metrics"] if step else {}
    totals = dict(rl_seconds=prev.get("rl_seconds", 0.0), rl_compute=prev.get("rl_compute", 0))
    budget.add(totals["rl_compute"])
    if step == 0 and (first := probe()):   # the probe before any update (rank 0's)
        run.log({"stage": "rlvr", "step": 0, **first})
    bar = tqdm(total=rl_steps, initial=step, desc="rlvr", disable=not master or rl_done)
    while step < rl_steps and not rl_done:
        for group in opt.param_groups:   # a linear warm-up over cfg.warmup steps, then constant
            group["lr"] = cfg.lr * min(1.0, (step + 1) / max(cfg.warmup, 1))
        prompts, items = draw(cfg.prompts_per_step)   # grpo_step draws more if groups lack spread
        try:   # rollout -> reward -> advantages -> PPO-clip + KL updates
            stats = grpo_step(trained, ref, opt, prompts, items, source, cfg, gen, step,
                              run.autocast)
        except FloatingPointError as e:   # a NaN/inf reward, loss, gradient norm or weight
            nan.nonfinite(step, model, str(e))   # stops, or logs a skipped step
            stats = {}
        step += 1
        bar.update(1)
        if stats:   # steps done: the log's step 0 is the probe before any update
            stats["step"] = step
            totals["rl_seconds"] += stats["t_step"]
            totals["rl_compute"] += stats["compute"]
            budget.add(stats["compute"])
            bar.set_postfix(reward=f"{stats['reward_mean']:.3f}", kept=stats["groups_kept"],
                            kl=f"{stats['kl']:.4f}")
            if step % PROBE_EVERY == 0 or step == rl_steps:
                stats.update(probe())
                if master:
                    print0(f"\nrlvr step {step}: reward {stats['reward_mean']:.3f} probe reward "
                           f"{stats['probe_reward']:.3f} (greedy {stats['probe_greedy']:.3f}) "
                           f"groups kept {stats['groups_kept']}/{stats['groups']} kl "
                           f"{stats['kl']:.5f} entropy {stats['entropy']:.3f}")
            run.log({"stage": "rlvr", **stats, **totals})
        # every --ckpt_every steps the resumable state; at the end the weights alone
        save_stage(run, rl_file, model, opt, step, {**stats, **totals}, gen,
                   done=step == rl_steps)
    bar.close()
    budget.close()   # RLVR's compute is final: the control stops once it has used as much
    check_ranks_in_sync(run, model, "rlvr")   # under torchrun: the same weights on every rank
    run.barrier()
    heads["rlvr"] = head("RLVR")
    model = trained = ref = opt = start_model = None   # let go of RLVR's memory
    control_after(run, child, control if args.control else None, rl_file)
    ckpts = {"mle": start, "rlvr": str(rl_file)}
    if args.control:
        ckpts["mle_more"] = str(out_dir / "mle_more.safetensors")
    # every model, loaded from its checkpoint, greedy on the first --eval_limit records of each
    # split (all: None), the same for every model: differences are paired (eval.py)
    limit = args.eval_limit or None
    compare_checkpoints(run, args.task, ckpts, tok, {"val": val_recs[:limit],
                                                     "test": test_recs[:limit]},
                        cfg.max_new_tokens, heads)
    print0(f"wrote eval.json (test) / eval_val.json (val) in {out_dir}; "
           f"total {(time.time() - t0) / 60:.1f} min")
if master:   # out_dir/report.md: the run on one page (tools/report.py), imported here only
    __import__("tools.report").report.write_report(out_dir, sys.argv, time.time() - t0)
run.finish()
