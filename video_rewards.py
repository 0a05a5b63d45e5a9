"""Verifiable rewards of video: each metric of decoded frames against the true ones. A reward never
raises on model output: an unscorable frame gets the worst video reward. In order: `video_reward`
(train_video.py's RLVR reward), its metrics (MAE, SSIM, ... , push_error), LPIPS, and
`repetition_rate`, an evaluation metric, not a reward. The formulas' sources: docs/rewards.md.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from data.robot.detect import locate_blocks


# Every function takes float tensors (N, 3, H, W) in [0, 1], the *decoded* prediction and the true
# frames, and returns a per-sample tensor (N,). Wrong shapes or dtypes and non-finite true frames
# are the caller's bug: a ValueError says what was expected.
WORST_VIDEO_REWARD = -3.0   # the floor of -(MAE + (1 - SSIM)): MAE <= 1, SSIM >= -1
# a moved pixel differs from the context by > MOVE_TOL, an object's from the background > OBJECT_TOL
MOVE_TOL, OBJECT_TOL = 0.1, 0.15
# push_error's scale in pixels: one step of the robot (sim.SPEED), so a pushed block left where it
# was scores about 1 after a full-speed push (pushes move a block 1.9 px on average)
PUSH_SCALE = 3.0
# the named rewards: "mae+lpips" = -(MAE + LPIPS), the paper's; "mae+ssim" = -(MAE + (1 - SSIM)),
# the default without LPIPS weights (SSIM, like LPIPS, pays for structure MAE alone would blur)
REWARDS = {"mae": lambda pred, true, lpips_net: -mae(pred, true),   # the headroom line's
           "mae+ssim": lambda pred, true, lpips_net: -(mae(pred, true) + (1 - ssim(pred, true))),
           "mae+lpips": lambda pred, true, lpips_net: -(mae(pred, true) + lpips_net(pred, true))}


@dataclass
class VideoReward:
    """A video reward: the named metric (REWARDS) minus weighted terms (each in [0, 1]) that close
    the holes whole-frame metrics leave (docs/rewards.md); VideoReward() is the metric alone."""
    name: str = "mae+ssim"   # "mae+ssim" | "mae+lpips"
    moving: float = 0.0      # x moving_mae: copying the last frame, or a still scene, is not paid
    object: float = 0.0      # x object_miss: erasing an object is not paid (needs backgrounds)
    push: float = 0.0        # x push_error: a pushed block drawn where the push did not take it


def video_reward(cfg, pred, true, lpips_net=None, context=None, background=None):
    """Per-sample reward (N,) of decoded predictions (N, 3, H, W) against the true frames, under
    VideoReward `cfg`; context: the last true context frames; background: the bare scenes. A
    non-finite sample or reward gets the floor, never a neutral value that RL could learn."""
    if cfg.name not in REWARDS:
        raise ValueError(f"unknown video reward {cfg.name!r}; choose from {sorted(REWARDS)}")
    _check_frames(pred, true, min_side=11)
    if not torch.isfinite(true).all():
        raise ValueError("video reward: the true frames hold non-finite values")
    if ((cfg.moving or cfg.push) and context is None) or (cfg.object and background is None):
        raise ValueError("video reward: moving and push terms need context, object backgrounds")
    with torch.no_grad():
        clamped, true = pred.float().clamp(0, 1), true.float()
        r = REWARDS[cfg.name](clamped, true, lpips_net)
        if cfg.moving:     # the error where the truth moves: whole frames are ~99% static pixels
            r = r - cfg.moving * moving_mae(clamped, true, context.float())
        if cfg.object:     # the truth's object pixels left empty
            r = r - cfg.object * object_miss(clamped, true, background.float())
        if cfg.push:       # the blocks the true step pushed, drawn away from where it took them
            r = r - cfg.push * push_error(clamped, true, context.float(), locate_blocks)
    # the floor for a non-finite prediction or reward: each term is at most 1, so it lies below all
    bad = ~torch.isfinite(pred.reshape(len(pred), -1)).all(1) | ~torch.isfinite(r)
    return r.masked_fill(bad, WORST_VIDEO_REWARD - cfg.moving - cfg.object - cfg.push)


# ---------------------------------------------------------------------------------- metrics
def _check_frames(pred, true, *others, min_side=None):
    """A ValueError unless pred, true and `others` are float tensors of one shape (N, ...); with
    min_side, (N, 3, H, W) with H, W >= min_side."""
    for x in (pred, *others):
        ok = (all(torch.is_tensor(t) and t.is_floating_point() for t in (x, true))
              and x.shape == true.shape and x.dim() >= 2)
        if ok and min_side is not None:
            ok = x.dim() == 4 and x.shape[1] == 3 and min(x.shape[2:]) >= min_side
        if not ok:
            need = f"(N, 3, H, W) with H, W >= {min_side}" if min_side else "(N, ...)"
            got = " and ".join(f"{tuple(t.shape)} {t.dtype}" if torch.is_tensor(t)
                               else type(t).__name__ for t in (x, true))
            raise ValueError(f"video metrics take two float tensors of one shape {need}, got {got}")


def mae(pred, true):
    """Mean absolute error per sample -> (N,)."""
    _check_frames(pred, true)
    return (pred - true).abs().flatten(1).mean(1)


def mse(pred, true):
    """Mean squared error per sample -> (N,)."""
    _check_frames(pred, true)
    return torch.square(pred - true).flatten(1).mean(1)


def psnr(pred, true):
    """Peak signal-to-noise ratio in dB per sample, pixels in [0, 1], in float64 -> (N,)."""
    _check_frames(pred, true)
    # the MSE floor of 1e-10 caps identical frames at 100 dB instead of infinity
    return 10 * torch.log10(1.0 / mse(pred.double(), true.double()).clamp(min=1e-10)).float()


def ssim(pred, true, data_range=1.0, sigma=1.5):
    """Structural similarity per sample (Gaussian window, valid region, float64) -> (N,)."""
    # the normalised Gaussian window; scipy.ndimage's radius (truncate 3.5): 11 taps for sigma 1.5
    radius = int(3.5 * sigma + 0.5)
    w = torch.exp(-0.5 * (torch.arange(-radius, radius + 1, dtype=torch.float64) / sigma) ** 2)
    w = (w / w.sum()).to(pred.device)
    k = len(w)
    _check_frames(pred, true, min_side=k)
    N, C, H, W = pred.shape

    def band(n):   # (n-k+1, n): row i holds the taps at columns i..i+k-1
        b = torch.zeros(n - k + 1, n, dtype=torch.float64, device=pred.device)
        for j in range(k):
            b.diagonal(j).fill_(w[j])
        return b

    x, y = pred.double(), true.double()
    # the separable Gaussian, valid region only, as two banded matmuls over all five maps at once,
    # (5, N, C, H', W'): float64 conv2d has no fast CPU path, matmuls are several times faster
    ux, uy, xx, yy, xy = band(H) @ torch.stack([x, y, x * x, y * y, x * y]) @ band(W).T
    vx, vy, vxy = xx - ux * ux, yy - uy * uy, xy - ux * uy   # local variances and covariance
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return s.view(N, -1).mean(1).float()


def moving_mae(pred, true, context, tol=MOVE_TOL):
    """MAE where the true frame differs from the context by > tol in a channel (0: none). -> (N,)"""
    _check_frames(pred, true, context)
    mask = ((true - context).abs().amax(1, keepdim=True) > tol).float()   # (N, 1, H, W)
    err = ((pred - true).abs() * mask).flatten(1).sum(1)   # summed over the moving pixels
    return err / (3 * mask.flatten(1).sum(1)).clamp(min=1)   # the mean over them, 3 channels each


def object_miss(pred, true, background, tol=OBJECT_TOL):
    """Share of the true object pixels (> tol off the background) left bare (0: none). -> (N,)"""
    _check_frames(pred, true, background)
    shown = (true - background).abs().amax(1) > tol   # (N, H, W) objects in the truth
    drawn = (pred - background).abs().amax(1) > tol   # ... and in the prediction
    return (shown & ~drawn).flatten(1).sum(1) / shown.flatten(1).sum(1).clamp(min=1)


def to_uint8(x):
    """float tensor (..., 3, H, W) in [0, 1] -> uint8 array (..., H, W, 3), as frames are stored."""
    return (x.clamp(0, 1).movedim(-3, -1) * 255 + 0.5).byte().numpy()


def push_error(pred, true, context, locate_blocks, scale=PUSH_SCALE, moved=0.5):
    """How far from the true blocks the prediction draws the blocks the true step pushed (centre
    moved > `moved` pixels), in [0, 1]: the mean distance between the predicted and the true centre
    over `scale` pixels, capped at 1 (1: not drawn); 0 where no block moved. -> (N,)"""
    _check_frames(pred, true, context)
    p, t, c = (to_uint8(x.nan_to_num(0.0)) for x in (pred, true, context))
    err = []
    for pf, tf, cf in zip(p, t, c):
        errs = []
        for bc, bt, bp in zip(locate_blocks(cf), locate_blocks(tf), locate_blocks(pf)):
            if bc is None or bt is None or math.dist(bc, bt) <= moved:
                continue                  # this block is not seen, or the step did not move it
            errs.append(1.0 if bp is None else min(math.dist(bp, bt) / scale, 1.0))
        err.append(sum(errs) / len(errs) if errs else 0.0)
    return torch.tensor(err)


# ---------------------------------------------------------------------------------- LPIPS (VGG16)
# LPIPS compares the two images' deep features: the unit-normalised activations of five VGG16
# stages, their squared difference weighted per channel by a learned 1x1 "lin" layer, averaged over
# space, and summed over the stages. tools/convert_lpips.py writes the official weights.

VGG16 = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512]
TAPS = (3, 8, 15, 22, 29)   # relu1_2 ... relu5_3 in torchvision's features
LIN_CHANNELS = (64, 128, 256, 512, 512)


class LPIPS(nn.Module):
    def __init__(self):
        super().__init__()
        # torchvision's VGG16 features and layer indices: a conv + ReLU per number, "M" a max-pool
        layers, c = [], 3
        for v in VGG16:
            if v == "M":
                layers += [nn.MaxPool2d(2, 2)]
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU()]
                c = v
        self.features = nn.Sequential(*layers)
        self.lins = nn.ModuleList([nn.Conv2d(ch, 1, 1, bias=False) for ch in LIN_CHANNELS])
        # the official input scaling layer: [-1, 1] images shifted and scaled per channel
        for key, v in ("shift", [-0.030, -0.088, -0.188]), ("scale", [0.458, 0.448, 0.450]):
            self.register_buffer(key, torch.tensor(v).view(1, 3, 1, 1), persistent=False)

    def forward(self, pred, true):
        """(N, 3, H, W) in [0, 1] twice, H, W >= 16 -> (N,) distances, on pred's device."""
        _check_frames(pred, true, min_side=16)   # five VGG stages: 16 pixels shrink to 1
        # both batches through the network at once: [0, 1] -> [-1, 1] -> the official scaling
        x = torch.cat([pred, true]).to(self.shift.device, torch.float32) * 2 - 1
        x = (x - self.shift) / self.scale
        total, k = 0.0, 0
        for i, layer in enumerate(self.features):
            x = layer(x)
            if i in TAPS:
                f = x / (x.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)   # unit length over channels
                a, b = f.chunk(2)   # pred's features, true's features
                total = total + self.lins[k]((a - b) ** 2).mean((1, 2, 3))
                k += 1
        return total.to(pred.device)


def load_lpips(path, device="cpu"):
    """LPIPS with the weights of a safetensors file (tools/convert_lpips.py); None for path None."""
    if path is None:
        return None
    from safetensors.torch import load_file
    net = LPIPS()
    try:   # the file names the lin layers lin0 ... lin4; the module holds them as lins.0 ... lins.4
        net.load_state_dict({k.replace("lin", "lins.", 1) if k.startswith("lin") else k: v
                             for k, v in load_file(str(path)).items()})
    except Exception as e:   # no safetensors file, or not these tensors
        raise ValueError(f"{path}: not LPIPS-VGG weights ({str(e)[:200]}); "
                         "see tools/convert_lpips.py") from None
    return net.to(device).eval().requires_grad_(False)


# ---------------------------------------------------------------------------------- repetition
def repetition_rate(pred_codes, context_codes, true_frames, context_frame, tol=0.05):
    """Share of predicted frames that repeat the previous frame while the world moved, per sample.
    pred_codes (N, K, L): the K predicted frames' codes; context_codes (N, L): the last context
    frame's; true_frames (N, K, 3, H, W), context_frame (N, 3, H, W): the truth. Frame k repeats
    when its codes equal the previous frame's while the true frame k differs from its previous
    one (some pixel by more than tol); the rate is over the frames whose truth changed. -> (N,)"""
    prev_codes = torch.cat([context_codes[:, None], pred_codes[:, :-1]], 1)
    repeated = (pred_codes == prev_codes).all(-1)                            # (N, K)
    prev_true = torch.cat([context_frame[:, None], true_frames[:, :-1]], 1)
    changed = (true_frames - prev_true).abs().flatten(2).amax(-1) > tol      # (N, K)
    return (repeated & changed).sum(1).float() / changed.sum(1).clamp(min=1).float()
