"""
engine.generate(graphs=True): the sampler on a few fixed shapes, for a GPU. There the eager loop
of engine.py is launch-bound (a 1.5B model's decode step: ~3,000 small kernels), so one decode
step, compiled and recorded once per shape as a CUDA graph, is replayed per token; the host looks
at EOS every SYNC_EVERY tokens only, and finished rows are dropped by halves. It draws the eager
path's tokens (tests/test_engine.py: greedy always, seeded samples when no row is dropped) and
runs eagerly on a CPU, where it is tested. Loaded only by generate(graphs=True).
"""
import math
import sys
import time
from types import SimpleNamespace

import torch

from model import KVCache, additive, decode_step, prefill, sample_next

SYNC_EVERY = 32   # tokens between the host's looks at EOS; uniforms are drawn as many at a time
CAPTURE = dict(seconds=0.0, graphs=0)   # the last call's CUDA graph captures (gpu_check)
# a step reads the generated keys in blocks of WIDTH, and drops done rows by halves (>= MIN_ROWS)
WIDTH = 128
MIN_ROWS = 8


class StaticCache(KVCache):
    """model.KVCache at a fixed shape: the position written next is a device tensor t (1,), a
    step reads the first `width` positions, new_mask (width,) hides those past t. kv starts at
    zeros (a masked position still enters a matmul: 0 x NaN would be NaN)."""
    # the position is t: length reads max_new whatever is written (all of it moves when rows
    # leave), so a compiled step sees one value
    length = property(lambda self: self.room, lambda self, n: None)

    def __init__(self, config, prompt, valid, samples, max_new):
        self.room = max_new
        super().__init__(config, prompt, valid, samples, max_new)
        self.kv.zero_()
        self.t = torch.zeros(1, dtype=torch.long, device=valid.device)
        self.steps, self.width = torch.arange(max_new, device=valid.device), max_new

    def write(self, layer, k, v):
        """Store k, v (R, nkv, hd) at position t of `layer` -> the first width positions of each."""
        kv = self.kv[layer]                                      # (2, R, nkv, max_new, hd)
        kv.index_copy_(3, self.t, torch.stack([k, v]).unsqueeze(3))
        return kv[:, :, :, :self.width].flatten(1, 2)


def uniforms(generator, N, max_new, device):
    """The sampler's uniforms, (N, 1) per output column, drawn SYNC_EVERY columns at a time."""
    where = generator.device if generator is not None else device
    for c in range(0, max_new, SYNC_EVERY):
        block = torch.rand(min(SYNC_EVERY, max_new - c), N, 1, generator=generator,
                           dtype=torch.float64, device=where)
        if device.type == "cuda" and block.device.type == "cpu":
            block = block.pin_memory()
        yield from block.to(device, non_blocking=True)


def static_generate(model, prompts, max_new, temperature, top_k, top_p, eos_id, generator,
                    num_samples, vocab, capture=True, compile=None, compact=True):
    """generate(graphs=True). `step` changes buffers in place only, so on a GPU it is captured
    once per shape (`cuda_graph`; capture False: run eagerly); compile (None: on a GPU) runs
    decode_step compiled by torch.compile. compact False: no row is ever dropped."""
    logits, lens, cache = prefill(model, prompts, max_new, num_samples, StaticCache, causal=True)
    N, device = len(logits), logits.device
    tokens = torch.full((N, max_new), -1, dtype=torch.long, device=device)
    logprobs = torch.zeros(N, max_new, device=device)
    draws = uniforms(generator, N, max_new, device)
    greedy, cuda = temperature == 0, device.type == "cuda"
    decode = compiled_step() if (cuda if compile is None else compile) else decode_step
    # the decoding rows' state, dropped together: uniforms, last tokens, prompt lengths, done
    # (drew eos_id); cache.live: their rows of the output
    rows = SimpleNamespace(u=torch.zeros(N, 1, dtype=torch.float64, device=device), lens=lens)

    def sample(logits):
        return sample_next(logits[:, :vocab].float(), temperature, top_k, top_p, None, u=rows.u)

    # column 0, from the prefill's logits
    if not greedy:
        rows.u.copy_(next(draws))
    rows.tok, lp = sample(logits)
    tokens[:, 0], logprobs[:, 0] = rows.tok, lp
    rows.done = rows.tok == eos_id if eos_id is not None else torch.zeros_like(rows.tok).bool()

    def step():
        """Feed tok at position t, draw column t + 1 (-1 and 0 for rows done before), t + 1."""
        cache.new_mask = additive(cache.steps[:cache.width] <= cache.t, cache.kv.dtype)
        nxt, lp = sample(decode(model, rows.tok, rows.lens + cache.t, cache))
        col = cache.t + 1
        tokens[cache.live, col] = nxt.masked_fill(rows.done, -1)
        logprobs[cache.live, col] = lp.masked_fill(rows.done, 0.0)
        if eos_id is not None:
            rows.done.logical_or_(nxt == eos_id)
        rows.tok.copy_(nxt)
        cache.t.add_(1)

    runs, pool = {}, torch.cuda.graph_pool_handle() if cuda else None
    CAPTURE.update(seconds=0.0, graphs=0)
    for c in range(1, max_new):
        # the host looks at EOS every SYNC_EVERY tokens only
        if eos_id is not None and c % SYNC_EVERY == 0:
            if bool(rows.done.all()):
                break
            if compact:
                drop_done(rows, cache)
        if not greedy:
            rows.u.copy_(next(draws)[cache.live])
        # this step writes position c - 1: it reads the first c, rounded up to WIDTH
        cache.width = min(max_new, WIDTH * math.ceil(c / WIDTH))
        shape = (len(cache.live), cache.width)
        if shape not in runs:   # a new shape: captured once (on a GPU)
            runs[shape] = cuda_graph(step, [rows.tok, rows.done, tokens, logprobs, cache.t],
                                     pool) if capture and cuda else step
        runs[shape]()
    # the last column any row wrote, as the eager path stops there
    width = int((tokens >= 0).any(0).nonzero().max()) + 1
    return tokens[:, :width], logprobs[:, :width]


def drop_done(rows, cache):
    """Half the R rows done: go on with R / 2 (R / 4, ... >= MIN_ROWS) rows, unfinished first."""
    R, left = len(cache.live), int((~rows.done).sum())
    keep = R
    while keep // 2 >= max(left, MIN_ROWS):
        keep //= 2
    if keep < R:
        kept = torch.argsort(rows.done.to(torch.int8), stable=True)[:keep].sort().values
        cache.keep(kept)
        for name in ("u", "lens", "tok", "done"):
            setattr(rows, name, getattr(rows, name)[kept])


STEP = {}   # decode_step compiled, made once (compiled_step)


def compiled_step():
    """decode_step compiled by torch.compile; where compiling fails, one message and uncompiled."""
    if "fn" not in STEP:
        body = torch.compile(decode_step, dynamic=True)

        def fn(*args):
            try:
                return STEP["body"](*args)
            except Exception as e:   # noqa: BLE001  (any compiler failure: run uncompiled)
                if STEP["body"] is decode_step:
                    raise
                print(f"engine: torch.compile failed ({type(e).__name__}: {e}"[:300] + "); "
                      "the static path's decode step runs uncompiled", file=sys.stderr)
                STEP["body"] = decode_step
                return decode_step(*args)
        STEP.update(fn=fn, body=body)
    return STEP["fn"]


def cuda_graph(step, state, pool=None):
    """step() recorded once as a CUDA graph -> a function replaying it: one launch for the whole
    decode step. A warm-up runs first on a side stream (as torch.cuda.graph asks); the buffers
    `state` it moved are put back. pool: the memory pool of graphs never replayed at once."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    saved = [x.clone() for x in state]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        step()
    for x, x0 in zip(state, saved):
        x.copy_(x0)
