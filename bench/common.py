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


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved(fns, repeats, warmup=1):
    """fns: {name: zero-arg callable}. Runs each `warmup` times, then `repeats` rounds of all of them in turn.
    Returns {name: sorted list of seconds}."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn))
    return {k: sorted(v) for k, v in times.items()}


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
