"""
The context-conditioned tokenizer (iVideoGPT's idea, small), a study: a context frame keeps the
per-frame VQ's 64 codes (the GPT must see it), and a *future* frame becomes an 8x8 grid of codes of
its own codebook, computed by an encoder that sees the frame and the context frame together, and
decoded by a U-Net whose skip connections are features of the context frame. The output starts from
the context frame itself: out = ctx + sigmoid(gate) * change, with a per-pixel gate trained to say
which pixels changed (decoding tokens shuts it where it is under 1/2, so those pixels are the
context's exactly). Finding (research/README.md): the GPT on these codes predicts well but ignores the
action; the one on per-frame codes with the copy gate (the core's) reads it. A 4x4 grid could not
redraw the uncovered table (next-frame MAE 0.0083 vs copying's 0.0052).

    python research/cond_tokenizer.py --vq=checkpoints/video_vq.safetensors --out=out/cvq.safetensors

Importing this module registers the format with tokenizer_vq.load_vq, so cvq files load there (and
data/robot/task.Layout.of / tokenize_split read them: still_code and find_still_code live there).
"""
import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tokenizer_vq  # noqa: E402
from tokenizer_vq import (ResBlock, VQConfig, VQVAE, VectorQuantizer, as_float_frames,  # noqa: E402
                          load_vq, save_vq)


@dataclass
class CondVQConfig(VQConfig):
    """The future frames' tokenizer: VQConfig's fields (its own narrower channels), plus the
    per-frame VQ's config."""
    channels: tuple = (16, 32, 64)   # one stride-2 level each: 8x downsampling, an 8x8 code grid
    frame: dict = None               # the VQConfig (as a dict) of the per-frame VQ for context frames

    def __post_init__(self):
        super().__post_init__()
        frame = {k: v for k, v in (self.frame or {}).items() if k in VQConfig.__dataclass_fields__}
        self.frame = asdict(VQConfig(**frame))   # normalised (tuples), so configs compare equal


class Pyramid(nn.Module):
    """conv 3x3, then per level a stride-2 conv 4x4 + residual block -> the features at every
    resolution, finest first."""

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
        self.frame = VQVAE(VQConfig(**c.frame))        # context frames' codes (trained, frozen)
        self.context_encoder = Pyramid(3, c.channels)   # context features for the decoder's skips
        self.encoder = Pyramid(6, c.channels)           # sees the future frame and the context
        self.to_code = nn.Sequential(nn.SiLU(), nn.Conv2d(c.channels[-1], c.code_dim, 1))
        self.from_code = nn.Conv2d(c.code_dim, c.channels[-1], 1)
        # decoder, coarse to fine: at each resolution concatenate the context features, mix, then
        # upsample and narrow to the next finer level's width
        widths = [c.channels[0]] + list(c.channels)
        self.mix = nn.ModuleList(nn.Sequential(nn.Conv2d(2 * w, w, 3, padding=1), ResBlock(w))
                                 for w in widths)
        self.up = nn.ModuleList(nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"),
                                              nn.Conv2d(widths[i + 1], widths[i], 3, padding=1))
                                for i in range(len(widths) - 1))
        # change (3) + gate logit (1); starts as "copy the context": change 0
        self.out = nn.Sequential(nn.SiLU(), nn.Conv2d(widths[0], 4, 3, padding=1))
        nn.init.zeros_(self.out[1].weight)
        nn.init.zeros_(self.out[1].bias)
        self.quantizer = VectorQuantizer(c.n_codes, c.code_dim, c.beta)

    def encode(self, x, ctx):
        return self.to_code(self.encoder(torch.cat([x, ctx], 1) * 2 - 1)[-1])

    def decode(self, z_q, ctx, hard=False):
        """-> frame, gate logits: the context plus the change where the gate is open (hard: shut
        wherever it is under 1/2, so those pixels are the context's exactly)."""
        feats = self.context_encoder(ctx * 2 - 1)
        h = self.from_code(z_q)
        for i in reversed(range(len(feats))):
            h = self.mix[i](torch.cat([h, feats[i]], 1))
            if i > 0:
                h = self.up[i - 1](h)
        out = self.out(h)
        change, gate = out[:, :3], out[:, 3:]
        open_ = torch.sigmoid(gate) * (gate > 0) if hard else torch.sigmoid(gate)
        return ctx + open_ * change, gate

    def forward(self, x, ctx):
        """-> (reconstruction, quantiser loss + the gate's BCE against "this pixel changed",
        indices). Without the gate's loss it closes early and never reopens."""
        z_q, qloss, idx = self.quantizer(self.encode(x, ctx))
        rec, gate = self.decode(z_q, ctx)
        changed = ((x - ctx).abs().amax(1, keepdim=True) > 2 / 255).float()
        return rec, qloss + F.binary_cross_entropy_with_logits(gate, changed), idx

    def _device(self):
        return self.quantizer.codebook.device

    @torch.no_grad()
    def tokenize(self, frames, context, batch_size=256):
        x, ctx = as_float_frames(frames, self._device()), as_float_frames(context, self._device())
        return torch.cat([self.quantizer(self.encode(x[i:i + batch_size],
                                                     ctx[i:i + batch_size]))[2].flatten(1)
                          for i in range(0, len(x), batch_size)])

    @torch.no_grad()
    def tokenize_context(self, frames):
        return self.frame.tokenize(frames)

    @torch.no_grad()
    def detokenize(self, codes, context, batch_size=256):
        g, ctx = self.config.grid, as_float_frames(context, self._device())
        z = self.quantizer.codebook[codes.view(-1, g, g)].permute(0, 3, 1, 2)
        return torch.cat([self.decode(z[i:i + batch_size], ctx[i:i + batch_size],
                                      hard=True)[0].clamp(0, 1)
                          for i in range(0, len(z), batch_size)])

    def vocab(self):
        """Code-token ranges for data/robot/task.Layout: context codes first, then future codes."""
        c, f = self.config, self.frame.config
        return dict(context_codes=f.n_codes, context_len=f.codes_per_frame, n_codes=c.n_codes,
                    codes_per_frame=c.codes_per_frame, code_offset=f.n_codes)


tokenizer_vq.FORMATS["nanorlvr-cvq-1"] = (CondVQVAE, CondVQConfig)


def train(frame_vq, frames, steps=2000, batch=32, crop=32, lr=1e-3, move_weight=10.0, gap=7,
          seed=1337):
    """A CondVQVAE on top of the per-frame VQ `frame_vq` (frozen), trained on random (frame t + k,
    context t) crop pairs of frames (E, T, 3, H, W) uint8, k in 1..gap: loss (MSE + L1) weighted
    1 + move_weight where the frame left its context, + the auxiliary loss -> the model."""
    vq = CondVQVAE(CondVQConfig(n_codes=frame_vq.config.n_codes, frame=asdict(frame_vq.config)))
    vq.frame.load_state_dict(frame_vq.state_dict())
    vq.frame.requires_grad_(False)
    g = torch.Generator().manual_seed(seed + 100)
    opt = torch.optim.Adam([p for p in vq.parameters() if p.requires_grad], lr=lr)
    E, T, side = frames.shape[0], frames.shape[1], frames.shape[-1]
    for step in range(steps):
        e = torch.randint(E, (batch,), generator=g)
        k = torch.randint(1, gap + 1, (batch,), generator=g)
        t = (torch.rand(batch, generator=g) * (T - k)).long()
        oy, ox = (8 * torch.randint((side - crop) // 8 + 1, (2,), generator=g)).tolist()
        x = frames[e, t + k, :, oy:oy + crop, ox:ox + crop].float().div(255)
        ctx = frames[e, t, :, oy:oy + crop, ox:ox + crop].float().div(255)
        if step == 0:   # the codebook from encoder outputs
            with torch.no_grad():
                z = vq.encode(x, ctx).permute(0, 2, 3, 1).flatten(0, 2)
                vq.quantizer.restart(z, torch.ones(vq.config.n_codes, dtype=torch.bool))
        rec, qloss, _ = vq(x, ctx)
        err = rec - x
        w = 1 + move_weight * ((x - ctx).abs().amax(1, keepdim=True) > 0.05).float()
        loss = (w * (err.square() + err.abs())).mean() + qloss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % 50 == 0 and step + 1 < 0.8 * steps:   # dead-code restart
            with torch.no_grad():
                vq.quantizer.restart_dead(vq.encode(x, ctx).permute(0, 2, 3, 1).flatten(0, 2))
    return vq.eval()


def main():
    from data.robot.prepare import DATA_DIR
    from data.robot.task import clips, load_split
    p = argparse.ArgumentParser(description="train the context-conditioned tokenizer")
    p.add_argument("--vq", default="checkpoints/video_vq.safetensors", help="per-frame VQ")
    p.add_argument("--data", default=str(DATA_DIR))
    p.add_argument("--out", default="out/video_cvq.safetensors")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--limit", type=int, default=0, help="train episodes (0 = all)")
    args = p.parse_args()
    frame_vq, _ = load_vq(args.vq)
    eps = clips(load_split(args.data, "train", 64, args.limit), 16)
    frames = torch.stack([torch.from_numpy(ep["image"]) for ep in eps]).permute(0, 1, 4, 2, 3)
    save_vq(args.out, train(frame_vq, frames, args.steps), {"done": True})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
