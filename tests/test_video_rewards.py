import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from video_rewards import (LPIPS, REWARDS, load_lpips, mae, moving_mae, mse, object_miss, psnr,
                     repetition_rate, ssim, video_reward, VideoReward)


def image_pairs(seed=0, n=4, size=32):
    g = torch.Generator().manual_seed(seed)
    true = torch.rand(n, 3, size, size, generator=g)
    true[1] = torch.linspace(0, 1, size).view(1, 1, -1).expand(3, size, size)   # smooth
    true[2] = 0.5                                                                 # flat
    pred = (true + 0.1 * torch.randn(n, 3, size, size, generator=g)).clamp(0, 1)
    pred[3] = torch.rand(3, size, size, generator=g)                              # unrelated
    return pred, true


def test_ssim_matches_scikit_image():
    pred, true = image_pairs()
    ours = ssim(pred, true)
    for i in range(len(pred)):
        ref = structural_similarity(pred[i].numpy().astype(np.float64), true[i].numpy().astype(np.float64),
                                    channel_axis=0, data_range=1, gaussian_weights=True, sigma=1.5,
                                    use_sample_covariance=False)
        assert abs(ours[i].item() - ref) < 1e-4, (i, ours[i].item(), ref)
    assert ours.shape == (4,) and torch.allclose(ssim(true, true), torch.ones(4))
    wide_pred, wide_true = pred[:, :, :20], true[:, :, :20]                       # not square: 20 x 32
    ref = structural_similarity(wide_pred[0].numpy().astype(np.float64), wide_true[0].numpy().astype(np.float64),
                                channel_axis=0, data_range=1, gaussian_weights=True, sigma=1.5,
                                use_sample_covariance=False)
    assert abs(ssim(wide_pred, wide_true)[0].item() - ref) < 1e-4


def test_psnr_mae_mse_match_definitions():
    pred, true = image_pairs(1)
    for i in range(len(pred)):
        ref = peak_signal_noise_ratio(true[i].numpy().astype(np.float64), pred[i].numpy().astype(np.float64), data_range=1)
        assert abs(psnr(pred, true)[i].item() - ref) < 1e-4
    d = (pred - true).numpy()
    assert np.allclose(mae(pred, true).numpy(), np.abs(d).reshape(4, -1).mean(1), atol=1e-6)
    assert np.allclose(mse(pred, true).numpy(), (d ** 2).reshape(4, -1).mean(1), atol=1e-7)
    assert torch.isfinite(psnr(true, true)).all()   # identical frames: mse floored, no inf


def random_lpips_file(path, seed=0):
    torch.manual_seed(seed)
    net = LPIPS()
    sd = {k: v for k, v in net.state_dict().items() if k.startswith("features")}
    sd.update({f"lin{k}.weight": torch.rand_like(m.weight) for k, m in enumerate(net.lins)})  # lin weights are >= 0
    save_file(sd, str(path))
    return path


def test_lpips_properties_and_loading(tmp_path):
    assert load_lpips(None) is None
    net = load_lpips(random_lpips_file(tmp_path / "lpips.safetensors"))
    pred, true = image_pairs(2, n=4, size=64)
    same = net(true, true)
    diff = net(pred, true)
    assert same.shape == (4,) and torch.allclose(same, torch.zeros(4), atol=1e-6)
    assert (diff > 0).all()
    near = net((true + 0.01).clamp(0, 1), true)
    assert (near < diff).all()                 # a tiny change is closer than noise
    save_file({"features.0.weight": torch.zeros(1)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError, match="bad.safetensors"):
        load_lpips(tmp_path / "bad.safetensors")


def test_repetition_rate_counts_repeats_only_where_truth_moves():
    L = 4
    ctx_codes = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    pred = torch.tensor([[[1, 2, 3, 4], [5, 5, 5, 5], [5, 5, 5, 5]],      # sample 0: frames 0 and 2 repeat
                         [[9, 2, 3, 4], [9, 2, 3, 5], [9, 2, 3, 6]]])     # sample 1: never repeats
    ctx = torch.zeros(2, 3, 8, 8)
    true = torch.zeros(2, 3, 3, 8, 8)
    true[0, 0, :, 0, 0] = 1.0      # truth moves at frame 0 ...
    true[0, 1, :, 0, 0] = 0.5      # ... and 1, and frame 2 equals frame 1: its repeat is no error
    true[0, 2, :, 0, 0] = 0.5
    true[1, :, :, 0, 0] = torch.tensor([1.0, 0.0, 1.0])[:, None]
    r = repetition_rate(pred, ctx_codes, true, ctx)
    assert r.tolist() == [0.5, 0.0]
    assert pred.shape[-1] == L


def test_named_rewards():
    pred, true = image_pairs(3)
    with pytest.raises(ValueError, match="unknown video reward 'psnr'"):
        video_reward(VideoReward(name="psnr"), pred, true)
    r = video_reward(VideoReward(), pred, true)
    assert torch.allclose(r, -(mae(pred, true) + 1 - ssim(pred, true)))
    assert torch.allclose(video_reward(VideoReward(), true, true), torch.zeros(4), atol=1e-6)
    assert (r < 0).all() and r[3] < r[0]       # the unrelated frame scores lowest
    bad = pred.clone()
    bad[0] = float("nan")
    out = video_reward(VideoReward(), bad, true)
    assert torch.isfinite(out).all() and out[0] == -3.0 and (out[1:] == r[1:]).all()  # NaN: the worst score
    assert set(REWARDS) == {"mae", "mae+ssim", "mae+lpips"}   # mae: the headroom line's


def test_moving_and_object_terms_by_hand():
    """A 16x16 grey table; the context has a white 2x2 block at (2, 2), the truth has it moved to (8, 8)."""
    bg = torch.full((1, 3, 16, 16), 0.5)
    ctx, true = bg.clone(), bg.clone()
    ctx[..., 2:4, 2:4] = 1.0
    true[..., 8:10, 8:10] = 1.0
    # moving pixels: the 4 the block left (truth 0.5) and the 4 it reached (truth 1.0), 3 channels each
    assert moving_mae(true, true, ctx).item() == 0.0
    assert moving_mae(ctx, true, ctx).item() == pytest.approx(0.5)       # copying: off by 0.5 on all 8 pixels
    assert moving_mae(bg, true, ctx).item() == pytest.approx(0.25)       # erasing: right where it left, wrong where
    assert moving_mae(bg, bg, bg).item() == 0.0                          # nothing moves: no error, no NaN
    # objects: the truth's 4 block pixels; copying and erasing both leave them empty, a half-drawn block hits 2
    assert object_miss(ctx, true, bg).item() == 1.0 and object_miss(bg, true, bg).item() == 1.0
    half = true.clone()
    half[..., 8:10, 9] = 0.5
    assert object_miss(half, true, bg).item() == pytest.approx(0.5) and object_miss(true, true, bg).item() == 0.0
    assert object_miss(bg, bg, bg).item() == 0.0                         # a frame without objects
    # in the reward: copying, which whole-frame MAE + SSIM barely punish, loses the two terms on top
    base = video_reward(VideoReward(), ctx, true)
    r = video_reward(VideoReward(moving=2.0, object=3.0), ctx, true, context=ctx, background=bg)
    assert r.item() == pytest.approx(base.item() - 2.0 * 0.5 - 3.0 * 1.0)
    nan = ctx.clone()
    nan[..., 0, 0] = float("nan")
    assert video_reward(VideoReward(moving=1.0), nan, true, context=ctx).item() == -4.0   # the floor
    with pytest.raises(ValueError, match="context"):
        video_reward(VideoReward(moving=1.0), ctx, true)
    with pytest.raises(ValueError, match="background"):
        video_reward(VideoReward(object=1.0), ctx, true)


def import_official_lpips():
    """The official lpips package, or skip. PyPI's torchvision is a CUDA build: beside the CPU torch of CI its compiled
    ops do not load and `import torchvision` fails in its __init__, though VGG16 needs none of them. Then the package is
    mounted without running that __init__, so lpips still builds torchvision's own VGG16 module."""
    import importlib.util
    import sys
    import types
    try:
        import torchvision.models  # noqa: F401
    except ImportError:
        pytest.skip("lpips/torchvision not installed (.ci/run installs them beside the suite for this test)")
    except RuntimeError:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        spec = importlib.util.find_spec("torchvision")
        package = types.ModuleType("torchvision")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchvision"] = package
    return pytest.importorskip("lpips")


def test_lpips_matches_official_package(tmp_path):
    """Parity with the lpips package (official network code and its shipped lin weights) on torchvision's VGG16 with
    random weights, through tools/convert_lpips.py. The ImageNet VGG16 weights cannot be fetched here, so what this
    checks is the architecture, scaling, normalisation, taps and averaging, and the converter, not the weights."""
    import warnings
    import_official_lpips()
    import tools.convert_lpips as convert_lpips
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")               # torchvision's deprecation notes about `pretrained`
        official = convert_lpips.convert(tmp_path / "lpips.safetensors", random_vgg=True)   # exits on > 1e-5
    ours = load_lpips(tmp_path / "lpips.safetensors")
    assert all((getattr(official, f"lin{k}").model[-1].weight >= 0).all() for k in range(5))   # the shipped ones
    for seed, (h, w) in enumerate([(64, 64), (48, 80), (16, 16)]):
        g = torch.Generator().manual_seed(seed)
        true = torch.rand(3, 3, h, w, generator=g)
        pred = (true + 0.2 * torch.randn(3, 3, h, w, generator=g)).clamp(0, 1)
        with torch.no_grad():
            ref = official(pred, true, normalize=True).flatten()
        assert torch.allclose(ours(pred, true), ref, atol=1e-5, rtol=1e-4), (h, w, ours(pred, true), ref)
        assert ref.min() > 0
