"""
The sampler the runs use: `generate`, with a KV cache, fast on one CPU thread. model.py's
`GPT.generate` is the plain version (one full forward per new token); this file draws the same
tokens (tests/test_engine.py) with far less work per token:
- Each prompt is prefilled once (model.py's `run_cached`), its keys and values kept once however
  many samples continue it (`num_samples`, GRPO's G).
- Each row's generated keys and values are written in place, in room for all max_new tokens.
- `decode_attention`: the queries sharing a prompt attend to its keys in one matmul, each row to
  its own generated keys in another; one softmax joins the two parts.
- Rows that reached EOS leave the batch once they are a quarter of it (prompts with no row left
  leave too).
A decode step is the weights' matmuls plus one read of the cache (docs/engineering.md, The
sampler's speed). `generate(graphs=True)` runs engine_static.py's static-shape sampler instead:
on a GPU each decode step one CUDA graph.
"""
import copy

import torch

from model import PromptCache, additive, apply_rope, is_fsdp, run_cached, sample_next


class KVCache:
    """What the decode steps attend to, for R decoding rows, each sample s of one of B prompts
    (at first all N = B * S, row b * S + s). The prompts' part, kept once per prompt:
      prompt_k[layer], prompt_v[layer]  (B * nkv, P, hd)     one matrix per (prompt, kv head)
      prompt_mask                       (B * nkv, S * g, P)  -inf at the prompts' left padding
    The generated part, one entry per decoding row, written in place:
      kv    (n_layer, 2, R, nkv, max_new, hd)  keys [:, 0], values [:, 1]; `length` written
      live       (R,) the grid rows still decoding, in order (all N until rows finish)"""
    new_mask = None   # engine_static's StaticCache: -inf at the positions not written yet

    def __init__(self, config, prompt, valid, samples, max_new):
        B, P = valid.shape
        self.S, self.nkv, self.g = samples, config.n_kv_head, config.n_head // config.n_kv_head
        # (B, nkv, P, hd) -> (B * nkv, P, hd) per layer
        self.prompt_k = [k.flatten(0, 1) for k in prompt.k]
        self.prompt_v = [v.flatten(0, 1) for v in prompt.v]
        # valid (B, P): True at a prompt's real tokens. As 0 / -inf, once per query sharing them
        mask = additive(valid, self.prompt_k[0].dtype)                       # (B, P)
        Sg = samples * self.g
        self.prompt_mask = mask[:, None, None].expand(B, self.nkv, Sg, P).reshape(-1, Sg, P)
        shape = (config.n_layer, 2, B * samples, self.nkv, max_new, config.head_dim)
        self.kv, self.length = self.prompt_k[0].new_empty(shape), 0
        self.live = torch.arange(B * samples, device=valid.device)
        self.prompts = torch.arange(B, device=valid.device)   # the prompts still decoding
        self.regroup()

    def keep(self, rows):
        """Go on with the decoding rows `rows` (long, indices among the R) only: their written
        keys and values move to room for all max_new; prompts without a row left leave too."""
        self.live, t, old = self.live[rows], self.length, self.kv
        self.kv = old.new_empty(old.shape[:2] + (len(rows),) + old.shape[3:])
        self.kv[:, :, :, :, :t] = old[:, :, rows, :, :t]
        left = torch.isin(self.prompts, self.live // self.S).nonzero().squeeze(1)
        if len(left) < len(self.prompts):   # the prompts' part: those with a row left
            B, nkv = len(self.prompts), self.nkv
            self.prompts = self.prompts[left]
            for part in (self.prompt_k, self.prompt_v):
                part[:] = [x.unflatten(0, (B, nkv))[left].flatten(0, 1) for x in part]
            self.prompt_mask = self.prompt_mask.unflatten(0, (B, nkv))[left].flatten(0, 1)
        self.regroup()

    def regroup(self):
        """The index_selects between the R rows' query heads (R * nkv * g, in the rows' order) and
        the prompts' (B * nkv * S * g: for each (prompt, kv head), the g query heads of its S
        samples): to_prompt gives a finished row's place any row (its results are dropped).
        None with one sample a prompt: the two orders are one."""
        self.to_prompt = self.to_row = None
        if self.S == 1:
            return
        B, S, nkv, g, dev = len(self.prompts), self.S, self.nkv, self.g, self.live.device
        # the live rows' places in the grid of the B prompts left, S samples each
        grid = torch.searchsorted(self.prompts, self.live // S) * S + self.live % S
        by_prompt = torch.arange(B * nkv * S * g, device=dev).view(B, nkv, S, g).transpose(1, 2)
        self.to_row = by_prompt.reshape(B * S, nkv * g)[grid].flatten()
        by_row = torch.zeros(B * S, nkv * g, dtype=torch.long, device=dev)
        by_row[grid] = torch.arange(len(grid) * nkv * g, device=dev).view(-1, nkv * g)
        self.to_prompt = by_row.view(B, S, nkv, g).transpose(1, 2).flatten()

    def by_prompt(self, x):
        """The rows' (R * nkv, g, X) -> (B * nkv, S * g, X): for each (prompt, kv head), the g
        query heads of its S samples stacked, as its keys take them."""
        if self.to_prompt is None:
            return x
        return x.flatten(0, 1).index_select(0, self.to_prompt).view(-1, self.S * self.g, x.size(-1))

    def by_row(self, x):
        """(B * nkv, S * g, X) -> the rows' (R * nkv, g, X): by_prompt undone."""
        if self.to_row is None:
            return x
        return x.flatten(0, 1).index_select(0, self.to_row).view(-1, self.g, x.size(-1))

    def write(self, layer, k, v):
        """Store the step's k, v (R, nkv, hd) at position `length` of `layer` -> the generated keys
        and values so far, (R * nkv, length + 1, hd) each (views, no copy)."""
        kv, t = self.kv[layer], self.length
        kv[0, :, :, t], kv[1, :, :, t] = k, v
        return kv[:, :, :, :t + 1].flatten(1, 2).unbind(0)


def decode_attention(q, k, v, cache, layer):
    """One new query per row attends to its prompt's keys and to its own generated ones: q (R,
    nh, hd), k and v (R, nkv, hd), the R decoding rows' (k and v go into the cache first)
    -> (R, nh * hd), the heads side by side as c_proj takes them."""
    R, nh, hd = q.shape
    scale = hd ** -0.5
    kn, vn = cache.write(layer, k, v)                       # (R * nkv, T, hd) each
    kp, vp = cache.prompt_k[layer], cache.prompt_v[layer]   # (B * nkv, P, hd)
    P = kp.size(1)
    # query head h uses kv head h // g: the g queries of a kv head side by side
    q = q.reshape(-1, cache.g, hd)                                            # (R * nkv, g, hd)
    # scores, scaled by 1/sqrt(hd) as in model.py's attention: a prompt's keys against all the
    # S * g queries sharing them in one matmul, which adds the padding mask too ...
    s_prompt = torch.baddbmm(cache.prompt_mask, cache.by_prompt(q), kp.mT, alpha=scale)
    # ... and each row's generated keys against its g queries
    s_new = torch.bmm(q, kn.mT).mul_(scale)
    if cache.new_mask is not None:   # static: the positions not yet written are -inf
        s_new += cache.new_mask
    # one softmax over both parts
    p = torch.softmax(torch.cat([cache.by_row(s_prompt), s_new], dim=-1), dim=-1)
    # values: the prompt part per prompt, then each row adds its own (baddbmm: y + p_new @ v_new)
    y = cache.by_row(torch.bmm(cache.by_prompt(p[..., :P]), vp))             # (R * nkv, g, hd)
    return torch.baddbmm(y, p[..., P:], vn).view(R, nh * hd)


def decode_step(model, tok, pos, cache):
    """Logits (R, vocab) of the next token of the R decoding rows, fed their last tokens tok (R,)
    at positions pos (R,): GPT.forward's layers, one token per row; the cache grows by one."""
    c = model.config
    R, nh, nkv, hd = len(tok), c.n_head, c.n_kv_head, c.head_dim
    x, rope = model.embed(tok, pos)                            # (R, C); cos, sin (R, 1, hd)
    for layer, block in enumerate(model.h):
        qkv = block.attn.c_attn(block.ln_1(x)).view(R, nh + 2 * nkv, hd)
        # q's heads, then k's: RoPE rotates them together
        qk, v = qkv[:, :nh + nkv], qkv[:, nh + nkv:]
        if rope is not None:
            qk = apply_rope(qk, *rope)
        x = x + block.attn.c_proj(decode_attention(qk[:, :nh], qk[:, nh:], v, cache, layer))
        x = x + block.mlp(block.ln_2(x))
    cache.length += 1
    return model.lm_head(model.ln_f(x))


def prefill(model, prompts, max_new_tokens, samples, cache=KVCache, causal=False):
    """Run the B prompts once, left-padded, pads masked (results independent of the batch) -> each
    row's first new token's logits (B * S, vocab), prompt length (B * S,), the cache (a `cache`).
    causal: where no prompt is padded, no mask (SDPA may run a flash kernel; engine_static's)."""
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
    causal_mask = torch.ones(P, P, dtype=torch.bool, device=device).tril()
    # mask (B, 1, P, P); a pad query may see itself so that its softmax row is never empty
    allowed = (causal_mask & valid[:, None]) | torch.eye(P, dtype=torch.bool, device=device)
    prompt = PromptCache(model.config.n_layer)
    mask = None if causal and bool((lens == P).all()) else additive(allowed.unsqueeze(1), dtype)
    logits = run_cached(model, idx, pos, mask, prompt, last=True)[:, -1]  # (B, vocab)
    kv = cache(model.config, prompt, valid, samples, max_new_tokens)
    return logits.repeat_interleave(samples, 0), lens.repeat_interleave(samples), kv


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
    graphs: engine_static.py's static-shape path, its decode step a CUDA graph on a GPU."""
    if graphs:
        from engine_static import static_generate   # loaded only for it
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
