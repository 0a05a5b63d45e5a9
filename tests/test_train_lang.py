"""End-to-end runs of train_lang.py and eval.py on tiny settings (slow: subprocesses, but well under a minute each)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--n_layer=1", "--n_embd=32", "--batch_size=8", "--eval_limit=12",
        "--max_new_tokens=64", "--group_size=4", "--prompts_per_step=2"]
pytestmark = pytest.mark.slow


def run(args, cwd=ROOT, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, **kw)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Data (small splits), tokenizer, 40 MLE steps and 3 RLVR steps from scratch: the whole default pipeline."""
    tmp = tmp_path_factory.mktemp("lang")
    run(["data/textgame/prepare.py", "--n_train=400", "--n_val=20", "--n_test=20", f"--out_dir={tmp / 'data'}"])
    p = run(["train_lang.py", "--init=scratch", f"--data_dir={tmp / 'data'}", f"--out_dir={tmp / 'out'}",
             "--mle_steps=40", "--rl_steps=3", "--ckpt_every=2", *TINY])
    return tmp, p.stdout


def test_default_pipeline_writes_eval_json(tiny_run):
    tmp, stdout = tiny_run
    for name, n in (("eval.json", 12), ("eval_val.json", 12)):
        result = json.loads((tmp / "out" / name).read_text())
        assert set(result) == {"mle", "rlvr", "mle_more"}
        for r in result.values():
            assert r["n"] == n and {"accuracy", "accuracy_changed", "accuracy_unchanged"} <= set(r)
            assert 0.0 <= r["accuracy"] <= 1.0
            pr = r["per_record"]   # one value per record, in file order: the paired statistics can be recomputed
            assert set(pr) == {"accuracy", "task_specific", "changed"} and all(len(v) == n for v in pr.values())
            assert sum(pr["accuracy"]) / n == r["accuracy"] and sum(pr["changed"]) == r["n_changed"]
            assert len(r["answers"]) == n and all(isinstance(a, str) for a in r["answers"])
    # the run on one page (tools/report.py), written at the end
    page = (tmp / "out" / "report.md").read_text()
    assert "![curves per GRPO step](curves.svg)" in page and "## Four test records" in page
    assert (tmp / "out" / "curves.svg").is_file() and "- command: `python train_lang.py --init=scratch" in page
    assert "always-no-change baseline" in stdout and "rlvr - mle " in stdout and "rlvr - mle_more" in stdout
    log = [json.loads(line) for line in (tmp / "out" / "log.jsonl").read_text().splitlines()]
    rl = [row for row in log if row["stage"] == "rlvr" and "reward_mean" in row]
    assert len(rl) == 3 and all(k in rl[0] for k in ("kl", "entropy", "clip_frac", "zero_std_frac", "grad_norm",
                                                     "groups_kept", "rl_compute"))
    probes = [row for row in log if "probe_reward" in row]   # before the first step and at the end (every 10)
    assert [row["step"] for row in probes] == [0, 3] and all(0 <= r["probe_reward"] <= 1 for r in probes)
    meta = json.loads((tmp / "out" / "rlvr.json").read_text())
    assert meta["step"] == 3 and meta["args"]["rl_steps"] == 3 and meta["metrics"]["done"]
    assert meta["metrics"]["rl_seconds"] > 0 and (tmp / "out" / "mle_more.safetensors").is_file()
    # the control, forked beside RLVR, stopped at the first step that reached RLVR's whole compute
    control = [row for row in log if row["stage"] == "mle_more"][-1]
    step_compute = control["compute"] / control["step"]
    assert 0 < rl[-1]["rl_compute"] <= control["compute"] < rl[-1]["rl_compute"] + 2 * step_compute


def test_rerun_reuses_finished_stages(tiny_run):
    tmp, _ = tiny_run
    p = run(["train_lang.py", "--init=scratch", f"--data_dir={tmp / 'data'}", f"--out_dir={tmp / 'out'}",
             "--mle_steps=40", "--rl_steps=3", *TINY])
    assert all(f"{name}.safetensors is complete" in p.stdout for name in ("mle", "rlvr", "mle_more"))


def test_eval_cli_side_by_side(tiny_run):
    tmp, _ = tiny_run
    out = tmp / "cmp.json"
    p = run(["eval.py", f"--ckpt={tmp / 'out' / 'rlvr.safetensors'}", f"--compare={tmp / 'out' / 'mle.safetensors'}",
             f"--data={tmp / 'data' / 'test.jsonl'}", "--limit=6", "--pass_k=2", "--max_new_tokens=32",
             f"--json={out}"])
    assert "rlvr.safetensors" in p.stdout and "mle.safetensors" in p.stdout and "pass@2" in p.stdout
    assert "paired differences" in p.stdout
    assert len(json.loads(out.read_text())) == 2


def test_bad_init_is_one_clear_line(tmp_path):
    p = subprocess.run([sys.executable, "train_lang.py", "--init=/nonexistent/ckpt.safetensors",
                        f"--out_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "--init /nonexistent/ckpt.safetensors" in p.stderr


def test_torchrun_two_ranks_end_identical(tiny_run):
    tmp, _ = tiny_run
    out = tmp / "ddp"
    run(["-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "train_lang.py",
         "--stage=rlvr", f"--init={tmp / 'out' / 'mle.safetensors'}", f"--data_dir={tmp / 'data'}",
         f"--out_dir={out}", "--rl_steps=2", *TINY])
    sums = [row["rank_checksums"] for row in map(json.loads, (out / "log.jsonl").read_text().splitlines())
            if "rank_checksums" in row][0]
    assert len(sums) == 2 and sums[0] == sums[1]


def test_torchrun_final_eval_equals_one_process(tiny_run, tmp_path):
    """Under torchrun the ranks share the final evaluation, batch by batch (runtime.rank_map): eval.json is the one
    process's, here the same command again in a copy of the run (the trained stage reused, forked workers)."""
    tmp, _ = tiny_run
    run(["data/textgame/prepare.py", "--n_train=100", "--n_val=4", "--n_test=140", f"--out_dir={tmp_path / 'data'}"])
    flags = ["train_lang.py", "--stage=rlvr", f"--init={tmp / 'out' / 'mle.safetensors'}", "--rl_steps=1",
             f"--data_dir={tmp_path / 'data'}", "--control=0", *TINY, "--eval_limit=0"]
    run(["-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", *flags, f"--out_dir={tmp_path / 'ddp'}"])
    shared = json.loads((tmp_path / "ddp" / "eval.json").read_text())
    assert shared["rlvr"]["n"] == 140                                  # three batches of 64: both ranks decode
    shutil.copytree(tmp_path / "ddp", tmp_path / "one")
    p = run([*flags, f"--out_dir={tmp_path / 'one'}"])
    assert "rlvr.safetensors is complete, reusing it" in p.stdout
    assert json.loads((tmp_path / "one" / "eval.json").read_text()) == shared


def test_rlvr_from_a_tiny_qwen2_hf_directory(tiny_run, tmp_path):
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    tmp, _ = tiny_run
    from data.textgame.task import load_records, prompt_text, target_text
    texts = [prompt_text(r) + target_text(r) for r in load_records(tmp / "data" / "train.jsonl")]
    tk = tokenizers.Tokenizer(tokenizers.models.BPE())
    tk.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = tokenizers.decoders.ByteLevel()
    tk.train_from_iterator(texts, tokenizers.trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    tk.save(str(tmp_path / "tokenizer.json"))
    cfg = transformers.Qwen2Config(vocab_size=tk.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                   max_position_embeddings=512, tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(tmp_path, safe_serialization=True)
    out = tmp_path / "out"
    run(["train_lang.py", "--stage=rlvr", f"--init={tmp_path}", f"--data_dir={tmp / 'data'}", f"--out_dir={out}",
         "--rl_steps=2", *TINY])
    result = json.loads((out / "eval.json").read_text())
    assert result["rlvr"]["n"] == 12


def test_webpage_task_runs_end_to_end(tmp_path):
    run(["data/webpage/prepare.py", "--n_train=300", "--n_val=10", "--n_test=10", f"--out_dir={tmp_path / 'data'}"])
    run(["train_lang.py", "--task=webpage", "--init=scratch", f"--data_dir={tmp_path / 'data'}",
         f"--out_dir={tmp_path / 'out'}", "--mle_steps=10", "--rl_steps=2", *TINY])
    result = json.loads((tmp_path / "out" / "eval.json").read_text())
    for stage in ("mle", "rlvr"):
        assert {"precision", "recall", "f1", "n", "f1_changed"} <= set(result[stage])
    assert 0.0 < result["mle"]["baseline_no_change"]["f1"] < 1.0


def test_bfloat16_autocast_on_cpu(tiny_run, tmp_path):
    tmp, _ = tiny_run
    run(["train_lang.py", "--stage=rlvr", f"--init={tmp / 'out' / 'mle.safetensors'}", f"--data_dir={tmp / 'data'}",
         f"--out_dir={tmp_path}", "--rl_steps=1", "--dtype=bfloat16", *TINY])
    assert json.loads((tmp_path / "eval.json").read_text())["rlvr"]["n"] == 12


def test_plot_rl_draws_the_run(tiny_run, tmp_path):
    pytest.importorskip("matplotlib")
    tmp, _ = tiny_run
    log = tmp / "out" / "log.jsonl"
    p = run(["research/plot_rl.py", str(log), str(log), "--labels=RLVR,again", f"--out={tmp_path / 'rl.png'}"])
    assert "wrote" in p.stdout and (tmp_path / "rl.png").read_bytes()[:4] == b"\x89PNG"
    bad = subprocess.run([sys.executable, "research/plot_rl.py", str(log), "--labels=a,b"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1] == "error: --labels names 2 runs, 1 logs given"


def test_stage_memory_prints_and_writes_nothing(tiny_run, tmp_path):
    """--stage=memory: each step's memory by part (MLE's too when it would train from scratch), and
    nothing written in out_dir (a later run there is not bound by its flags)."""
    tmp, _ = tiny_run
    for init, stages in ((tmp / "out" / "mle.safetensors", ["rlvr"]), ("scratch", ["mle", "rlvr"])):
        out = tmp_path / init.__class__.__name__
        p = run(["train_lang.py", "--stage=memory", f"--init={init}", f"--data_dir={tmp / 'data'}",
                 f"--out_dir={out}", "--dtype=bfloat16", "--grad_ckpt=1", *TINY])
        lines = [x for x in p.stdout.splitlines() if " memory estimate (GB):" in x]
        assert [x.split()[0] for x in lines] == stages
        assert all(k in lines[-1] for k in ("weights", "adamw", "kv_cache", "logits", "peak"))
        assert not out.exists() or not any(out.iterdir())


def test_bfloat16_run_takes_no_optimizer_step_inside_autocast(tiny_run, tmp_path):
    """A global optimizer-step hook over a --dtype=bfloat16 RLVR run: every step runs outside autocast (inside it,
    autocast's cached bf16 weights would keep the forwards after the step on the old weights)."""
    tmp, _ = tiny_run
    shipped = ROOT / "checkpoints" / "textgame" / "mle.safetensors"   # right often enough for reward spread
    argv = ["train_lang.py", "--stage=rlvr", f"--init={shipped}", f"--data_dir={tmp / 'data'}", f"--out_dir={tmp_path}",
            "--rl_steps=2", "--dtype=bfloat16", "--control=0", *TINY, "--eval_limit=1"]
    code = ("import runpy, sys, torch\n"
            "from torch.optim.optimizer import register_optimizer_step_pre_hook\n"
            "seen = []\n"
            "register_optimizer_step_pre_hook(lambda o, a, k: seen.append(torch.is_autocast_enabled('cpu')))\n"
            f"sys.argv = {argv!r}\n"
            "try:\n    runpy.run_path('train_lang.py', run_name='__main__')\n"
            "finally:\n    print('STEPS', len(seen), sum(seen))\n")
    p = run(["-c", code])
    n, inside = map(int, p.stdout.strip().splitlines()[-1].split()[1:])
    assert n >= 2 and inside == 0, p.stdout[-500:]


def test_torchrun_prompts_per_step_is_global_and_the_recipe_runs(tmp_path):
    """Under torchrun --prompts_per_step counts the prompts of all ranks (issue 57): 2 gloo ranks, 2 prompts in all,
    1 each; --recipe=paper's epoch sampler (every changed record, the unchanged slots) and its prompt filter."""
    run(["data/textgame/prepare.py", "--n_train=60", "--n_val=2", "--n_test=2", f"--out_dir={tmp_path / 'data'}"])
    shipped = ROOT / "checkpoints" / "textgame" / "mle.safetensors"
    p = run(["-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "train_lang.py", "--stage=rlvr",
             f"--init={shipped}", f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'out'}", "--recipe=paper",
             "--rl_steps=1", "--control=0", *TINY, "--eval_limit=1", "--max_new_tokens=32"])
    assert "per step 2 prompts in all, 1 per rank" in p.stdout, p.stdout[-2000:]
    assert "--recipe=paper: epochs of" in p.stdout and "tokens left out" in p.stdout
    rows = [json.loads(x) for x in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    step = [r for r in rows if r.get("step") == 1 and "groups" in r][0]
    assert step["groups"] == 2 and step["groups_kept"] == 2   # both ranks' groups; every group kept (recipe)
