"""
The visual tokenizer: a VQ-VAE (or FSQ-VAE) that turns a 64x64 frame into 8x8 = 64 discrete codes and back.

    codes = vq.tokenize(frames)     # (N, H, W, 3) uint8 or (N, 3, H, W) float in [0, 1] -> (N, 64) long
    frames = vq.detokenize(codes)   # (N, 64) long -> (N, 3, H, W) float in [0, 1]

Architecture (a small cousin of VQGAN/iVideoGPT's tokenizer, without the GAN and perceptual losses):
encoder = conv 3x3, then per level a stride-2 conv 4x4 and a residual block (channels 32 -> 64 -> 128, three levels
= 8x downsampling), then a 1x1 conv to the code dimension; the decoder mirrors it with nearest-neighbour upsampling +
conv 3x3. No normalisation layers: the model is fully convolutional, so it can train on 32x32 crops (4x cheaper on a
CPU, the latent grid stays aligned because crops start at multiples of 8) and run on whole frames.

Two quantisers, `VQConfig.quantizer`:
- "vq" (default): nearest codebook vector, straight-through gradient (z + (q - z).detach()), codebook loss
  ||sg[z] - q||^2 + beta * commitment ||z - sg[q]||^2 (VQ-VAE, beta = 0.25). The codebook is initialised from the
  encoder outputs of the first training batch (random init leaves most codes unused), and `restart_dead` re-seeds
  codes whose running usage fell near zero with random encoder outputs (dead-code restart), so usage stays high.
- "fsq": finite scalar quantisation (Mentzer et al. 2023, the paper's choice): each of a few channels is bounded by
  tanh and rounded to one of L_i levels (straight-through); the code is the mixed-radix number of the digits, so
  the codebook is implicit (prod L_i codes, default 8x8x8 = 512), has no loss and cannot collapse.
Usage statistics: `codebook_stats(codes)` gives the number of codes used and the perplexity exp(H) of their histogram.
The tokenizer is trained by train_video.py --stage=tokenizer and frozen afterwards (MLE and RLVR only see codes).
"""
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file


@dataclass
class VQConfig:
    size: int = 64                                   # frame side in pixels
    channels: tuple = (32, 64, 128)                  # one stride-2 level each: 8x downsampling
    quantizer: str = "vq"                            # "vq" | "fsq"
    n_codes: int = 512                               # vq: codebook size
    code_dim: int = 32                               # vq: codebook vector size
    fsq_levels: tuple = (8, 8, 8)                    # fsq: levels per channel (512 codes)
    beta: float = 0.25                               # vq: commitment weight

    def __post_init__(self):
        assert self.quantizer in ("vq", "fsq"), f"quantizer must be vq|fsq, got {self.quantizer!r}"
        self.channels, self.fsq_levels = tuple(self.channels), tuple(self.fsq_levels)
        if self.quantizer == "fsq":
            self.n_codes = math.prod(self.fsq_levels)

    @property
    def grid(self):
        return self.size // 2 ** len(self.channels)

    @property
    def codes_per_frame(self):
        return self.grid ** 2


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
        self.register_buffer("usage", torch.ones(n_codes))          # running mean of assignments per batch
        self.register_buffer("initialised", torch.tensor(False))

    def forward(self, z):
        """z (B, dim, h, w) -> (z_q (B, dim, h, w) with straight-through gradient, loss, indices (B, h, w))."""
        B, C, h, w = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, C)
        if self.training and not bool(self.initialised):
            self.restart(flat, torch.ones(len(self.codebook), dtype=torch.bool))
            self.initialised.fill_(True)
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
        """Set the codes in `which` (bool mask) to random rows of flat (N, dim), with a little noise."""
        n = int(which.sum())
        rows = flat.detach()[torch.randint(len(flat), (n,), device=flat.device)]
        self.codebook.data[which] = rows + 0.01 * rows.std() * torch.randn_like(rows)
        self.usage[which] = 1.0
        return n

    def restart_dead(self, flat, threshold=0.03):
        """Dead-code restart: re-seed codes used less than `threshold` times per batch (running mean) -> count."""
        return self.restart(flat, self.usage < threshold)

    def lookup(self, idx):
        return self.codebook[idx]                                     # (..., dim)


class FSQ(nn.Module):
    def __init__(self, levels):
        super().__init__()
        L = torch.tensor(levels, dtype=torch.float32)
        self.register_buffer("levels", L, persistent=False)
        self.register_buffer("basis", torch.cumprod(torch.tensor([1] + list(levels[:-1])), 0), persistent=False)

    def forward(self, z):
        """z (B, d, h, w) -> (z_q in [-1, 1], loss 0, indices (B, h, w)); d = len(levels)."""
        L = self.levels.view(1, -1, 1, 1)
        half_l = (L - 1) * (1 + 1e-3) / 2
        offset = (L % 2 == 0).float() * 0.5                           # even L: levels -L/2 .. L/2 - 1
        bounded = torch.tanh(z + torch.atanh(offset / half_l)) * half_l - offset
        digits = bounded + (bounded.round() - bounded).detach()       # round, straight-through
        half_w = torch.div(L, 2, rounding_mode="floor")
        idx = ((digits.detach() + half_w) * self.basis.view(1, -1, 1, 1)).sum(1).round().long()
        return digits / half_w, z.new_zeros(()), idx

    def lookup(self, idx):
        half_w = torch.div(self.levels, 2, rounding_mode="floor")
        digits = torch.div(idx[..., None], self.basis, rounding_mode="floor") % self.levels - half_w
        return digits / half_w                                         # (..., d)


class VQVAE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = c = config
        qdim = len(c.fsq_levels) if c.quantizer == "fsq" else c.code_dim
        enc, prev = [nn.Conv2d(3, c.channels[0], 3, padding=1)], c.channels[0]
        for ch in c.channels:
            enc += [nn.Conv2d(prev, ch, 4, stride=2, padding=1), ResBlock(ch)]
            prev = ch
        self.encoder = nn.Sequential(*enc, nn.SiLU(), nn.Conv2d(prev, qdim, 1))
        dec = [nn.Conv2d(qdim, prev, 1), ResBlock(prev)]
        for ch in list(reversed(c.channels))[1:] + [c.channels[0]]:
            dec += [nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(prev, ch, 3, padding=1), ResBlock(ch)]
            prev = ch
        self.decoder = nn.Sequential(*dec, nn.SiLU(), nn.Conv2d(prev, 3, 3, padding=1))
        self.quantizer = FSQ(c.fsq_levels) if c.quantizer == "fsq" else VectorQuantizer(c.n_codes, c.code_dim, c.beta)

    def forward(self, x):
        """x (B, 3, H, W) in [0, 1] -> (reconstruction, quantiser loss, indices (B, h, w))."""
        z_q, qloss, idx = self.quantizer(self.encoder(x * 2 - 1))
        return self.decoder(z_q) + 0.5, qloss, idx

    def _frames(self, frames):
        if isinstance(frames, np.ndarray):
            frames = torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255
        return frames.to(self.quantizer.lookup(torch.zeros(1, dtype=torch.long)).device)

    @torch.no_grad()
    def tokenize(self, frames, batch_size=256):
        """(N, H, W, 3) uint8 array or (N, 3, H, W) float tensor in [0, 1] -> codes (N, grid * grid) long."""
        x = self._frames(frames)
        return torch.cat([self.quantizer(self.encoder(x[i:i + batch_size] * 2 - 1))[2].flatten(1)
                          for i in range(0, len(x), batch_size)])

    @torch.no_grad()
    def detokenize(self, codes):
        """codes (N, grid * grid) long -> frames (N, 3, H, W) float in [0, 1]."""
        g = self.config.grid
        z = self.quantizer.lookup(codes.view(-1, g, g)).permute(0, 3, 1, 2)
        return (self.decoder(z) + 0.5).clamp(0, 1)


def codebook_stats(codes, n_codes):
    """codes: any long tensor -> dict(used = distinct codes, perplexity = exp(entropy of the code histogram))."""
    p = torch.bincount(codes.flatten(), minlength=n_codes).float()
    p = p / p.sum()
    nz = p[p > 0]
    return dict(used=int((p > 0).sum()), perplexity=float(torch.exp(-(nz * nz.log()).sum())))


# -----------------------------------------------------------------------------
# one safetensors file: weights + config (and training metadata) in the header

def save_vq(path, model, meta=None):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = getattr(model, "module", model)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    header = {"format": "nanorlvr-vq-1", "config": asdict(model.config), **(meta or {})}
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"nanorlvr": json.dumps(header)})
    os.replace(tmp, path)


def load_vq(path, device="cpu"):
    """-> (VQVAE in eval mode, header dict). A clear ValueError naming the file on any problem."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            header = json.loads((f.metadata() or {})["nanorlvr"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        assert header.get("format") == "nanorlvr-vq-1"
    except Exception as e:
        raise ValueError(f"{path}: not a nanoRLVR tokenizer checkpoint ({type(e).__name__}: {e})") from None
    model = VQVAE(VQConfig(**header["config"]))
    model.load_state_dict(tensors)
    return model.to(device).eval().requires_grad_(False), header
