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
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from checkpoint import atomic_write, atomic_write_text
from engine import generate
from data.robot.detect import gripper_response
from video_rewards import OBJECT_TOL, to_uint8, video_reward

N_BINS = 256
STILL_TOL = 0.1     # a pixel is unchanged when no channel moves by more than this (video_rewards.MOVE_TOL)


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
    if not zipfile.is_zipfile(path):   # else numpy takes it for a pickle and suggests unpickling it
        raise ValueError(f"{path}: cannot read the .npz episode (not a zip archive of .npy arrays)")
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


def load_split(data_dir, split, size, limit=0, rank=0, world=1):
    """The first `limit` episodes of a split (0: all), resized; of them only every world-th from the rank-th
    (a torchrun rank's share; the others are never read)."""
    files = episode_files(data_dir, split)[:limit or None]
    if not files:
        raise ValueError(f"{data_dir}: no .npz episodes for the {split} split")
    if len(files) < world:
        raise ValueError(f"{data_dir}: {len(files)} {split} episodes for {world} ranks; each needs one")
    files = files[rank::world]
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
    atomic_write_text(Path(data_dir) / "action_stats.json", json.dumps(stats) + "\n")
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
    """Token ids of a window: `context` true frames, then predicted frames, with each frame's action between them.

    A context frame is Lc codes with ids in [0, Kc); a predicted (future) frame is L codes with ids code_offset + code,
    code in [0, K); the action tokens come after all code ids. The per-frame tokenizer codes every frame alike
    (Kc = K, Lc = L, offset 0); the context-conditioned one gives context frames 64 codes and future frames 64 codes
    of their own codebook (offset Kc). `Layout.of(vq, D)` reads these numbers from a tokenizer."""

    def __init__(self, n_codes, codes_per_frame, action_dim, context_codes=None, context_len=None, code_offset=0):
        self.K, self.L, self.D = n_codes, codes_per_frame, action_dim
        self.Kc, self.Lc = context_codes or n_codes, context_len or codes_per_frame
        self.offset = code_offset
        self.A = max(self.Kc, code_offset + n_codes)        # the first action token id
        self.vocab_size = self.A + N_BINS * action_dim
        self.frame_len = codes_per_frame + action_dim        # a predicted frame's codes and its action tokens
        self.context_frame_len = self.Lc + action_dim        # a context frame's codes and its action tokens

    @classmethod
    def of(cls, vq, action_dim):
        return cls(action_dim=action_dim, **vq.vocab())

    def action_tokens(self, bins):
        """(..., D) bins -> (..., D) token ids."""
        return self.A + N_BINS * np.arange(self.D) + np.asarray(bins)

    def prompt_len(self, context):
        """Tokens of the context frames with their actions: c_0 a_0 ... c_{C-1} a_{C-1}."""
        return context * self.context_frame_len

    def window_len(self, context, horizon):
        return self.prompt_len(context) + horizon * self.L + (horizon - 1) * self.D

    def code_positions(self, context, horizon):
        """Positions in a window that hold the predicted frames' codes (the only targets of the loss)."""
        return np.concatenate([self.prompt_len(context) + k * self.frame_len + np.arange(self.L)
                               for k in range(horizon)])

    def training_pair(self, windows, context):
        """Windows (B, n) of token ids with `context` true frames -> idx, targets (B, n - 1): targets are -1 except
        where the next token is a predicted frame's code (context codes and actions are inputs, never targets)."""
        windows = torch.as_tensor(windows)
        horizon = (windows.shape[-1] - self.prompt_len(context) + self.D) // self.frame_len
        keep = torch.zeros(windows.shape[-1], dtype=torch.bool)
        keep[torch.as_tensor(self.code_positions(context, horizon))] = True
        return windows[..., :-1], windows[..., 1:].masked_fill(~keep[1:], -1)


# -----------------------------------------------------------------------------
# the tokens of a split, and windows cut from them

@torch.no_grad()
def tokenize_split(vq, episodes, horizon, layout, lo, hi, still_code=None):
    """Every clip's tokens, computed once per tokenizer and split:
    context (E, T, Lc): each frame's codes as a context frame (vq.tokenize_context);
    future (E, T, horizon, L): codes of frame t + 1 + k coded against context frame t (0 past the clip's end);
    actions (E, T, D): action token ids, binned between lo and hi (the last frame's action is never used).
    For the per-frame tokenizer the future codes are the context codes of the later frames.
    still_code (the context-conditioned tokenizer only; None: off): the code of every cell whose pixels do not change
    from the context frame (`still_cells`), so that one code, not the many the encoder gives a cell it leaves to the
    context, means "unchanged" (find_still_code)."""
    images = np.stack([ep["image"] for ep in episodes])                                  # (E, T, H, W, 3) uint8
    E, T = images.shape[:2]
    context = vq.tokenize_context(images.reshape(E * T, *images.shape[2:])).view(E, T, -1).cpu()
    future = torch.zeros(E, T, horizon, layout.L, dtype=torch.long)
    for k in range(min(horizon, T - 1)):                                                 # frame t+1+k given frame t
        if layout.offset == 0:                                                           # per-frame: shift
            future[:, :T - 1 - k, k] = context[:, 1 + k:]
        else:
            target = images[:, 1 + k:].reshape(-1, *images.shape[2:])
            ctx = images[:, :T - 1 - k].reshape(-1, *images.shape[2:])
            future[:, :T - 1 - k, k] = vq.tokenize(target, ctx).view(E, T - 1 - k, -1).cpu()
            if still_code is not None:
                still = still_cells(target, ctx, vq.config.grid).view(E, T - 1 - k, -1)
                future[:, :T - 1 - k, k][still] = still_code
    bins = np.stack([layout.action_tokens(action_bins(ep["action"], lo, hi)) for ep in episodes])   # (E, T, D)
    return dict(context=context, future=future, actions=torch.from_numpy(bins))


def cached_tokens(run, vq_path, vq, layout, splits, horizon, lo, hi, size):
    """{split: tokenize_split(...)} of every split (name -> clips), each cached in out_dir per
    tokenizer file, data and horizon. Under torchrun each rank caches its own share of the train
    clips in a file of its own; the held-out splits, whole on every rank, are written by rank 0."""
    args, tokens = run.args, {}
    for split, episodes in splits.items():
        own = run.ddp and split == "train"   # this rank's share (train_vq.load_clips)
        # the cache is valid only for the same tokenizer bytes, data folder, frame size, clip
        # count and horizon
        key = (f"{zlib.crc32(Path(vq_path).read_bytes())}-{Path(args.data).resolve()}-"
               f"{size}-{len(episodes)}-{horizon}")
        cache = run.out_dir / (f"tokens_{split}_rank{run.rank}of{run.world}.safetensors" if own
                               else f"tokens_{split}.safetensors")
        try:
            with safe_open(str(cache), framework="pt") as f:
                if (f.metadata() or {}).get("key") == key:   # a hit: the tensors as saved
                    tokens[split] = {k: f.get_tensor(k) for k in f.keys()}
                    continue
        except Exception:   # missing or unreadable: computed again and rewritten below
            pass
        t0 = time.time()
        # context, future and action tokens per clip
        tokens[split] = tokenize_split(vq, episodes, horizon, layout, lo, hi)
        if run.master or own:
            atomic_write(cache, lambda tmp: save_file(tokens[split], str(tmp),
                                                      metadata={"key": key}))
        run.print0(f"tokenized {split}: {len(episodes)} clips in {time.time() - t0:.0f}s")
    return tokens


def still_cells(frames, context, grid, tol=STILL_TOL):
    """(N, H, W, 3) uint8 frames and their context frames -> (N, grid * grid) bool: the cells of the code grid where
    no pixel of the frame differs from the context by more than tol in any channel."""
    diff = np.abs(frames.astype(np.int16) - context.astype(np.int16)).max(-1) > tol * 255      # (N, H, W)
    N, H, W = diff.shape
    cells = diff.reshape(N, grid, H // grid, grid, W // grid).any(axis=(2, 4))
    return torch.from_numpy(~cells.reshape(N, -1))


@torch.no_grad()
def find_still_code(vq, frames):
    """The context-conditioned tokenizer's code for "unchanged": the future code that, put in every cell, decodes to
    the context frames (N, H, W, 3) uint8 with the least mean absolute error (its gate shuts: the context's pixels)."""
    codes = torch.arange(vq.config.n_codes)
    err = torch.zeros(len(codes))
    grids = codes[:, None].expand(-1, vq.config.codes_per_frame)                  # code c in every cell
    for f in frames:                                          # every code's all-cells frame against one context
        out = vq.detokenize(grids, np.repeat(f[None], len(codes), 0)).cpu()
        err += (out - torch.from_numpy(f).permute(2, 0, 1).float() / 255).abs().mean((1, 2, 3))
    return int(err.argmin())


def windows(tokens, layout, ids, starts, context, horizon):
    """Token windows (B, layout.window_len(context, horizon)) of clips `ids` starting at frames `starts`:
    c_s a_s ... c_{s+C-1} a_{s+C-1} f_0 a_{s+C} f_1 ... f_{h-1}, the f_k being codes of frame s+C+k against the last
    context frame s+C-1 (shifted by the layout's code offset)."""
    ids, starts = torch.as_tensor(ids)[:, None], torch.as_tensor(starts)[:, None]
    ctx = tokens["context"][ids, starts + torch.arange(context)]                          # (B, C, Lc)
    act = tokens["actions"][ids, starts + torch.arange(context + horizon - 1)]            # (B, C + h - 1, D)
    fut = tokens["future"][ids[:, 0], starts[:, 0] + context - 1, :horizon] + layout.offset   # (B, h, L)
    B = len(ids)
    head = torch.cat([ctx, act[:, :context]], 2).view(B, -1)                              # context frames + actions
    body = torch.cat([fut[:, :-1], act[:, context:]], 2).view(B, -1)                      # f_k a_k for k < h - 1
    return torch.cat([head, body, fut[:, -1]], 1)


# -----------------------------------------------------------------------------
# multi-step rollout: the GPT samples a frame's codes, the true next action is injected, and so on

def rollout(model, prompts, actions, horizon, L, temperature, generator=None, top_k=None):
    """Predict `horizon` frames of L codes after each prompt, injecting actions (N, horizon - 1, D) token ids between
    them (temperature 0: greedy; top_k: sample among the k likeliest tokens only). -> tokens (N, horizon * L + (horizon - 1) * D), their log-probs (0 for injected), sampled mask.
    Each frame is one `engine.generate` call on the grown prompt: re-running the prompt is one batched forward pass per
    frame, far cheaper than the L sequential decoding steps."""
    seqs = [list(p) for p in prompts]
    toks, lps, sampled = [], [], []
    for k in range(horizon):
        tok, lp = generate(model, seqs, L, temperature=temperature, top_k=top_k, generator=generator)   # (N, L)
        toks.append(tok)
        lps.append(lp)
        sampled.append(torch.ones_like(tok, dtype=torch.bool))
        if k < horizon - 1:                       # the true action that follows frame k: an input, never sampled
            act = actions[:, k].to(tok.device)
            toks.append(act)
            lps.append(torch.zeros(act.shape, device=tok.device))
            sampled.append(torch.zeros_like(act, dtype=torch.bool))
            seqs = [s + t + a for s, t, a in zip(seqs, tok.tolist(), act.tolist())]
    return torch.cat(toks, 1), torch.cat(lps, 1), torch.cat(sampled, 1)


def frame_codes(tokens, layout, horizon):
    """Rollout tokens (N, ...) -> (N, horizon, L) codes in [0, K); a sampled token that is not a future code
    (a context code or an action token) becomes code 0."""
    t = torch.as_tensor(tokens)
    out = torch.stack([t[:, k * layout.frame_len:k * layout.frame_len + layout.L] for k in range(horizon)], 1)
    out = out - layout.offset
    return torch.where((out >= 0) & (out < layout.K), out, torch.zeros_like(out))


# -----------------------------------------------------------------------------
# the RL interface (train_video.py's RLVR, as tasks.py's for text): the prompt draw, the reward of
# decoded frames, the multi-step sampler

def to_float(frames):
    """uint8 (..., H, W, 3) array -> float tensor (..., 3, H, W) in [0, 1]."""
    return torch.from_numpy(np.ascontiguousarray(frames)).movedim(-1, -3).float() / 255


@dataclass
class Clips:
    """What RLVR draws its windows from: the train clips, their tokens and the token layout."""
    episodes: list        # the clips: image (T, H, W, 3) uint8, action, background
    tokens: dict          # their tokens (tokenize_split)
    layout: Layout
    horizon: int          # predicted frames per window
    context: int = 1      # true frames before the first predicted one


def moving_windows(clips, tol=25):
    """Every (clip, first frame) window of the train clips where some predicted frame differs from
    the last context frame by more than `tol` (of 255) somewhere: a static window gives every
    sample the same reward (copying is exact), so no advantage and no gradient."""
    C, img = clips.context, [ep["image"] for ep in clips.episodes]
    n = C + clips.horizon
    return [(e, t) for e in range(len(img)) for t in range(len(img[e]) - n + 1)
            if np.abs(img[e][t + C:t + n].astype(np.int16) - img[e][t + C - 1]).max() > tol]


def window_batch(clips, picks, seq=None, truths=None, background=True):
    """The prompts and items of windows `picks` ((clip, first frame) each): seq (B, n_tokens)
    token windows (default: cut from the cache) and truths (per window the true frames (K, H, W, 3)
    uint8; default: the clips') -> (prompts: the context frames and their actions as token lists,
    items: truth, context frame, the true later actions and (background) the bare scene)."""
    L, FL, h, B = clips.layout.L, clips.layout.frame_len, clips.horizon, len(picks)
    C = clips.context
    if seq is None:
        seq = windows(clips.tokens, clips.layout, [e for e, _ in picks], [t for _, t in picks], C, h)
    if truths is None:
        truths = [clips.episodes[e]["image"][t + C:t + C + h] for e, t in picks]
    P = clips.layout.prompt_len(C)
    acts = seq[:, P:P + (h - 1) * FL].view(B, h - 1, FL)[:, :, L:]   # the true later actions
    eps = clips.episodes
    items = [dict(truth=to_float(truths[i]),                               # (K, 3, H, W)
                  context=to_float(eps[e]["image"][t + C - 1]),            # (3, H, W)
                  actions=acts[i],
                  background=to_float(eps[e]["background"]) if background else None)
             for i, (e, t) in enumerate(picks)]
    return seq[:, :P].tolist(), items


def make_draw(clips, pool, n, background):
    """The default prompt draw: n windows of `pool` at random -> draw(g) -> (prompts, items)."""
    def draw(g):
        picks = [pool[i] for i in torch.randint(len(pool), (n,), generator=g)]
        return window_batch(clips, picks, background=background)
    return draw


def make_reward(vq, clips, cfg, lpips_net, device):
    """reward_fn(items, completions) -> one reward per completion: its frames decoded against the
    true last context frame and scored by video_reward under VideoReward `cfg`, averaged over the
    predicted frames."""
    layout, h = clips.layout, clips.horizon

    def reward_fn(items, completions):
        # completions hold h frames of L codes with D action tokens between them
        codes = frame_codes([c[:h * layout.frame_len - layout.D] for c in completions], layout,
                            h)                                               # (N, K, L)

        def per_frame(key):   # items' (3, H, W) image, repeated per predicted frame: (N*K, ...)
            return torch.stack([it[key] for it in items])[:, None].expand(
                -1, h, -1, -1, -1).flatten(0, 1)

        ctx = per_frame("context")                  # the last context frame
        with torch.no_grad():                       # N*K frames decoded at once
            pred = vq.detokenize(codes.flatten(0, 1).to(device), ctx.to(device)).cpu()
        truth = torch.cat([it["truth"] for it in items])                   # (N*K, 3, H, W)
        bg = per_frame("background") if cfg.object else None               # the bare scenes
        r = video_reward(cfg, pred, truth, lpips_net, ctx, bg)
        return r.view(-1, h).mean(1).tolist()       # a completion: its frames' mean

    return reward_fn


def make_sampler(horizon, L):
    """Multi-step: sample frame by frame, injecting each window's true actions (single: None, the
    plain sampler)."""
    def sampler(m, prompts, items, cfg, gen):
        actions = torch.stack([it["actions"] for it in items])
        return rollout(m, prompts, actions, horizon, L, cfg.temperature, gen)
    return sampler if horizon > 1 else None


# -----------------------------------------------------------------------------
# the held-out evaluation's checks of the embedded robot data (video_eval.eval_video): did the predicted frames keep the
# objects, and does the predicted gripper follow the action?

EFFECTS = ("object_recall", "action_response")   # the per-window action-effect metrics


def object_scores(episodes, batch, context, horizon, true, pred):
    """The windows `batch` ((clip, first context frame) pairs of clips with a `background`, the bare table) scored
    on their true and predicted frames true, pred (B * horizon, 3, H, W): object pixels are away from the table
    (> OBJECT_TOL) -> (the object pixel counts, summed over batches: truth, pred, hit (both) and n (all pixels);
    the per-window effects, EFFECTS -> list)."""
    B = len(batch)
    bg = torch.stack([to_float(episodes[e]["background"]) for e, _ in batch]).repeat_interleave(horizon, 0)
    ot, op = ((x - bg).abs().amax(1) > OBJECT_TOL for x in (true, pred))         # (B * horizon, H, W)
    effects = {k: [] for k in EFFECTS}
    add_effects(effects, episodes, batch, context, horizon, ot.view(B, -1), op.view(B, -1),
                pred.view(B, horizon, *pred.shape[1:]))
    return dict(truth=float(ot.sum()), pred=float(op.sum()), hit=float((ot & op).sum()), n=ot.numel()), effects


def add_effects(effects, episodes, batch, context, horizon, truth, pred_objects, pred):
    """Append a batch's per-window object_recall and action_response to `effects`. truth and
    pred_objects (B, horizon * H * W) bool: the object pixels of the true and predicted frames;
    pred (B, horizon, 3, H, W): the predicted frames."""
    hit, n = (truth & pred_objects).sum(1).tolist(), truth.sum(1).tolist()
    effects["object_recall"] += [h / t if t else None for h, t in zip(hit, n)]
    for (e, t), p in zip(batch, to_uint8(pred)):
        img = episodes[e]["image"]
        effects["action_response"].append(
            gripper_response(img[t + context - 1], img[t + context:t + context + horizon], p))


def object_report(scores):
    """object_scores' (counts, effects) of every batch, in window order -> (objects: the shares of
    object pixels in the true and predicted frames and their recall, the true object pixels the
    prediction keeps; the per-window effects, EFFECTS -> list; summarize_effects of them)."""
    counts = {k: sum(c[k] for c, _ in scores) for k in ("truth", "pred", "hit", "n")}
    effects = {k: sum((e[k] for _, e in scores), []) for k in EFFECTS}
    objects = dict(pixels_truth=counts["truth"] / counts["n"], pixels_pred=counts["pred"] / counts["n"],
                   recall=counts["hit"] / max(counts["truth"], 1))
    return objects, effects, summarize_effects(effects)


def summarize_effects(effects):
    """Per-window action-effect values -> their means over the windows that have one, and the
    count of windows with a true gripper move."""
    kept = {k: [x for x in v if x is not None] for k, v in effects.items()}
    return dict({k: float(np.mean(v)) if v else None for k, v in kept.items()},
                response_windows=len(kept["action_response"]))
