"""
What the text studies share: train_lang.py's stages as functions of their inputs, so a study
changes the one piece it studies (the reward, the prompt pool, the MLE data) and keeps the rest.
Built on the core only: tasks.py, grpo.py, eval.py, runtime.py.
"""
import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file: the repository root
from checkpoint import read_meta  # noqa: E402
from eval import compare_checkpoints  # noqa: E402
from grpo import GRPOConfig  # noqa: E402
from runtime import ComputeBudget, Run, add_flags, from_flags  # noqa: E402
from tasks import (TASKS, UNCHANGED_FRAC, encode, keep_tokenizer,  # noqa: E402
                   load_lang_model, load_splits, train_control, train_rlvr)


def parser(doc):
    """The flags every text study takes: train_lang.py's, where the study keeps them."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0].strip(), allow_abbrev=False)
    p.add_argument("--task", default="textgame", choices=sorted(TASKS))
    p.add_argument("--init", default=None, help="MLE checkpoint (default: the shipped one)")
    p.add_argument("--data_dir", default=None, help="default data/<task>")
    p.add_argument("--out_dir", required=True)
    p.add_argument("--rl_steps", type=int, default=30)
    add_flags(p, GRPOConfig)
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
    run.save_config(run.check_config(list(stage_files)))
    splits = load_splits(run, args.task, Path(args.data_dir or ROOT / "data" / args.task))
    model, tok, meta = load_lang_model(init, run.device)
    run.recorded["tokenizer"] = str(out_dir / keep_tokenizer(init, meta, out_dir))
    return run, splits, init, model, tok


def rlvr(run, model, tok, args, records, score=None, unchanged_frac=UNCHANGED_FRAC):
    """train_lang.py's RLVR stage (tasks.train_rlvr) on the prompt pool of `records`, rewarded by
    `score` (default: the task's reward, as train_lang.py) -> the checkpoint."""
    cfg = dataclasses.replace(from_flags(args, GRPOConfig), vocab=tok.n_vocab)
    return train_rlvr(run, model, cfg, args.task, tok, records,
                      args.reward or TASKS[args.task].rewards[0], run.out_dir / "rlvr.safetensors",
                      args.rl_steps, reward=score, unchanged_frac=unchanged_frac)


def rl_compute(ckpt):
    """The compute an RLVR checkpoint records (forward-token units): the control's budget."""
    return read_meta(ckpt)["metrics"].get("rl_compute", 0)


def control(run, start, tok, args, train, val, compute, lr=None):
    """train_lang.py's control (tasks.train_control): MLE continued from `start` on every train
    record for `compute` (forward-token units), at `lr` (default: the start's final MLE rate)."""
    pairs = [encode(args.task, tok, r) for r in train]
    return train_control(run, args.task, tok, start, pairs, val, ComputeBudget(compute),
                         from_flags(args, GRPOConfig).max_new_tokens, lr)


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
                               from_flags(args, GRPOConfig).max_new_tokens)
