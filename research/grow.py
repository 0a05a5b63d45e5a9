"""
Grow a world model's GPT without changing what it predicts, to ask whether the old model was short
of capacity (research/README.md, the push). Two ways, `--double`:

- depth: after each block a new one whose two output projections (attention's and the MLP's c_proj)
  are zero, so it adds nothing to the residual stream until training moves it. Exact: the grown
  model's logits equal the old one's.
- width: twice the residual channels, heads (of the same size) and MLP channels. The old weights
  fill the old rows and columns; the new channels of the residual stream start at zero (their
  embeddings and every projection writing them are zero) and are read with a random init; the new
  heads and MLP channels read a random init and write nothing. RMSNorm averages over twice the
  channels, half of them zero, so its gains are divided by sqrt(2) and its epsilon halved: the
  logits are equal up to rounding.

    python research/grow.py --double=width --ckpt=checkpoints/video_mle_4000.safetensors \
        --out=out/wide_init/video_mle.safetensors
    python train_video.py --stage=mle --mode=multi --init=out/wide_init/video_mle.safetensors \
        --data=out/robot4000 --out_dir=out/wide --mle_steps=500 --mle_lr=1e-3 --warmup=20

The new checkpoint keeps the old one's metadata (its tokenizer and flags), with n_layer, or n_embd,
n_head and mlp_hidden, doubled. Width needs a Llama-style GPT (RMSNorm, no biases, n_kv_head =
n_head), as train_video.py's are.
"""
import argparse
import math
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file: the repository root
from checkpoint import load_model, recorded_path, save_checkpoint  # noqa: E402
from model import GPT  # noqa: E402

p = argparse.ArgumentParser(description="double a GPT checkpoint's depth or width, predicting the same",
                            allow_abbrev=False)
p.add_argument("--ckpt", required=True, help="a model checkpoint (.safetensors)")
p.add_argument("--out", required=True, help="the grown checkpoint (.safetensors)")
p.add_argument("--double", default="depth", choices=["depth", "width"], help="what to double")
p.add_argument("--seed", type=int, default=0, help="the new weights' random init")
args = p.parse_args()
try:
    old, meta = load_model(args.ckpt)
except ValueError as e:
    sys.exit(f"error: {e}")
c = old.config
if args.double == "width" and (c.norm != "rmsnorm" or c.bias or c.qkv_bias or c.n_kv_head != c.n_head):
    sys.exit(f"error: {args.ckpt}: --double=width needs RMSNorm, no biases and n_kv_head = n_head")
torch.manual_seed(args.seed)
old_state = old.state_dict()


def deeper():
    """Old block i becomes block 2i; block 2i+1 is new, its output projections zero."""
    new = GPT(replace(c, n_layer=2 * c.n_layer))
    state = new.state_dict()
    for name, tensor in old_state.items():
        if name.startswith("h."):                        # h.<i>.rest -> h.<2i>.rest
            _, i, rest = name.split(".", 2)
            name = f"h.{2 * int(i)}.{rest}"
        state[name] = tensor
    for i in range(1, new.config.n_layer, 2):
        for name in (f"h.{i}.attn.c_proj.weight", f"h.{i}.mlp.c_proj.weight"):
            state[name] = torch.zeros_like(state[name])
    return new, state


def wider():
    """Every tensor doubled along its channel axes: old weights in the old places (per part of a
    fused Linear: q, k, v; gate, up), zero where the new residual channels are written, random
    (the new model's init) wherever they are read: zero inputs for now, but the path by which the
    loss reaches the zero weights (were reads zero too, no new weight would ever get a gradient)."""
    new = GPT(replace(c, n_embd=2 * c.n_embd, n_head=2 * c.n_head, n_kv_head=2 * c.n_kv_head,
                      mlp_hidden=2 * c.mlp_hidden, norm_eps=c.norm_eps / 2))
    state = new.state_dict()
    C = c.n_embd                                     # old residual channels (= heads x head_dim)
    for name, w in old_state.items():
        if name == "lm_head.weight":                 # tied to wte: set through it
            continue
        n = state[name]
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            n[:C] = w / math.sqrt(2)                 # the RMS over 2C channels, C of them zero
            n[C:] = 1 / math.sqrt(2)
        elif name == "wte.weight":                   # new residual channels start at zero
            n.zero_()
            n[:, :C] = w
        elif name.endswith("attn.c_attn.weight"):    # q, k, v: (3C, C) -> (6C, 2C)
            for part in range(3):
                rows = n[2 * C * part:2 * C * (part + 1)]
                rows[:C, :C] = w[C * part:C * (part + 1)]
        elif name.endswith("mlp.c_fc.weight"):       # gate, up: (2H, C) -> (4H, 2C)
            H = c.mlp_hidden
            for part in range(2):
                rows = n[2 * H * part:2 * H * (part + 1)]
                rows[:H, :C] = w[H * part:H * (part + 1)]
        elif name.endswith("c_proj.weight"):         # (C, X) -> (2C, 2X): only old -> old
            n.zero_()
            n[:C, :w.shape[1]] = w
        else:
            raise ValueError(f"{name}: no rule to widen it")
    return new, state


# ---------------------------------------------------------------------------------------------
# the grown model predicts what the old one did
new, state = deeper() if args.double == "depth" else wider()
new.load_state_dict(state)
tokens = torch.randint(c.vocab_size, (2, min(64, c.block_size)))
with torch.no_grad():
    gap = (old(tokens)[0] - new(tokens)[0]).abs().max().item()
assert gap <= (0.0 if args.double == "depth" else 1e-4), f"the grown model's logits differ by {gap}"

# ---------------------------------------------------------------------------------------------
# saved with the old metadata; a tokenizer the metadata names relative to the old checkpoint (beside
# it) is copied beside the new one, where a run looks for it
out = Path(args.out)
for key in ("n_layer", "n_embd", "n_head"):
    if key in meta["args"]:
        meta["args"][key] = getattr(new.config, key)
save_checkpoint(out, new, args=meta["args"])
vq = meta["args"].get("vq")
if vq and not Path(vq).is_absolute() and recorded_path(vq, Path(args.ckpt).parent).is_file():
    shutil.copyfile(recorded_path(vq, Path(args.ckpt).parent), recorded_path(vq, out.parent))
print(f"{args.ckpt}: {c.n_layer} layers x {c.n_embd} channels, {old.num_params():,} parameters -> {out}: "
      f"{new.config.n_layer} x {new.config.n_embd}, {new.num_params():,}; logits within {gap:.1e}")
