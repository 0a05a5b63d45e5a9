"""
What the text studies share: train_lang.py's stages as functions of their inputs, so a study
changes the one piece it studies (the reward, the prompt pool, the MLE data) and keeps the rest.
`rl_loop` is train_lang.py's RL loop as a function, for the studies that pass their own prompts,
reward or probe in. Built on the core only: tasks.py, grpo.py, eval.py, runtime.py, checkpoint.py.
"""
import argparse
import dataclasses
import sys
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file: the repository root
from checkpoint import check_config, read_meta, resume_stage, save_config, save_stage  # noqa: E402
from eval import compare_checkpoints  # noqa: E402
from grpo import Env, GRPOConfig, grpo_step  # noqa: E402
from model import finite_weights  # noqa: E402
from runtime import ComputeBudget, NanPolicy, Run, check_ranks_in_sync, unsharded  # noqa: E402
from tasks import (PROBE_EVERY, PROBE_N, TASKS, UNCHANGED_FRAC, PromptPool, encode,  # noqa: E402
                   keep_tokenizer, load_lang_model, load_splits, probe_rewards, reward_fn,
                   train_control)


# train_lang.py's RL flags and the GRPOConfig fields they set
RL_FLAGS = dict(prompts_per_step="prompts_per_step", group_size="group_size", rl_lr="lr",
                micro_batch="micro_batch", max_new_tokens="max_new_tokens", graphs="graphs")


def rl_config(args):
    """The GRPOConfig of `parser`'s RL flags (its other fields: their defaults)."""
    return GRPOConfig(**{name: getattr(args, flag) for flag, name in RL_FLAGS.items()})


def parser(doc):
    """The flags every text study takes: train_lang.py's, where the study keeps them."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0].strip(), allow_abbrev=False)
    p.add_argument("--task", default="textgame", choices=sorted(TASKS))
    p.add_argument("--init", default=None, help="MLE checkpoint (default: the shipped one)")
    p.add_argument("--data_dir", default=None, help="default data/<task>")
    p.add_argument("--out_dir", required=True)
    p.add_argument("--rl_steps", type=int, default=30)
    for flag, name in RL_FLAGS.items():   # GRPOConfig's defaults; a bool as 0 / 1
        default = getattr(GRPOConfig, name)
        p.add_argument(f"--{flag}", type=int if isinstance(default, bool) else type(default),
                       default=default)
    p.add_argument("--reward", default=None, help="default: the task's first")
    p.add_argument("--control", type=int, default=1, help="1: the equal-compute MLE control")
    for flag, default in (("val_limit", 0), ("test_limit", 0), ("seed", 1337), ("resume", 1),
                          ("ckpt_every", 50), ("grad_ckpt", 0), ("batch_size", 32),
                          ("threads", 1)):
        p.add_argument(f"--{flag}", type=int, default=default)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    return p


def setup(args, stage_files=("rlvr.safetensors", "mle_more.safetensors")):
    """Run, splits and the start -> (run, (train, val, test), the start's path, model, tokenizer)."""
    init = args.init or str(ROOT / "checkpoints" / args.task / "mle.safetensors")
    out_dir = Path(args.out_dir)
    run = Run(args, out_dir, path_flags=("init", "data_dir", "out_dir", "tokenizer"))
    save_config(run, check_config(run, list(stage_files)))
    splits = load_splits(run, args.task, Path(args.data_dir or ROOT / "data" / args.task))
    model, tok, meta = load_lang_model(init, run.device)
    run.recorded["tokenizer"] = str(out_dir / keep_tokenizer(init, meta, out_dir))
    return run, splits, init, model, tok


def policy(run, model, cfg, grad_ckpt=False):
    """train_lang.py's RL stage start: (the GPT on the device, the module that steps (DDP),
    its frozen reference or None, AdamW)."""
    ref = run.reference(model) if cfg.beta > 0 else None   # FSDP: sharded too
    model, trained = run.wrap(model, grad_ckpt=grad_ckpt)
    return model, trained, ref, torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas,
                                                  weight_decay=cfg.weight_decay)


def rl_loop(run, parts, source, cfg, gen, ckpt, steps, budget=None, probe=None,
            every=PROBE_EVERY, name="rlvr"):
    """train_lang.py's RL loop: GRPO for `steps` steps from `parts` (`policy`), prompts from
    source.draw, checkpointed to `ckpt` and resumed from it; each step's compute added to `budget`;
    probe() -> a dict for the log (rank 0) before the first step and every `every` steps."""
    model, trained, ref, opt = parts
    step, done = resume_stage(run, ckpt, model, opt, gen, name)
    if done:
        return read_meta(ckpt)["metrics"]
    prev = read_meta(ckpt)["metrics"] if step else {}
    totals = dict(rl_seconds=prev.get("rl_seconds", 0.0), rl_compute=prev.get("rl_compute", 0))
    if budget is not None:
        budget.add(totals["rl_compute"])
    nan = NanPolicy(run, name)   # --on_nan: a NaN/inf stops the run, or skips the step
    if not finite_weights(model):
        nan.nonfinite(step, model, "non-finite weights in the policy")

    def watch():   # every rank gathers FSDP's weights; rank 0 runs the probe
        with unsharded(model), run.autocast:
            return probe() if probe and run.master else {}
    if step == 0 and (first := watch()):
        run.log({"stage": name, "step": 0, **first})
    bar, stats = tqdm(total=steps, initial=step, desc=name, disable=not run.master), {}
    while step < steps:
        for group in opt.param_groups:   # a linear warm-up over cfg.warmup steps, then constant
            group["lr"] = cfg.lr * min(1.0, (step + 1) / max(cfg.warmup, 1))
        prompts, items = source.draw(cfg.prompts_per_step)
        try:
            stats = grpo_step(trained, ref, opt, prompts, items, source, cfg, gen, step,
                              run.autocast)
        except FloatingPointError as e:
            nan.nonfinite(step, model, str(e))
            stats = {}
        step += 1
        bar.update(1)
        if stats:
            stats["step"] = step
            totals["rl_seconds"] += stats["t_step"]
            totals["rl_compute"] += stats["compute"]
            if budget is not None:
                budget.add(stats["compute"])
            if step % every == 0 or step == steps:
                stats.update(watch())
            stats.update(totals)
            run.log({"stage": name, **stats})
        save_stage(run, ckpt, model, opt, step, {**stats, **totals}, gen, done=step == steps)
    bar.close()
    if budget is not None:
        budget.close()
    check_ranks_in_sync(run, model, name)
    run.barrier()
    return stats


def rlvr(run, model, tok, args, records, score=None, unchanged_frac=UNCHANGED_FRAC):
    """train_lang.py's RLVR stage on the prompt pool of `records`, rewarded by `score` (default:
    the task's reward, as train_lang.py) -> the checkpoint."""
    cfg = dataclasses.replace(rl_config(args), vocab=tok.n_vocab)
    kind = args.reward or TASKS[args.task].rewards[0]
    parts = policy(run, model, cfg, args.grad_ckpt)
    gen = torch.Generator().manual_seed(args.seed + 1000 + run.rank)
    data = TASKS[args.task].data
    pool = PromptPool(records, data.prompt_text, data.is_changed, tok,
                      parts[0].config.block_size - cfg.max_new_tokens, unchanged_frac, gen)
    probe_prompts, probe_recs = pool(PROBE_N)
    ckpt = run.out_dir / "rlvr.safetensors"
    rl_loop(run, parts, Env(score or reward_fn(args.task, tok, kind), tok.eos_id, pool), cfg,
            gen, ckpt, args.rl_steps,
            probe=lambda: probe_rewards(args.task, parts[0], tok, probe_prompts, probe_recs, kind,
                                        cfg.max_new_tokens))
    return ckpt


def rl_compute(ckpt):
    """The compute an RLVR checkpoint records (forward-token units): the control's budget."""
    return read_meta(ckpt)["metrics"].get("rl_compute", 0)


def control(run, start, tok, args, train, val, compute, lr=None):
    """train_lang.py's control (tasks.train_control): MLE continued from `start` on every train
    record for `compute` (forward-token units), at `lr` (default: the start's final MLE rate)."""
    pairs = [encode(args.task, tok, r) for r in train]
    return train_control(run, args.task, tok, start, pairs, val, ComputeBudget(compute),
                         rl_config(args).max_new_tokens, lr)


def compare(run, tok, args, init, rl, train, val, test):
    """train_lang.py's last stages after RLVR (`rl`, its checkpoint) from `init`: the control for
    RLVR's compute (--control=1), then the final comparison -> evaluate's results."""
    ckpts = {"mle": init, "rlvr": str(rl)}
    if args.control:
        ckpts["mle_more"] = str(control(run, init, tok, args, train, val, rl_compute(rl)))
    return evaluate(run, tok, args, ckpts, val, test)


def evaluate(run, tok, args, ckpts, val, test=None):
    """train_lang.py's final comparison: eval_val.json and eval.json (test None: none) in out_dir,
    and the tables."""
    splits = {"val": val[:args.val_limit or None], "test": (test or [])[:args.test_limit or None]}
    return compare_checkpoints(run, args.task, ckpts, tok, {k: v for k, v in splits.items() if v},
                               rl_config(args).max_new_tokens)
