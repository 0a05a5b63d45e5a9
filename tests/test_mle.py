"""mle.py, the MLE loop both training scripts share, on a tiny GPT in one process: the log lines
of the validation checks, an interrupted stage resumed to the same weights, the stop event and
the control's schedule."""
import argparse
import json
import threading

import pytest
import torch

import mle
from model import GPT, GPTConfig
from runtime import Run, lr_at

torch.set_num_threads(1)


def make_run(tmp_path, **kw):
    tmp_path.mkdir(exist_ok=True)
    args = argparse.Namespace(device="cpu", dtype="float32", threads=1, seed=0, resume=1,
                              ckpt_every=4, weight_decay=0.1, eval_every=3, **kw)
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
    assert list(rows[0]) == ["stage", "step", "loss", "val_loss", "minutes", "extra"]
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


def test_the_stop_event_ends_the_stage_after_its_step(tmp_path, capsys):
    stop = threading.Event()
    stop.set()                                   # set before the first step: one step, then done
    run = make_run(tmp_path)
    ckpt = tmp_path / "mle_more.safetensors"
    mle.train(run, tiny(), "mle_more", ckpt, 10 ** 6, next_batch, val_loss, mle.control_lr(1e-3),
              stop=stop)
    rows = logged(tmp_path / "log.jsonl")
    assert [(r["stage"], r["step"]) for r in rows] == [("mle_more", 1)]
    assert json.loads(ckpt.with_suffix(".json").read_text())["metrics"]["done"]
    assert "mle_more: stopping after" in capsys.readouterr().out


def test_control_lr_warms_up_then_stays_constant():
    schedule = mle.control_lr(2e-4)
    assert [schedule(s) for s in (0, 4, 9, 10, 500)] == [2e-4 * 0.1, 2e-4 * 0.5, 2e-4, 2e-4, 2e-4]
