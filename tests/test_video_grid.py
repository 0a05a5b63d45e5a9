"""tools/video_grid.py: which windows it draws, and the grid's layout."""
import numpy as np
import torch

from tools.video_grid import grid_images, moving_windows


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
