"""
Grow a world model's depth without changing what it predicts: after each block of a checkpoint's
GPT, a new block whose two output projections (attention's and the MLP's c_proj) are zero, so it
adds nothing to the residual stream until training moves it. The grown model's logits equal the
old one's (checked here on random tokens). Training it further then asks whether the old model
was short of capacity (docs/video.md, the push):

    python experiments/deepen.py --ckpt=checkpoints/video_mle_4000.safetensors \
        --out=out/deep_init/video_mle.safetensors
    python train_video.py --stage=mle --mode=multi --init=out/deep_init/video_mle.safetensors \
        --data=out/robot4000 --out_dir=out/deep --mle_steps=500 --mle_lr=1e-3 --warmup=20

The new checkpoint keeps the old one's metadata (its tokenizer and flags), with n_layer doubled.
"""
import argparse
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file: the repository root
from checkpoint import load_model, recorded_path, save_checkpoint  # noqa: E402
from model import GPT  # noqa: E402

p = argparse.ArgumentParser(description="double a GPT checkpoint's depth with identity blocks",
                            allow_abbrev=False)
p.add_argument("--ckpt", required=True, help="a model checkpoint (.safetensors)")
p.add_argument("--out", required=True, help="the grown checkpoint (.safetensors)")
p.add_argument("--seed", type=int, default=0, help="the new blocks' random init (but c_proj)")
args = p.parse_args()
try:
    old, meta = load_model(args.ckpt)
except ValueError as e:
    sys.exit(f"error: {e}")

# ---------------------------------------------------------------------------------------------
# old block i becomes block 2i; block 2i+1 is new, its output projections zero
torch.manual_seed(args.seed)
new = GPT(replace(old.config, n_layer=2 * old.config.n_layer))
state = new.state_dict()
for name, tensor in old.state_dict().items():
    if name.startswith("h."):                        # h.<i>.rest -> h.<2i>.rest
        _, i, rest = name.split(".", 2)
        name = f"h.{2 * int(i)}.{rest}"
    state[name] = tensor
for i in range(1, new.config.n_layer, 2):
    for name in (f"h.{i}.attn.c_proj.weight", f"h.{i}.mlp.c_proj.weight"):
        state[name] = torch.zeros_like(state[name])
new.load_state_dict(state)

# the grown model predicts exactly what the old one did
tokens = torch.randint(old.config.vocab_size, (2, min(64, old.config.block_size)))
with torch.no_grad():
    gap = (old(tokens)[0] - new(tokens)[0]).abs().max().item()
assert gap == 0.0, f"the grown model's logits differ by {gap}"

# ---------------------------------------------------------------------------------------------
# saved with the old metadata; a tokenizer the metadata names relative to the old checkpoint (beside
# it) is copied beside the new one, where a run looks for it
out = Path(args.out)
meta["args"]["n_layer"] = new.config.n_layer
save_checkpoint(out, new, args=meta["args"])
vq = meta["args"].get("vq")
if vq and not Path(vq).is_absolute() and recorded_path(vq, Path(args.ckpt).parent).is_file():
    shutil.copyfile(recorded_path(vq, Path(args.ckpt).parent), recorded_path(vq, out.parent))
print(f"{args.ckpt}: {old.config.n_layer} layers, {old.num_params():,} parameters -> {out}: "
      f"{new.config.n_layer} layers, {new.num_params():,}; the same logits")
