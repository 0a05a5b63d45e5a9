"""
The sampler the runs use: `generate`, with a KV cache, fast on one CPU thread. model.py's
`GPT.generate` is the plain version (one full forward per new token); this file draws the same
tokens (tests/test_engine.py) with far less work per token. A decode step's matmuls are small,
and reading the cache takes as long (docs/engineering.md):
- Each prompt is prefilled once (model.py's `run_cached`), its keys and values kept once however
  many samples continue it (`num_samples`, GRPO's G).
- The generated tokens' keys and values live in one tensor, written in place: no concatenation,
  and dropping finished rows is one index. On a CPU it is packed (`KVCache.grow`).
- `decode_attention`: the queries sharing a prompt attend to its keys in one matmul, each row to
  its own generated keys in another; one softmax joins the two parts.
- Rows that reached EOS leave the batch once they are a quarter of it.

On a GPU that eager loop is launch-bound (a 1.5B model's decode step: ~3,000 small kernels), so
`generate(graphs=True)` takes a static-shape path (`static_generate`): one step, compiled and
recorded once per shape as a CUDA graph, is replayed per token; the host looks at EOS every
SYNC_EVERY tokens, and finished rows are dropped by halves.
"""
import copy
import math
import sys
import time
from types import SimpleNamespace

import torch

from model import PromptCache, additive, apply_rope, is_fsdp, run_cached, sample_next

# a CPU's prefetcher streams over gaps under 512 bytes between rows' keys: packed (KVCache.grow)
PACK = 4            # positions of room added at a time (where a key takes <= 128 bytes a position)
PACKED_UNTIL = 64   # past this many, room for all max_new: moving the cache would cost more
# the static path reads the generated keys in blocks of WIDTH, and halves its rows (>= MIN_ROWS)
WIDTH = 128
MIN_ROWS = 8


class KVCache:
    """What the decode steps attend to, for a grid of N = B * S rows (row b * S + s: sample s of
    prompt b), R of them still decoding. The prompts' part, kept once per prompt by the prefill:
      prompt_k[layer], prompt_v[layer]  (B * nkv, P, hd)     one matrix per (prompt, kv head)
      prompt_mask                       (B * nkv, S * g, P)  -inf at the prompts' left padding
    The generated part, one entry per decoding row:
      new_kv   (n_layer, 2, R, nkv, room, hd)  keys [:, 0] and values [:, 1], written in place
      length   how many positions of new_kv are written (room: max_new, or a few more on a CPU)
      live     (R,) the grid rows still decoding, in order (all N until rows finish)"""
    PACKS = True   # on a CPU the generated part is packed (grow); StaticCache: never

    def __init__(self, config, prompt, valid, samples, max_new):
        B, P = valid.shape
        self.B, self.S = B, samples
        self.nkv, self.g = config.n_kv_head, config.n_head // config.n_kv_head
        # (B, nkv, P, hd) -> (B * nkv, P, hd) per layer
        self.prompt_k = [k.flatten(0, 1) for k in prompt.k]
        self.prompt_v = [v.flatten(0, 1) for v in prompt.v]
        # valid (B, P): True at a prompt's real tokens. As 0 / -inf, once per query sharing them
        mask = additive(valid, self.prompt_k[0].dtype)                      # (B, P)
        Sg = samples * self.g
        self.prompt_mask = mask[:, None, None].expand(B, self.nkv, Sg, P).reshape(-1, Sg, P)
        shape = (config.n_layer, 2, B * samples, config.n_kv_head, max_new, config.head_dim)
        kp, self.length, self.max_new = self.prompt_k[0], 0, max_new
        # packed (a key <= 128 bytes a position): room for PACK, then two buffers in turn (grow)
        packed = (self.PACKS and kp.device.type == "cpu" and max_new > PACK
                  and config.head_dim * kp.element_size() <= 128)
        n = math.prod(shape[:4]) * min(PACKED_UNTIL, max_new) * shape[5]
        self.buffers = [kp.new_empty(n) for _ in range(2)] if packed else []
        self.new_kv = kp.new_empty(shape[:4] + (PACK if packed else max_new, shape[5]))
        self.live = torch.arange(B * samples, device=valid.device)
        self.new_mask = None   # StaticCache's

    def keep(self, rows):
        """Go on with the decoding rows `rows` (long, indices among the R) only."""
        self.live = self.live[rows]
        self.new_kv = self.new_kv[:, :, rows]

    def grow(self):
        """Packed, new_kv is full: move it into room for PACK more positions (decode_attention reads
        rows' keys ~2.5x faster than max_new - length apart). Past PACKED_UNTIL, room for all."""
        t, old = self.length, self.new_kv
        room = min(t + PACK, self.max_new)
        shape = old.shape[:4] + (room if room <= PACKED_UNTIL else self.max_new, old.size(5))
        if room <= PACKED_UNTIL:   # into the buffer new_kv is not in
            self.buffers.reverse()
            self.new_kv = self.buffers[0][:math.prod(shape)].view(shape)
        else:   # room for all from here on; the buffers go
            self.new_kv, self.buffers = old.new_empty(shape), []
        self.new_kv[:, :, :, :, :t] = old

    def write(self, layer, k, v):
        """Store the step's k, v (R, nkv, hd) at position `length` of `layer` -> the generated keys
        and values so far, (R * nkv, length + 1, hd) each (views, no copy)."""
        t = self.length
        if layer == 0 and t == self.new_kv.size(4):   # full (packed): grow, every layer at once
            self.grow()
        self.new_kv[layer, 0, :, :, t], self.new_kv[layer, 1, :, :, t] = k, v
        return self.new_kv[layer, :, :, :, :t + 1].flatten(1, 2)

    def by_prompt(self, x):
        """The decoding rows' (R, nkv, g, X) -> (B * nkv, S * g, X): for each (prompt, kv head),
        the g query heads of its S samples stacked (finished rows: zeros), as its keys take them."""
        B, S, (R, nkv, g, X) = self.B, self.S, x.shape
        # rows have finished: back to the full grid, decoding row i at grid row live[i]
        if R < B * S:
            x = x.new_zeros(B * S, nkv, g, X).index_copy_(0, self.live, x)
        x = x.reshape(B, S, nkv, g, X).transpose(1, 2)          # (B, nkv, S, g, X)
        return x.reshape(B * nkv, S * g, X)

    def by_row(self, x):
        """(B * nkv, S * g, X) -> the decoding rows' (R, nkv, g, X): by_prompt undone."""
        B, S, nkv, g = self.B, self.S, self.nkv, self.g
        x = x.reshape(B, nkv, S, g, -1).transpose(1, 2)         # (B, S, nkv, g, X)
        x = x.reshape(B * S, nkv, g, -1)                        # (N, nkv, g, X): the grid
        return x if len(self.live) == B * S else x[self.live]


class StaticCache(KVCache):
    """KVCache at a fixed shape: the position written next is a device tensor t (1,), a step reads
    the first `width` positions, new_mask (width,) hides those past t. new_kv starts at zeros (a
    masked position still enters a matmul: 0 x NaN would be NaN)."""
    PACKS = False   # room for all max_new from the start
    # the position is t: length reads 0 whatever is written, so a compiled step sees one value
    length = property(lambda self: 0, lambda self, n: None)

    def __init__(self, config, prompt, valid, samples, max_new):
        super().__init__(config, prompt, valid, samples, max_new)
        self.new_kv.zero_()
        self.t = torch.zeros(1, dtype=torch.long, device=valid.device)
        self.steps, self.width = torch.arange(max_new, device=valid.device), max_new

    def write(self, layer, k, v):
        """Store k, v (R, nkv, hd) at position t of `layer` -> the first width positions of each."""
        kv = self.new_kv[layer]                                  # (2, R, nkv, max_new, hd)
        kv.index_copy_(3, self.t, torch.stack([k, v]).unsqueeze(3))
        return kv[:, :, :, :self.width].flatten(1, 2)


def decode_attention(q, k, v, cache, layer):
    """One new query per row attends to its prompt's keys and to its own generated ones: q (R,
    nh, hd), k and v (R, nkv, hd), the R decoding rows' (k and v go into the cache first)
    -> (R, nh * hd), the heads side by side as c_proj takes them."""
    R, nh, hd = q.shape
    nkv, g, scale = cache.nkv, cache.g, hd ** -0.5
    kn, vn = cache.write(layer, k, v)                       # (R * nkv, T, hd) each
    kp, vp = cache.prompt_k[layer], cache.prompt_v[layer]   # (B * nkv, P, hd)
    P, T = kp.size(1), kn.size(1)   # T: the positions written so far (eager), or width (static)
    # query head h uses kv head h // g: the g queries of a kv head side by side (no copy of k, v)
    q = q.contiguous().view(R, nkv, g, hd)
    # scores, scaled by 1/sqrt(hd) as in model.py's attention: a prompt's keys against all the
    # S * g queries sharing them in one matmul, which adds the padding mask too ...
    s_prompt = torch.baddbmm(cache.prompt_mask, cache.by_prompt(q), kp.transpose(1, 2), alpha=scale)
    s_prompt = cache.by_row(s_prompt)                                         # (R, nkv, g, P)
    # ... and each row's generated keys against its g queries
    s_new = torch.bmm(q.view(R * nkv, g, hd), kn.transpose(1, 2)).mul_(scale)
    if cache.new_mask is not None:   # static: the positions not yet written are -inf
        s_new += cache.new_mask
    s_new = s_new.view(R, nkv, g, T)
    # one softmax over both parts
    p = torch.softmax(torch.cat([s_prompt, s_new], dim=-1), dim=-1)         # (R, nkv, g, P + T)
    # values: the prompt part per prompt, then each row adds its own (baddbmm: y + p_new @ v_new)
    y = cache.by_row(torch.bmm(cache.by_prompt(p[..., :P]), vp))             # (R, nkv, g, hd)
    y = torch.baddbmm(y.reshape(R * nkv, g, hd), p[..., P:].reshape(R * nkv, g, T), vn)
    return y.view(R, nh * hd)


def decode_step(model, tok, pos, cache):
    """Logits (R, vocab) of the next token of the R decoding rows, fed their last tokens tok (R,)
    at positions pos (R,): GPT.forward's layers, one token per row; the cache grows by one."""
    c = model.config
    R, nh, nkv, hd = len(tok), c.n_head, c.n_kv_head, c.head_dim
    x, rope = model.embed(tok, pos)                            # (R, C); cos, sin (R, 1, hd)
    for layer, block in enumerate(model.h):
        qk, v = block.attn.c_attn(block.ln_1(x)).split([(nh + nkv) * hd, nkv * hd], dim=-1)
        # q's heads, then k's: RoPE rotates them together
        qk = qk.view(R, nh + nkv, hd)
        if rope is not None:
            qk = apply_rope(qk, *rope)
        q, k = qk.split([nh, nkv], dim=1)
        x = x + block.attn.c_proj(decode_attention(q, k, v.view(R, nkv, hd), cache, layer))
        x = x + block.mlp(block.ln_2(x))
    cache.length += 1
    return model.lm_head(model.ln_f(x))


def prefill(model, prompts, max_new_tokens, samples, static=False):
    """Run the B prompts once, left-padded, pads masked (results independent of the batch) -> each
    row's first new token's logits (B * S, vocab), prompt length (B * S,), the KVCache."""
    device, B, dtype = model.wte.weight.device, len(prompts), model.wte.weight.dtype
    lens = torch.tensor([len(p) for p in prompts], device=device)
    assert B > 0 and int(lens.min()) >= 1, "engine.generate: every prompt needs at least one token"
    P = int(lens.max())
    assert P + max_new_tokens <= model.config.block_size, \
        f"prompt {P} + {max_new_tokens} new > block_size"
    pads = [[0] * (P - len(p)) + list(p) for p in prompts]
    idx = torch.tensor(pads, dtype=torch.long, device=device)           # (B, P)
    col = torch.arange(P, device=device)
    # a key is a real token (the pads are at the left); positions count from a row's first token
    valid = col.unsqueeze(0) >= (P - lens).unsqueeze(1)                 # (B, P)
    pos = (col.unsqueeze(0) - (P - lens).unsqueeze(1)).clamp(min=0)     # (B, P)
    causal = torch.ones(P, P, dtype=torch.bool, device=device).tril()
    # mask (B, 1, P, P); a pad query may see itself so that its softmax row is never empty
    allowed = (causal & valid[:, None]) | torch.eye(P, dtype=torch.bool, device=device)
    prompt = PromptCache(model.config.n_layer)
    # no pads on the static path: causal, where SDPA may run a flash kernel
    mask = None if static and bool((lens == P).all()) else additive(allowed.unsqueeze(1), dtype)
    logits = run_cached(model, idx, pos, mask, prompt, last=True)[:, -1]  # (B, vocab)
    cache = (StaticCache if static else KVCache)(model.config, prompt, valid, samples,
                                                 max_new_tokens)
    return logits.repeat_interleave(samples, 0), lens.repeat_interleave(samples), cache


@torch.inference_mode()
def generate(model, prompts, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
             eos_id=None, generator=None, num_samples=1, vocab=None, graphs=False):
    """Sample continuations of a batch of prompts with a KV cache.
    prompts: B token-id lists (lengths may differ; each >= 1); results do not depend on the batch.
    num_samples S: continuations per prompt (rows b*S .. b*S+S-1 of the output are prompt b's).
    temperature 0 means greedy; top_k / top_p filter the distribution (model.sample_next). vocab:
    draw only ids below it, the ones the tokenizer decodes; None: every id of the model.
    Returns (tokens, logprobs), both (B*S, N), N <= max_new_tokens (it stops once every row is
    done): tokens long, -1 after a row's eos_id (kept); logprobs float32, each sampled token's
    log-prob under the sampling distribution (greedy: the model's at T=1), 0 where tokens == -1.
    graphs: the static-shape path (`static_generate`), its decode step a CUDA graph on a GPU."""
    if graphs:
        return static_generate(model, prompts, max_new_tokens, temperature, top_k, top_p, eos_id,
                               generator, num_samples, vocab)
    logits, lens, cache = prefill(model, prompts, max_new_tokens, num_samples)
    N, device = len(logits), logits.device
    tokens = torch.full((N, max_new_tokens), -1, dtype=torch.long, device=device)
    logprobs = torch.zeros(N, max_new_tokens, device=device)
    # per decoding row: its prompt length (lens) and whether it has drawn eos_id (done)
    done = torch.zeros(N, dtype=torch.bool, device=device)
    for t in range(max_new_tokens):
        tok, lp = sample_next(logits[:, :vocab].float(), temperature, top_k, top_p, generator)
        # cache.live: the output rows still decoding; a finished row's draws are not kept
        rows = cache.live
        tokens[rows, t], logprobs[rows, t] = tok.masked_fill(done, -1), lp.masked_fill(done, 0.0)
        if eos_id is not None:
            done = done | (tok == eos_id)
        if t == max_new_tokens - 1 or (eos_id is not None and bool(done.all())):
            break
        # a quarter of the rows finished: they leave the batch
        if eos_id is not None and 4 * int(done.sum()) >= len(done):
            live = (~done).nonzero().squeeze(1)
            lens, tok, done = lens[live], tok[live], done[live]
            cache.keep(live)
        logits = decode_step(model, tok, lens + t, cache)
    return tokens[:, :t + 1], logprobs[:, :t + 1]


# -----------------------------------------------------------------------------
# the static-shape path (generate(graphs=True)): see the module's docstring

SYNC_EVERY = 32   # tokens between the host's looks at EOS; uniforms are drawn as many at a time
CAPTURE = dict(seconds=0.0, graphs=0)   # the last call's CUDA graph captures (gpu_check)


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
    """generate(graphs=True): the eager path's tokens on a few fixed shapes (seeded samples equal
    when it drops no row, without eos_id; greedy ones always). `step` changes buffers in place
    only, so on a GPU it is captured once per shape (`cuda_graph`; capture False: run eagerly);
    compile (None: on a GPU) runs decode_step compiled by torch.compile."""
    logits, lens, cache = prefill(model, prompts, max_new, num_samples, static=True)
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
        cache.new_mask = additive(cache.steps[:cache.width] <= cache.t, cache.new_kv.dtype)
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
    torch.cuda.synchronize()
    CAPTURE["seconds"] += time.perf_counter() - t0
    CAPTURE["graphs"] += 1
    return graph.replay


def cast_copy(model):
    """Inside a low-precision autocast region, a float32 model -> a copy in that dtype; else it."""
    device = model.wte.weight.device.type
    dtype = torch.get_autocast_dtype(device)
    if (not torch.is_autocast_enabled(device) or dtype == torch.float32
            or model.wte.weight.dtype != torch.float32 or is_fsdp(model)):
        return model   # (FSDP, runtime.unsharded: its gathered weights cannot be deep-copied)
    memo = {id(p): torch.nn.Parameter(p.detach().to(dtype), requires_grad=False)
            for p in model.parameters()}
    return copy.deepcopy(model, memo)
