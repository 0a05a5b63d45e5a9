"""
Train a language world model: MLE (supervised next-state prediction), then RLVR (GRPO with the
task's own metric as the reward), then compare the MLE start, RLVR and the control (MLE continued
for RLVR's compute) on held-out records, paired. Tasks: textgame (exact next state, the default),
webpage (F1 of the page changes), and any task registered in tasks.py (docs/tasks.md).

    python train_lang.py                 # CPU: RLVR from the shipped MLE checkpoint, control, eval
    python train_lang.py --placebo=1 --out_dir=out/textgame_placebo   # rewards permuted: no signal
    python train_lang.py --init=scratch  # everything from scratch: data, tokenizer, MLE, RLVR
    python train_lang.py --horizon=3 --out_dir=out/textgame_k3   # 3-step imagination
1 GPU from pretrained HF weights (e.g. DeepSeek-R1-Distill-Qwen-1.5B, the paper's base: SFT first,
then RLVR), and 8 GPUs:
    python train_lang.py --init=/path/to/hf_dir --device=cuda --dtype=bfloat16 --micro_batch=8
    torchrun --nproc_per_node=8 train_lang.py --init=/path/to/hf_dir --device=cuda --dtype=bfloat16

Writes to --out_dir (default out/<task>): mle / rlvr / mle_more (the control) .safetensors with
.json sidecars, the tokenizer, config.json (the run's flags), log.jsonl (a JSON line per logged
step), eval.json (test) and eval_val.json (validation), each {"mle": M, "rlvr": M, "mle_more": M},
M = evaluate_lang.evaluate's result (summary and per-record metrics). Stages checkpoint every
--ckpt_every steps and a re-run of the same command resumes (also under torchrun
--max-restarts=N); a re-run with other flags stops, naming them (runtime.Run.check_config: use
another --out_dir, or --resume=0 to start over). A NaN/inf loss, reward or gradient stops the run
naming the step (--on_nan=skip skips it); bad input is one "error:" line, before anything is
written.

k-step imagination (--horizon=K > 1): the world model predicts K consecutive recorded steps of an
episode, each after the first prompted with the state its own previous answer leads to and the
next recorded action (tasks.imagine_chains). RLVR samples G such chains per start state, every step
at --temperature, and trains on every step's answer tokens with the chain's mean step reward from
that step on, grouped by step (each step scored as the text game's exact state or the web page's F1
of the changes), or with --chain_reward=last every answer with the chain's reward of its last
step. MLE and its control stay one step, teacher-forced; --control_imagined=N also
gives the control the states the start imagines on N train chains. The evaluation scores chains
(evaluate_chains): per chain start `<headline>_k` and the first step's metrics.
"""
import argparse
import copy
import dataclasses
import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from checkpoint import read_meta, write_json
from evaluate_lang import evaluate, evaluate_checkpoints, print_comparison
from grpo import GRPOConfig, grpo_step, make_optimizer, set_lr
import mle
from model import GPT, GPTConfig
from runtime import (ComputeBudget, Run, WeightPath, add_flags, check_ranges, finite_weights,
                     fork_alongside, from_flags, lr_at, memory_estimate, print_memory,
                     prompts_per_chunk, rank_map)
from tasks import (CHAINING, TASKS, chain_hooks, episode_chains, imagined_pairs, keep_tokenizer,
                   load_lang_model, probe_chain_rewards, probe_rewards)
from tokenizer_text import Tokenizer

ROOT = Path(__file__).resolve().parent

# -----------------------------------------------------------------------------
# flags; the RL stage's come from grpo.GRPOConfig (`runtime.add_flags`), the home of their defaults
# allow_abbrev=False: a prefix of a flag (--data for --data_dir) is an error, not that flag
p = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            allow_abbrev=False, description="MLE then RLVR for a language world "
                                                            "model, against equal-compute MLE")
g = p.add_argument_group("task and data")
g.add_argument("--task", default="textgame", choices=sorted(TASKS), help="which world to model")
g.add_argument("--data_dir", default=None,
               help="holds train/val/test.jsonl; default data/<task> (generated when it holds "
                    "none)")
g.add_argument("--out_dir", default=None,
               help="checkpoints, logs and eval JSON; default out/<task>")
g = p.add_argument_group("stages and initialisation")
g.add_argument("--stage", default="all", choices=["all", "mle", "rlvr", "control"],
               help="all: MLE (unless --init is a checkpoint), RLVR, the control, evaluation; "
                    "mle: MLE only; rlvr: RLVR, the control and evaluation from --init; "
                    "control: the control alone from --init for --control_compute, evaluated")
g.add_argument("--init", default="auto",
               help="auto (shipped MLE checkpoint if present, else scratch) | scratch | "
                    "our .safetensors | HF dir")
g.add_argument("--resume", type=int, default=1,
               help="1: continue each stage from its checkpoint in out_dir (with the same flags); "
                    "0: start over there")
g.add_argument("--control", type=int, default=1,
               help="1: train the control, MLE continued for RLVR's compute (counted in tokens)")
g.add_argument("--control_alongside", type=int, default=1,
               help="1: on a CPU, train the control in a second process while RLVR runs "
                    "(0: after RLVR; the same steps either way)")
g = p.add_argument_group("model, when training from scratch")
g.add_argument("--vocab_size", type=int, default=448, help="BPE ranks trained on the train split")
g.add_argument("--n_layer", type=int, default=4, help="transformer blocks")
g.add_argument("--n_head", type=int, default=4, help="attention heads per block")
g.add_argument("--n_embd", type=int, default=128, help="width of the residual stream")
g.add_argument("--block_size", type=int, default=512, help="longest prompt + answer in tokens")
g = p.add_argument_group("MLE")
g.add_argument("--mle_steps", type=int, default=2000,
               help="optimizer steps (cosine schedule over them)")
g.add_argument("--mle_minutes", type=float, default=0,
               help="stop MLE after this wall-clock (0 = no limit)")
g.add_argument("--batch_size", type=int, default=32, help="(prompt, answer) pairs per step")
g.add_argument("--mle_lr", type=float, default=3e-3, help="peak learning rate (decays to a tenth)")
g.add_argument("--warmup", type=int, default=100, help="MLE warm-up steps")
g.add_argument("--weight_decay", type=float, default=0.1, help="MLE AdamW weight decay")
g.add_argument("--control_lr", type=float, default=0,
               help="constant learning rate of the control; 0: the start's own final MLE rate "
                    "(an HF start: --rl_lr)")
g = p.add_argument_group("RLVR (GRPO, grpo.py); defaults follow the official RLVR-World recipe "
                         "where they fit a CPU")
g.add_argument("--rl_steps", type=int, default=30, help="GRPO steps")
add_flags(g, GRPOConfig)   # --prompts_per_step ... --max_new_tokens: GRPOConfig's fields
g.add_argument("--reward", default=None,
               help="textgame: binary | task_specific; webpage: f1 (default: the first)")
g.add_argument("--horizon", type=int, default=1,
               help="K > 1: k-step imagination, RLVR on and evaluation of chains of K recorded "
                    "steps, each from the state the previous prediction leads to")
g.add_argument("--chain_reward", default="to_go", choices=("last", "to_go"),
               help="--horizon K > 1: to_go = step k's answer gets the chain's mean step reward "
                    "from k on, its advantage against the other chains' step k (chosen on "
                    "validation: docs/results.md); last = every step's answer gets the chain's "
                    "reward of its last answer (tasks.chain_hooks)")
g = p.add_argument_group("research: controls, probes and the regime study (not needed to train)")
g.add_argument("--label_frac", type=float, default=1.0,
               help="MLE sees only this fraction of the train labels (the regime study; RLVR still "
                    "uses all prompts)")
g.add_argument("--rl_pool", type=int, default=0,
               help="RL prompts: the first N train records (0 = all); a small pool checks that the "
                    "optimiser climbs")
g.add_argument("--rl_unchanged_frac", type=float, default=0.3,
               help="share of unchanged prompts drawn for RL")
add_flags(g, GRPOConfig, research=True)   # --placebo
g.add_argument("--control_imagined", type=int, default=0,
               help="--horizon K > 1: the control also learns the states the start imagines on "
                    "this many train chains, each labelled with the answer the chain metric "
                    "counts right (tasks.imagined_pairs; the imagination is charged to its "
                    "compute); 0: teacher-forced only")
g.add_argument("--control_compute", type=float, default=0,
               help="--stage=control: the control's compute in forward-token units (an RLVR "
                    "run's rl_compute, in its log.jsonl)")
g.add_argument("--probe_n", type=int, default=64,
               help="fixed training prompts whose reward is tracked")
g.add_argument("--probe_every", type=int, default=10,
               help="RLVR steps between probe-set measurements")
g = p.add_argument_group("evaluation")
g.add_argument("--eval_every", type=int, default=500, help="MLE steps between validation checks")
g.add_argument("--val_n", type=int, default=200,
               help="validation records for the MLE progress checks")
g.add_argument("--val_limit", type=int, default=0,
               help="validation records in the final eval (0 = all)")
g.add_argument("--test_limit", type=int, default=0, help="test records in the final eval (0 = all)")
g.add_argument("--final_eval", default="val,test",
               help="splits of the final evaluation (choices are made on val)")
g.add_argument("--eval_workers", type=int, default=2,
               help="processes sharing the final evaluation on a CPU")
g = p.add_argument_group("system")
g.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
               help="autocast dtype")
g.add_argument("--compile", type=int, default=0, help="1: torch.compile the trained model")
g.add_argument("--estimate_memory", type=int, default=0,
               help="1: print the memory estimate of the run's MLE and RLVR steps (weights, "
                    "optimizer, reference, KV cache, activations, logits, peak) and exit")
g.add_argument("--grad_ckpt", type=int, default=0,
               help="1: activation checkpointing, each block's activations recomputed in the "
                    "backward pass (a large model's memory for about a third more compute)")
g.add_argument("--threads", type=int, default=1,
               help="torch CPU threads; 1 is fastest for tiny models on 2 cores")
g.add_argument("--seed", type=int, default=1337,
               help="seeds data order, sampling and the probe set")
g.add_argument("--ckpt_every", type=int, default=50, help="steps between resumable checkpoints")
g.add_argument("--on_nan", default="stop", choices=["stop", "skip"],
               help="on a NaN/inf loss, reward or gradient: stop the run, or skip that step "
                    "(single process only)")
args = p.parse_args()
check_ranges(p, args,
             at_least_1=("n_layer", "n_head", "n_embd", "block_size", "mle_steps", "batch_size",
                         "horizon",
                         "rl_steps", "prompts_per_step", "max_rounds", "group_size", "ppo_epochs",
                         "minibatches", "micro_batch", "max_new_tokens", "eval_every", "val_n",
                         "threads", "ckpt_every", "probe_n", "probe_every", "eval_workers"),
             at_least_0=("mle_minutes", "mle_lr", "warmup", "weight_decay", "control_lr",
                         "control_compute", "rl_lr", "rl_warmup", "rl_weight_decay", "beta",
                         "entropy_coef", "clip_eps", "test_limit", "val_limit", "rl_pool",
                         "control_imagined"))
if not set(args.final_eval.split(",")) <= {"val", "test"}:
    p.error(f"--final_eval takes val, test or val,test, got {args.final_eval!r}")
if not 0 <= args.rl_unchanged_frac <= 1 or not 0 < args.label_frac <= 1 or not args.temperature > 0:
    p.error(f"--rl_unchanged_frac must be in [0, 1] (got {args.rl_unchanged_frac}), --label_frac "
            f"in (0, 1] (got {args.label_frac}) and --temperature > 0 (got {args.temperature})")

# -----------------------------------------------------------------------------
# setup: distributed, devices, precision (runtime.py); every input is checked before anything is
# written
out_dir = Path(args.out_dir or f"out/{args.task}")
# one process, or one rank of torchrun; checks --device, seeds torch, sets threads and autocast
run = Run(args, out_dir, path_flags=("data_dir", "init", "out_dir", "tokenizer"))
master, rank, world, autocast = run.master, run.rank, run.world, run.autocast
print0, fail, log, barrier = run.print0, run.fail, run.log, run.barrier
task = TASKS[args.task]   # data module, per-record scores, rewards (tasks.py)
data = task.data          # load_records, prompt_text, target_text, is_changed
args.data_dir = args.data_dir or str(ROOT / "data" / args.task)
args.reward = args.reward or task.rewards[0]
if args.reward not in task.rewards:
    fail(f"--reward {args.reward}: the {args.task} task has rewards {task.rewards}")
if args.horizon > 1 and args.task not in CHAINING:
    fail(f"--horizon {args.horizon}: the {args.task} task has no k-step imagination "
         f"(tasks.CHAINING)")
if args.control_imagined and args.horizon == 1:
    fail("--control_imagined: imagined states need chains (--horizon K > 1)")
# --init=auto: RLVR post-trains the shipped MLE checkpoint; MLE alone starts from scratch
if args.init == "auto":
    shipped = ROOT / "checkpoints" / args.task / "mle.safetensors"
    args.init = str(shipped) if shipped.is_file() and args.stage != "mle" else "scratch"
# else: scratch or an HF directory
init_is_ckpt = args.init != "scratch" and Path(args.init).is_file()
if args.init != "scratch" and not Path(args.init).exists():
    fail(f"--init {args.init}: no such checkpoint file or HF directory")
if args.stage in ("rlvr", "control") and args.init == "scratch":
    fail(f"--stage={args.stage} needs --init=<checkpoint or HF dir> (it post-trains a trained "
         f"model)")
if args.stage == "control" and not args.control_compute:
    fail("--stage=control needs --control_compute (an RLVR run's rl_compute, in its log.jsonl)")
if init_is_ckpt:   # its header only: a readable checkpoint of a language model
    try:
        init_args = read_meta(args.init)["args"]
    except ValueError as e:
        fail(str(e))
    if "vq" in init_args:   # train_video.py's checkpoints name their frame tokenizer (vq)
        fail(f"--init {args.init}: a video world model of train_video.py (its tokens are frame "
             f"codes, not text); start from a train_lang.py checkpoint or an HF directory")
# with --resume=1, out_dir must hold no run with other flags (out_dir/config.json, runtime.py)
record = run.check_config(["mle.safetensors", "rlvr.safetensors", "mle_more.safetensors"])


# -----------------------------------------------------------------------------
# data: generated on first run, like nanoGPT's prepare.py
def missing_splits(data_dir):
    """The split files --data_dir lacks, or a one-line stop. The task's own folders (data/<task>
    and its coverage folder data/<task>/cover) are generated by rank 0 from the seeded simulator
    when they hold none of the three; any other missing file stops the run, so a folder of your
    own records is never topped up with simulator data."""
    files = [f"{s}.jsonl" for s in ("train", "val", "test")]
    missing = [f for f in files if not (data_dir / f).is_file()]
    own = ROOT / "data" / args.task
    ours = data_dir.resolve() in (own.resolve(), (own / "cover").resolve())
    if missing and not ours:
        fail(f"--data_dir {data_dir}: missing {', '.join(missing)} (a data folder holds "
             f"{', '.join(files)}; only data/{args.task} is generated when missing)")
    if 0 < len(missing) < len(files):
        fail(f"--data_dir {data_dir}: missing {', '.join(missing)}; its splits are generated all "
             f"three at once: delete the others to have them generated again, or add the missing "
             f"ones")
    return missing


try:
    data_dir = Path(args.data_dir)
    generate = missing_splits(data_dir)
    barrier()   # every rank has looked before rank 0 writes
    if master and generate:
        task.prepare.ensure_splits(data_dir)   # the seeded simulator's splits
    barrier()
    train_recs, val_recs, test_recs = (data.load_records(data_dir / f"{s}.jsonl")
                                       for s in ("train", "val", "test"))
except (OSError, ValueError) as e:   # a missing or malformed file: one line naming it
    fail(str(e))
print0(f"data: {len(train_recs)} train / {len(val_recs)} val / {len(test_recs)} test records "
       f"({sum(map(data.is_changed, train_recs)) / len(train_recs):.0%} of train change something)")

# -----------------------------------------------------------------------------
# tokenizer and model: from a checkpoint, an HF directory, or trained here from scratch
if args.init != "scratch":   # loaded before anything is written
    try:
        start_model, tok, start_meta = load_lang_model(args.init, args.device)
    except ValueError as e:
        fail(str(e))
    except (OSError, KeyError, TypeError) as e:   # e.g. an HF config.json without a key we need
        fail(f"--init {args.init}: cannot load ({type(e).__name__}: {e})")
run.save_config(record)   # out_dir/config.json: the inputs are good; from here on the run writes
if args.init == "scratch":
    tok_file = out_dir / "tokenizer.tiktoken"
    # BPE on the train split's prompts and answers (again when starting over: the flags may differ)
    if master and (not args.resume or not tok_file.is_file()):
        t0 = time.time()
        texts = [data.prompt_text(r) + data.target_text(r) for r in train_recs]
        try:
            Tokenizer.train(texts, args.vocab_size).save(tok_file)   # written atomically
        except ValueError as e:
            fail(f"--vocab_size {args.vocab_size}: {e}")
        print0(f"tokenizer: trained {args.vocab_size} BPE ranks in {time.time() - t0:.1f}s "
               f"-> {tok_file}")
    barrier()   # the other ranks wait for rank 0's file
    # the model is built once the vocab is known
    start_model, tok = None, Tokenizer.from_tiktoken_file(tok_file)
    # in every checkpoint's args (relative to its folder): eval.py finds the tokenizer through it
    args.tokenizer = str(tok_file)
else:   # HF: its directory; ours: a copy beside the run's checkpoints
    args.tokenizer = str(out_dir / keep_tokenizer(args.init, start_meta, out_dir, write=master))
    print0(f"init: {args.init} ({start_model.num_params() / 1e6:.2f}M non-embedding parameters)")


def encode(r):
    """A record -> (prompt ids, answer ids + EOS): the model reads the prompt and learns to write
    the answer."""
    return encode_pair(data.prompt_text(r), data.target_text(r))


def encode_pair(prompt, answer):
    """A prompt text and its answer text -> (prompt ids, answer ids + EOS)."""
    return tok.encode(prompt), tok.encode(answer) + [tok.eos_id]


def batch_from(pairs):
    """(prompt, answer) id lists -> right-padded idx (B, T) and targets (B, T) on the device,
    -1 outside the answer tokens."""
    T = max(len(a) + len(b) for a, b in pairs) - 1          # the longest sequence, but its last
    idx = torch.zeros(len(pairs), T, dtype=torch.long)       # padding 0 is never a target
    tgt = torch.full((len(pairs), T), -1, dtype=torch.long)  # -1 = ignored by the cross-entropy
    for i, (a, b) in enumerate(pairs):
        s = a + b                                            # prompt, answer (+ EOS): one sequence
        idx[i, :len(s) - 1] = torch.tensor(s[:-1])           # input: all but the last token
        tgt[i, len(a) - 1:len(s) - 1] = torch.tensor(b)      # target: the answer, shifted by one
    return idx.to(args.device), tgt.to(args.device)


# -----------------------------------------------------------------------------
# stage 1: MLE on (prompt -> state difference) pairs, loss on the answer tokens only (mle.py).
# The same loop trains the control (MLE continued from the RLVR start for RLVR's compute).
def run_mle(model, name, pairs, steps, minutes, lr_of_step, budget=None):
    """mle.train on the pairs that fit the model's block, for `steps` steps, `minutes` of
    wall-clock (0: no limit) or RLVR's compute (`budget`, runtime.ComputeBudget) -> the
    checkpoint out_dir/<name>.safetensors."""
    ckpt = out_dir / f"{name}.safetensors"   # resumable while it runs, the model once done

    def fits(pair):   # a whole (prompt, answer) pair fits the model's context
        return len(pair[0]) + len(pair[1]) <= model.config.block_size + 1

    keep = [pr for pr in pairs if fits(pr)]
    print0(f"{name}: {len(keep)}/{len(pairs)} train pairs fit block_size "
           f"{model.config.block_size}; {model.num_params() / 1e6:.2f}M non-embedding parameters")
    if not keep:
        fail("no training pair fits the model's block_size (raise --block_size)")
    val_pairs = [pr for pr in map(encode, val_recs[:256]) if fits(pr)]   # up to 256 val pairs

    def next_batch(gen):   # --batch_size pairs, sampled with replacement
        ids = torch.randint(len(keep), (args.batch_size,), generator=gen).tolist()
        return batch_from([keep[i] for i in ids])

    def val_loss(model):   # the mean loss of the chunks of --micro_batch validation pairs
        vl = []
        for i in range(0, len(val_pairs), args.micro_batch):
            idx, tgt = batch_from(val_pairs[i:i + args.micro_batch])
            vl.append(model(idx, tgt, at=tgt >= 0)[1].item())   # logits of the answers only
        return sum(vl) / len(vl)

    def val_metrics(model):   # rank 0: greedy decoding of the first --val_n validation records
        if not master:
            return {}, ""
        with autocast:
            r = evaluate(args.task, model, tok, val_recs[:args.val_n], args.max_new_tokens,
                         desc=None)
        more = {"val": r[task.headline], "val_changed": r[task.headline + "_changed"]}
        return more, f" val {task.headline} {more['val']:.3f}"

    # the bar's label: the control stops at RLVR's compute
    until = " (until RLVR's compute)" if budget is not None else ""
    mle.train(run, model, name, ckpt, steps, next_batch, val_loss, lr_of_step, minutes, budget,
              val_metrics, desc=name + until, compile=args.compile)
    return ckpt


# -----------------------------------------------------------------------------
# stage 2: RLVR with GRPO on the prompt pool's prompts; the reward is the task metric of the
# decoded prediction (rewards.py)
class PromptPool:
    """RLVR's prompt pool: every record whose prompt is at most `room` tokens, split into those that
    change something (where the headroom is) and those that do not (mostly right already; drawn so
    "no change" stays right). horizon K > 1: the pool's items are the records' K-step chains
    (`episode_chains`), by their first prompt; a chain changes something when any step does."""

    def __init__(self, task, tok, records, room, unchanged_frac, generator, horizon=1):
        data = TASKS[task].data
        if horizon == 1:
            pool = [(r, prompt) for r in records
                    if len(prompt := tok.encode(data.prompt_text(r))) <= room]
            self.changed = [x for x in pool if data.is_changed(x[0])]
            self.unchanged = [x for x in pool if not data.is_changed(x[0])]
        else:
            pool = [(c, prompt) for c in episode_chains(task, records, horizon)
                    if len(prompt := tok.encode(data.prompt_text(c[0]))) <= room]
            self.changed = [x for x in pool if any(map(data.is_changed, x[0]))]
            self.unchanged = [x for x in pool if not any(map(data.is_changed, x[0]))]
        self.unchanged_frac, self.generator = unchanged_frac, generator

    def __call__(self, n):
        """n draws with replacement, a share unchanged_frac of them unchanged
        -> (token-id prompts, records or chains)."""
        n_unch = round(n * self.unchanged_frac) if self.unchanged else 0
        picks = [self.changed[i] for i in
                 torch.randint(len(self.changed), (n - n_unch,), generator=self.generator)]
        picks += [self.unchanged[i] for i in   # (max: none to draw from is 0 draws, not an error)
                  torch.randint(max(len(self.unchanged), 1), (n_unch,), generator=self.generator)]
        return [x[1] for x in picks], [x[0] for x in picks]


def run_rlvr(model, budget):
    """GRPO from `model` for --rl_steps steps; each step's compute is added to `budget` (the
    control's, runtime.ComputeBudget), which is closed at the end -> the checkpoint."""
    ckpt = out_dir / "rlvr.safetensors"   # resumable while it runs, the RLVR model once done
    # the frozen MLE start, the KL's reference
    # the frozen MLE start, the KL's reference, kept in the forwards' dtype (bf16 under autocast)
    ref = (copy.deepcopy(model).eval().requires_grad_(False).to(run.dtype) if args.beta > 0
           else None)
    model, trained = run.wrap(model, compile=args.compile, grad_ckpt=args.grad_ckpt)
    # the GRPO flags, --placebo included; only ids the tokenizer decodes are sampled
    cfg = dataclasses.replace(from_flags(args, GRPOConfig), vocab=tok.n_vocab)
    opt = make_optimizer(model, cfg)     # AdamW, betas (0.9, 0.999), weight decay --rl_weight_decay
    gen = torch.Generator().manual_seed(args.seed + 1000 + rank)   # prompts, samples, minibatches
    # the prompt pool: every train prompt that leaves room for the longest answer, split into
    # changed and unchanged records; draw(n) -> n token-id prompts and their records, a share
    # --rl_unchanged_frac of them unchanged
    room = model.config.block_size - args.max_new_tokens
    pool = train_recs[:args.rl_pool or None]
    draw = PromptPool(args.task, tok, pool, room, args.rl_unchanged_frac, gen, args.horizon)

    def reward_fn(records, completions):   # token lists -> the task's metric of each decoded answer
        # decode: the reward reads text; task.reward never raises on model output
        texts = [tok.decode([t for t in c if t != tok.eos_id]) for c in completions]
        return [task.reward(t, r, args.reward) for t, r in zip(texts, records)]

    # one step: a group is a prompt's G answers, sampled by grpo.py itself
    draw_groups, sampler, score = draw, None, reward_fn
    if args.horizon > 1:   # chains: G per start, K x G rows (tasks.chain_hooks)
        per_step = args.chain_reward == "to_go"
        draw_groups, sampler, score = chain_hooks(args.task, tok, draw, room, args.horizon,
                                                  args.group_size, args.reward, per_step)
        if not per_step:   # a group is a start's K x G rows; per step, a step's G rows
            cfg = dataclasses.replace(cfg, group_size=args.horizon * args.group_size)

    # the probe set: fixed training prompts whose greedy and T=1 reward (4 samples each, a fixed
    # seed) is logged every --probe_every steps: the reward GRPO optimises, on the same prompts
    probe_prompts, probe_recs = draw(args.probe_n)

    def probe():
        with autocast:
            if args.horizon > 1:   # the chains' reward, greedy and sampled
                return probe_chain_rewards(args.task, model, tok, probe_recs, args.reward,
                                           args.max_new_tokens)
            return probe_rewards(args.task, model, tok, probe_prompts, probe_recs, args.reward,
                                 args.max_new_tokens)

    print0(f"rlvr: {len(draw.changed)} changed + {len(draw.unchanged)} unchanged train prompts; "
           f"per step {args.prompts_per_step} groups with reward spread (up to {args.max_rounds} "
           f"rounds) x {args.group_size} samples x {world} ranks; reward {args.reward}"
           f"{'; PLACEBO: rewards permuted within each kept group' if args.placebo else ''}"
           f"{f'; chains of {args.horizon} steps' if args.horizon > 1 else ''}")
    # the MLE start, for the log's weight movement (rank 0 logs: only it keeps the CPU copies)
    moved = WeightPath(model) if master else None
    step, done = run.resume_stage(ckpt, model, opt, gen, "rlvr")   # as in run_mle
    if done:
        return ckpt
    prev = read_meta(ckpt)["metrics"] if step else {}   # the interrupted run's last log
    rl_seconds = prev.get("rl_seconds", 0.0)   # time in GRPO steps so far (logged beside compute)
    rl_compute = prev.get("rl_compute", 0)     # forward-token units so far: the control's budget
    budget.add(rl_compute)
    if master:
        moved.resume(model, prev.get("w_path", 0.0))
    if not finite_weights(model):   # a poisoned start stops here, before any sampling from it
        run.nonfinite("rlvr", step, model, "non-finite weights in the policy")
    if step == 0 and master:
        log({"stage": "rlvr", "step": 0, **probe()})   # the probe set before any update
    bar = tqdm(total=args.rl_steps, initial=step, desc="rlvr", disable=not master)
    stats = {}
    while step < args.rl_steps:
        set_lr(opt, cfg, step)   # linear warm-up, then constant
        # the first round's prompts; grpo_step draws more if groups lack spread
        prompts, recs = draw_groups(args.prompts_per_step)
        try:   # rollout -> reward -> advantages -> PPO-clip + KL updates, all in grpo.py
            stats = grpo_step(trained, ref, opt, prompts, recs, score, cfg, tok.eos_id, gen, step,
                              sampler=sampler, next_prompts=draw_groups, autocast=autocast)
        except FloatingPointError as e:   # grpo.py checks rewards, loss, gradient norm and weights
            run.nonfinite("rlvr", step, model, str(e))   # stops, or logs a skipped step
            stats = {}
        step += 1
        bar.update(1)
        if stats:
            stats["step"] = step   # steps done: the log's step 0 is the probe before any update
            rl_seconds += stats["t_step"]
            rl_compute += stats["compute"]   # counted by grpo.compute_used
            budget.add(stats["compute"])
            stats.update(rl_seconds=rl_seconds, rl_compute=rl_compute,
                         **(moved.step(model) if master else {}))   # w_path, w_rms, straightness
            bar.set_postfix(reward=f"{stats['reward_mean']:.3f}", kept=stats["groups_kept"],
                            kl=f"{stats['kl']:.4f}")
            if master and (step % args.probe_every == 0 or step == args.rl_steps):
                stats.update(probe())   # the probe, and a line of text
                print0(f"\nrlvr step {step}: reward {stats['reward_mean']:.3f} probe reward "
                       f"{stats['probe_reward']:.3f} (greedy {stats['probe_greedy']:.3f}) "
                       f"groups kept {stats['groups_kept']}/{stats['groups']} kl {stats['kl']:.5f} "
                       f"entropy {stats['entropy']:.3f} straightness {stats['w_straightness']:.2f} "
                       f"(random walk {1 / math.sqrt(step):.2f})")
            log({"stage": "rlvr", **stats})   # reward, KL, entropy, clip fraction, movement, probe
        # a checkpoint every --ckpt_every steps, and the last
        run.save_stage(ckpt, model, opt, step, stats, gen, done=step == args.rl_steps)
    bar.close()
    budget.close()   # RLVR's compute is final: the control may stop once it has used as much
    run.check_ranks_in_sync(model, "rlvr")   # under torchrun: every rank ends with the same weights
    barrier()
    return ckpt


# -----------------------------------------------------------------------------
# run the stages: MLE (from scratch) -> RLVR -> the equal-compute MLE control -> paired evaluation
t0 = time.time()
all_pairs = [encode(r) for r in train_recs]   # every train record as (prompt ids, answer ids + EOS)
pairs = all_pairs   # what MLE learns from
# the memory of a step, per rank, printed before the stages run (--estimate_memory=1: only that)
config = start_model.config if start_model else GPTConfig.llama(
    vocab_size=tok.n_vocab, block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
    n_embd=args.n_embd)
low = args.dtype != "float32"
if args.stage == "mle" or (args.stage == "all" and not init_is_ckpt):
    # MLE: a micro-batch of the longest pair that fits, logits on its answer (no reference, no
    # sampling)
    fit = [(len(p), len(a)) for p, a in all_pairs if len(p) + len(a) <= config.block_size + 1]
    p_len, a_len = max(fit or [(config.block_size // 2, config.block_size // 2)], key=sum)
    mb = min(args.micro_batch, args.batch_size)
    print_memory("mle", memory_estimate(config, low, False, args.grad_ckpt, p_len, a_len, 0, 1,
                                        mb, mb), print0)
if args.stage in ("all", "rlvr"):
    # RLVR at its longest prompt
    room = config.block_size - args.max_new_tokens
    longest = max([len(p) for p, _ in all_pairs if len(p) <= room] or [room])
    chunk_prompts = prompts_per_chunk(args.prompts_per_step, args.group_size, args.minibatches,
                                      args.micro_batch)
    print_memory("rlvr", memory_estimate(config, low, args.beta > 0, args.grad_ckpt, longest,
                                         args.max_new_tokens, args.prompts_per_step,
                                         args.group_size, args.micro_batch, chunk_prompts), print0)
if args.estimate_memory:
    run.finish()
    raise SystemExit(0)
# the regime study: MLE on a fraction of the labels; RLVR and the control see every record
if args.label_frac < 1:
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(args.seed)).tolist()
    pairs = [pairs[i] for i in order[:max(1, round(args.label_frac * len(pairs)))]]
start = args.init   # the checkpoint RLVR and the control start from
if args.stage == "mle" or (args.stage == "all" and not init_is_ckpt):
    model = start_model or GPT(GPTConfig.llama(
        vocab_size=tok.n_vocab, block_size=args.block_size, n_layer=args.n_layer,
        n_head=args.n_head, n_embd=args.n_embd))
    start = str(run_mle(model, "mle", pairs, args.mle_steps, args.mle_minutes,
                        lambda s: lr_at(s, args.mle_steps, args.mle_lr, args.warmup)))
    start_model = model = None   # RLVR and the control start from the checkpoint: free its memory


def control(budget):
    """The control: MLE continued from the start until it has used `budget`, at --control_lr or
    the start's own final MLE rate (mle.final_lr; an HF start records none: RLVR's rate,
    --rl_lr)."""
    final = mle.final_lr(start)
    lr = args.control_lr or (args.rl_lr if final is None else final)
    print0(f"control: MLE continued from the start at lr {lr:.3g} for RLVR's compute")
    model = load_lang_model(start, args.device)[0]
    pairs = all_pairs
    if args.control_imagined:   # the stronger control: the start's own imagined states as well
        g = torch.Generator().manual_seed(args.seed)
        chains = episode_chains(args.task, train_recs, args.horizon)
        chains = [chains[i] for i in torch.randperm(len(chains), generator=g).tolist()]
        with autocast:
            more, cost, ended = imagined_pairs(args.task, model, tok,
                                               chains[:args.control_imagined], args.max_new_tokens)
        model.train()   # generation left it in eval mode
        pairs = all_pairs + [encode_pair(a, b) for a, b in more]
        budget = budget.less(cost)   # the imagination is part of the control's compute
        print0(f"control: + {len(more)} imagined pairs from {args.control_imagined} train chains "
               f"({ended} ended early, unreadable); the imagination cost {cost:.3g} of its compute")
    return run_mle(model, "mle_more", pairs, 10 ** 9, 0, mle.control_lr(lr),
                   budget)   # 10 warm-up steps, then constant


if args.stage == "control":   # the control alone, for a given compute (the lr sweep)
    ckpts = {"mle": start, "mle_more": str(control(ComputeBudget(args.control_compute)))}
if args.stage in ("all", "rlvr"):
    rl_file = out_dir / "rlvr.safetensors"
    rl_done = (args.resume and rl_file.is_file()
               and read_meta(rl_file)["metrics"].get("done"))
    # The control, MLE continued from the same start, gets RLVR's compute (ComputeBudget: counted
    # in tokens, the same on any machine). On a CPU it runs in a forked process on the second core
    # *while* RLVR runs, waiting whenever it is ahead: the demo takes half as long. Otherwise (GPU,
    # torchrun, a resumed run) it runs after RLVR. Its steps are the same either way.
    alongside = (args.control and args.control_alongside and world == 1 and args.device == "cpu"
                 and not rl_done and not args.control_imagined)   # imagined: it needs the total
    budget = ComputeBudget()   # RLVR adds its compute step by step
    if alongside:
        # runtime.fork_alongside: the child shares the loaded data and tokenizer and prints to
        # control.log
        child = fork_alongside(lambda: control(budget), out_dir / "control.log")
        print0(f"control: MLE continues from the start in process {child.pid} while RLVR runs "
               f"(progress: {out_dir / 'control.log'})")
    # the start: the model loaded from --init, or a fresh copy of the MLE checkpoint (one copy
    # in memory: the name start_model lets go of it)
    model, start_model = start_model or load_lang_model(start, args.device)[0], None
    rl_ckpt, model = run_rlvr(model, budget), None
    ckpts = {"mle": start, "rlvr": str(rl_ckpt)}
    if alongside:
        child.join()   # it stops at RLVR's compute, saves mle_more.safetensors and exits
        if child.exitcode:
            fail(f"the control process failed (exit code {child.exitcode}); "
                 f"see {out_dir / 'control.log'}")
        ckpts["mle_more"] = str(out_dir / "mle_more.safetensors")
    elif args.control:   # after RLVR, for the compute its checkpoint records
        rl_compute = read_meta(rl_ckpt)["metrics"].get("rl_compute", 0)
        ckpts["mle_more"] = str(control(ComputeBudget(rl_compute)))
if args.stage != "mle":
    # every model, loaded from its checkpoint, greedy on the same records: differences are paired
    def scored(recs):   # what one result scores: a record, or a chain's start (--horizon)
        return recs if args.horizon == 1 else episode_chains(args.task, recs, args.horizon)
    splits = {split: scored(recs)[:limit or None] for split, recs, limit in
              (("val", val_recs, args.val_limit), ("test", test_recs, args.test_limit))
              if split in args.final_eval.split(",")}
    # one process on a CPU: the jobs split over the cores; under torchrun every rank decodes its
    # share of each job's batches (runtime.rank_map), and every rank gets the same results
    workers = args.eval_workers if args.device == "cpu" and world == 1 else 1
    results = evaluate_checkpoints(args.task, ckpts, tok, splits, args.max_new_tokens,
                                   args.device, autocast, workers, args.horizon,
                                   rank_map if world > 1 else None)
    if master:
        for split, r in results.items():
            write_json(out_dir / ("eval.json" if split == "test" else "eval_val.json"), r)
            # the table, RLVR - MLE start, RLVR - control: paired 95% CIs
            print_comparison(args.task, split, r)
        print0(f"wrote eval.json (test) / eval_val.json (val) in {out_dir}; "
               f"total {(time.time() - t0) / 60:.1f} min")
run.finish()
