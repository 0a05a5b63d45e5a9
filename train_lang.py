"""
Train a language world model: MLE (supervised next-state prediction), then RLVR (GRPO with the task's own metric as
the reward), then compare both on the held-out test split. Tasks: textgame (exact next state, the default) and
webpage (F1 of predicted page changes: add --task=webpage to any command below).

CPU, the default job (embedded data; RLVR starts from the shipped converged MLE checkpoint; 4-10 min on 2 cores):
    python train_lang.py
CPU, everything from scratch (data, tokenizer, MLE, RLVR):
    python train_lang.py --init=scratch
Continued-MLE baseline for the same extra wall-clock as RLVR:
    python train_lang.py --stage=mle --init=checkpoints/textgame/mle.safetensors --mle_minutes=8 --out_dir=out/mle_more
1 GPU, from pretrained HF weights (e.g. DeepSeek-R1-Distill-Qwen-1.5B, the paper's base; SFT first, then RLVR):
    python train_lang.py --init=/path/to/hf_dir --device=cuda --dtype=bfloat16 --batch_size=16 --micro_batch=8
8 GPUs:
    torchrun --nproc_per_node=8 train_lang.py --init=/path/to/hf_dir --device=cuda --dtype=bfloat16

Outputs in --out_dir (default out/<task>): mle.safetensors, rlvr.safetensors (+ .json sidecars), tokenizer file,
log.jsonl (one JSON line per logged step) and eval.json = {"mle": <eval.py JSON>, "rlvr": <eval.py JSON>}.
Each stage checkpoints every --ckpt_every steps with optimizer and RNG state, and a re-run of the same command resumes
where it stopped, ending with the weights and metrics of an uninterrupted run (also under torchrun --max-restarts=N;
log.jsonl may then repeat the steps after the last checkpoint, with identical values). A NaN/inf loss, reward or
gradient stops the run naming the step (--on_nan=skip skips the step instead); bad input is one "error:" line.
"""
import argparse
import copy
import json
import math
import os
import shutil
import time
from pathlib import Path

import torch
from tqdm import tqdm

from checkpoint import atomic_write_text
from eval import TASKS, eval_lang, load_lang_model, print_table
from grpo import GRPOConfig, grpo_step
from model import GPT, GPTConfig
from runtime import Run, lr_at
from tokenizer_text import Tokenizer

ROOT = Path(__file__).resolve().parent

# -----------------------------------------------------------------------------
# flags
p = argparse.ArgumentParser(description="MLE then RLVR for a language world model",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
# task and data
p.add_argument("--task", default="textgame", choices=sorted(TASKS))
p.add_argument("--data_dir", default=None, help="holds train/val/test.jsonl (made if missing); default data/<task>")
p.add_argument("--out_dir", default=None, help="default out/<task>")
# stages and initialisation
p.add_argument("--stage", default="all", choices=["all", "mle", "rlvr"])
p.add_argument("--init", default="auto",
               help="auto (shipped MLE checkpoint if present, else scratch) | scratch | our .safetensors | HF dir")
p.add_argument("--resume", type=int, default=1, help="1: continue a stage from its checkpoint in out_dir")
# model, when training from scratch
p.add_argument("--vocab_size", type=int, default=448, help="BPE ranks trained on the train split")
p.add_argument("--n_layer", type=int, default=4)
p.add_argument("--n_head", type=int, default=4)
p.add_argument("--n_embd", type=int, default=128)
p.add_argument("--block_size", type=int, default=512)
# MLE
p.add_argument("--mle_steps", type=int, default=2000)
p.add_argument("--mle_minutes", type=float, default=0, help="stop MLE after this wall-clock (0 = no limit)")
p.add_argument("--batch_size", type=int, default=32)
p.add_argument("--mle_lr", type=float, default=3e-3)
p.add_argument("--warmup", type=int, default=100)
p.add_argument("--weight_decay", type=float, default=0.1)
# RLVR
p.add_argument("--rl_steps", type=int, default=50)
p.add_argument("--prompts_per_step", type=int, default=16)
p.add_argument("--group_size", type=int, default=8)
p.add_argument("--rl_lr", type=float, default=1e-4)
p.add_argument("--beta", type=float, default=0.02, help="KL coefficient")
p.add_argument("--clip_eps", type=float, default=0.2)
p.add_argument("--loss_agg", default="token-mean", choices=["token-mean", "seq-mean"])
p.add_argument("--std_norm", type=int, default=1)
p.add_argument("--skip_zero_std", type=int, default=1, help="drop groups with no reward spread before the update")
p.add_argument("--minibatches", type=int, default=2)
p.add_argument("--micro_batch", type=int, default=64)
p.add_argument("--temperature", type=float, default=1.0)
p.add_argument("--max_new_tokens", type=int, default=200)
p.add_argument("--reward", default=None, help="textgame: binary | task_specific; webpage: f1 (default: the first)")
p.add_argument("--rl_unchanged_frac", type=float, default=0.3, help="share of unchanged prompts per RL batch")
# evaluation
p.add_argument("--eval_every", type=int, default=500, help="MLE steps between validation checks (RLVR: every 25)")
p.add_argument("--val_n", type=int, default=200, help="validation records for greedy accuracy")
p.add_argument("--test_limit", type=int, default=0, help="test records in the final eval (0 = all)")
# system
p.add_argument("--device", default="cpu")
p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
p.add_argument("--compile", type=int, default=0)
p.add_argument("--threads", type=int, default=1, help="torch CPU threads; 1 is fastest for tiny models on 2 cores")
p.add_argument("--seed", type=int, default=1337)
p.add_argument("--ckpt_every", type=int, default=50)
p.add_argument("--on_nan", default="stop", choices=["stop", "skip"],
               help="on a NaN/inf loss, reward or gradient: stop the run, or skip that step (single process only)")
args = p.parse_args()
for name in ("n_layer", "n_head", "n_embd", "block_size", "mle_steps", "batch_size", "rl_steps", "prompts_per_step",
             "group_size", "minibatches", "micro_batch", "max_new_tokens", "eval_every", "val_n", "threads",
             "ckpt_every"):
    if getattr(args, name) < 1:
        p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
for name in ("mle_minutes", "mle_lr", "warmup", "weight_decay", "rl_lr", "beta", "clip_eps", "test_limit"):
    if not getattr(args, name) >= 0:
        p.error(f"--{name} must be >= 0, got {getattr(args, name)}")
if not 0 <= args.rl_unchanged_frac <= 1 or not args.temperature > 0:
    p.error(f"--rl_unchanged_frac must be in [0, 1] (got {args.rl_unchanged_frac}) and --temperature > 0 "
            f"(got {args.temperature})")

# -----------------------------------------------------------------------------
# setup: distributed, devices, precision (runtime.py)
out_dir = Path(args.out_dir or f"out/{args.task}")
run = Run(args, out_dir)
master, rank, world, autocast = run.master, run.rank, run.world, run.autocast
print0, fail, log, barrier = run.print0, run.fail, run.log, run.barrier
task = TASKS[args.task]
data = task.data  # load_records, prompt_text, target_text, is_changed
args.data_dir = args.data_dir or str(ROOT / "data" / args.task)
args.reward = args.reward or task.rewards[0]

if args.reward not in task.rewards:
    fail(f"--reward {args.reward}: the {args.task} task has rewards {task.rewards}")
if args.init == "auto":
    shipped = ROOT / "checkpoints" / args.task / "mle.safetensors"
    args.init = str(shipped) if shipped.is_file() and args.stage != "mle" else "scratch"
init_is_ckpt = args.init != "scratch" and Path(args.init).is_file()
if args.init != "scratch" and not Path(args.init).exists():
    fail(f"--init {args.init}: no such checkpoint file or HF directory")
if args.stage == "rlvr" and args.init == "scratch":
    fail("--stage=rlvr needs --init=<checkpoint or HF dir> (RLVR post-trains a trained model)")
if master:
    out_dir.mkdir(parents=True, exist_ok=True)

# -----------------------------------------------------------------------------
# data: generated on first run, like nanoGPT's prepare.py
try:
    if master:
        task.prepare.ensure_splits(Path(args.data_dir))
    barrier()
    train_recs, val_recs, test_recs = (data.load_records(Path(args.data_dir) / f"{s}.jsonl") for s in ("train", "val", "test"))
except (OSError, ValueError) as e:
    fail(str(e))
print0(f"data: {len(train_recs)} train / {len(val_recs)} val / {len(test_recs)} test records "
       f"({sum(map(data.is_changed, train_recs)) / len(train_recs):.0%} of train change something)")

# -----------------------------------------------------------------------------
# tokenizer and model: from a checkpoint, an HF directory, or trained here from scratch
if args.init == "scratch":
    tok_file = out_dir / "tokenizer.tiktoken"
    if master and not tok_file.is_file():
        t0 = time.time()
        texts = [data.prompt_text(r) + data.target_text(r) for r in train_recs]
        try:
            Tokenizer.train(texts, args.vocab_size).save(tok_file)   # written atomically
        except ValueError as e:
            fail(f"--vocab_size {args.vocab_size}: {e}")
        print0(f"tokenizer: trained {args.vocab_size} BPE ranks in {time.time() - t0:.1f}s -> {tok_file}")
    barrier()
    start_model, tok, _ = None, Tokenizer.from_tiktoken_file(tok_file), None
    args.tokenizer = tok_file.name
else:
    try:
        start_model, tok, start_meta = load_lang_model(args.init, args.device)
    except ValueError as e:
        fail(str(e))
    except (OSError, KeyError, TypeError) as e:   # e.g. an HF config.json without a key we need
        fail(f"--init {args.init}: cannot load ({type(e).__name__}: {e})")
    src = start_meta["args"]["tokenizer"]
    src = Path(src) if Path(src).is_absolute() else Path(args.init).parent / src
    if src.is_dir():  # HF: the tokenizer stays in its directory
        args.tokenizer = str(src.resolve())
    else:
        args.tokenizer = "tokenizer" + src.suffix
        if master and not (out_dir / args.tokenizer).is_file():
            tmp = out_dir / (args.tokenizer + ".tmp")   # copy, then rename: a killed copy is never trusted
            shutil.copyfile(src, tmp)
            os.replace(tmp, out_dir / args.tokenizer)
    print0(f"init: {args.init} ({start_model.num_params() / 1e6:.2f}M non-embedding parameters)")


def encode(r, with_target):
    prompt = tok.encode(data.prompt_text(r))
    return (prompt, tok.encode(data.target_text(r)) + [tok.eos_id]) if with_target else (prompt, None)


def fits(pair, block_size):
    return len(pair[0]) + len(pair[1]) <= block_size + 1


def batch_from(pairs):
    """(prompt, target) id lists -> right-padded idx (B, T) and targets (B, T), -1 outside the target tokens."""
    T = max(len(a) + len(b) for a, b in pairs) - 1
    idx = torch.zeros(len(pairs), T, dtype=torch.long)
    tgt = torch.full((len(pairs), T), -1, dtype=torch.long)
    for i, (a, b) in enumerate(pairs):
        s = a + b
        idx[i, :len(s) - 1] = torch.tensor(s[:-1])
        tgt[i, len(a) - 1:len(s) - 1] = torch.tensor(b)
    return idx.to(args.device), tgt.to(args.device)


def fmt(x):
    return "-" if x is None else f"{x:.3f}"  # a metric over an empty subset (no changed records) is None


def val_accuracy(model, n):
    """Greedy headline metric (textgame: exact accuracy, webpage: F1) on the first n validation records."""
    with autocast:
        r = eval_lang(args.task, model, tok, val_recs[:n], args.max_new_tokens, sampled=False, desc=None)
    return r[task.headline], r[task.headline + "_changed"]


# -----------------------------------------------------------------------------
# stage 1: MLE on (prompt -> state difference) pairs, loss on the target tokens only
def run_mle():
    ckpt = out_dir / "mle.safetensors"
    if start_model is not None:
        model = start_model
    else:
        model = GPT(GPTConfig.llama(vocab_size=tok.n_vocab, block_size=args.block_size, n_layer=args.n_layer,
                                    n_head=args.n_head, n_embd=args.n_embd))
    model, trained = run.wrap(model, compile=args.compile)
    pairs = [encode(r, True) for r in train_recs]
    keep = [pr for pr in pairs if fits(pr, model.config.block_size)]
    print0(f"mle: {len(keep)}/{len(pairs)} train pairs fit block_size {model.config.block_size}; "
           f"{model.num_params() / 1e6:.2f}M non-embedding parameters")
    if not keep:
        fail("no training pair fits the model's block_size (raise --block_size)")
    val_pairs = [pr for pr in (encode(r, True) for r in val_recs[:256]) if fits(pr, model.config.block_size)]
    opt = torch.optim.AdamW(model.parameters(), lr=args.mle_lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    g = torch.Generator().manual_seed(args.seed + rank)
    step, done = run.resume_stage(ckpt, model, opt, g, "mle")
    if done:
        return ckpt
    t_start, metrics = time.time(), {}
    bar = tqdm(total=args.mle_steps, initial=step, desc="mle", disable=not master)
    while step < args.mle_steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.mle_steps, args.mle_lr, args.warmup)
        ids = torch.randint(len(keep), (args.batch_size,), generator=g).tolist()
        idx, tgt = batch_from([keep[i] for i in ids])
        with autocast:
            _, loss = trained(idx, tgt)
        run.update("mle", step, model, opt, loss, grad_clip=1.0)   # a NaN/inf stops the run, or skips the step
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        timed_out = args.mle_minutes and time.time() - t_start > 60 * args.mle_minutes
        if step % args.eval_every == 0 or step == args.mle_steps or timed_out:
            model.eval()
            with torch.no_grad(), autocast:
                vl = sum(model(*batch_from(val_pairs[i:i + 64]))[1].item() for i in range(0, len(val_pairs), 64))
            vl /= math.ceil(len(val_pairs) / 64)
            metrics = dict(stage="mle", step=step, loss=loss.item(), val_loss=vl, minutes=(time.time() - t_start) / 60)
            if master:
                metrics["val_acc"], metrics["val_acc_changed"] = val_accuracy(model, args.val_n)
                print0(f"\nmle step {step}: train loss {loss.item():.4f} val loss {vl:.4f} "
                       f"val {task.headline} {metrics['val_acc']:.3f} (changed {fmt(metrics['val_acc_changed'])})")
            model.train()
            log(metrics)
        run.save_stage(ckpt, model, opt, step, metrics, g, done=step == args.mle_steps or bool(timed_out))
        if timed_out:
            print0(f"mle: stopping after {args.mle_minutes} minutes at step {step}")
            break
    bar.close()
    barrier()
    return ckpt


# -----------------------------------------------------------------------------
# stage 2: RLVR with GRPO; the reward is the task metric of the decoded prediction (rewards.py)
def run_rlvr(start):
    ckpt = out_dir / "rlvr.safetensors"
    model = load_lang_model(start, args.device)[0] if start != args.init or start_model is None else start_model
    ref = copy.deepcopy(model).eval().requires_grad_(False) if args.beta > 0 else None
    model, trained = run.wrap(model, compile=args.compile)
    cfg = GRPOConfig(group_size=args.group_size, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                     clip_eps=args.clip_eps, beta=args.beta, loss_agg=args.loss_agg, std_norm=bool(args.std_norm),
                     minibatches=args.minibatches, micro_batch=args.micro_batch,
                     skip_zero_std=bool(args.skip_zero_std))
    opt = torch.optim.AdamW(model.parameters(), lr=args.rl_lr, betas=(0.9, 0.99), weight_decay=0.0)
    room = model.config.block_size - args.max_new_tokens
    pool = [(r, encode(r, False)[0]) for r in train_recs]
    pool = [x for x in pool if len(x[1]) <= room]
    changed = [x for x in pool if data.is_changed(x[0])]
    unchanged = [x for x in pool if not data.is_changed(x[0])]
    n_unch = round(args.prompts_per_step * args.rl_unchanged_frac)
    print0(f"rlvr: {len(changed)} changed + {len(unchanged)} unchanged train prompts; per step {args.prompts_per_step} "
           f"prompts ({n_unch} unchanged) x {args.group_size} samples x {world} ranks; reward {args.reward}")
    g = torch.Generator().manual_seed(args.seed + 1000 + rank)
    step, done = run.resume_stage(ckpt, model, opt, g, "rlvr")
    if done:
        return ckpt

    def reward_fn(items, completions):
        texts = [tok.decode([t for t in c if t != tok.eos_id]) for c in completions]
        return [task.reward(t, r, args.reward) for t, r in zip(texts, items)]

    bar = tqdm(total=args.rl_steps, initial=step, desc="rlvr", disable=not master)
    stats = {}
    while step < args.rl_steps:
        picks = [changed[i] for i in torch.randint(len(changed), (args.prompts_per_step - n_unch,), generator=g)]
        picks += [unchanged[i] for i in torch.randint(len(unchanged), (n_unch,), generator=g)] if n_unch else []
        try:
            with autocast:
                stats = grpo_step(trained, ref, opt, [x[1] for x in picks], [x[0] for x in picks], reward_fn, cfg,
                                  tok.eos_id, g, step)
        except FloatingPointError as e:   # grpo.py checks rewards, loss, gradient norm and weights
            run.nonfinite("rlvr", step, model, str(e))   # stops, or logs a skipped step
            stats = {}
        step += 1
        bar.update(1)
        if stats:
            bar.set_postfix(reward=f"{stats['reward_mean']:.3f}", kl=f"{stats['kl']:.4f}")
        if stats and (step % 25 == 0 or step == args.rl_steps):
            if master:
                stats["val_acc"], stats["val_acc_changed"] = val_accuracy(model, args.val_n)
                print0(f"\nrlvr step {step}: reward {stats['reward_mean']:.3f} zero-spread groups "
                       f"{stats['zero_std_frac']:.2f} kl {stats['kl']:.4f} val {task.headline} {stats['val_acc']:.3f} "
                       f"(changed {fmt(stats['val_acc_changed'])})")
        if stats:
            log({"stage": "rlvr", **stats})
        run.save_stage(ckpt, model, opt, step, stats, g, done=step == args.rl_steps)
    bar.close()
    run.check_ranks_in_sync(model, "rlvr")
    barrier()
    return ckpt


# -----------------------------------------------------------------------------
# run the stages, then compare MLE and RLVR on the held-out test split
t0 = time.time()
mle_ckpt = run_mle() if args.stage in ("all", "mle") and not init_is_ckpt or args.stage == "mle" else None
if args.stage in ("all", "rlvr"):
    start = str(mle_ckpt) if mle_ckpt else args.init
    rl_ckpt = run_rlvr(start)
    if master:
        rows = {}
        for name, path in (("mle", start), ("rlvr", rl_ckpt)):
            model = load_lang_model(path, args.device)[0]
            with autocast:
                rows[name] = eval_lang(args.task, model, tok, test_recs[:args.test_limit or None],
                                       args.max_new_tokens, desc=f"test {name}")
        atomic_write_text(out_dir / "eval.json", json.dumps(rows, indent=2) + "\n")
        print0(f"\nheld-out test split ({rows['mle']['n']} transitions, {rows['mle']['n_changed']} changed), "
               f"{task.headline} %:")
        print_table(args.task, rows)
        print0(f"wrote {out_dir / 'eval.json'}; total {(time.time() - t0) / 60:.1f} min")
run.finish()
