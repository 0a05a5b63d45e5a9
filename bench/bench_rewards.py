"""
Reward throughput: our batched torch SSIM / PSNR against scikit-image, and the text-game reward in records per second.

    python bench/bench_rewards.py            # 64 frames of 64x64, 1 and 2 threads, 7 repeats
    python bench/bench_rewards.py --tiny     # seconds; the smoke test in tests/test_bench.py

Video: `video_rewards.ssim` / `video_rewards.psnr` score a whole (N, 3, H, W) batch in a few tensor ops (separable
Gaussian convolutions in float64); scikit-image's `structural_similarity` (the settings our parity test uses:
Gaussian weights, sigma 1.5, population covariance) and `peak_signal_noise_ratio` score one frame per call, as a
reward loop would call them. Both get the same random frames (a noisy copy as the prediction); the values are
checked to agree.
Text game: `rewards.textgame_reward` (parse the predicted diff, apply it, compare states) on held-out-style records,
half with the true answer and half with a corrupted one; there is no reference implementation to compare with.
"""
import argparse

import numpy as np
import torch
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from common import interleaved, machine, median, print_table, thread_list

from data.textgame.prepare import generate_split  # noqa: E402
from data.textgame.task import target_text  # noqa: E402
from rewards import textgame_reward  # noqa: E402
from video_rewards import psnr, ssim  # noqa: E402

# -----------------------------------------------------------------------------
# flags
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            allow_abbrev=False)
p.add_argument("--threads", default="1,2", help="torch thread counts to run, comma list")
p.add_argument("--repeats", type=int, default=7, help="timed rounds (median reported)")
p.add_argument("--frames", type=int, default=64)
p.add_argument("--size", type=int, default=64, help="frame side")
p.add_argument("--records", type=int, default=1000, help="text-game records scored per round")
p.add_argument("--tiny", action="store_true", help="smoke mode: 4 frames of 16x16, 20 records, 1 repeat")
args = p.parse_args()
if args.tiny:
    args.frames, args.size, args.records, args.repeats, args.threads = 4, 16, 20, 1, "1"

# -----------------------------------------------------------------------------
# data
g = torch.Generator().manual_seed(0)
true = torch.rand(args.frames, 3, args.size, args.size, generator=g)
pred = (true + 0.1 * torch.randn(true.shape, generator=g)).clamp(0, 1)
pred_np, true_np = pred.double().numpy(), true.double().numpy()


def sk_ssim():
    return [structural_similarity(a, b, channel_axis=0, data_range=1, gaussian_weights=True, sigma=1.5,
                                  use_sample_covariance=False) for a, b in zip(pred_np, true_np)]


def sk_psnr():
    return [peak_signal_noise_ratio(b, a, data_range=1) for a, b in zip(pred_np, true_np)]


assert np.allclose(ssim(pred, true).numpy(), sk_ssim(), atol=1e-4), "SSIM disagrees with scikit-image"
assert np.allclose(psnr(pred, true).numpy(), sk_psnr(), atol=1e-3), "PSNR disagrees with scikit-image"

records = generate_split("test", args.records, 0)
answers = [target_text(r) if i % 2 == 0 else target_text(r).replace("true", "false", 1) for i, r in enumerate(records)]


def text_rewards(kind):
    return [textgame_reward(a, r["state"], r["next_state"], kind) for a, r in zip(answers, records)]


# -----------------------------------------------------------------------------
print(f"machine: {machine()}")
print(f"video: {args.frames} frames of 3x{args.size}x{args.size}; text game: {args.records} records; "
      f"median of {args.repeats}")
video_rows, text_rows = [], []
for threads in thread_list(args.threads):
    torch.set_num_threads(threads)
    t = interleaved({"ssim": lambda: ssim(pred, true), "sk_ssim": sk_ssim,
                     "psnr": lambda: psnr(pred, true), "sk_psnr": sk_psnr}, args.repeats)
    for name in ("ssim", "psnr"):
        ours, theirs = median(t[name]), median(t["sk_" + name])
        video_rows.append([name.upper(), threads, f"{args.frames / ours:,.0f}", f"{args.frames / theirs:,.0f}",
                           f"**{theirs / ours:.1f}x**"])
    t = interleaved({"binary": lambda: text_rewards("binary"), "task_specific": lambda: text_rewards("task_specific")},
                    args.repeats)
    text_rows += [[kind, threads, f"{args.records / median(t[kind]):,.0f}"] for kind in ("binary", "task_specific")]
print_table(["metric", "threads", "ours frames/s", "scikit-image frames/s", "ours / scikit-image"], video_rows,
            "video rewards (frames per second; higher is better)")
print_table(["text-game reward", "threads", "records/s"], text_rows, "text-game reward throughput")
