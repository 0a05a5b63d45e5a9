"""bench/gpu_check.py --tiny on the CPU (~35 s on one thread): the scale path's checks (HF directory
with a padded vocabulary, our loader, parity with transformers, the sampler, GRPO, the optimizer
steps outside autocast, train_lang.py / torchrun / train_video.py runs) at a small shape, each
row of its table PASS. The same script at the 1.5B shape is the GPU check (docstring there)."""
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
    # steps 1-8: build, load, logits, greedy, 2 x 3 sampler + its greedy check, 4 GRPO,
    # 2 stale-weight, 3 scripts, FSDP
    assert len(rows) == 21, out.read_text()
    failed = [f"{r[0]}: {r[2]}" for r in rows if r[-1] != "PASS"]
    assert not failed, "\n".join(failed)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
