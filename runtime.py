"""
The run plumbing every script shares: *how* a run executes (torchrun ranks, devices, precision,
printing, the one way out on an error), not *what* it trains, so the scripts stay straight-line
nanoGPT style; the scale path GRPO and MLE step through (DDP, FSDP); forked processes on a CPU.
Why: docs/engineering.md (The GPU path, Reliability).

    run = Run(args, out_dir, path_flags)    # after argparse: DDP, device per rank, seed, autocast
    run.print0(...), run.log({...}), run.barrier(), run.fail("message")
    model, trained = run.wrap(model)        # to the device, DDP (FSDP with --fsdp=1)
    nan = NanPolicy(run, "rlvr")            # --on_nan: if nan.finite(step, model, loss): opt.step()
    budget, child = control_beside(run, control, rl_file)   # MLE on the second core
    results = fork_map(evaluate_one, jobs, workers=2)   # jobs shared by 2 forked processes
    results = rank_map(evaluate_batch, batches)   # shared by the torchrun ranks, all get all
"""
import copy
import datetime
import json
import math
import multiprocessing as mp
import os
import re
import sys
import threading
import time
import zlib
from collections import namedtuple
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from checkpoint import read_meta
from model import finite_weights, is_fsdp

# a rank's wait at a collective: NCCL's 10 minutes is less than rank 0 may work alone at scale
DIST_TIMEOUT = datetime.timedelta(minutes=60)
FAILED = "failed"   # the group store's key of the first failing rank's line (Run.fail)
MAX_SKIPS = 10   # --on_nan=skip stops the run after this many skipped steps in a row


class Run:
    """Rank, world size, device and precision of this process, and the helpers that need them."""
    def __init__(self, args, out_dir, path_flags=()):
        """path_flags: the flags holding paths, recorded relative to out_dir (`recorded_args`)."""
        self.args, self.out_dir, self.path_flags = args, Path(out_dir), path_flags
        self.recorded = {}   # entries recorded beside the flags (train_lang.py: its tokenizer)
        self.or_fail(check_device, args.device)
        self.ddp = int(os.environ.get("RANK", -1)) != -1   # launched by torchrun
        # one process: rank 0 of 1 on --device; torchrun: its rank, its GPU, fail's store, watcher
        self.rank, self.world, self.device, self.store, self.watcher = (
            join_process_group(args.device) if self.ddp else (0, 1, args.device, None, None))
        self.master = self.rank == 0
        self.forks = self.world == 1 and self.device == "cpu"   # a second core for forked work
        self.fsdp = self.ddp and bool(getattr(args, "fsdp", 0))   # --fsdp=1 (one process: whole)
        self.load_device = "cpu" if self.fsdp else self.device   # wrap shards from the CPU
        if getattr(args, "fsdp", 0) and not self.ddp:
            self.print0("--fsdp=1 without torchrun: one process, nothing to shard (kept whole)")
        if self.ddp and getattr(args, "on_nan", "stop") == "skip":
            self.fail("--on_nan=skip is for single-process runs (under torchrun use --on_nan=stop)")
        torch.set_num_threads(getattr(args, "threads", 1))   # a script without --threads: 1
        torch.manual_seed(args.seed)
        if args.dtype == "float16":   # its gradients underflow; bfloat16 has float32's range
            self.fail("--dtype=float16: needs a gradient scaler (none here); use --dtype=bfloat16")
        self.dtype = getattr(torch, args.dtype)   # the forwards' (autocast's, a frozen reference's)
        self.autocast = torch.autocast(torch.device(self.device).type, dtype=self.dtype,
                                       enabled=args.dtype != "float32")

    def print0(self, *a, **k):
        if self.master:
            print(*a, **k, flush=True)

    def fail(self, msg):
        # torchrun: every rank ends at once with the first failing rank's line (watch_failures)
        if getattr(self, "watcher", None) and self.watcher.is_alive():
            self.store.compare_set(FAILED, "", msg)   # (a line posted first stays)
            self.watcher.join(60)   # it prints the line and ends this process
        last_line(msg)
        sys.exit(1)

    def or_fail(self, fn, *a):
        """fn(*a); a ValueError (a bad file or flag, in one line naming it) stops the run."""
        try:
            return fn(*a)
        except ValueError as e:
            self.fail(str(e))

    def log(self, row):
        """Append one JSON line to out_dir/log.jsonl (rank 0 only)."""
        if self.master:
            with open(self.out_dir / "log.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")

    def barrier(self):
        if self.ddp:
            dist.barrier()

    def sum_ranks(self, x):
        """A number summed over the ranks (one process: x itself)."""
        if not self.ddp:
            return x
        t = torch.tensor([float(x)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.item()

    def any_rank(self, flag):
        """True on every rank if any rank's `flag` is (one rank leaving a loop alone would hang)."""
        return self.sum_ranks(bool(flag)) > 0

    def finish(self):
        if self.ddp:
            dist.barrier()   # every rank is done: the watchers read "" (no failure) and stop
            self.store.compare_set(FAILED, "", "")
            self.watcher.join()
            dist.barrier()   # no rank tears the group down while another still talks to it
            dist.destroy_process_group()

    def wrap(self, model, grad_ckpt=False):
        """-> (model on the device, the module to train: DDP-wrapped, or sharded with --fsdp=1:
        from the CPU a unit at a time, so no GPU holds the whole float32 model)."""
        model = model if self.fsdp else model.to(self.device)
        if grad_ckpt:   # (a VQ-VAE has none)
            model.grad_ckpt = True
        if self.fsdp:
            self.shard(model).h[-1].set_reshard_after_backward(False)   # no_sync_unless_last frees
        elif self.ddp:   # its gradients: views of its all-reduce buckets (no second copy)
            ddp = torch.nn.parallel.DistributedDataParallel
            return model, ddp(model, gradient_as_bucket_view=True)
        return model, model

    def reference(self, model):
        """The KL's frozen reference: `model` copied in the forwards' dtype (--fsdp=1: on the CPU,
        then sharded; grpo_step gathers it for its log-probs after the policy's are freed)."""
        ref = copy.deepcopy(model).eval().requires_grad_(False).to(self.dtype)
        return self.shard(ref) if self.fsdp else ref.to(self.device)

    def shard(self, model):
        """`model` sharded by FSDP, a unit per block then the root (embeddings, norm, head), each
        moved to the device in turn; bf16: gathered in bf16, gradients reduced in float32."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard   # (takes a second)
        mp = MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)
        for m in (*model.h, model):
            fully_shard(m, mp_policy=mp)
        with torch.no_grad(), self.autocast:   # FSDP finds its root at the first forward (the
            model(torch.zeros(1, 1, dtype=torch.long, device=self.device))   # sampler calls blocks)
        model.reshard()   # (the root keeps its forward's weights; AdamW must get the shards)
        return model


class NanPolicy:
    """--on_nan for one stage's loop: a NaN/inf loss, reward or gradient stops the run, or (skip)
    drops that step; created beside the loop, one per stage."""
    def __init__(self, run, stage):
        self.run, self.stage, self.skips, self.last_skip = run, stage, 0, None

    def check_start(self, model):
        """A start with non-finite weights stops before anything samples from it."""
        if not finite_weights(model):
            self.nonfinite(0, model, "non-finite weights in the policy")

    def nonfinite(self, step, model, what):
        """A NaN/inf `what` at `step`: --on_nan=stop ends the run with one line; --on_nan=skip logs
        it and returns (the caller drops the step), unless the weights are too or MAX_SKIPS were."""
        msg = f"{self.stage}: {re.sub(r' at step [0-9]+$', '', what)} at step {step}"
        if not finite_weights(model):
            self.run.fail(f"{msg}: the weights are non-finite; stopping (the last checkpoint is "
                          "intact)")
        if getattr(self.run.args, "on_nan", "stop") == "skip":
            self.skips = self.skips + 1 if self.last_skip == step - 1 else 1
            self.last_skip = step
            if self.skips <= MAX_SKIPS:
                self.run.print0(f"\n{msg}: step skipped (--on_nan=skip)")
                self.run.log({"stage": self.stage, "step": step, "skipped": what})
                return
            msg += f" ({MAX_SKIPS} steps in a row already skipped)"
        self.run.fail(f"{msg}; stopping before it reaches the weights (the last checkpoint is "
                      f"intact; --on_nan=skip skips such steps)")

    def finite(self, step, model, loss, grad_norm=None):
        """May the optimizer step? Yes if `loss` and `grad_norm` are finite; else `nonfinite`."""
        for what, x in (("loss", loss), ("gradient norm", grad_norm)):
            if x is not None and not torch.isfinite(x):
                self.nonfinite(step, model, f"non-finite {what} ({x.item()})")
                return False
        return True


def check_ranks_in_sync(run, model, stage):
    """Under DDP (not FSDP: shards) log each rank's weight checksum, stop on a mismatch."""
    if not run.ddp or run.fsdp:
        return
    sums = [None] * run.world   # CRC32 of the weights' bytes: equal iff bit-identical
    crc = zlib.crc32(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters()))
    dist.all_gather_object(sums, crc)
    run.print0(f"{stage}: weight checksums per rank {sums}")
    run.log({"stage": stage, "rank_checksums": sums})
    if len(set(sums)) != 1:
        run.fail(f"ranks diverged: weight checksums {sums}")


def join_process_group(device):
    """A torchrun rank joins the others (NCCL on its GPU, or gloo) -> (rank, world size, device:
    LOCAL_RANK's GPU, the group's store, watch_failures's thread)."""
    # each torchrun attempt keeps its keys under its own prefix: after a restart the shared store
    # still holds the dead attempt's addresses, and a new rank would dial them
    store, rank, world = next(dist.rendezvous("env://"))
    prefix = f"attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    gpu = device.startswith("cuda") and torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    if gpu:   # (NCCL binds to it at once: device_id)
        torch.cuda.set_device(gpu)
    dist.init_process_group(backend="nccl" if gpu else "gloo", rank=rank, world_size=world,
                            store=(store := dist.PrefixStore(prefix, store)), timeout=DIST_TIMEOUT,
                            device_id=gpu or None)
    return rank, world, str(gpu or device), store, watch_failures(prefix, rank, world)


def watch_failures(prefix, rank, world):
    """Start this rank's watcher -> the thread: once a rank's Run.fail posts its line in the group's
    store, every rank prints it and ends, none left waiting for a dead peer (NCCL: DIST_TIMEOUT)."""
    store = dist.PrefixStore(prefix, dist.TCPStore(   # its own connection: its get holds it
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
        timeout=datetime.timedelta(days=3650)))

    def watch():
        msg = ""
        with suppress(dist.DistError):   # (the store is gone: the run has ended)
            msg = store.get(FAILED).decode()   # a rank's line, or "" (Run.finish: none failed)
        if msg:
            last_line(msg)   # then nothing: the main thread's error as peers exit ends it at once
            sys.excepthook = lambda *a: os._exit(1)   # (finalizing torch there may abort)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)   # (and C++'s warnings go nowhere)
            with suppress(dist.DistError):   # every rank has printed it (the store may be rank 0's)
                store.set(f"{FAILED}{rank}", "")
                store.wait([f"{FAILED}{r}" for r in range(world)], datetime.timedelta(seconds=30))
            os._exit(1)
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def last_line(msg):
    """`msg`, the process's last line, on stderr (after its progress bars, closed)."""
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
    print(f"error: {msg}", file=sys.stderr, flush=True)


def check_device(device):
    """ValueError, in one line, when `device` is not one this torch can run on (cpu, cuda:N)."""
    try:
        d = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device}: not a device; use cpu, cuda or cuda:N") from None
    if d.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: only cpu and cuda are supported")
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA GPU; "
                         "use --device=cpu")
    if d.type == "cuda" and d.index is not None and d.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: there are {torch.cuda.device_count()} CUDA GPUs")


def check_ranges(parser, args, at_least_1=(), at_least_0=()):
    """parser.error on the first flag out of range: at_least_1 >= 1, at_least_0 >= 0 (not NaN)."""
    for low, names in ((1, at_least_1), (0, at_least_0)):
        for name in names:
            if not getattr(args, name) >= low:
                parser.error(f"--{name} must be >= {low}, got {getattr(args, name)}")


def lr_at(step, total, base, warmup):
    """Linear warmup over `warmup` steps, then cosine decay from base to 0.1 * base at `total`."""
    if step < warmup:
        return base * (step + 1) / warmup
    return base * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (step - warmup)
                                                                 / max(1, total - warmup)))))


# -----------------------------------------------------------------------------
# the scale path of a GRPO or MLE step: several processes (DDP, or FSDP's shards) take the same
# optimizer steps; on one process each of these is a no-op

@contextmanager
def unsharded(model):
    """FSDP: the full weights inside (all ranks enter), for the sampler, past FSDP's hooks."""
    units = [m for m in model.modules() if is_fsdp(m)]   # the root, then each block
    for m in units:   # gathered, and kept through the forwards inside (each rank's own number)
        m.unshard()
        m.set_reshard_after_forward(False, recurse=False)
    yield
    for i, m in enumerate(units):
        m.reshard()
        m.set_reshard_after_forward(i > 0, recurse=False)   # the blocks' again; the root's not


@contextmanager
def no_sync_unless_last(policy, last):
    """DDP all-reduces the gradients on a minibatch's last chunk only. FSDP reduce-scatters a
    block's each chunk and frees its weights, the last block's here (a prompt pass needs them)."""
    with policy.no_sync() if not last and hasattr(policy, "no_sync") else nullcontext():
        yield
    if is_fsdp(policy):
        policy.h[-1].reshard()


# the update's plan, per minibatch: this rank's micro-batches (row lists); `pad`, the passes without
# rows it runs to match the others (FSDP: as many passes as the rank with the most; DDP: one on a
# rank with none); the loss's normalisers `tokens` and `parts` (rows; verl's "micro-token-mean":
# this rank's micro-batches), the counts summed over the ranks over their number: DDP and FSDP
# average the ranks' gradients, which then equal one process's on all the rows
Minibatch = namedtuple("Minibatch", "micro pad tokens parts")


def plan_update(policy, b, cfg, generator):
    """The GRPO update's plan, once a step -> a Minibatch each: every epoch the N rows of Batch b
    (None: none) shuffled, cut into cfg.minibatches, each into micro-batches of cfg.micro_batch
    rows (several: in row order, a prompt's samples together), evened out over the ranks."""
    N, mu = (0 if b is None else len(b.idx)), cfg.micro_batch
    per_mb = math.ceil(N / cfg.minibatches)
    orders = [torch.randperm(N, generator=generator).tolist() for _ in range(cfg.ppo_epochs)]
    mbs = [order[m * per_mb:(m + 1) * per_mb] for order in orders for m in range(cfg.minibatches)]
    micro = [[(mb if len(mb) <= mu else sorted(mb))[s:s + mu] for s in range(0, len(mb), mu)]
             for mb in mbs]
    device = next(policy.parameters()).device
    have = torch.tensor([len(c) for c in micro], device=device)   # micro-batches here
    totals = torch.tensor([[float(b.mask[mb].sum()) if mb else 0.0, len(mb)] for mb in mbs],
                          dtype=torch.float64, device=device)       # (minibatches, 2)
    most, world, fsdp = have.clone(), 1, is_fsdp(policy)
    if hasattr(policy, "no_sync") or fsdp:   # DDP / FSDP
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        dist.all_reduce(totals)
        world = dist.get_world_size()
    return [Minibatch(c, m - n if fsdp else int(m > 0 and n == 0), tokens / world,
                      n if cfg.loss_agg == "micro-token-mean" else rows / world)
            for c, n, m, (tokens, rows) in zip(micro, have.tolist(), most.tolist(),
                                               totals.tolist())]


def over_ranks(policy, sums, maxes):
    """Dicts of numbers -> the same, summed (sums) and maxed (maxes) over the ranks (DDP, FSDP)."""
    if not (hasattr(policy, "no_sync") or is_fsdp(policy)):
        return sums, maxes
    device = next(policy.parameters()).device
    out = []
    for d, op in ((sums, dist.ReduceOp.SUM), (maxes, dist.ReduceOp.MAX)):
        t = torch.tensor([float(v) for v in d.values()], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op)
        out.append(dict(zip(d, t.tolist())))
    return tuple(out)


def join_rows(parts):
    """Consecutive rows' (tokens, log-probs, sampled or None) -> one, right-padded."""
    T = max(p[0].shape[1] for p in parts)
    return tuple(None if parts[0][i] is None else torch.cat(
        [torch.nn.functional.pad(p[i], (0, T - p[i].shape[1]), value=v) for p in parts])
        for i, v in enumerate((-1, 0.0, False)))


def join_passes(policy, n, autocast):
    """n passes without rows (Minibatch.pad): 0 gradients of a 1-token prompt and row, that join
    the collectives of a rank with more micro-batches, in its autocast (its casts order them)."""
    one = torch.zeros(1, 1, dtype=torch.long, device=next(policy.parameters()).device)
    for _ in range(n):
        with no_sync_unless_last(policy, True):
            with autocast:
                out = policy(one, prompts=(one, one[0] + 1, one[0]))[0]
            (out.float().sum() * 0.0).backward()


def check_step(model, step, autocast):
    """grpo_step's guards: no enclosing autocast (ValueError), finite weights (FloatingPointError)
    -> True when `autocast` or the weights make the forwards bf16 / fp16."""
    device = model.wte.weight.device.type
    if torch.is_autocast_enabled(device):
        raise ValueError("grpo_step: called inside an autocast region, where its optimizer steps "
                         "would leave the forwards on stale weights; pass autocast= instead")
    if not finite_weights(model):
        raise FloatingPointError(f"non-finite weights in the policy at step {step}")
    with autocast:   # its dtype, read inside it
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    return dtype not in (None, torch.float32) or next(model.parameters()).dtype != torch.float32


# -----------------------------------------------------------------------------
# more processes: on two cores a second one beside the run (fork: the child inherits the loaded
# data and models, nothing is pickled but jobs and results; CPU only, where forking after torch has
# run is safe); under torchrun the ranks share jobs (rank_map: the final evaluations' batches)

def fork_alongside(target, log_path):
    """target() in a forked process printing to log_path, dying with the parent -> the process."""
    parent = os.getpid()

    def orphaned():   # a parent killed outright (SIGKILL, out of memory) cannot stop its child: the
        while os.getppid() == parent:   # child stops itself within half a second
            time.sleep(0.5)
        os._exit(1)

    def main():
        threading.Thread(target=orphaned, daemon=True).start()
        with open(log_path, "w") as f:
            sys.stdout = sys.stderr = f
            target()

    child = mp.get_context("fork").Process(target=main, daemon=True)
    child.start()
    return child


class ComputeBudget:
    """The control's allowance: RLVR's compute in forward-token units (grpo.step_stats). Given a
    total: a finished RLVR's; else shared with a control forked beside a running RLVR."""
    def __init__(self, total=None):
        fork = mp.get_context("fork")
        self.rl = fork.Value("d", total or 0.0)   # RLVR's compute so far, shared across the fork
        self.closed = fork.Event()                # set: RLVR has ended, self.rl is final
        if total is not None:
            self.closed.set()

    def add(self, compute):
        with self.rl.get_lock():
            self.rl.value += compute

    def close(self):
        self.closed.set()

    def reached(self, used):
        """True once `used` is at least RLVR's whole compute (waiting while RLVR is behind)."""
        while used >= self.rl.value and not self.closed.is_set():
            time.sleep(0.05)
        return used >= self.rl.value


def control_beside(run, control, rl_file):
    """Start control(budget), MLE from the RLVR start for RLVR's compute: on a CPU in a forked
    process on the second core *while* RLVR runs, waiting whenever it is ahead -> (the budget RLVR
    adds to, the process); otherwise (a GPU, torchrun, RLVR done) -> (the budget, None)."""
    budget = ComputeBudget()
    done = run.args.resume and rl_file.is_file() and read_meta(rl_file)["metrics"].get("done")
    if control is None or not run.forks or done:
        return budget, None
    log = run.out_dir / "control.log"   # the child shares the loaded data and models
    child = fork_alongside(lambda: control(budget), log)
    run.print0(f"control: MLE continues from the start in process {child.pid} while RLVR runs "
               f"(progress: {log})")
    return budget, child


def control_after(run, child, control, rl_file):
    """After RLVR: wait for the forked control, or run control (None: none) for rl_file's."""
    if child is not None:
        child.join()
        if child.exitcode:
            run.fail(f"the control failed (exit {child.exitcode}); see {run.out_dir}/control.log")
    elif control is not None:
        control(ComputeBudget(read_meta(rl_file)["metrics"].get("rl_compute", 0)))


def fork_map(fn, jobs, workers):
    """[fn(job) for job in jobs], in order, by `workers` forked processes (largest jobs first)."""
    if workers <= 1:
        return [fn(job) for job in jobs]
    global _fork_fn
    # a forked worker inherits this closure; the pool pickles only the jobs and results
    _fork_fn = fn
    with mp.get_context("fork").Pool(workers) as pool:
        return pool.map(_call_fork_fn, jobs, chunksize=1)


def _call_fork_fn(job):
    return _fork_fn(job)


def rank_map(fn, jobs):
    """[fn(job) for job in jobs] on every rank; under torchrun rank r does jobs r, r + world..."""
    jobs = list(jobs)
    if not dist.is_initialized():
        return [fn(job) for job in jobs]
    rank, world = dist.get_rank(), dist.get_world_size()
    parts = [None] * world
    dist.all_gather_object(parts, [fn(job) for job in jobs[rank::world]])
    return [parts[i % world][i // world] for i in range(len(jobs))]
