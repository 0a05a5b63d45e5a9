"""The context-conditioned tokenizer of research/cond_tokenizer.py: shapes, learning the change, save/load through
tokenizer_vq.load_vq (the format it registers), and eval_video on its codes."""
from dataclasses import asdict

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from data.robot import sim
from data.robot.task import Layout
from model import GPT, GPTConfig
from research.cond_tokenizer import CondVQConfig, CondVQVAE
from tokenizer_vq import VQConfig, load_vq, save_vq
from video_eval import EvalSpec, eval_video


def tiny_cond():
    torch.manual_seed(0)
    return CondVQVAE(CondVQConfig(size=32, channels=(8, 8, 16, 16), n_codes=16,
                                  frame=asdict(VQConfig(size=32, channels=(4, 4, 8), n_codes=8))))


def moved_squares(n, seed=0):
    """Pairs (context, frame) of 32x32 frames: a grey table with a red 6x6 square that moves a few pixels."""
    g = torch.Generator().manual_seed(seed)
    ctx, x = torch.full((n, 3, 32, 32), 0.5), torch.full((n, 3, 32, 32), 0.5)
    for i in range(n):
        y0, x0 = torch.randint(4, 20, (2,), generator=g).tolist()
        dy, dx = torch.randint(-4, 5, (2,), generator=g).tolist()
        ctx[i, :, y0:y0 + 6, x0:x0 + 6] = torch.tensor([0.9, 0.1, 0.1])[:, None, None]
        x[i, :, y0 + dy:y0 + dy + 6, x0 + dx:x0 + dx + 6] = torch.tensor([0.9, 0.1, 0.1])[:, None, None]
    return ctx, x


def test_cond_tokenizer_shapes_determinism_and_layout():
    vq = tiny_cond().eval()
    ctx, x = moved_squares(3)
    codes = vq.tokenize(x, ctx)
    assert codes.shape == (3, 4) and codes.dtype == torch.long and int(codes.max()) < vq.config.n_codes
    assert torch.equal(codes, vq.tokenize(x, ctx))                          # deterministic
    assert torch.equal(codes, vq.tokenize((x * 255).round().byte().permute(0, 2, 3, 1).numpy(),
                                          (ctx * 255).round().byte().permute(0, 2, 3, 1).numpy()))
    out = vq.detokenize(codes, ctx)
    assert out.shape == (3, 3, 32, 32) and 0 <= float(out.min()) and float(out.max()) <= 1
    assert torch.equal(out, vq.detokenize(codes, ctx))
    assert torch.equal(out, ctx)                  # untrained: the change layer starts at zero, so it copies
    assert vq.tokenize_context(ctx).shape == (3, 16)                         # the per-frame VQ's 4x4 grid
    assert vq.vocab() == dict(context_codes=8, context_len=16, n_codes=vq.config.n_codes, codes_per_frame=4,
                              code_offset=8)


@pytest.mark.slow   # 300 training steps (~14 s): CI runs it
def test_cond_tokenizer_learns_the_change_and_save_load(tmp_path):
    vq = tiny_cond()
    ctx, x = moved_squares(16)
    opt = torch.optim.Adam([p for n, p in vq.named_parameters() if not n.startswith("frame.")], lr=2e-3)
    copy_err = F.l1_loss(ctx, x).item()
    for _ in range(300):
        rec, qloss, _ = vq(x, ctx)
        w = 1 + 10 * ((x - ctx).abs().amax(1, keepdim=True) > 0.05).float()
        loss = (w * ((rec - x).square() + (rec - x).abs())).mean() + qloss
        opt.zero_grad()
        loss.backward()
        opt.step()
    vq.eval()
    rec = vq.detokenize(vq.tokenize(x, ctx), ctx)
    assert F.l1_loss(rec, x).item() < 0.5 * copy_err              # its codes carry where the square went
    save_vq(tmp_path / "cvq.safetensors", vq, {"steps": 300})
    back, header = load_vq(tmp_path / "cvq.safetensors")
    assert header["format"] == "nanorlvr-cvq-1" and header["steps"] == 300 and back.config == vq.config
    assert torch.equal(back.tokenize(x, ctx), vq.tokenize(x, ctx))
    assert torch.equal(back.detokenize(vq.tokenize(x, ctx), ctx), rec)
    assert torch.equal(back.tokenize_context(ctx), vq.tokenize_context(ctx))


def test_eval_video_with_the_context_conditioned_tokenizer():
    torch.manual_seed(0)
    frame = asdict(VQConfig(channels=(4, 4, 8), n_codes=8))
    vq = CondVQVAE(CondVQConfig(channels=(4, 4, 8, 8), n_codes=16, frame=frame))
    lay = Layout.of(vq.eval(), 2)
    assert (lay.Kc, lay.Lc, lay.K, lay.L, lay.offset) == (8, 64, 16, 16, 8)
    gpt = GPT(GPTConfig.llama(vocab_size=lay.vocab_size, block_size=lay.window_len(1, 2), n_layer=1, n_head=2,
                              n_embd=16))
    rng = np.random.default_rng(0)
    eps = [dict(sim.episode(rng, 5, 0.0)) for _ in range(2)]
    lo, hi = np.full(2, -1, np.float32), np.ones(2, np.float32)
    res = eval_video(gpt, vq, eps, None, EvalSpec(lo, hi, 1, 2), desc=None)
    assert res["n"] == 8 and np.isfinite(res["mae"]) and 0 <= res["repetition_rate"] <= 1
    # an untrained cond tokenizer decodes to (nearly) its context: the ceiling sits next to copy-last-frame
    assert abs(res["tokenizer_ceiling"]["mae"] - res["copy_last_frame"]["mae"]) < 0.02
