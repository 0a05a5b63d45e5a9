"""mle.py, the MLE loop both training scripts share, on a tiny GPT in one process: the log lines
of the validation checks, an interrupted stage resumed to the same weights, the control's compute
budget and schedule."""
import argparse
import json
import threading
import time
from pathlib import Path

import pytest
import torch

import mle
from model import GPT, GPTConfig
from runtime import ComputeBudget, Run, lr_at

torch.set_num_threads(1)


def make_run(tmp_path, **kw):
    tmp_path.mkdir(exist_ok=True)
    args = argparse.Namespace(**{**dict(device="cpu", dtype="float32", threads=1, seed=0, resume=1,
                                        ckpt_every=4, weight_decay=0.1, eval_every=3,
                                        micro_batch=64, grad_ckpt=0), **kw})
    return Run(args, tmp_path)


def tiny():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16))


def next_batch(gen):
    """Sequences counting up from a random start: the next token is always predictable."""
    start = torch.randint(8, (4, 1), generator=gen)
    seq = start + torch.arange(9)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def val_loss(model):
    seq = torch.arange(9)[None]
    return model(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())[1].item()


def lr(step):
    return lr_at(step, 10, 1e-2, 2)


def logged(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_train_logs_every_eval_every_and_at_the_end(tmp_path, capsys):
    run = make_run(tmp_path)
    ckpt = tmp_path / "mle.safetensors"
    metrics = lambda model: ({"extra": 1.0}, " extra 1")   # noqa: E731
    model = mle.train(run, tiny(), "mle", ckpt, 10, next_batch, val_loss, lr, val_metrics=metrics)
    rows = logged(tmp_path / "log.jsonl")
    assert [r["step"] for r in rows] == [3, 6, 9, 10]                   # --eval_every=3, the end
    assert list(rows[0]) == ["stage", "step", "loss", "val_loss", "minutes", "compute", "extra"]
    assert rows[-1]["val_loss"] == pytest.approx(val_loss(model))       # the final weights' loss
    assert rows[-1]["val_loss"] < rows[0]["val_loss"]                   # it learned
    out = capsys.readouterr().out
    assert f"mle step 10: train loss {rows[-1]['loss']:.4f} val loss {rows[-1]['val_loss']:.4f} " \
           f"extra 1" in out
    # a finished stage keeps its weights only, and a re-run reuses it without training
    assert mle.train(run, tiny(), "mle", ckpt, 10, next_batch, val_loss, lr) is not None
    assert "mle: " + str(ckpt) + " is complete, reusing it" in capsys.readouterr().out
    assert len(logged(tmp_path / "log.jsonl")) == 4


def test_an_interrupted_stage_resumes_to_the_same_weights(tmp_path):
    ref = mle.train(make_run(tmp_path / "a"), tiny(), "mle", tmp_path / "a" / "mle.safetensors",
                    10, next_batch, val_loss, lr)
    calls = []

    def dies_at_step_6(gen):   # the run is killed while drawing its 7th batch
        calls.append(1)
        if len(calls) == 7:
            raise KeyboardInterrupt
        return next_batch(gen)

    run = make_run(tmp_path / "b")
    ckpt = tmp_path / "b" / "mle.safetensors"
    with pytest.raises(KeyboardInterrupt):
        mle.train(run, tiny(), "mle", ckpt, 10, dies_at_step_6, val_loss, lr)
    torch.manual_seed(123)   # the resumed run restores the global generator from the checkpoint
    model = mle.train(run, tiny(), "mle", ckpt, 10, next_batch, val_loss, lr)   # from step 4
    for a, b in zip(ref.parameters(), model.parameters()):
        assert torch.equal(a, b)
    rows = logged(tmp_path / "b" / "log.jsonl")
    assert [r["step"] for r in rows] == [3, 6, 6, 9, 10]   # step 6 again, after the resume
    assert rows[1] == {**rows[2], "minutes": rows[1]["minutes"]}


def test_batch_compute_counts_each_row_up_to_its_last_scored_token_three_times():
    tgt = torch.tensor([[-1, 5, 6, -1, -1],     # last scored position 2: 3 input tokens
                        [-1, -1, -1, -1, 7],    # 5
                        [-1, -1, -1, -1, -1]])  # nothing scored: 0
    assert mle.batch_compute(tgt) == 3 * (3 + 5 + 0)


def test_a_compute_budget_ends_the_stage_at_the_first_step_that_reaches_it(tmp_path, capsys):
    # every batch of next_batch is 4 rows x 8 scored tokens: 96 units a step; 250 -> 3 steps
    run = make_run(tmp_path)
    ckpt = tmp_path / "mle_more.safetensors"
    mle.train(run, tiny(), "mle_more", ckpt, 10 ** 6, next_batch, val_loss, mle.control_lr(1e-3),
              budget=ComputeBudget(250))
    rows = logged(tmp_path / "log.jsonl")
    assert [(r["stage"], r["step"], r["compute"]) for r in rows] == [("mle_more", 3, 288)]
    meta = json.loads(ckpt.with_suffix(".json").read_text())["metrics"]
    assert meta["done"] and meta["compute"] == 288
    assert "mle_more: stopping after" in capsys.readouterr().out


def test_the_control_waits_for_a_running_rlvr_and_stops_at_its_final_compute(tmp_path):
    # RLVR (a thread here) adds 100 units five times, slowly, then closes: the control is ahead
    # of it most of the time and must wait, not stop at the compute RLVR had so far
    budget = ComputeBudget()

    def rlvr():
        for _ in range(5):
            time.sleep(0.2)
            budget.add(100)
        budget.close()

    thread = threading.Thread(target=rlvr)
    thread.start()
    run = make_run(tmp_path)
    mle.train(run, tiny(), "mle_more", tmp_path / "c.safetensors", 10 ** 6, next_batch, val_loss,
              mle.control_lr(1e-3), budget=budget)
    thread.join()
    # 500 units at 96 a step: the 6th step is the first to reach it, whatever the timing
    rows = logged(tmp_path / "log.jsonl")
    assert (rows[-1]["step"], rows[-1]["compute"]) == (6, 576) and rows[-1]["minutes"] > 0.8 / 60


def test_control_lr_warms_up_then_stays_constant():
    schedule = mle.control_lr(2e-4)
    assert [schedule(s) for s in (0, 4, 9, 10, 500)] == [2e-4 * 0.1, 2e-4 * 0.5, 2e-4, 2e-4, 2e-4]


def test_final_lr_is_the_checkpoints_schedule_at_its_last_step(tmp_path):
    # the shipped text MLE: 2600 cosine steps from 3e-4, warm-up 50 -> it ended at a tenth, 3e-5
    shipped = Path(__file__).resolve().parents[1] / "checkpoints" / "textgame" / "mle.safetensors"
    assert mle.final_lr(shipped) == pytest.approx(3e-5, rel=1e-3)
    assert mle.final_lr(tmp_path) is None   # an HF directory records no MLE schedule


def test_weighted_batches_train_on_the_weighted_mean(tmp_path):
    """A next_batch that also returns weights (video's --change_weight): the step's loss is the weighted mean
    cross-entropy over the scored tokens; weights of 1 train exactly as none."""
    def weighted(w):
        def batch(gen):
            idx, tgt = next_batch(gen)
            tgt[:, :2] = -1                                  # unscored tokens weigh nothing, whatever w says
            return idx, tgt, torch.full(tgt.shape, 1.0).index_fill_(1, torch.tensor([5, 6]), w)
        return batch
    run = make_run(tmp_path / "w")
    mle.train(run, tiny(), "mle", tmp_path / "w" / "m.safetensors", 1, weighted(3.0), val_loss, lr)
    idx, tgt, w = weighted(3.0)(torch.Generator().manual_seed(0))
    ce = torch.nn.functional.cross_entropy(tiny()(idx)[0].detach().flatten(0, 1), tgt.flatten(), ignore_index=-1,
                                           reduction="none").view(tgt.shape)
    scored = (tgt != -1).float()
    assert logged(tmp_path / "w" / "log.jsonl")[0]["loss"] == pytest.approx(
        float((ce * w * scored).sum() / (w * scored).sum()), rel=1e-5)
    ones = mle.train(make_run(tmp_path / "a"), tiny(), "mle", tmp_path / "a" / "m.safetensors", 5, weighted(1.0),
                     val_loss, lr)
    plain = mle.train(make_run(tmp_path / "b"), tiny(), "mle", tmp_path / "b" / "m.safetensors", 5,
                      lambda g: weighted(1.0)(g)[:2], val_loss, lr)
    for a, b in zip(ones.parameters(), plain.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("weighted_batch", [False, True])
def test_micro_batches_train_as_the_whole_batch(tmp_path, weighted_batch):
    """--micro_batch: the batch in pieces (rows with different numbers of scored tokens), each its share of the
    batch's mean, trains as the whole batch does (only the order of sums differs)."""
    def batch(gen):
        idx, tgt = next_batch(gen)
        tgt[0, :5] = -1                                      # row 0 scores fewer tokens than the others
        return (idx, tgt, torch.rand(tgt.shape, generator=gen) + 0.5) if weighted_batch else (idx, tgt)
    models = [mle.train(make_run(tmp_path / str(mb), micro_batch=mb), tiny(), "mle", tmp_path / str(mb) / "m.safetensors",
                        5, batch, val_loss, lr) for mb in (64, 1, 3)]
    losses = [[r["loss"] for r in logged(tmp_path / str(mb) / "log.jsonl")] for mb in (64, 1, 3)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5) and losses[2] == pytest.approx(losses[0], rel=1e-5)
    for other in models[1:]:
        for a, b in zip(models[0].parameters(), other.parameters()):
            assert torch.allclose(a, b, atol=1e-5)
