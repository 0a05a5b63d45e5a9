"""tools/video_grid.py: which windows it draws, the grid's layout, and its labels."""
import numpy as np
import torch

from tools.video_grid import (FONT, GLYPH_H, GLYPH_W, glyph, grid_images, labelled, moving_windows,
                              text_block)


def test_moving_windows_picks_the_windows_that_change_most():
    eps = [dict(image=np.zeros((6, 8, 8, 3), np.uint8)) for _ in range(2)]
    eps[1]["image"][3:, :4] = 255           # clip 1, from frame 3 on: 32 pixels change (window starting at frame 2)
    eps[0]["image"][5, :1] = 255            # clip 0, frame 5: 8 pixels change (window starting at frame 4)
    assert moving_windows(eps, 1, 1, 2) == [(1, 2), (0, 4)]
    # ties (no change anywhere else) come in window order, after the moving ones
    assert moving_windows(eps, 1, 1, 4) == [(1, 2), (0, 4), (0, 0), (0, 1)]


def test_grid_images_layout():
    N, K, H = 2, 3, 8
    ctx, truth = torch.zeros(N, 3, H, H), torch.ones(N, K, 3, H, H)
    pred = torch.full((N, K, 3, H, H), 0.5)
    imgs = grid_images(ctx, truth, [pred], scale=2)
    # one image per predicted step; columns: context, truth, model, error of copy, error of the model (2-px gutters)
    assert len(imgs) == K and imgs[0].shape == (2 * (N * H + 2), 2 * (5 * H + 4 * 2), 3)
    top = imgs[0][:2 * H]                   # the first row, zoomed 2x
    assert (top[:, :2 * H] == 0).all() and (top[:, 2 * (H + 2):2 * (2 * H + 2)] == 255).all()   # context, truth
    assert (top[:, 2 * (3 * H + 6):2 * (4 * H + 6)] == 255).all()     # |copy - truth| x 3, clipped to 1


def test_labels_name_columns_and_rows_around_the_unchanged_grid():
    N, K, H, scale = 2, 2, 40, 2     # a 80-pixel cell holds 6 characters: "ERR CO", "ERR ML"
    ctx, truth = torch.zeros(N, 3, H, H), torch.ones(N, K, 3, H, H)
    imgs = grid_images(ctx, truth, [torch.full((N, K, 3, H, H), 0.5)], scale)
    columns = ["context", "truth", "mle", "err copy", "err mle"]
    rows = [["clip 0", "frame 3"], ["clip 12", "frame 3"]]
    out = labelled(imgs[0], columns, rows, "step 1/2", (H, H), scale)
    head, left = scale * (GLYPH_H + 3), scale * (4 + (GLYPH_W + 1) * len("step 1/2"))
    assert out.shape == (head + imgs[0].shape[0], left + imgs[0].shape[1], 3)
    assert (out[head:, left:] == imgs[0]).all()              # the grid itself is untouched
    cell, gap = H * scale, 2 * scale
    names = [out[:head, left + c * (cell + gap):][:, :cell] for c in range(5)]
    assert all((n == 0).any() and (n == 255).any() for n in names)      # black text on white
    assert len({n.tobytes() for n in names}) == 5                      # each column its own name
    row_labels = [out[head + r * (cell + gap):, :left][:cell] for r in range(2)]
    assert (row_labels[0] == 0).any() and not (row_labels[0] == row_labels[1]).all()
    # the corner names the step: another step, another corner, same everything else
    other = labelled(imgs[0], columns, rows, "step 2/2", (H, H), scale)
    assert not (other[:head, :left] == out[:head, :left]).all()
    assert (other[head:] == out[head:]).all() and (other[:, left:] == out[:, left:]).all()


def test_text_block_font():
    a, upper = text_block(["ab-1"], 9, 30, 1), text_block(["AB-1"], 9, 30, 1)
    assert (a == upper).all()   # drawn in capitals
    assert (a[1:8, 1:6, 0] == 0).sum() == glyph("a").sum()
    assert (glyph("~") == glyph("?")).all() and not (glyph("a") == glyph("b")).all()
    assert set(FONT) >= set("abcdefghijklmnopqrstuvwxyz0123456789 _-+|./".upper())
    assert text_block(["too long for the block"], 4, 10, 2).shape == (4, 10, 3)   # cut, no error
