"""The video prediction task: episode files, action bins, and the token sequence the GPT reads and writes.

Episode files. A directory holds train/, val/ and test/ folders of `.npz` episodes with `image` (T, H, W, 3) uint8
and `action` (T, D) float (action[t] takes frame t to frame t + 1; the format the RLVR-World/iVideoGPT converter
writes for RT-1). A flat directory of .npz files is split deterministically by sorted position instead (every 10th
file is test, every 20th from the 5th on is val). Frames of any size are resized to the model's square resolution
(bilinear with antialiasing, aspect not kept: RT-1's 256x320 becomes 64x64, as in iVideoGPT's preprocessing), and
episodes are cut into clips of a fixed number of frames (`clips`).

Actions. Each dimension is quantised into 256 bins between its min and max over the train split, stored beside the
data in `action_stats.json` (written on first use), so train and test use the same bins.

Token layout. With K visual codes per tokenizer and D action dimensions, the vocabulary is
    [0, K)                          visual codes (L = 64 per 64x64 frame)
    K + 256 * d + bin               the action token of dimension d
and a window of n frames is the sequence  f_0 a_0 f_1 a_1 ... f_{n-1}  (L codes, then D action tokens, per frame).
The loss and the samples cover only the codes of frames after the `context` first ones: action tokens are always
inputs, never predicted. Single-step prediction uses n = context + 1; multi-step uses n = context + K.
"""
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

N_BINS = 256


def episode_files(data_dir, split):
    """Sorted .npz paths of one split of data_dir (sub-folder per split, or a flat folder split by position)."""
    data_dir = Path(data_dir)
    if (data_dir / split).is_dir():
        return sorted((data_dir / split).glob("*.npz"))
    files = sorted(data_dir.glob("*.npz"))
    if split == "test":
        return files[9::10]
    if split == "val":
        return files[4::20]
    return [f for i, f in enumerate(files) if i % 10 != 9 and i % 20 != 4]


def resize_frames(frames, size):
    """(T, H, W, 3) uint8 -> (T, size, size, 3) uint8 (unchanged when already that size)."""
    if frames.shape[1:3] == (size, size):
        return frames
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).float()
    x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def read_npz(path, keys=None):
    """The arrays of an .npz file (only `keys` if given) -> dict. Never unpickles: an object array or a pickle
    file is refused (allow_pickle=False), as is anything unreadable, with a ValueError naming the file."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if keys is None or k in keys}
    except Exception as e:   # zipfile, OSError, numpy's ValueError for pickles: all mean "not an episode"
        raise ValueError(f"{path}: cannot read the .npz episode ({e})") from None
    if not all(isinstance(a, np.ndarray) for a in arrays.values()):   # numpy hands other zip members over as bytes
        raise ValueError(f"{path}: not an .npz episode (a zip of files other than .npy arrays)")
    return arrays


def load_episode(path, size):
    """-> dict(image (T, size, size, 3) uint8, action (T, D) float32, background (size, size, 3) uint8 or None)."""
    ep = read_npz(path)
    if "image" not in ep or "action" not in ep:
        raise ValueError(f"{path}: an episode needs 'image' and 'action' arrays, found {sorted(ep)}")
    img, act = ep["image"], ep["action"]
    if img.ndim != 4 or img.shape[-1] != 3 or img.dtype != np.uint8 or 0 in img.shape:
        raise ValueError(f"{path}: 'image' must be (T, H, W, 3) uint8, got {img.shape} {img.dtype}")
    if act.ndim != 2 or len(act) != len(img) or len(img) < 2 or not np.issubdtype(act.dtype, np.number):
        raise ValueError(f"{path}: 'action' must be numbers (T, D) with the T = {len(img)} >= 2 of 'image', "
                         f"got {act.shape} {act.dtype}")
    if not np.isfinite(act).all():
        raise ValueError(f"{path}: 'action' holds NaN or inf values")
    bg = ep.get("background")
    return dict(image=resize_frames(img, size), action=act.astype(np.float32),
                background=None if bg is None else resize_frames(bg[None], size)[0])


def load_split(data_dir, split, size, limit=0):
    files = episode_files(data_dir, split)[:limit or None]
    if not files:
        raise ValueError(f"{data_dir}: no .npz episodes for the {split} split")
    episodes = [load_episode(f, size) for f in files]
    for f, ep in zip(files, episodes):
        if ep["action"].shape[1] != episodes[0]["action"].shape[1]:
            raise ValueError(f"{f}: {ep['action'].shape[1]}-dim actions, but {files[0]} has "
                             f"{episodes[0]['action'].shape[1]}")
    return episodes


def clips(episodes, length):
    """Cut episodes into consecutive clips of `length` frames (the rest of each episode is dropped), so episodes of
    any length (RT-1's vary from a few to 60+ frames) become one (E, length) array of windows."""
    out = []
    for ep in episodes:
        for s in range(0, len(ep["image"]) - length + 1, length):
            out.append(dict(ep, image=ep["image"][s:s + length], action=ep["action"][s:s + length]))
    return out


# -----------------------------------------------------------------------------
# action bins

def write_action_stats(data_dir):
    """Per-dimension min/max of the actions of the train split -> data_dir/action_stats.json (written atomically)."""
    files = episode_files(data_dir, "train")
    if not files:
        raise ValueError(f"{data_dir}: no .npz episodes for the train split")
    acts = [read_npz(f, ("action",)).get("action") for f in files]
    for f, a in zip(files, acts):
        if a is None or a.ndim != 2 or a.shape[1] != acts[0].shape[1] or not np.issubdtype(a.dtype, np.number) \
                or not np.isfinite(a).all():
            raise ValueError(f"{f}: 'action' must be a finite number array (T, D) like in {files[0]}")
    acts = np.concatenate(acts)
    stats = {"min": acts.min(0).tolist(), "max": acts.max(0).tolist(), "n_bins": N_BINS}
    path = Path(data_dir) / "action_stats.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(stats) + "\n")
    tmp.replace(path)
    return stats


def read_action_stats(data_dir):
    path = Path(data_dir) / "action_stats.json"
    if not path.is_file():
        stats = write_action_stats(data_dir)
        return np.array(stats["min"], np.float32), np.array(stats["max"], np.float32)
    try:
        stats = json.loads(path.read_text())
        lo, hi = np.array(stats["min"], np.float32), np.array(stats["max"], np.float32)
        ok = lo.ndim == 1 and lo.shape == hi.shape and np.isfinite(lo).all() and np.isfinite(hi).all()
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise ValueError(f"{path}: not action statistics {{\"min\": [...], \"max\": [...]}} of finite numbers; "
                         f"delete it to recompute")
    return lo, hi


def action_bins(actions, lo, hi):
    """(..., D) float -> (..., D) int64 bins in [0, 256), values outside [lo, hi] clipped."""
    span = np.maximum(hi - lo, 1e-8)
    return np.clip(np.round((actions - lo) / span * (N_BINS - 1)), 0, N_BINS - 1).astype(np.int64)


# -----------------------------------------------------------------------------
# token layout

class Layout:
    """Token ids of a window of frames. n_codes: K; codes_per_frame: L; action_dim: D."""

    def __init__(self, n_codes, codes_per_frame, action_dim):
        self.K, self.L, self.D = n_codes, codes_per_frame, action_dim
        self.vocab_size = n_codes + N_BINS * action_dim
        self.frame_len = codes_per_frame + action_dim   # one frame's codes and its action tokens

    def action_tokens(self, bins):
        """(..., D) bins -> (..., D) token ids."""
        return self.K + N_BINS * np.arange(self.D) + np.asarray(bins)

    def sequence(self, codes, bins):
        """codes (n, L), bins (n - 1, D) -> 1-D int64 array f_0 a_0 ... f_{n-1} of n L + (n - 1) D tokens."""
        n = len(codes)
        parts = []
        for f in range(n):
            parts.append(np.asarray(codes[f]))
            if f < n - 1:
                parts.append(self.action_tokens(bins[f]))
        return np.concatenate(parts).astype(np.int64)

    def code_positions(self, n, context):
        """Positions in a window of n frames that hold the codes of frames context .. n-1 (the predicted ones)."""
        return np.concatenate([f * self.frame_len + np.arange(self.L) for f in range(context, n)])

    def training_pair(self, codes, bins, context):
        """-> idx (T - 1,), targets (T - 1,) with -1 except where the next token is a predicted frame's code."""
        seq = self.sequence(codes, bins)
        targets = np.full(len(seq), -1, np.int64)
        pos = self.code_positions(len(codes), context)
        targets[pos] = seq[pos]
        return seq[:-1], targets[1:]
