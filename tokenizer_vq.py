"""
The visual tokenizers: discrete codes for 64x64 frames and back. Two kinds, with one API:

    codes = vq.tokenize(frames, context)     # frames, context: (N, H, W, 3) uint8 or (N, 3, H, W) float in [0, 1]
    frames = vq.detokenize(codes, context)   # codes (N, L) long -> (N, 3, H, W) float in [0, 1]
    ctx_codes = vq.tokenize_context(frames)  # the codes a context frame gets in the GPT's sequence

1. `VQVAE`, per frame: every frame becomes 8x8 = 64 codes, on its own (`context` is ignored), and is decoded on
   its own, every pixel re-drawn; with `vq.copy_gate = True` (train_video.py --copy_gate=1) decoding against a
   context frame copies the context's pixels in every 8x8 cell whose code is the context frame's code there, so a
   cell the prediction leaves as it was is the context exactly (docs/video.md: the GPT on per-frame codes reads its
   action, the one on context-conditioned codes does not).
2. `CondVQVAE`, context-conditioned (iVideoGPT's idea, small): a context frame keeps the per-frame VQ's 64 codes (the
   GPT must see it), and a *future* frame becomes an 8x8 grid of codes of its own codebook, computed by an encoder
   that sees the frame and the context frame together, and decoded by a U-Net whose skip connections are features
   of the context frame. The output starts from the context frame itself: out = ctx + sigmoid(gate) * change, with
   a per-pixel gate trained to say which pixels changed (decoding tokens shuts it where it is under 1/2, so those
   pixels are the context's exactly) and a change that starts at zero (an untrained decoder copies the context).
   Static pixels are carried over and the codes spend their capacity on what moves (gripper, pushed blocks, and the
   table they uncover). The context is the *true* last observed frame, which a world model always has; a window's
   future frames are all coded against the same (last) context frame. A 4x4 grid (16 codes, channels=(16, 32, 64,
   128)) would be 4x cheaper for the GPT but cannot redraw the uncovered table: its reconstruction of the next frame
   stayed worse than copying the last frame (MAE 0.0083 vs 0.0052; docs/video.md).

VQVAE architecture (a small cousin of VQGAN/iVideoGPT's tokenizer, without the GAN and perceptual losses):
encoder = conv 3x3, then per level a stride-2 conv 4x4 and a residual block (channels 32 -> 64 -> 128, three levels
= 8x downsampling), then a 1x1 conv to the code dimension; the decoder mirrors it with nearest-neighbour upsampling +
conv 3x3. No normalisation layers: the model is fully convolutional, so it can train on 32x32 crops (4x cheaper on a
CPU, the latent grid stays aligned because crops start at multiples of 8) and run on whole frames. CondVQVAE uses the
same blocks (channels 16 -> 32 -> 64) for its encoder, its context encoder and its U-Net decoder.

Two quantisers, `VQConfig.quantizer`:
- "vq" (default): nearest codebook vector, straight-through gradient (z + (q - z).detach()), codebook loss
  ||sg[z] - q||^2 + beta * commitment ||z - sg[q]||^2 (VQ-VAE, beta = 0.25). The codebook is initialised from the
  encoder outputs of the first training batch (random init leaves most codes unused), and `restart_dead` re-seeds
  codes whose running usage fell near zero with random encoder outputs (dead-code restart), so usage stays high.
- "fsq": finite scalar quantisation (Mentzer et al. 2023, the paper's choice): each of a few channels is bounded by
  tanh and rounded to one of L_i levels (straight-through); the code is the mixed-radix number of the digits, so
  the codebook is implicit (prod L_i codes, default 8x8x8 = 512), has no loss and cannot collapse.
Usage statistics: `codebook_stats(codes)` gives the number of codes used and the perplexity exp(H) of their histogram.
The tokenizers are trained by train_video.py --stage=tokenizer and frozen afterwards (MLE and RLVR only see codes).
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

from checkpoint import atomic_write


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
        if n == 0:   # nothing to restart (and the std of no rows would warn)
            return 0
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
        self.copy_gate = False   # True: detokenize copies the context in cells of its own code
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

    def encode(self, x, ctx=None):
        """x (B, 3, H, W) in [0, 1] -> pre-quantisation latents (B, qdim, H/8, W/8); ctx is ignored."""
        return self.encoder(x * 2 - 1)

    def forward(self, x, ctx=None):
        """x (B, 3, H, W) in [0, 1] -> (reconstruction, quantiser loss, indices (B, h, w)); ctx is ignored."""
        z_q, qloss, idx = self.quantizer(self.encode(x))
        return self.decoder(z_q) + 0.5, qloss, idx

    @torch.no_grad()
    def tokenize(self, frames, context=None, batch_size=256):
        """(N, H, W, 3) uint8 array or (N, 3, H, W) float tensor in [0, 1] -> codes (N, grid * grid) long.
        context is ignored: a per-frame tokenizer codes every frame on its own."""
        x = as_float_frames(frames, self.quantizer.lookup(torch.zeros(1, dtype=torch.long)).device)
        return torch.cat([self.quantizer(self.encode(x[i:i + batch_size]))[2].flatten(1)
                          for i in range(0, len(x), batch_size)])

    tokenize_context = tokenize        # a context frame gets the same 64 codes as any frame

    @torch.no_grad()
    def detokenize(self, codes, context=None):
        """codes (N, grid * grid) long -> frames (N, 3, H, W) float in [0, 1]. The context frames
        (as in tokenize) are ignored, unless self.copy_gate: then each cell whose code equals the
        context frame's code there is the context's pixels."""
        g = self.config.grid
        z = self.quantizer.lookup(codes.view(-1, g, g)).permute(0, 3, 1, 2)
        x = (self.decoder(z) + 0.5).clamp(0, 1)                          # (N, 3, H, W)
        if not self.copy_gate or context is None:
            return x
        ctx = as_float_frames(context, x.device)                         # (N, 3, H, W)
        same = (self.tokenize(ctx) == codes.to(x.device)).view(-1, 1, g, g).float()   # (N, 1, g, g)
        keep = F.interpolate(same, size=x.shape[-2:], mode="nearest")    # 1 on a cell's pixels
        return keep * ctx + (1 - keep) * x

    def vocab(self):
        """Code-token ranges for data/robot/task.Layout: context frames and future frames share one codebook."""
        c = self.config
        return dict(context_codes=c.n_codes, context_len=c.codes_per_frame, n_codes=c.n_codes,
                    codes_per_frame=c.codes_per_frame, code_offset=0)


def as_float_frames(frames, device="cpu"):
    """(N, H, W, 3) uint8 array -> (N, 3, H, W) float in [0, 1]; a float tensor passes through. On `device`."""
    if isinstance(frames, np.ndarray):
        frames = torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255
    return frames.to(device)


# -----------------------------------------------------------------------------
# the context-conditioned tokenizer

@dataclass
class CondVQConfig(VQConfig):
    """The future frames' tokenizer: VQConfig's fields (its own narrower channels), plus the per-frame VQ's config."""
    channels: tuple = (16, 32, 64)                   # one stride-2 level each: 8x downsampling, an 8x8 code grid
    frame: dict = None                               # the VQConfig (as a dict) of the per-frame VQ for context frames

    def __post_init__(self):
        super().__post_init__()
        self.frame = asdict(VQConfig(**(self.frame or {})))   # normalised (tuples), so configs compare equal


class Pyramid(nn.Module):
    """conv 3x3, then per level a stride-2 conv 4x4 + residual block -> the features at every resolution, finest
    first: [(B, c0, S, S), (B, c0, S/2, S/2), (B, c1, S/4, S/4), ...]."""

    def __init__(self, in_ch, channels):
        super().__init__()
        self.stem = nn.Conv2d(in_ch, channels[0], 3, padding=1)
        prev, levels = channels[0], []
        for ch in channels:
            levels.append(nn.Sequential(nn.Conv2d(prev, ch, 4, stride=2, padding=1), ResBlock(ch)))
            prev = ch
        self.levels = nn.ModuleList(levels)

    def forward(self, x):
        feats = [self.stem(x)]
        for level in self.levels:
            feats.append(level(feats[-1]))
        return feats


class CondVQVAE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = c = config
        qdim = len(c.fsq_levels) if c.quantizer == "fsq" else c.code_dim
        self.frame = VQVAE(VQConfig(**c.frame))              # context frames' codes (trained first, then frozen)
        self.context_encoder = Pyramid(3, c.channels)         # context features for the decoder's skips
        self.encoder = Pyramid(6, c.channels)                 # sees the future frame and the context frame
        self.to_code = nn.Sequential(nn.SiLU(), nn.Conv2d(c.channels[-1], qdim, 1))
        self.from_code = nn.Conv2d(qdim, c.channels[-1], 1)
        # decoder, coarse to fine: at each resolution concatenate the context features, mix (conv + residual block),
        # then upsample and narrow to the next finer level's width
        widths = [c.channels[0]] + list(c.channels)           # feature widths of the pyramid, finest first
        self.mix = nn.ModuleList(nn.Sequential(nn.Conv2d(2 * w, w, 3, padding=1), ResBlock(w)) for w in widths)
        self.up = nn.ModuleList(nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"),
                                              nn.Conv2d(widths[i + 1], widths[i], 3, padding=1))
                                for i in range(len(widths) - 1))
        self.out = nn.Sequential(nn.SiLU(), nn.Conv2d(widths[0], 4, 3, padding=1))   # change (3) + gate logit (1)
        nn.init.zeros_(self.out[1].weight)      # starts as "copy the context": change 0
        nn.init.zeros_(self.out[1].bias)
        self.quantizer = FSQ(c.fsq_levels) if c.quantizer == "fsq" else VectorQuantizer(c.n_codes, c.code_dim, c.beta)

    def encode(self, x, ctx):
        """x, ctx (B, 3, H, W) in [0, 1] -> pre-quantisation latents (B, qdim, H/16, W/16)."""
        return self.to_code(self.encoder(torch.cat([x, ctx], 1) * 2 - 1)[-1])

    def decode(self, z_q, ctx, hard=False):
        """z_q (B, qdim, h, w), ctx (B, 3, H, W) -> frame (B, 3, H, W), gate logits (B, 1, H, W): the frame is the
        context plus the change where the gate is open. hard=True (tokens -> frames) shuts the gate wherever it is
        under 1/2, so those pixels are the context's exactly."""
        feats = self.context_encoder(ctx * 2 - 1)
        h = self.from_code(z_q)
        for i in reversed(range(len(feats))):
            h = self.mix[i](torch.cat([h, feats[i]], 1))
            if i > 0:
                h = self.up[i - 1](h)
        out = self.out(h)
        change, gate = out[:, :3], out[:, 3:]       # (B, 3, H, W), (B, 1, H, W)
        open_ = torch.sigmoid(gate) * (gate > 0) if hard else torch.sigmoid(gate)   # (B, 1, H, W)
        return ctx + open_ * change, gate

    def forward(self, x, ctx):
        """x, ctx (B, 3, H, W) in [0, 1] -> (reconstruction of x, auxiliary loss, indices (B, h, w)). The auxiliary
        loss is the quantiser's plus the gate's: binary cross-entropy against "this pixel changed" (> 2/255 in some
        channel). Without it the gate closes early, before the codes carry anything, and never reopens (the sigmoid
        saturates): the decoder then only copies the context."""
        z_q, qloss, idx = self.quantizer(self.encode(x, ctx))
        rec, gate = self.decode(z_q, ctx)
        changed = ((x - ctx).abs().amax(1, keepdim=True) > 2 / 255).float()
        return rec, qloss + F.binary_cross_entropy_with_logits(gate, changed), idx

    def _device(self):
        return self.quantizer.lookup(torch.zeros(1, dtype=torch.long)).device

    @torch.no_grad()
    def tokenize(self, frames, context, batch_size=256):
        """frames and their context frames (N each; uint8 arrays or float tensors) -> codes (N, grid * grid) long."""
        x, ctx = as_float_frames(frames, self._device()), as_float_frames(context, self._device())
        return torch.cat([self.quantizer(self.encode(x[i:i + batch_size], ctx[i:i + batch_size]))[2].flatten(1)
                          for i in range(0, len(x), batch_size)])

    @torch.no_grad()
    def tokenize_context(self, frames):
        """Context frames -> their per-frame codes (N, 64): what the GPT reads for a context frame."""
        return self.frame.tokenize(frames)

    @torch.no_grad()
    def detokenize(self, codes, context, batch_size=256):
        """codes (N, grid * grid) long, context frames (N, ...) -> frames (N, 3, H, W) float in [0, 1]."""
        g, ctx = self.config.grid, as_float_frames(context, self._device())
        z = self.quantizer.lookup(codes.view(-1, g, g)).permute(0, 3, 1, 2)
        return torch.cat([self.decode(z[i:i + batch_size], ctx[i:i + batch_size], hard=True)[0].clamp(0, 1)
                          for i in range(0, len(z), batch_size)])

    def vocab(self):
        """Code-token ranges for data/robot/task.Layout: context codes first, the future codes after them."""
        c, f = self.config, self.frame.config
        return dict(context_codes=f.n_codes, context_len=f.codes_per_frame, n_codes=c.n_codes,
                    codes_per_frame=c.codes_per_frame, code_offset=f.n_codes)


def codebook_stats(codes, n_codes):
    """codes: any long tensor -> dict(used = distinct codes, perplexity = exp(entropy of the code histogram))."""
    p = torch.bincount(codes.flatten(), minlength=n_codes).float()
    p = p / p.sum()
    nz = p[p > 0]
    return dict(used=int((p > 0).sum()), perplexity=float(torch.exp(-(nz * nz.log()).sum())))


# -----------------------------------------------------------------------------
# one safetensors file: weights + config (and training metadata) in the header

FORMATS = {"nanorlvr-vq-1": (VQVAE, VQConfig), "nanorlvr-cvq-1": (CondVQVAE, CondVQConfig)}


def save_vq(path, model, meta=None):
    """Either tokenizer -> one .safetensors file: weights, and config + `meta` as JSON in the header."""
    model = getattr(model, "module", model)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    fmt = "nanorlvr-cvq-1" if isinstance(model, CondVQVAE) else "nanorlvr-vq-1"
    header = {"format": fmt, "config": asdict(model.config), **(meta or {})}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata={"nanorlvr": json.dumps(header)}))


def load_vq(path, device="cpu"):
    """-> (VQVAE or CondVQVAE in eval mode, header dict). A clear ValueError naming the file on any problem."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            header = json.loads((f.metadata() or {})["nanorlvr"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        model_cls, config_cls = FORMATS[header.get("format")]
        model = model_cls(config_cls(**header["config"]))
        model.load_state_dict(tensors)
    except Exception as e:
        raise ValueError(f"{path}: not a nanoRLVR tokenizer checkpoint ({type(e).__name__}: {e})") from None
    return model.to(device).eval().requires_grad_(False), header
