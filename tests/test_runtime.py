"""The shared run plumbing on one process: the learning-rate schedule by hand, stage checkpoints that resume the exact
generator streams (and shrink to weights once done), one-line failures, NaN handling (--on_nan), the JSONL log, and the
flags recorded in out_dir/config.json that a re-run must match; and on two gloo ranks, rank_map and greedy decoding
shared by them."""
import argparse
import datetime
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from model import GPT, GPTConfig
import runtime
from checkpoint import check_config, read_meta, resume_stage, save_checkpoint, save_config, save_stage
from runtime import (MAX_SKIPS, ComputeBudget, NanPolicy, Run, check_device, check_ranges,
                     check_ranks_in_sync, fork_alongside, fork_map, lr_at, rank_map)
from tasks import generate_texts

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


def make_run(tmp_path, **kw):
    args = argparse.Namespace(device="cpu", dtype="float32", threads=1, seed=0, resume=1, ckpt_every=10, **kw)
    return Run(args, tmp_path)


def tiny():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16))


def test_lr_at_warmup_then_cosine_to_a_tenth():
    assert lr_at(0, 100, 1.0, 10) == pytest.approx(0.1)
    assert lr_at(9, 100, 1.0, 10) == pytest.approx(1.0)
    assert lr_at(10, 100, 1.0, 10) == pytest.approx(1.0)              # cosine starts at the base rate
    assert lr_at(55, 100, 1.0, 10) == pytest.approx(0.55)             # halfway: 0.1 + 0.45 * (1 + cos(pi / 2))
    assert lr_at(100, 100, 2.0, 10) == pytest.approx(0.2)
    assert lr_at(500, 100, 2.0, 10) == pytest.approx(0.2)             # stays at the floor past the end
    assert lr_at(0, 100, 1.0, 0) == pytest.approx(1.0)                # no warmup
    assert lr_at(25, 100, 1.0, 0) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))


def test_save_resume_round_trip_restores_weights_optimizer_and_generator(tmp_path):
    run = make_run(tmp_path)
    model = tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = torch.randint(0, 32, (2, 8))
    model(idx, idx)[1].backward()
    opt.step()
    g = torch.Generator().manual_seed(5)
    torch.randint(100, (7,), generator=g)
    ckpt = tmp_path / "stage.safetensors"
    save_stage(run, ckpt, model, opt, 3, {"loss": 1.5}, g, done=False)
    assert not ckpt.exists()                                          # step 3 is not a --ckpt_every multiple
    save_stage(run, ckpt, model, opt, 10, {"loss": 1.5}, g, done=False)
    expected = torch.randint(100, (20,), generator=g)

    model2 = GPT(model.config)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    g2 = torch.Generator().manual_seed(99)
    assert resume_stage(run, ckpt, model2, opt2, g2, "mle") == (10, False)
    assert torch.equal(torch.randint(100, (20,), generator=g2), expected)
    assert all(torch.equal(a, b) for a, b in zip(model2.parameters(), model.parameters()))
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_finished_stage_keeps_weights_only_and_is_reused(tmp_path, capsys):
    run = make_run(tmp_path)
    model, g = tiny(), torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = torch.randint(0, 32, (2, 8))
    model(idx, idx)[1].backward()
    opt.step()                                                       # Adam's moments: twice the weights
    ckpt = tmp_path / "stage.safetensors"
    save_stage(run, ckpt, model, opt, 10, {}, g, done=False)
    size_resumable = ckpt.stat().st_size
    save_stage(run, ckpt, model, opt, 13, {}, g, done=True)          # saved although 13 is off the schedule
    assert ckpt.stat().st_size < size_resumable / 2
    assert resume_stage(run, ckpt, GPT(model.config), opt, g, "rlvr") == (13, True)
    assert f"rlvr: {ckpt} is complete, reusing it" in capsys.readouterr().out
    run.args.resume = 0
    assert resume_stage(run, ckpt, GPT(model.config), opt, g, "rlvr") == (0, False)


def test_fail_is_one_line_on_stderr_and_exit_1(tmp_path, capsys):
    run = make_run(tmp_path)
    (tmp_path / "bad.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit) as e:
        resume_stage(run, tmp_path / "bad.safetensors", tiny(), None, torch.Generator(), "mle")
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "--resume=0" in err


def test_log_appends_json_lines_and_single_process_needs_no_process_group(tmp_path):
    run = make_run(tmp_path)
    assert (run.ddp, run.rank, run.world, run.master) == (False, 0, 1, True)
    run.log({"stage": "mle", "step": 1})
    run.log({"stage": "mle", "step": 2})
    run.barrier()
    check_ranks_in_sync(run, tiny(), "rlvr")                         # a no-op without DDP: nothing logged
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert rows == [{"stage": "mle", "step": 1}, {"stage": "mle", "step": 2}]


def test_nonfinite_stops_or_skips_and_still_stops_after_max_skips(tmp_path, capsys):
    model = tiny()
    nan = NanPolicy(make_run(tmp_path, on_nan="stop"), "mle")
    with pytest.raises(SystemExit):
        nan.nonfinite(7, model, "non-finite loss (nan)")
    err = capsys.readouterr().err
    assert err.startswith("error: mle: non-finite loss (nan) at step 7; stopping before it reaches the weights")
    assert err.count("\n") == 1
    nan = NanPolicy(make_run(tmp_path, on_nan="skip"), "rlvr")
    for step in [3, 5, *range(10, 10 + MAX_SKIPS)]:        # isolated skips, then MAX_SKIPS in a row: all allowed
        nan.nonfinite(step, model, f"non-finite GRPO loss at step {step}")
    skipped = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in skipped] == [3, 5, *range(10, 10 + MAX_SKIPS)] and skipped[0]["stage"] == "rlvr"
    with pytest.raises(SystemExit):                          # one more in a row: stop
        nan.nonfinite(10 + MAX_SKIPS, model, "non-finite reward")
    assert f"({MAX_SKIPS} steps in a row already skipped)" in capsys.readouterr().err
    with torch.no_grad():
        model.wte.weight[0, 0] = float("nan")
    with pytest.raises(SystemExit):                          # skipping cannot repair non-finite weights
        NanPolicy(make_run(tmp_path, on_nan="skip"), "mle").nonfinite(1, model, "non-finite loss (nan)")
    assert "the weights are non-finite" in capsys.readouterr().err


def test_resume_restores_the_global_generator_and_refuses_another_world_size(tmp_path, capsys):
    run = make_run(tmp_path)
    model, g = tiny(), torch.Generator().manual_seed(3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ckpt = tmp_path / "stage.safetensors"
    torch.manual_seed(11)
    save_stage(run, ckpt, model, opt, 10, {}, g, done=False)
    expected = torch.rand(5)                                 # the global stream after the checkpoint
    torch.manual_seed(0)
    assert resume_stage(run, ckpt, model, opt, g, "mle") == (10, False)
    assert torch.equal(torch.rand(5), expected)
    with safe_open(str(ckpt), framework="pt") as f:
        header, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    tensors["state.rng1"] = tensors["state.rng0"].clone()    # as if saved by two ranks
    save_file(tensors, str(ckpt), metadata=header)
    with pytest.raises(SystemExit):
        resume_stage(run, ckpt, model, opt, g, "mle")
    assert "another number of ranks" in capsys.readouterr().err


def test_check_ranges_names_the_first_bad_flag(capsys):
    p = argparse.ArgumentParser(prog="train_x.py")
    ok = argparse.Namespace(steps=1, lr=0.0)
    check_ranges(p, ok, at_least_1=("steps",), at_least_0=("lr",))     # in range: nothing happens
    for bad, msg in ((dict(steps=0, lr=0.1), "--steps must be >= 1, got 0"),
                     (dict(steps=2, lr=float("nan")), "--lr must be >= 0, got nan")):
        with pytest.raises(SystemExit):
            check_ranges(p, argparse.Namespace(**bad), at_least_1=("steps",), at_least_0=("lr",))
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"train_x.py: error: {msg}"


def test_fork_map_and_fork_alongside(tmp_path):
    """fork_map: the jobs' results in order, from 2 forked processes as from one; fork_alongside: the child's prints
    go to its log file; a ComputeBudget shared with it makes it wait for the parent's compute, then stop at its total."""
    offset = 10   # a closure over the parent's state: a forked worker inherits it, nothing is pickled but the jobs
    jobs = [3, 1, 2, 5]
    assert fork_map(lambda j: (j * j + offset, os.getpid()), jobs, 1)[0][0] == 19
    two = fork_map(lambda j: (j * j + offset, os.getpid()), jobs, 2)
    assert [r for r, _ in two] == [19, 11, 14, 35] and os.getpid() not in {pid for _, pid in two}

    budget = ComputeBudget()

    def target():   # the control: one unit of compute a step, until the budget is reached
        used = 1
        while not budget.reached(used):
            used += 1
        print(f"stopped at {used} in {os.getpid()}")

    child = fork_alongside(target, tmp_path / "child.log")
    budget.add(3)                      # RLVR's first steps: the child catches up, then waits
    time.sleep(0.3)
    assert child.is_alive()            # it waits while RLVR runs
    budget.add(2)
    budget.close()                     # RLVR ended at 5 units: the child stops at its 5th step
    child.join(10)
    assert child.exitcode == 0
    assert (tmp_path / "child.log").read_text() == f"stopped at 5 in {child.pid}\n"


def test_fork_alongside_child_dies_with_a_killed_parent(tmp_path):
    """A run killed outright (SIGKILL: no atexit, no daemon clean-up) leaves no control process behind, which would
    otherwise wait forever or write the control's checkpoint beside a re-run's."""
    root = Path(__file__).resolve().parents[1]
    script = (f"import sys, time; sys.path.insert(0, {str(root)!r}); from runtime import fork_alongside; "
              f"child = fork_alongside(lambda: time.sleep(60), {str(tmp_path / 'child.log')!r}); "
              f"print(child.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()

    def alive(pid):   # a process that has not exited (an unreaped zombie has)
        try:
            return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
    deadline = time.time() + 10
    while alive(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(child), "the forked child outlived its killed parent"


def config_run(out, capsys=None, **flags):
    """A Run over out_dir `out` with a few flags of each kind; -> (run, the record check_config returned)."""
    args = dict(device="cpu", dtype="float32", threads=1, seed=0, resume=1, ckpt_every=10, lr=0.1,
                data_dir=str(out.parent / "data"), init="scratch", out_dir=str(out), test_limit=0)
    run = Run(argparse.Namespace(**{**args, **flags}), out, path_flags=("data_dir", "init", "out_dir"))
    return run, check_config(run, ["mle.safetensors"])


def test_config_refuses_a_rerun_with_other_flags(tmp_path, capsys):
    out = tmp_path / "out"
    run, record = config_run(out)
    assert not out.exists()                                   # checking writes nothing
    save_config(run, record)
    saved = json.loads((out / "config.json").read_text())
    assert saved["data_dir"] == str((tmp_path / "data").resolve()) and saved["out_dir"] == "."   # outside the repo
    (out / "mle.safetensors").write_bytes(b"")
    config_run(out)                                           # the same flags: resumes
    config_run(out, device="cpu:0", threads=2, ckpt_every=5)  # flags that cannot change the trained weights
    config_run(out, data_dir=os.path.relpath(tmp_path / "data"))   # the same folder, spelled otherwise
    assert capsys.readouterr().out == ""
    config_run(out, test_limit=10)                            # the final evaluation only: evaluated again
    assert capsys.readouterr().out == "config.json: the trained stages are reused and evaluated again with " \
                                      "--test_limit 0 -> 10\n"
    for flags, named in ((dict(lr=0.2), "--lr 0.1 -> 0.2"),
                         (dict(seed=1, test_limit=5), "--seed 0 -> 1, --test_limit 0 -> 5"),
                         (dict(init=str(tmp_path / "ckpt.safetensors")),
                          f"--init scratch -> {tmp_path.resolve() / 'ckpt.safetensors'}")):
        with pytest.raises(SystemExit):
            config_run(out, **flags)
        assert capsys.readouterr().err == (f"error: {out} holds a run with other flags: {named}; use a new --out_dir, "
                                           f"or --resume=0 to start over in {out}\n")
    config_run(out, lr=0.2, resume=0)                         # starting over: no check
    (out / "config.json").unlink()                            # checkpoints whose flags are unknown
    with pytest.raises(SystemExit):
        config_run(out)
    assert capsys.readouterr().err == (f"error: {out} holds mle.safetensors but no config.json recording the flags "
                                       f"they were trained with; use a new --out_dir, or --resume=0 to start over "
                                       f"in {out}\n")


def test_device_is_checked_first(tmp_path, capsys):
    for device, words in (("gpu", "--device gpu: not a device; use cpu, cuda or cuda:N"),
                          ("meta", "--device meta: only cpu and cuda are supported")):
        with pytest.raises(SystemExit):
            Run(argparse.Namespace(device=device, dtype="float32", threads=1, seed=0), tmp_path)
        assert capsys.readouterr().err == f"error: {words}\n"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"--device cuda: this torch \(.*\) sees no CUDA GPU; use --device=cpu"):
            check_device("cuda")


def test_process_group_waits_longer_than_nccls_default(tmp_path, monkeypatch):
    """Rank 0 may work alone for more than NCCL's default 10 minutes while the others wait at a barrier."""
    seen = {}
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(runtime.dist, "rendezvous", lambda url: iter([(runtime.dist.HashStore(), 0, 1)]))
    monkeypatch.setattr(runtime.dist, "init_process_group", lambda **kw: seen.update(kw))
    monkeypatch.setattr(runtime.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(runtime.dist, "get_world_size", lambda: 1)
    monkeypatch.setattr(runtime, "watch_failures", lambda *a: None)
    make_run(tmp_path)
    assert seen["timeout"] == runtime.DIST_TIMEOUT >= datetime.timedelta(minutes=30)


# -----------------------------------------------------------------------------
# two gloo ranks: jobs shared by rank_map, greedy decoding shared batch by batch

def rank_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    jobs = list(range(7))                                   # not a multiple of the ranks
    done = rank_map(lambda j: (j * j, rank), jobs)
    tok = SimpleNamespace(eos_id=0, n_vocab=None, decode=lambda ids: " ".join(map(str, ids)))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 32, (n,), generator=g).tolist() for n in (3, 9, 1, 5, 7, 2, 4)]
    model = tiny()                                          # the same weights on every rank
    shared = generate_texts(model, tok, prompts, 6, batch_size=2, share=rank_map)
    Path(f"{out_dir}/rank{rank}.json").write_text(json.dumps(dict(done=done, shared=shared)))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_rank_map_and_shared_greedy_decoding_on_two_ranks(tmp_path):
    torch.multiprocessing.spawn(rank_worker, args=(2, tmp_path / "init", tmp_path), nprocs=2)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # every rank gets every result, in the jobs' order; job i ran once, on rank i % 2
    assert r0["done"] == r1["done"] == [[j * j, j % 2] for j in range(7)]
    # the batches (2 prompts each, by length) decoded by two ranks: the texts of one process
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 32, (n,), generator=g).tolist() for n in (3, 9, 1, 5, 7, 2, 4)]
    tok = SimpleNamespace(eos_id=0, n_vocab=None, decode=lambda ids: " ".join(map(str, ids)))
    alone = generate_texts(tiny(), tok, prompts, 6, batch_size=2)
    assert r0["shared"] == r1["shared"] == alone and len(set(alone)) > 1


# a rank of two, launched as a scheduler would (no torchrun agent to stop the others): the RL loop, checkpointed each
# step; at its second step rank `bad` gets a NaN reward for one sample (the other rank's are finite)
NAN_RANK = """
import argparse, sys, time, torch
from pathlib import Path
import grpo
from model import GPT, GPTConfig
from research import common
from runtime import Run
rank, bad, fsdp, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
run = Run(argparse.Namespace(device="cpu", threads=1, seed=0, dtype="float32", resume=1, ckpt_every=1,
                             fsdp=fsdp), out)
torch.manual_seed(0)
cfg = grpo.GRPOConfig(group_size=4, max_new_tokens=6, prompts_per_step=2, max_rounds=1, micro_batch=4, warmup=0)
parts = common.policy(run, GPT(GPTConfig.llama(vocab_size=8, block_size=32, n_layer=2, n_head=2, n_embd=16)), cfg)
steps = []

def reward(items, completions):
    steps.append(1)
    r = [sum(t == 3 for t in c) / 6 for c in completions]
    if rank == bad and len(steps) == 2:
        (out / "nan_at").write_text(str(time.time()))
        r[0] = float("nan")
    return r

source = grpo.Env(reward, draw=lambda n: ([[1, 2, 3]] * n, list(range(n))))
common.rl_loop(run, parts, source, cfg, torch.Generator().manual_seed(rank), out / "rl.safetensors", 3)
"""


@pytest.mark.parametrize("bad, fsdp", [(1, 1), (0, 0)])   # (rank 0 holds the group's store)
def test_a_nan_reward_on_one_rank_stops_both_at_once_with_the_same_line(tmp_path, bad, fsdp):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # DETAIL: gloo raises on a mismatched collective (torch 2.13's DDP crashes under it on the CPU)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
           "TORCH_DISTRIBUTED_DEBUG": "DETAIL" if fsdp else "OFF", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", NAN_RANK, str(r), str(bad), str(fsdp), str(tmp_path)],
                              cwd=ROOT, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=open(tmp_path / f"out{r}", "w"), stderr=open(tmp_path / f"err{r}", "w"))
             for r in (0, 1)]
    ended, t0 = {}, time.time()
    while len(ended) < 2 and time.time() - t0 < 300:
        ended.update({r: time.time() for r, p in enumerate(procs) if r not in ended and p.poll() is not None})
        time.sleep(0.05)
    for p in procs:
        p.kill()
    nan_at, errs = float((tmp_path / "nan_at").read_text()), [(tmp_path / f"err{r}").read_text() for r in (0, 1)]
    assert [p.wait() for p in procs] == [1, 1] and all(ended[r] - nan_at < 10 for r in (0, 1)), (ended, nan_at, errs)
    last = [e.splitlines()[-1] for e in errs]
    # the failing rank's line, last on both (nothing after it: no traceback of the broken collective)
    assert last[0] == last[1] == ("error: rlvr: reward_fn returned a non-finite reward at step 1; stopping before it "
                                  "reaches the weights (the last checkpoint is intact; --on_nan=skip skips such steps)")
    assert all(e.count("error:") == 1 and "Traceback" not in e for e in errs), errs
    # step 1 logged and checkpointed, nothing of step 2
    assert [json.loads(row)["step"] for row in (tmp_path / "log.jsonl").read_text().splitlines()] == [1]
    assert read_meta(tmp_path / "rl.safetensors")["step"] == 1 and not list(tmp_path.glob("*.tmp"))
