"""
A language world model: MLE, then RLVR (GRPO, the task's metric as the reward), then the MLE
start, RLVR and the control (MLE for RLVR's compute) on held-out records, paired. GPUs: README.
    python train_lang.py                 # CPU: RLVR from the shipped MLE checkpoint, control, eval
    python train_lang.py --init=scratch  # everything from scratch: data, tokenizer, MLE, RLVR
Writes to --out_dir (out/<task>) the checkpoints, the tokenizer, config.json, log.jsonl, eval.json
(test), eval_val.json (val), report.md. Run again, it resumes; bad input: one "error:" line.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from checkpoint import ROOT, check_config, read_meta, resume_stage, save_stage, write_json
from eval import compare_checkpoints, evaluate_checkpoints
from grpo import PAPER_RECIPE, Env, GRPOConfig, grpo_step
import mle
from runtime import (NanPolicy, Run, check_ranges, check_ranks_in_sync, control_after,
                     control_beside)
from tasks import (PROBE_EVERY, TASKS, RLPrompts, check_inputs, encode, load_lang_model,
                   load_splits, load_start, reward_fn, train_control, train_mle)

VOCAB_SIZE = 448   # BPE ranks trained on the train split (--init=scratch)

# -----------------------------------------------------------------------------
# flags (allow_abbrev=False: a prefix of a flag, --data for --data_dir, is an error)
p = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            allow_abbrev=False, description="MLE then RLVR for a language world "
                                                            "model, against equal-compute MLE")
g = p.add_argument_group("task and data")
g.add_argument("--task", default="textgame", choices=sorted(TASKS), help="which world to model")
g.add_argument("--data_dir", help="holds train/val/test.jsonl; default data/<task> (made if none)")
g.add_argument("--out_dir", help="checkpoints, logs and eval JSON; default out/<task>")
g = p.add_argument_group("stages and initialisation")
g.add_argument("--stage", default="all", choices=["all", "mle", "rlvr", "memory"],
               help="all: MLE (unless --init is a checkpoint), RLVR, the control, evaluation; "
                    "mle: MLE only; rlvr: RLVR, the control and evaluation from --init; "
                    "memory: print each step's memory estimate by part, write nothing")
g.add_argument("--init", default="auto", help="auto (the shipped MLE checkpoint if present, else "
                                              "scratch) | scratch | our .safetensors | HF dir")
g.add_argument("--resume", type=int, default=1, help="1: continue each stage from its checkpoint "
                                                     "in out_dir (same flags); 0: start over")
g.add_argument("--control", type=int, default=1,
               help="1: train the control, MLE continued for RLVR's compute (counted in tokens)")
g = p.add_argument_group("model, when training from scratch")
g.add_argument("--n_layer", type=int, default=4, help="transformer blocks")
g.add_argument("--n_embd", type=int, default=128, help="width, a multiple of 32 (heads of 32)")
g.add_argument("--block_size", type=int, default=512, help="longest prompt + answer in tokens")
g = p.add_argument_group("MLE")
g.add_argument("--mle_steps", type=int, default=2000, help="optimizer steps (cosine schedule)")
g.add_argument("--batch_size", type=int, default=32, help="(prompt, answer) pairs per step")
g.add_argument("--mle_lr", type=float, default=3e-3, help="peak learning rate (decays to a tenth)")
g = p.add_argument_group("RLVR (GRPO, grpo.py); a flag left out: --recipe=paper's value, else "
                         "grpo.GRPOConfig's (the official recipe's where it fits a CPU)")
C, S = GRPOConfig, argparse.SUPPRESS   # S: a flag left out is absent from the parsed flags
g.add_argument("--recipe", default="default", choices=["default", "paper"],
               help="paper: the official RLVR-World recipe (grpo.PAPER_RECIPE: textgame, webpage), "
                    "its values below; and KL 0.001 (k3 clamped to 10), entropy 0.001, clip 0.2, "
                    "T 1.0, 2 (webpage 4) optimizer steps a batch, lr constant, every group kept, "
                    "std N-1, micro-batch token-means, its prompt filter and epochs")

# an RL flag's help ends with GRPOConfig's default and the recipe's values
P = {f: f"({getattr(C, f)}; --recipe=paper: "
     + ", ".join(f"{t} {r[f]}" for t, r in PAPER_RECIPE.items() if t in TASKS) + ")"
     for f in ("prompts_per_step", "group_size", "lr", "micro_batch", "max_new_tokens")}
g.add_argument("--rl_steps", type=int, default=S, help="GRPO steps (30; the recipe: its epochs)")
g.add_argument("--prompts_per_step", type=int, default=S,
               help=f"groups WITH reward spread per step (DAPO refill) {P['prompts_per_step']}")
g.add_argument("--group_size", type=int, default=S, help=f"samples a prompt {P['group_size']}")
g.add_argument("--rl_lr", type=float, default=S,
               help=f"AdamW's rate after {C.warmup} steps of linear warm-up {P['lr']}")
g.add_argument("--micro_batch", type=int, default=S,
               help=f"sequences a forward/backward: GRPO, MLE, validation {P['micro_batch']}")
g.add_argument("--max_new_tokens", type=int, default=S,
               help=f"the longest answer {P['max_new_tokens']}")
g.add_argument("--graphs", type=int, default=0, help="1: sample on static shapes, each decode step "
                                                     "one CUDA graph on a GPU (engine_static.py)")
g.add_argument("--reward", help="textgame: binary | task_specific; webpage: f1 (None: the first)")
g = p.add_argument_group("evaluation")
g.add_argument("--eval_limit", type=int, default=0, help="the first N val, test records (0: all)")
g = p.add_argument_group("system")
g.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
               help="autocast dtype")
g.add_argument("--grad_ckpt", type=int, default=0, help="1: activation checkpointing (a large "
                                                        "model's memory for a third more compute)")
g.add_argument("--fsdp", type=int, default=0, help="1 under torchrun: shard weights, gradients "
                                                   "and AdamW state across the GPUs (PyTorch FSDP)")
g.add_argument("--seed", type=int, default=1337, help="seeds data order, sampling and the probe")
g.add_argument("--ckpt_every", type=int, default=50, help="steps between resumable checkpoints")
g.add_argument("--on_nan", default="stop", choices=["stop", "skip"], help="on a NaN/inf loss, "
               "reward or gradient: stop the run, or skip that step (single process only)")
flags = p.parse_args()
task = TASKS[flags.task]   # data module, per-record scores, rewards (tasks.py)
data = task.data           # load_records, prompt_text, target_text, is_changed

# the RL stage's settings: GRPOConfig's defaults, then --recipe=paper's values, then flags given
recipe = PAPER_RECIPE.get(flags.task, {}) if flags.recipe == "paper" else {}
RL_FLAGS = dict(prompts_per_step="prompts_per_step", group_size="group_size", rl_lr="lr",
                micro_batch="micro_batch", max_new_tokens="max_new_tokens")
rl = {**recipe, **{f: getattr(flags, k) for k, f in RL_FLAGS.items() if hasattr(flags, k)}}
# the flags in force (config.json's): the RL values, the task's defaults; --init=auto: shipped MLE
shipped = ROOT / "checkpoints" / flags.task / "mle.safetensors"
auto = str(shipped) if shipped.is_file() and flags.stage != "mle" else "scratch"
args = argparse.Namespace(**{
    **vars(flags), **{k: rl.get(f, getattr(GRPOConfig, f)) for k, f in RL_FLAGS.items()},
    "rl_steps": getattr(flags, "rl_steps", 0 if recipe else 30),   # the recipe's 0: its epochs
    "reward": flags.reward or task.rewards[0], "init": auto if flags.init == "auto" else flags.init,
    "data_dir": flags.data_dir or str(ROOT / "data" / flags.task)})
check_ranges(p, args, at_least_0=("mle_lr", "rl_lr", "eval_limit", "rl_steps"),
             at_least_1=("n_layer", "n_embd", "block_size", "mle_steps", "batch_size",
                         "prompts_per_step", "group_size", "micro_batch", "max_new_tokens",
                         "ckpt_every") + (() if recipe else ("rl_steps",)))
if args.n_embd % 32:
    p.error(f"--n_embd must be a multiple of 32, got {args.n_embd}")
if args.recipe == "paper" and not recipe:
    p.error(f"--recipe=paper: the paper's recipes: {sorted(PAPER_RECIPE.keys() & TASKS)}")

# -----------------------------------------------------------------------------
# setup (runtime.Run: a process or torchrun rank, device, seeds, 1 thread); inputs checked first
out_dir = Path(args.out_dir or f"out/{args.task}")
run = Run(args, out_dir, path_flags=("data_dir", "init", "out_dir", "tokenizer"))
init_is_ckpt = check_inputs(run, args)   # True: --init is a checkpoint (else scratch or HF)
writes = args.stage != "memory"   # --stage=memory only reads
# with --resume=1, out_dir must hold no run with other flags (out_dir/config.json)
flags_to_save = writes and check_config(run, [f"{n}.safetensors" for n in ("mle", "rlvr",
                                                                           "mle_more")])

# -----------------------------------------------------------------------------
# data (made on first run, like nanoGPT's prepare.py); the tokenizer and the start (--init)
train_recs, val_recs, test_recs = load_splits(run, args.task, Path(args.data_dir))
changed = sum(map(data.is_changed, train_recs)) / len(train_recs)
run.print0(f"data: {len(train_recs)} train / {len(val_recs)} val / {len(test_recs)} test records "
           f"({changed:.0%} of train change something)")
start_model, tok = load_start(run, args, train_recs, VOCAB_SIZE, flags_to_save)
# the RL stage's settings, one object: per rank, sampling only the ids the tokenizer decodes
cfg = GRPOConfig(**{**rl, "prompts_per_step": args.prompts_per_step // run.world,
                    "vocab": tok.n_vocab, "graphs": bool(args.graphs)})

# -----------------------------------------------------------------------------
# the stages: MLE (from scratch; tasks.train_mle) -> RLVR (GRPO, the task's metric of the decoded
# prediction as the reward) -> the control (MLE continued for RLVR's compute) -> paired evaluation
t0 = time.time()
all_pairs = [encode(args.task, tok, r) for r in train_recs]   # (prompt, answer + EOS) ids
config = start_model.config   # RLVR's prompts leave room for the longest answer (or the recipe's)
longest_prompt = min(config.block_size - cfg.max_new_tokens, cfg.max_prompt or config.block_size)
do_mle = args.stage == "mle" or (args.stage in ("all", "memory") and not init_is_ckpt)
if args.stage == "memory" or run.device != "cpu":   # a GPU step's memory by part, per rank
    from tools.memory import print_estimates   # (a planning tool: it sizes GPU rollout chunks)
    cfg = print_estimates(config, cfg, all_pairs, do_mle, longest_prompt if args.stage != "mle"
                          else None, args.dtype != "float32", args.grad_ckpt, args.batch_size, run)
if not writes:
    run.finish()
    raise SystemExit(0)
start = args.init   # the checkpoint RLVR and the control start from
if do_mle:
    start = str(train_mle(run, args.task, tok, start_model, "mle", all_pairs, val_recs,
                          args.mle_steps, mle.cosine_lr(args.mle_steps, args.mle_lr),
                          cfg.max_new_tokens))
    start_model = None   # RLVR and the control start from the checkpoint: free its memory
if args.stage in ("all", "rlvr"):
    rl_file = out_dir / "rlvr.safetensors"
    limit = args.eval_limit or None   # every model greedy on the same records: paired (eval.py)
    splits = {"val": val_recs[:limit], "test": test_recs[:limit]}
    start_eval = out_dir / "eval_start.json"   # the start's, if the control's process made it

    def control(budget):   # MLE continued for RLVR's compute: beside RLVR on a CPU, else after
        return train_control(run, args.task, tok, start, all_pairs, val_recs, budget,
                             cfg.max_new_tokens)

    def beside(budget):   # the second core: the start's evaluation while RLVR's first steps run
        write_json(start_eval, evaluate_checkpoints(args.task, {"mle": start}, tok, splits,
                                                    cfg.max_new_tokens, run.device, run.autocast))
        control(budget)   # (it has waited for RLVR's compute then: it catches up)
    budget, child = control_beside(run, beside if args.control else None, rl_file)

    # RLVR (grpo.py): the policy from the start, its frozen copy as the KL's reference (in the
    # forwards' dtype), AdamW; the prompts (tasks.RLPrompts): train, probe and held-out ones
    raw_model = start_model or load_lang_model(start, run.load_device)[0]   # the GPT itself
    ref_model = run.reference(raw_model) if cfg.beta > 0 else None   # FSDP: sharded too
    raw_model, model = run.wrap(raw_model, grad_ckpt=args.grad_ckpt)   # model: DDP or FSDP's
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas,
                            weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(args.seed + 1000 + run.rank)   # prompts and samples
    prompts = RLPrompts(run, args, tok, train_recs, val_recs, longest_prompt, cfg, gen)
    env = Env(reward_fn(args.task, tok, args.reward), tok.eos_id, draw=prompts.pool)
    nan = NanPolicy(run, "rlvr")   # --on_nan: a NaN/inf stops the run, or skips the step
    nan.check_start(raw_model)   # a poisoned start stops before anything samples from it
    # the headroom line (grpo.headroom): RLVR can only sharpen what its samples already find
    heads = {"mle": prompts.headroom(raw_model, env, "the start")}
    step, rl_done = resume_stage(run, rl_file, raw_model, opt, gen, "rlvr")   # a re-run: exactly
    draw, rl_steps = prompts.schedule(step)   # the pool, or --recipe=paper's epochs from `step`
    prev = read_meta(rl_file)["metrics"] if step else {}   # the steps so far, for the control
    totals = {k: prev.get(k, 0) for k in ("rl_seconds", "rl_compute")}
    budget.add(totals["rl_compute"])
    if step == 0 and (first := prompts.score_probe(raw_model)):   # before any update
        run.log({"stage": "rlvr", "step": 0, **first})
    bar = tqdm(total=rl_steps, initial=step, desc="rlvr", disable=not run.master or rl_done)
    while step < rl_steps and not rl_done:
        for group in opt.param_groups:   # warm-up, then constant (the recipe: verl's, from 0)
            group["lr"] = cfg.lr_at(step)
        try:   # rollout -> reward -> advantages -> PPO-clip + KL updates
            stats = grpo_step(model, ref_model, opt, *draw(cfg.prompts_per_step), env,
                              cfg, gen, step, run.autocast)
        except FloatingPointError as e:   # a NaN/inf reward, loss, gradient norm or weight
            nan.nonfinite(step, raw_model, str(e))   # stops, or logs a skipped step
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
                stats.update(prompts.score_probe(raw_model))
                if run.master:
                    print(f"\nrlvr step {step}: reward {stats['reward_mean']:.3f} probe reward "
                          f"{stats['probe_reward']:.3f} (greedy {stats['probe_greedy']:.3f}) "
                          f"groups kept {stats['groups_kept']}/{stats['groups']} kl "
                          f"{stats['kl']:.5f} entropy {stats['entropy']:.3f}", flush=True)
            run.log({"stage": "rlvr", **stats, **totals})
        # every --ckpt_every steps the resumable state; at the end the weights alone
        save_stage(run, rl_file, raw_model, opt, step, {**stats, **totals}, gen,
                   done=step == rl_steps)
    bar.close()
    budget.close()   # RLVR's compute is final: the control stops once it has used as much
    check_ranks_in_sync(run, raw_model, "rlvr")   # under torchrun: the same weights on every rank
    run.barrier()
    heads["rlvr"] = prompts.headroom(raw_model, env, "RLVR")
    model = raw_model = ref_model = opt = start_model = None   # let go of RLVR's memory
    control_after(run, child, control if args.control else None, rl_file)
    ckpts = {"mle": start, "rlvr": str(rl_file)}
    if args.control:
        ckpts["mle_more"] = str(out_dir / "mle_more.safetensors")
    done = json.loads(start_eval.read_text()) if child else None   # the control's: the start's
    compare_checkpoints(run, args.task, ckpts, tok, splits, cfg.max_new_tokens, heads, done)
    run.print0(f"wrote eval.json (test) / eval_val.json (val) in {out_dir}; "
               f"total {(time.time() - t0) / 60:.1f} min")
if run.master:   # out_dir/report.md: the run on one page, with its pictures
    from tools.report import write_report
    write_report(out_dir, sys.argv, time.time() - t0)
run.finish()
