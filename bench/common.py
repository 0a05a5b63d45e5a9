"""
Shared helpers for the bench/ scripts: thread settings, interleaved timing with medians, the machine line, tables,
the bytes a decode step moves (the bandwidth bounds).

Every bench script compares us with a reference tool *in the same process and run*: the two are timed in turn
(ours, theirs, ours, theirs, ...) after a warm-up, and the median of the repeats is reported, so background load
affects both sides alike and the ratio stays fair on a shared machine.
"""
import math
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


def decode_traffic(config, itemsize, prompts, prompt_len, samples, new, vocab=None, static=False,
                   width=None):
    """The bytes one decode step of engine.generate reads and writes, by part, averaged over the
    decode: R = prompts x samples rows, the prompts left-padded to prompt_len, `new` tokens each,
    the weights and the KV cache at itemsize bytes a value, sampling over the ids below vocab
    (None: all). Each op reads its inputs and writes its output once (a kernel taking two passes
    moves more). Pure arithmetic on the config, so it runs anywhere (bench/gpu_check.py's rows).
    - weights: every matrix, bias and norm once, the LM head included; of the token (and learned
      position) embeddings only the R rows looked up;
    - cache: the keys and values decode_attention reads (the prompts' once per prompt, shared by
      their samples; each row's own: on the eager path those written so far, new / 2 on average,
      on the static path those written rounded up to `width` (engine_static.WIDTH; None: all `new`)) and
      the step's k, v written;
    - sampling: the logits (R, vocab_size) written, then sample_next's float32 copy, log_softmax,
      exp and float64 cumsum over the sampled ids;
    - scores: decode_attention's scores and probabilities, R x n_head rows of prompt_len + T
      (T: the generated positions read): the masks added, the two scaled products, the prompt
      part regrouped twice (when samples and n_kv_head > 1), cat, softmax, the products with v.
    Left out: the activations (R x n_embd, R x mlp_hidden), a few MB that stay in a GPU's L2
    cache; the scores, a few MB a layer, may stay there too."""
    c, R, P = config, prompts * samples, prompt_len
    C, nh, nkv, hd, H = c.n_embd, c.n_head, c.n_kv_head, c.head_dim, c.mlp_hidden
    qkv, mlp_in = (nh + 2 * nkv) * hd, (2 if c.mlp == "swiglu" else 1) * H
    norm = C * (2 if c.bias and c.norm == "layernorm" else 1)             # gain (and bias)
    layer = C * qkv + nh * hd * C + C * mlp_in + H * C + 2 * norm
    if c.bias:   # GPT-2: every Linear's
        layer += qkv + C + mlp_in + C
    elif c.qkv_bias:   # Qwen2: q, k, v's
        layer += qkv
    rows = R * C * (2 if c.pos == "learned" else 1)                       # embedding lookups
    weights = (c.n_layer * layer + norm + c.vocab_size * C + rows) * itemsize
    w = width or new   # static: step i (1 .. new - 1) reads i positions rounded up to w
    T = sum(min(new, w * math.ceil(i / w)) for i in range(1, new)) / max(new - 1, 1) if static \
        else new / 2
    position = c.n_layer * 2 * nkv * hd * itemsize                         # k and v, all layers
    cache = position * (prompts * P + R * T + R)
    V, v = c.vocab_size, vocab or c.vocab_size
    cast = 0 if itemsize == 4 else itemsize + 4                            # .float()
    sampling = R * V * itemsize + R * v * (cast + 8 + 8 + 12)              # log_softmax, exp, cumsum
    regroup = 4 if samples > 1 and nkv > 1 else 0
    scores = c.n_layer * R * nh * itemsize * ((7 + regroup) * P + (10 if static else 8) * T)
    return dict(weights=weights, cache=cache, sampling=sampling, scores=scores)


def traffic_text(parts, bw):
    """decode_traffic's parts -> "weights 0.74 + cache 0.94 ms ..." at bw bytes/s."""
    ms = {k: f"{v / bw * 1e3:.3g}" for k, v in parts.items()}
    return (f"a step moves weights {ms['weights']} + cache {ms['cache']} + sampling "
            f"{ms['sampling']} (+ scores {ms['scores']}) ms at {bw / 1e9:,.0f} GB/s")


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
