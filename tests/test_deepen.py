"""experiments/deepen.py: the grown checkpoint has twice the blocks, the old ones in the even places, zero output
projections in the new ones, the old metadata and tokenizer, and the same logits on any tokens."""
import json
import subprocess
import sys
from pathlib import Path

import torch

from checkpoint import load_model, save_checkpoint
from model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]


def test_deepen_keeps_the_logits(tmp_path):
    torch.manual_seed(0)
    old = GPT(GPTConfig.llama(vocab_size=50, block_size=32, n_layer=2, n_head=2, n_embd=16))
    save_checkpoint(tmp_path / "a" / "m.safetensors", old, args={"vq": "vq.safetensors", "n_layer": 2})
    (tmp_path / "a" / "vq.safetensors").write_bytes(b"tokenizer")
    out = tmp_path / "b" / "m.safetensors"
    r = subprocess.run([sys.executable, str(ROOT / "experiments" / "deepen.py"), "--ckpt",
                        str(tmp_path / "a" / "m.safetensors"), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    new, meta = load_model(out)
    assert new.config.n_layer == 4 and meta["args"] == {"vq": "vq.safetensors", "n_layer": 4}
    assert json.loads(out.with_suffix(".json").read_text())["config"]["n_layer"] == 4
    assert (tmp_path / "b" / "vq.safetensors").read_bytes() == b"tokenizer"
    for name, t in old.h[1].state_dict().items():      # old block 1 is new block 2
        assert torch.equal(new.h[2].state_dict()[name], t)
    assert not new.h[3].attn.c_proj.weight.any() and not new.h[3].mlp.c_proj.weight.any()
    assert new.h[3].attn.c_attn.weight.any()           # the rest is a random init: it can learn
    x = torch.randint(50, (3, 32))
    with torch.no_grad():
        assert torch.equal(old(x)[0], new(x)[0])
    # a file that is not a checkpoint: one line naming it
    r = subprocess.run([sys.executable, str(ROOT / "experiments" / "deepen.py"), "--ckpt", str(tmp_path / "no"),
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip() == f"error: {tmp_path / 'no'}: checkpoint file not found"
