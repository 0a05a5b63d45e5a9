"""Build the LPIPS-VGG weights file that video_rewards.LPIPS loads (run once, on a machine with internet).

    pip install lpips torchvision          # the official LPIPS package; it fetches torchvision's VGG16 weights
    python tools/convert_lpips.py --out=checkpoints/lpips_vgg.safetensors
    python train_video.py --lpips=checkpoints/lpips_vgg.safetensors         # reward mae+lpips, lpips in eval

The official model is `lpips.LPIPS(net="vgg")`: torchvision's ImageNet VGG16 features split into five slices
(features[0:4], [4:9], [9:16], [16:23], [23:30]; each slice keeps torchvision's layer indices as module names) and
five learned 1x1 "lin" layers (`lin<k>.model.1.weight`, shipped inside the lpips package). We write
`features.<i>.weight/bias` (torchvision's names) and `lin<k>.weight`, then check on random images that our plain-torch
LPIPS gives the official distances (to 1e-5). Only this converter imports lpips/torchvision; the runtime does not.

`--random_vgg=1` builds torchvision's VGG16 with random weights instead (no download; the lin layers are still the
official ones shipped in the lpips package): the file is useless as a metric, but it lets a machine without internet
check our LPIPS against the official code (tests/test_video_rewards.py does, in CI).
"""
import argparse
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from video_rewards import load_lpips  # noqa: E402


def convert(out, random_vgg=False):
    import lpips                                            # official package, only here
    official = lpips.LPIPS(net="vgg", pnet_rand=random_vgg, verbose=False).eval()
    tensors = {}
    for s in range(1, 6):
        for name, module in getattr(official.net, f"slice{s}").named_children():   # name = torchvision index
            if isinstance(module, torch.nn.Conv2d):
                tensors[f"features.{name}.weight"] = module.weight.detach().contiguous()
                tensors[f"features.{name}.bias"] = module.bias.detach().contiguous()
    for k in range(5):
        tensors[f"lin{k}.weight"] = getattr(official, f"lin{k}").model[-1].weight.detach().contiguous()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out))
    ours = load_lpips(out)
    x, y = torch.rand(4, 3, 64, 64), torch.rand(4, 3, 64, 64)
    ref = official(x, y, normalize=True).flatten()          # normalize=True: inputs in [0, 1]
    err = (ours(x, y) - ref).abs().max().item()
    print(f"wrote {out}: {len(tensors)} tensors; max |ours - official| on random images = {err:.2e}")
    if err > 1e-5:
        sys.exit("error: our LPIPS disagrees with the official one")
    return official


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--out", default="checkpoints/lpips_vgg.safetensors")
    p.add_argument("--random_vgg", type=int, default=0, help="1: random VGG16 weights, for parity checks offline")
    args = p.parse_args()
    convert(args.out, bool(args.random_vgg))
