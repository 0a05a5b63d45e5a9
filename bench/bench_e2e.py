"""
End to end: wall time and peak memory of the two default jobs, and whether memory grows across RL steps.

    python bench/bench_e2e.py                # the real defaults: train_lang.py and train_video.py (~15 min quiet)
    python bench/bench_e2e.py --quick        # the same jobs with 5 RL steps and a 100-record test split (~3 min)
    python bench/bench_e2e.py --tiny         # train_lang.py with one tiny RL step; the smoke test in tests/test_bench.py

Each job runs as a subprocess (`python train_lang.py`, `python train_video.py`, their defaults plus --out_dir in a
temporary directory so earlier results in out/ are neither reused nor overwritten, and --threads); its wall time,
peak resident memory (`wait4`'s ru_maxrss) and the median GRPO step and rollout times from its log.jsonl are
reported. Then, in this process, `grpo.grpo_step` runs --mem_steps times on the shipped text-game MLE model and
text-game prompts (the default job's RL settings, fewer prompts), and the resident memory after each step is
compared after the warm-up steps and at the end: the bytes of live tensors, and the resident memory after handing
freed memory back to the OS (glibc keeps freed blocks for reuse, so untrimmed RSS wanders with each step's shapes;
its peak is given too).
"""
import argparse
import copy
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import ROOT, machine, median, print_table

from data.textgame.prepare import generate_split  # noqa: E402
from data.textgame.task import is_changed, prompt_text  # noqa: E402
from grpo import Env, GRPOConfig, grpo_step  # noqa: E402
from tasks import TASKS, load_lang_model  # noqa: E402

# -----------------------------------------------------------------------------
# flags
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            allow_abbrev=False)
p.add_argument("--threads", type=int, default=1, help="--threads passed to the jobs and used here")
p.add_argument("--jobs", default=None, help="comma list of lang|video ('' = memory check only); default both, "
               "--tiny: lang")
p.add_argument("--quick", action="store_true", help="5 RL steps and a 100-record / 10-episode test split per job")
p.add_argument("--tiny", action="store_true", help="one RL step per job, tiny test splits, 3 memory-check steps")
p.add_argument("--mem_steps", type=int, default=30, help="GRPO steps of the in-process memory check")
p.add_argument("--mem_warmup", type=int, default=5, help="steps before memory is expected to be flat")
p.add_argument("--mem_prompts", type=int, default=4, help="prompts per memory-check step (x G=8 samples)")
p.add_argument("--mem_tokens", type=int, default=200, help="max new tokens per sample in the memory check")
args = p.parse_args()
EXTRA = {"lang": [], "video": []}
if args.quick:
    EXTRA = {"lang": ["--rl_steps=5", "--eval_limit=100"], "video": ["--rl_steps=5", "--test_limit=10"]}
    args.mem_steps, args.mem_warmup = 12, 4
if args.tiny:
    EXTRA = {"lang": ["--rl_steps=1", "--eval_limit=4", "--prompts_per_step=2", "--group_size=2",
                      "--max_new_tokens=32"],
             "video": ["--rl_steps=1", "--test_limit=1", "--prompts_per_step=2", "--group_size=2"]}
    args.mem_steps, args.mem_warmup, args.mem_prompts, args.mem_tokens = 3, 1, 2, 32
args.jobs = args.jobs if args.jobs is not None else "lang" if args.tiny else "lang,video"


def rss_mb(trim=False):
    """Resident memory of this process; trim: first hand the allocator's free memory back to the OS (glibc's
    malloc_trim), so what remains is memory in use, not memory freed and kept for reuse."""
    if trim:
        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def tensor_mb():
    """Memory of the tensors still alive (model, optimizer state and anything a step left behind)."""
    seen = {}
    for o in gc.get_objects():
        if torch.is_tensor(o) and o.device.type == "cpu":
            seen[o.untyped_storage().data_ptr()] = o.untyped_storage().nbytes()
    return sum(seen.values()) / 2 ** 20


# -----------------------------------------------------------------------------
# the default jobs, as subprocesses

def run_job(name, out_dir):
    threads = [f"--threads={args.threads}"] if name == "video" else []   # train_lang runs on 1 thread
    cmd = [sys.executable, f"train_{name}.py", f"--out_dir={out_dir}", *threads, *EXTRA[name]]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # reaps the job and reads its own resource usage
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out[-3000:]}")
    return " ".join(["python", *cmd[1:]]), wall, usage.ru_maxrss / 1024  # kB on Linux


# -----------------------------------------------------------------------------
# memory across RL steps, in this process

def memory_check():
    model, tok, _ = load_lang_model(ROOT / "checkpoints" / "textgame" / "mle.safetensors")
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    cfg = GRPOConfig(group_size=8, prompts_per_step=args.mem_prompts, max_new_tokens=args.mem_tokens, beta=0.02,
                     entropy_coef=0.0, minibatches=2, micro_batch=64, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    records = [r for r in generate_split("train", 400, 0) if is_changed(r)]
    task = TASKS["textgame"]

    def reward_fn(items, completions):
        texts = [tok.decode([t for t in c if t != tok.eos_id]) for c in completions]
        return [task.reward(t, r, "binary") for t, r in zip(texts, items)]

    g = torch.Generator().manual_seed(0)
    rss, times, w = [], [], min(args.mem_warmup, args.mem_steps - 1)
    for step in range(args.mem_steps):
        if step == w:
            in_use = (rss_mb(trim=True), tensor_mb())
        picks = [records[i] for i in torch.randint(len(records), (args.mem_prompts,), generator=g)]
        t0 = time.perf_counter()
        grpo_step(model, ref, opt, [tok.encode(prompt_text(r)) for r in picks], picks, Env(reward_fn, tok.eos_id),
                  cfg, g, step)
        times.append(time.perf_counter() - t0)
        rss.append(rss_mb())
    return in_use, (rss_mb(trim=True), tensor_mb()), max(rss), median(times)


# -----------------------------------------------------------------------------
torch.set_num_threads(args.threads)
mode = "tiny" if args.tiny else "quick" if args.quick else "default"
print(f"machine: {machine()}")
print(f"mode: {mode}; threads {args.threads}")
rows = []
with tempfile.TemporaryDirectory() as d:
    for name in [j for j in args.jobs.split(",") if j]:
        if name not in EXTRA:
            raise SystemExit(f"--jobs: unknown job {name!r} (lang|video)")
        print(f"running train_{name}.py ...", flush=True)
        cmd, wall, peak = run_job(name, Path(d) / name)
        log = [json.loads(line) for line in (Path(d) / name / "log.jsonl").read_text().splitlines()]
        rl = [r for r in log if r.get("stage") == "rlvr" and "t_step" in r]
        rows.append([f"`{cmd.replace(d, '<tmp>')}`", f"{wall / 60:.1f} min", f"{peak:,.0f} MB", len(rl),
                     f"{median([r['t_step'] for r in rl]):.2f} s", f"{median([r['t_rollout'] for r in rl]):.2f} s"])
if rows:
    print_table(["job", "wall", "peak RSS", "GRPO steps", "median s/step", "of which rollout"], rows,
                "default jobs end to end")
(rss0, t0), (rss1, t1), peak, step_s = memory_check()
n = args.mem_steps - min(args.mem_warmup, args.mem_steps - 1)
print_table(["GRPO steps", "live tensors", "RSS in use (trimmed)", "peak RSS (untrimmed)", "median s/step"],
            [[f"{n} after {args.mem_steps - n} warm-up", f"{t0:,.0f} -> {t1:,.0f} MB", f"{rss0:,.0f} -> {rss1:,.0f} MB",
              f"{peak:,.0f} MB", f"{step_s:.2f}"]],
            f"memory across RL steps (text game, {args.mem_prompts} prompts x 8, in process)")
