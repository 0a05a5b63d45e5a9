"""
The visual tokenizer: discrete codes for 64x64 frames and back (research/cond_tokenizer.py's too):

    codes = vq.tokenize(frames)              # (N, H, W, 3) uint8 or (N, 3, H, W) float in [0, 1]
    frames = vq.detokenize(codes, context)   # codes (N, L) long -> (N, 3, H, W) float in [0, 1]
    ctx_codes = vq.tokenize_context(frames)  # the codes a context frame gets in the GPT's sequence

`VQVAE`, per frame: every frame becomes 8x8 = 64 codes, on its own, and is decoded on its own; with
`vq.copy_gate = True` (train_video.py's RLVR and evaluation) decoding against a context frame copies
the context's pixels in every 8x8 cell whose code is the context frame's code there.

Architecture: a small cousin of VQGAN/iVideoGPT's tokenizer without the GAN and perceptual losses,
per level a stride-2 conv and a residual block (8x downsampling), the decoder its mirror. Fully
convolutional (no normalisation layers), so it trains on 32x32 crops and runs on whole frames.
The quantiser: nearest codebook vector, straight-through gradient, codebook loss ||sg[z] - q||^2 +
beta * commitment ||z - sg[q]||^2 (VQ-VAE). The codebook starts from encoder outputs (random init
leaves most codes unused) and dead codes are re-seeded (restart_dead), so usage stays high.
"""
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from checkpoint import atomic_write


@dataclass
class VQConfig:
    size: int = 64                                   # frame side in pixels
    channels: tuple = (32, 64, 128)                  # one stride-2 level each: 8x downsampling
    n_codes: int = 512                               # vq: codebook size
    code_dim: int = 32                               # vq: codebook vector size
    beta: float = 0.25                               # vq: commitment weight

    def __post_init__(self):
        self.channels = tuple(self.channels)                # a list when read from JSON
        self.grid = self.size // 2 ** len(self.channels)    # the code grid's side
        self.codes_per_frame = self.grid ** 2


class ResBlock(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(ch, ch, 3, padding=1), nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x):
        return x + self.conv2(F.silu(self.conv1(F.silu(x))))


class VectorQuantizer(nn.Module):
    def __init__(self, n_codes, dim, beta):
        super().__init__()
        self.beta = beta
        self.codebook = nn.Parameter(torch.randn(n_codes, dim) / math.sqrt(dim))
        self.register_buffer("usage", torch.ones(n_codes))   # running mean of assignments per batch
        self.register_buffer("initialised", torch.tensor(False))

    def forward(self, z):
        """z (B, dim, h, w) -> (z_q, straight-through gradient; loss; indices (B, h, w))."""
        B, C, h, w = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, C)
        if self.training and not bool(self.initialised):   # the first batch seeds every code
            self.restart(flat, torch.ones(len(self.codebook), dtype=torch.bool))
        cb = self.codebook
        dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ cb.t() + cb.pow(2).sum(1)[None]
        idx = dist.argmin(1)
        q = cb[idx]
        loss = F.mse_loss(q, flat.detach()) + self.beta * F.mse_loss(flat, q.detach())
        if self.training:
            counts = torch.bincount(idx, minlength=len(cb)).float()
            self.usage.mul_(0.99).add_(0.01 * counts)
        q = flat + (q - flat).detach()
        return q.view(B, h, w, C).permute(0, 3, 1, 2), loss, idx.view(B, h, w)

    @torch.no_grad()
    def restart(self, flat, which):
        """Set the codes in `which` (bool mask) to random rows of flat (N, dim), plus noise."""
        n = int(which.sum())
        if n == 0:   # nothing to restart (and the std of no rows would warn)
            return 0
        rows = flat.detach()[torch.randint(len(flat), (n,), device=flat.device)]
        self.codebook.data[which] = rows + 0.01 * rows.std() * torch.randn_like(rows)
        self.usage[which] = 1.0
        self.initialised.fill_(True)   # seeded from data: the forward pass keeps it
        return n

    def restart_dead(self, flat, threshold=0.03):
        """Re-seed the codes used < `threshold` times per batch (running mean) -> their count."""
        return self.restart(flat, self.usage < threshold)


class VQVAE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = c = config
        self.copy_gate = False   # True: detokenize copies the context in cells of its own code
        enc, prev = [nn.Conv2d(3, c.channels[0], 3, padding=1)], c.channels[0]
        for ch in c.channels:
            enc += [nn.Conv2d(prev, ch, 4, stride=2, padding=1), ResBlock(ch)]
            prev = ch
        self.encoder = nn.Sequential(*enc, nn.SiLU(), nn.Conv2d(prev, c.code_dim, 1))
        dec = [nn.Conv2d(c.code_dim, prev, 1), ResBlock(prev)]
        for ch in list(reversed(c.channels))[1:] + [c.channels[0]]:
            dec += [nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(prev, ch, 3, padding=1),
                    ResBlock(ch)]
            prev = ch
        self.decoder = nn.Sequential(*dec, nn.SiLU(), nn.Conv2d(prev, 3, 3, padding=1))
        self.quantizer = VectorQuantizer(c.n_codes, c.code_dim, c.beta)

    def encode(self, x, ctx=None):
        """x (B, 3, H, W) in [0, 1] -> latents (B, code_dim, H/8, W/8); ctx is ignored."""
        return self.encoder(x * 2 - 1)

    def forward(self, x, ctx=None):
        """x (B, 3, H, W) in [0, 1] -> (reconstruction, quantiser loss, indices (B, h, w))."""
        z_q, qloss, idx = self.quantizer(self.encode(x))
        return self.decoder(z_q) + 0.5, qloss, idx

    @torch.no_grad()
    def tokenize(self, frames, context=None, batch_size=256):
        """frames as in as_float_frames -> codes (N, grid * grid) long; context is ignored."""
        x = as_float_frames(frames, self.quantizer.codebook.device)
        starts = tqdm(range(0, len(x), batch_size), desc="frames to codes", leave=False,
                      disable=len(x) <= 8 * batch_size)   # a bar where it takes seconds
        return torch.cat([self.quantizer(self.encode(x[i:i + batch_size]))[2].flatten(1)
                          for i in starts])

    tokenize_context = tokenize        # a context frame gets the same 64 codes as any frame

    @torch.no_grad()
    def detokenize(self, codes, context=None):
        """codes (N, grid * grid) long -> frames (N, 3, H, W) float in [0, 1]; with self.copy_gate,
        each cell whose code is the context frame's code there is the context's pixels."""
        g = self.config.grid
        z = self.quantizer.codebook[codes.view(-1, g, g)].permute(0, 3, 1, 2)   # (N, dim, g, g)
        x = (self.decoder(z) + 0.5).clamp(0, 1)                          # (N, 3, H, W)
        if not self.copy_gate or context is None:
            return x
        ctx = as_float_frames(context, x.device)                         # (N, 3, H, W)
        same = (self.tokenize(ctx) == codes.to(x.device)).view(-1, 1, g, g).float()   # (N, 1, g, g)
        keep = F.interpolate(same, size=x.shape[-2:], mode="nearest")    # 1 on a cell's pixels
        return keep * ctx + (1 - keep) * x

    def vocab(self):
        """Code-token ranges for data/robot/task.Layout: one codebook for context and future."""
        c = self.config
        return dict(context_codes=c.n_codes, context_len=c.codes_per_frame, n_codes=c.n_codes,
                    codes_per_frame=c.codes_per_frame, code_offset=0)


def as_float_frames(frames, device="cpu"):
    """(N, H, W, 3) uint8 array -> (N, 3, H, W) float in [0, 1] on `device` (a tensor: as is)."""
    if isinstance(frames, np.ndarray):
        frames = torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255
    return frames.to(device)


def codebook_stats(codes, n_codes):
    """codes: a long tensor -> dict(used: distinct codes, perplexity: exp(entropy of their use))."""
    p = torch.bincount(codes.flatten(), minlength=n_codes).float()
    p = p / p.sum()
    nz = p[p > 0]
    return dict(used=int((p > 0).sum()), perplexity=float(torch.exp(-(nz * nz.log()).sum())))


# -----------------------------------------------------------------------------
# one safetensors file: weights + config (and training metadata) in the header

# format name -> (model, config) classes; a study registers its own (research/cond_tokenizer.py)
FORMATS = {"nanorlvr-vq-1": (VQVAE, VQConfig)}


def save_vq(path, model, meta=None):
    """A tokenizer -> one .safetensors file: weights, and config + `meta` as JSON in the header."""
    model = getattr(model, "module", model)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    fmt = next(name for name, (cls, _) in FORMATS.items() if type(model) is cls)
    header = {"format": fmt, "config": asdict(model.config), **(meta or {})}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp),
                                             metadata={"nanorlvr": json.dumps(header)}))


def load_vq(path, device="cpu"):
    """-> (the tokenizer in eval mode, header dict); a ValueError naming the file on any problem."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            header = json.loads((f.metadata() or {})["nanorlvr"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        model_cls, config_cls = FORMATS[header.get("format")]
        # the fields of its config class (older files also name the quantizer: "vq", the only one)
        config = {k: v for k, v in header["config"].items() if k in config_cls.__dataclass_fields__}
        assert header["config"].get("quantizer", "vq") == "vq", "a quantizer other than vq"
        model = model_cls(config_cls(**config))
        model.load_state_dict(tensors)
    except Exception as e:
        raise ValueError(f"{path}: not a nanoRLVR tokenizer ({type(e).__name__}: {e})") from None
    return model.to(device).eval().requires_grad_(False), header
