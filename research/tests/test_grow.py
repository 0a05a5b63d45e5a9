"""research/grow.py: a checkpoint grown deeper has twice the blocks, the old ones in the even places, zero output
projections in the new ones; one grown wider has twice the channels and heads, the old weights in the old places; both
keep the old metadata and tokenizer and the same logits on any tokens."""
import json
import subprocess
import sys
from pathlib import Path

import torch

from checkpoint import load_model, save_checkpoint
from model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[2]


def test_deeper_keeps_the_logits(tmp_path):
    torch.manual_seed(0)
    old = GPT(GPTConfig.llama(vocab_size=50, block_size=32, n_layer=2, n_head=2, n_embd=16))
    save_checkpoint(tmp_path / "a" / "m.safetensors", old, args={"vq": "vq.safetensors", "n_layer": 2})
    (tmp_path / "a" / "vq.safetensors").write_bytes(b"tokenizer")
    out = tmp_path / "b" / "m.safetensors"
    r = subprocess.run([sys.executable, str(ROOT / "research" / "grow.py"), "--ckpt",
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
    r = subprocess.run([sys.executable, str(ROOT / "research" / "grow.py"), "--ckpt", str(tmp_path / "no"),
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip() == f"error: {tmp_path / 'no'}: checkpoint file not found"


def test_wider_keeps_the_logits_and_can_learn(tmp_path):
    torch.manual_seed(0)
    old = GPT(GPTConfig.llama(vocab_size=50, block_size=32, n_layer=2, n_head=2, n_embd=16))
    with torch.no_grad():                               # gains away from 1, so their rescaling is tested
        for p in old.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    save_checkpoint(tmp_path / "m.safetensors", old, args={"n_embd": 16, "n_head": 2})
    out = tmp_path / "w" / "m.safetensors"
    r = subprocess.run([sys.executable, str(ROOT / "research" / "grow.py"), "--double=width", "--ckpt",
                        str(tmp_path / "m.safetensors"), "--out", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    new, meta = load_model(out)
    c = new.config
    assert (c.n_embd, c.n_head, c.head_dim, c.mlp_hidden) == (32, 4, 8, 2 * old.config.mlp_hidden)
    assert meta["args"] == {"n_embd": 32, "n_head": 4}
    assert torch.equal(new.wte.weight[:, :16], old.wte.weight) and not new.wte.weight[:, 16:].any()
    x = torch.randint(50, (3, 32))
    with torch.no_grad():
        assert torch.allclose(old(x)[0], new(x)[0], atol=1e-5)
    # the new channels learn: a step of SGD moves the zero weights that write them
    loss = new(x[:, :-1], x[:, 1:].contiguous())[1]
    loss.backward()
    assert new.h[0].attn.c_proj.weight.grad[16:].abs().sum() > 0
    # a GPT-2 block (LayerNorm, biases) cannot be widened this way: one line naming the file
    gpt2 = GPT(GPTConfig.gpt2(vocab_size=50, block_size=32, n_layer=1, n_head=2, n_embd=16))
    save_checkpoint(tmp_path / "g.safetensors", gpt2, args={})
    r = subprocess.run([sys.executable, str(ROOT / "research" / "grow.py"), "--double=width", "--ckpt",
                        str(tmp_path / "g.safetensors"), "--out", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and r.stderr.strip().startswith(f"error: {tmp_path / 'g.safetensors'}: --double=width")
