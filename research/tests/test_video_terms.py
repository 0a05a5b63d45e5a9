"""research/video_terms.py: its prompt draw over the core's window batches, the change weights and the action
embeddings."""
import numpy as np
import torch

from data.robot import sim
from data.robot.task import Clips, Layout, N_BINS, tokenize_split
from model import GPT, GPTConfig
from research import video_terms as vt
from tokenizer_vq import VQConfig, VQVAE


def tiny_clips(horizon=2):
    torch.manual_seed(0)
    vq = VQVAE(VQConfig(channels=(4, 4, 8), n_codes=16)).eval()
    rng = np.random.default_rng(0)
    eps = [dict(sim.episode(rng, 6, 0.0)) for _ in range(3)]
    lay = Layout.of(vq, 2)
    lo, hi = np.full(2, -1, np.float32), np.ones(2, np.float32)
    return Clips(eps, tokenize_split(vq, eps, horizon, lay, lo, hi), lay, horizon), lo, hi


def test_study_draw_mixes_push_windows_and_counts_prompts():
    clips, lo, hi = tiny_clips()
    pool = [(e, t) for e in range(3) for t in range(3)]
    draw = vt.study_draw(clips, pool, 4, pushes=pool[:2], n_push=1)
    prompts, items = draw(torch.Generator().manual_seed(0))
    assert len(prompts) == len(items) == 4 and len(prompts[0]) == clips.layout.prompt_len(1)
    assert items[0]["truth"].shape == (2, 3, 64, 64) and items[0]["actions"].shape == (1, 2)


def test_change_weights_and_action_embeddings():
    clips, _, _ = tiny_clips()
    lay, tok = clips.layout, clips.tokens
    ids, starts = torch.tensor([0, 1]), torch.tensor([0, 1])
    tgt = torch.zeros(2, lay.window_len(1, 2) - 1)
    w = vt.change_weights(tok, ids, starts, tgt, lay, 1, 2, 3.0)
    assert w.shape == tgt.shape and set(w.unique().tolist()) <= {1.0, 3.0}
    gpt = GPT(GPTConfig.llama(vocab_size=lay.vocab_size, block_size=64, n_layer=1, n_head=1, n_embd=32))
    vt.init_action_embeddings(gpt, lay)
    rows = gpt.wte.weight[lay.A:lay.A + N_BINS]
    assert torch.count_nonzero(rows[:, 16:]) == 0 and torch.allclose(rows[0], rows[0].clone())
