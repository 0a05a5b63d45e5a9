"""
Shared helpers for the bench/ scripts: thread settings, interleaved timing with medians, the machine line, tables.

Every bench script compares us with a reference tool *in the same process and run*: the two are timed in turn
(ours, theirs, ours, theirs, ...) after a warm-up, and the median of the repeats is reported, so background load
affects both sides alike and the ratio stays fair on a shared machine.
"""
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench scripts import the components (model.py, grpo.py, rewards.py) from the root
    sys.path.insert(0, str(ROOT))


def thread_list(text):
    """'1,2' -> [1, 2]; the --threads flag of every bench script."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise SystemExit(f"--threads: expected a comma-separated list of positive integers, got {text!r}")
    return out


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine():
    """One line naming the machine, the software and the load it ran under."""
    load = "%.2f" % os.getloadavg()[0] if hasattr(os, "getloadavg") else "?"
    return (f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, python {platform.python_version()}, "
            f"load average {load} at start")


def timed(fn, clock=time.perf_counter):
    t0 = clock()
    fn()
    return clock() - t0


def interleaved(fns, repeats, warmup=1, clock=time.perf_counter):
    """fns: {name: zero-arg callable}. Runs each `warmup` times, then `repeats` rounds of all of them in turn.
    Returns {name: sorted list of seconds}. clock: wall time by default; time.process_time (the CPU time of this
    process) suits one-thread runs on a shared machine, where the time given to other processes is not ours."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn, clock))
    return {k: sorted(v) for k, v in times.items()}


def matmul_run(n):
    """A zero-arg function multiplying two float32 (n, n) matrices about 2 GFLOP's worth, and the FLOPs it does: timed
    beside the measured code, it gives the machine's matmul peak under the same load (the roofline's ceiling)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    reps = max(1, int(2e9 // (2 * n ** 3)))

    def run():
        for _ in range(reps):
            a @ b
    return run, 2 * n ** 3 * reps


def bandwidth(device, repeats=5):
    """Memory bandwidth in bytes/s: the best of `repeats` copies of a tensor on `device` into
    another (each byte read once and written once; 1 GiB on a GPU, 256 MiB on a CPU), timed with
    a sync on a GPU."""
    device = torch.device(device)
    gib = 1.0 if device.type == "cuda" else 0.25
    src = torch.empty(int(gib * 2 ** 30), dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best = float("inf")
    for _ in range(repeats + 1):   # the first one warms up
        sync()
        t0 = time.perf_counter()
        dst.copy_(src)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() / best


def weight_bytes(model):
    """Bytes of weights a decode step reads: every parameter once (a tied LM head once), but the
    token embedding when untied (a step reads only its rows' entries)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    w = model.wte.weight
    return total - (0 if model.lm_head.weight is w else w.numel() * w.element_size())


def median(xs):
    return statistics.median(xs)


def print_table(headers, rows, title=None):
    """A markdown table (pasted into the README as it is)."""
    if title:
        print(f"\n{title}")
    print("| " + " | ".join(headers) + " |")
    print("| " + " | ".join("---" if i == 0 else "---:" for i in range(len(headers))) + " |")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    sys.stdout.flush()
