"""bench/gpu_check.py --tiny on the CPU (~35 s on one thread): the scale path's checks (HF directory
with a padded vocabulary, our loader, parity with transformers, the sampler, GRPO, the optimizer
steps outside autocast, train_lang.py / torchrun / train_video.py runs) at a small shape, each
row of its table PASS. The same script at the 1.5B shape is the GPU check (docstring there). And
its profile of the sampler's decode steps (--profile_sampler), alone, in seconds."""
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.mark.slow
def test_gpu_check_tiny_on_cpu_passes_every_row(tmp_path):
    out = tmp_path / "gpu_check.md"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([sys.executable, "bench/gpu_check.py", "--tiny", "--device=cpu",
                        "--dtype=float32", f"--out={out}", f"--work_dir={tmp_path / 'work'}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.is_file(), p.stdout[-3000:] + p.stderr[-3000:]
    table = [line for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    # steps 1-8: build, load, logits, greedy, 2 x 5 sampler + its greedy check, 4 GRPO + the
    # chunked rollout, 2 stale-weight, 3 scripts, FSDP
    assert len(rows) == 26, out.read_text()
    failed = [f"{r[0]}: {r[2]}" for r in rows if r[-1] != "PASS"]
    assert not failed, "\n".join(failed)
    # every sampler row of ours: tok/s, ms a step, both bounds with the share reached; the EOS
    # rows beside the others, at both prompt lengths, the graphs path included
    ours = [r for r in rows if r[0].startswith("4 sampler ours")]
    assert [r[0][len("4 sampler ours "):] for r in ours] == ["eager", "graphs", "eager EOS",
                                                             "graphs EOS"] * 2
    for r in ours:
        assert " tok/s, " in r[2] and " ms a step, " in r[2] and "of the weights bound" in r[2]
        assert "of the weights + cache bound" in r[2], r[2]
    assert all("rows ended" in r[2] for r in ours if r[0].endswith("EOS"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def test_gpu_check_profiles_the_sampler_on_cpu(tmp_path):
    """--profile_sampler (step 9) alone at the tiny shape, a few seconds: the top ops table and
    the chrome trace beside --out, so the GPU session's profile does not rot."""
    out = tmp_path / "gpu_check.md"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([sys.executable, "bench/gpu_check.py", "--tiny", "--device=cpu",
                        "--dtype=float32", "--skip=3,4,5,6,7,8", "--profile_sampler",
                        f"--out={out}", f"--work_dir={tmp_path / 'work'}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 9 sampler")]
    assert len(rows) == 1 and rows[0].endswith("| PASS |"), out.read_text()
    table = (tmp_path / "gpu_check_sampler_profile.md").read_text()
    ops = [line for line in table.splitlines() if line.startswith("| aten::")]
    assert len(ops) == 20 and "aten::mm" in table and "decode_attention" in table, table
    trace = (tmp_path / "gpu_check_sampler_profile.json.gz").read_bytes()
    names = {e.get("name") for e in json.loads(gzip.decompress(trace))["traceEvents"]}
    assert {"decode_step", "decode_attention", "sample_next"} <= names


@pytest.mark.slow
def test_gpu_check_times_the_compiled_decode_step_on_cpu(tmp_path):
    """--compile_sampler: step 4's row of the graphs path compiled the other way (on a CPU by
    torch.compile, inductor) runs, draws decodable ids and gives the uncompiled greedy tokens; the
    rows after it still run."""
    out = tmp_path / "gpu_check.md"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([sys.executable, "bench/gpu_check.py", "--tiny", "--device=cpu",
                        "--dtype=float32", "--skip=3,5,6,7,8", "--compile_sampler",
                        "--sampler_lens=30", f"--out={out}", f"--work_dir={tmp_path / 'work'}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 4 ")]
    compiled = [r for r in rows if r.startswith("| 4 sampler ours graphs compiled")]
    assert len(compiled) == 1 and compiled[0].endswith("| PASS |"), out.read_text()
    assert "greedy vs uncompiled: equal" in compiled[0], compiled[0]
    assert [r for r in rows if r.startswith("| 4 sampler ours graphs EOS")]
    assert rows[-1].startswith("| 4 graphs greedy") and rows[-1].endswith("| PASS |")
