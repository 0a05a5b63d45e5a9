"""
Sampling from a GPT (model.py): prefill, KV cache, one decode step and `generate`, fast on one CPU thread.

model.py's forward pass is written for training, T tokens per row at once. A decode step feeds one token per row: its
matmuls are small, and reading every row's cached keys and values takes as long as they do (docs/performance.md has
the profile, and the measurements behind each choice below and of the alternatives that lost):
- Each prompt is prefilled once by the model's own forward pass (`GPT._run` into a `PromptCache`), however many
  samples continue it (`num_samples`, GRPO's G): its keys and values are kept once per prompt, not once per sample.
- The generated tokens' keys and values live in one tensor preallocated for all layers and both of k and v, written
  in place at each step: no concatenation, and dropping finished rows is one index of it.
- The decode step walks the model's layers on (R, C) activations, one token per row, with no transposes: RoPE
  rotates q and k in one go, and the attention output is already laid out as c_proj wants it.
- `decode_attention`: the queries that share a prompt (its S samples x the g query heads of a kv head) attend to the
  prompt's keys in one matmul, and each row to its own generated keys in another; one softmax joins the two parts.
- Rows that reached EOS leave the batch once they are a quarter of it.
- Sampling draws one uniform per row and inverts the CDF: no exponential per vocabulary entry as in multinomial.
- Opt-in, `generate(compile=True | "cuda-graphs")`: `static_decode_step`, the step with the same shapes at every
  step, for torch.compile and CUDA graphs (no row dropping there).
"""
import functools

import torch

from model import PromptCache, additive, apply_rope


class KVCache:
    """The keys and values a decode step attends to, for a grid of N = B * S rows (S samples of each of B prompts,
    rows b * S .. b * S + S - 1 continuing prompt b).

    Prompts: `k`, `v`, one (B * n_kv_head, P, head_dim) per layer, kept once per prompt by the prefill, and `bias`
    (B * n_kv_head, S * g, P), 0 or -inf, masking their left padding for the S * g queries that share a kv head.
    Generated tokens: `kv` (n_layer, 2, R, n_kv_head, max_new, head_dim), keys [:, 0] and values [:, 1] of the R rows
    still decoding, one tensor preallocated for every layer and written in place; `length` positions are filled.
    The R live rows are the grid rows `slots` (None: all N, in order); `keep` drops the others.
    The compiled step (`static_attention`) needs `unseen` (max_new,): 0 at the positions written, -inf elsewhere."""

    def __init__(self, config, prompt, valid, samples, max_new):
        B, P = valid.shape
        self.B, self.S, self.nkv, self.g = B, samples, config.n_kv_head, config.n_head // config.n_kv_head
        self.k = [k.flatten(0, 1) for k in prompt.k]  # (B * nkv, P, hd) per layer
        self.v = [v.flatten(0, 1) for v in prompt.v]
        bias = additive(valid, self.k[0].dtype)        # (B, P)
        self.bias = bias[:, None, None].expand(B, self.nkv, samples * self.g, P).reshape(-1, samples * self.g, P)
        shape = (config.n_layer, 2, B * samples, config.n_kv_head, max_new, config.head_dim)
        self.kv = torch.empty(shape, dtype=self.k[0].dtype, device=valid.device)
        self.length, self.slots, self.unseen = 0, None, None

    def keep(self, live):
        """Go on with the current rows `live` (long) only: finished rows leave the batch."""
        self.slots = live if self.slots is None else self.slots[live]
        self.kv = self.kv[:, :, live]

    def by_prompt(self, x):
        """Live rows (R, nkv, g, X) -> (B * nkv, S * g, X): the queries sharing a prompt and a kv head side by side
        (a dropped row's are zeros). A view when S = 1 and no row was dropped."""
        B, S, (_, nkv, g, X) = self.B, self.S, x.shape
        if self.slots is not None:
            x = x.new_zeros(B * S, nkv, g, X).index_copy_(0, self.slots, x)
        return x.reshape(B, S, nkv, g, X).transpose(1, 2).reshape(B * nkv, S * g, X)

    def by_row(self, x):
        """(B * nkv, S * g, X) -> live rows (R, nkv, g, X), the inverse of by_prompt."""
        B, S, nkv, g = self.B, self.S, self.nkv, self.g
        x = x.reshape(B, nkv, S, g, -1).transpose(1, 2).reshape(B * S, nkv, g, -1)
        return x if self.slots is None else x[self.slots]


def decode_attention(q, k, v, cache, layer):
    """Attention of one new query per row to its prompt's keys and to its own generated ones.

    q (R, nh, hd), k and v (R, nkv, hd): the step's, for the R live rows; k and v are stored in the cache first.
    Returns (R, nh * hd), the heads side by side as c_proj takes them."""
    R, nh, hd = q.shape
    nkv, g, t, scale = cache.nkv, cache.g, cache.length, hd ** -0.5
    cache.kv[layer, 0, :, :, t], cache.kv[layer, 1, :, :, t] = k, v      # in place, no concatenation
    kn, vn = cache.kv[layer, :, :, :, :t + 1].flatten(1, 2)               # (R * nkv, t + 1, hd) each, views
    kp, vp = cache.k[layer], cache.v[layer]                               # (B * nkv, P, hd)
    P = kp.size(1)
    q = q.contiguous().view(R, nkv, g, hd)  # query head h uses kv head h // g (no copy of k, v per query head)
    # scores: a prompt's keys against all its S * g queries in one matmul (the padding bias added by it), a row's
    # generated keys against its g queries; both scaled by 1/sqrt(hd) as in model.py's attention
    s_prompt = cache.by_row(torch.baddbmm(cache.bias, cache.by_prompt(q), kp.transpose(1, 2), alpha=scale))
    s_new = torch.bmm(q.view(R * nkv, g, hd), kn.transpose(1, 2)).mul_(scale).view(R, nkv, g, t + 1)
    p = torch.softmax(torch.cat([s_prompt, s_new], dim=-1), dim=-1)       # (R, nkv, g, P + t + 1): one softmax
    # values: the prompt part per prompt, then each row adds its own part (baddbmm: y + p_new @ v_new)
    y = cache.by_row(torch.bmm(cache.by_prompt(p[..., :P]), vp))          # (R, nkv, g, hd)
    y = torch.baddbmm(y.reshape(R * nkv, g, hd), p[..., P:].reshape(R * nkv, g, t + 1), vn)
    return y.view(R, nh * hd)


def static_attention(q, k, v, cache, layer):
    """decode_attention with the same shapes at every step, for torch.compile: each row attends to its prompt, to
    all max_new positions of its generated-token buffer (cache.unseen adds -inf at those not written yet; the buffer
    starts as zeros, so they add exactly nothing) and to its own new key. Writes nothing to the cache."""
    R, nh, hd = q.shape
    nkv, g, scale = cache.nkv, cache.g, hd ** -0.5
    kn, vn = cache.kv[layer].flatten(1, 2)                                # (R * nkv, max_new, hd) each, views
    kp, vp = cache.k[layer], cache.v[layer]                               # (B * nkv, P, hd)
    P, M = kp.size(1), kn.size(1)
    q = q.contiguous().view(R, nkv, g, hd)
    s_prompt = cache.by_row(torch.baddbmm(cache.bias, cache.by_prompt(q), kp.transpose(1, 2), alpha=scale))
    s_new = torch.baddbmm(cache.unseen, q.view(R * nkv, g, hd), kn.transpose(1, 2), alpha=scale).view(R, nkv, g, M)
    s_self = (q * k[:, :, None]).sum(-1, keepdim=True) * scale            # (R, nkv, g, 1): the step's own key
    p = torch.softmax(torch.cat([s_prompt, s_new, s_self], dim=-1), dim=-1)   # (R, nkv, g, P + M + 1)
    y = cache.by_row(torch.bmm(cache.by_prompt(p[..., :P]), vp))          # (R, nkv, g, hd)
    y = torch.baddbmm(y.reshape(R * nkv, g, hd), p[..., P:-1].reshape(R * nkv, g, M), vn).view(R, nkv, g, hd)
    return (y + p[..., -1:] * v[:, :, None]).view(R, nh * hd)


def static_decode_step(model, tok, pos, cache):
    """decode_step with static_attention, the function torch.compile compiles once per shape (rows, max_new, prompt
    length): logits (N, vocab) and the step's keys and values (n_layer, 2, N, n_kv_head, head_dim), which the caller
    stores (torch.compile gives no CUDA graph to a function that writes to inputs without fixed addresses)."""
    new = []

    def attention(q, k, v, cache, layer):
        new.append(torch.stack([k, v]))
        return static_attention(q, k, v, cache, layer)
    return decode_step(model, tok, pos, cache, attention), torch.stack(new)


def decode_step(model, tok, pos, cache, attention=None):
    """Logits (R, vocab) of the next token of the R live rows, fed their last tokens tok (R,) at positions pos (R,).
    The same layers as GPT._run, on (R, C) activations; `attention` stores the new keys and values in the cache."""
    c = model.config
    R, nh, nkv, hd = len(tok), c.n_head, c.n_kv_head, c.head_dim
    x, rope, attention = model.wte(tok), None, attention or decode_attention  # (R, C)
    if model.wpe is not None:
        x = x + model.wpe(pos)
    else:
        rope = model.rope_cos[pos].unsqueeze(1).to(x.dtype), model.rope_sin[pos].unsqueeze(1).to(x.dtype)  # (R, 1, hd)
    for layer, block in enumerate(model.h):
        qk, v = block.attn.c_attn(block.ln_1(x)).split([(nh + nkv) * hd, nkv * hd], dim=-1)
        qk = qk.view(R, nh + nkv, hd)                                     # q's heads, then k's
        if rope is not None:
            qk = apply_rope(qk, *rope)                                    # q and k rotated together
        q, k = qk.split([nh, nkv], dim=1)
        x = x + block.attn.c_proj(attention(q, k, v.view(R, nkv, hd), cache, layer))
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(model.ln_f(x))


def prefill(model, prompts, max_new_tokens, samples):
    """Run the B prompts once, left-padded to their longest length P; each row gets positions 0..len-1 for its own
    tokens and a mask hiding the pads, so a row's results do not depend on the batch.
    Returns the logits (B * S, vocab) of every row's first new token, the rows' prompt lengths (B * S,) and the
    KVCache holding the prompts' keys and values."""
    device, B, dtype = model.wte.weight.device, len(prompts), model.wte.weight.dtype
    lens = torch.tensor([len(p) for p in prompts], device=device)
    assert B > 0 and int(lens.min()) >= 1, "engine.generate: every prompt needs at least one token"
    P = int(lens.max())
    assert P + max_new_tokens <= model.config.block_size, f"prompt {P} + {max_new_tokens} new > block_size"
    idx = torch.tensor([[0] * (P - len(p)) + list(p) for p in prompts], dtype=torch.long, device=device)  # (B, P)
    col = torch.arange(P, device=device)
    valid = col.unsqueeze(0) >= (P - lens).unsqueeze(1)               # (B, P) key is a real token (pads at the left)
    pos = (col.unsqueeze(0) - (P - lens).unsqueeze(1)).clamp(min=0)   # (B, P)
    causal = torch.ones(P, P, dtype=torch.bool, device=device).tril()
    # mask (B, 1, P, P); a pad query may see itself so that its softmax row is never empty
    allowed = (causal & valid[:, None]) | torch.eye(P, dtype=torch.bool, device=device)
    prompt = PromptCache(model.config.n_layer)
    logits = model._run(idx, pos, additive(allowed.unsqueeze(1), dtype), prompt, last=True)[:, -1]  # (B, vocab)
    cache = KVCache(model.config, prompt, valid, samples, max_new_tokens)
    return logits.repeat_interleave(samples, 0), lens.repeat_interleave(samples), cache


@functools.cache
def compiled_step(cuda_graphs):
    """static_decode_step compiled by torch.compile (inductor), with CUDA graphs ("reduce-overhead") or without."""
    return torch.compile(static_decode_step, fullgraph=True, mode="reduce-overhead" if cuda_graphs else None)


def decoder(model, cache, compile):
    """generate's decode step: step(tok, pos) -> logits, the cache one position longer. compile: see generate."""
    if compile not in (False, True, "cuda-graphs"):
        raise ValueError(f"engine.generate: compile={compile!r}; expected False, True or 'cuda-graphs'")
    if not compile:
        def step(tok, pos):
            logits = decode_step(model, tok, pos, cache)
            cache.length += 1
            return logits
        return step
    fn = compiled_step(compile == "cuda-graphs")
    cache.kv.zero_()  # positions not written yet are attended to with weight 0: zeros, not garbage (0 * nan = nan)
    cache.unseen = torch.full(cache.kv.shape[4:5], float("-inf"), dtype=cache.kv.dtype, device=cache.kv.device)

    def step(tok, pos):
        torch.compiler.cudagraph_mark_step_begin()   # the previous step's outputs are used up (CUDA graphs only)
        logits, new = fn(model, tok, pos, cache)
        cache.kv[:, :, :, :, cache.length] = new     # the step's keys and values, then they are seen
        cache.unseen[cache.length] = 0
        cache.length += 1
        return logits
    return step


@torch.inference_mode()
def generate(model, prompts, max_new_tokens, temperature=1.0, top_k=None, top_p=None, eos_id=None, generator=None,
             num_samples=1, compile=False):
    """Sample continuations of a batch of prompts with a KV cache.

    prompts: list of B token-id lists (lengths may differ; each >= 1); results do not depend on the batch.
    num_samples: continuations per prompt; each prompt is prefilled once and its keys and values shared by its
    samples (rows b*num_samples .. b*num_samples+num_samples-1 of the output belong to prompt b).
    temperature 0 means greedy. top_k / top_p filter the distribution before sampling.
    Returns (tokens, logprobs), both (B*num_samples, N) with N <= max_new_tokens (decoding stops once every row is
    done): tokens is long, the sampled ids, with -1 after a row's eos_id (the eos itself is kept);
    logprobs is float32, each sampled token's log-prob under the sampling distribution (for greedy: under the
    model at T=1), 0 where tokens == -1.
    compile: False, the eager decode step; True, a decode step of the same shapes at every step (it attends to all
    max_new_tokens positions, masking those not written yet), compiled by torch.compile once per shape (rows,
    max_new_tokens, longest prompt), never per step: minutes of compilation on a shared 2-core CPU for ~10% more
    tokens/s (docs/performance.md); "cuda-graphs", the same also captured as CUDA graphs (torch.compile's
    mode="reduce-overhead"; GPU only, untested: no GPU was available). Compiled, finished rows are not dropped (they
    decode on, their outputs masked), so with eos_id a seeded run draws other tokens than the eager one once the eager
    one drops rows; without row dropping the results equal the eager ones up to float rounding (1e-5).
    """
    logits, lens, cache = prefill(model, prompts, max_new_tokens, num_samples)
    step = decoder(model, cache, compile)
    N, device = len(logits), logits.device
    tokens = torch.full((N, max_new_tokens), -1, dtype=torch.long, device=device)
    logprobs = torch.zeros(N, max_new_tokens, device=device)
    rows = torch.arange(N, device=device)       # the output rows still being decoded
    done = torch.zeros(N, dtype=torch.bool, device=device)
    for t in range(max_new_tokens):
        tok, lp = sample_next(logits.float(), temperature, top_k, top_p, generator)
        tokens[rows, t], logprobs[rows, t] = tok.masked_fill(done, -1), lp.masked_fill(done, 0.0)
        if eos_id is not None:
            done = done | (tok == eos_id)
        if t == max_new_tokens - 1 or (eos_id is not None and bool(done.all())):
            break
        if eos_id is not None and not compile and 4 * int(done.sum()) >= len(done):  # a quarter finished: drop them
            live = (~done).nonzero().squeeze(1)
            rows, lens, tok, done = rows[live], lens[live], tok[live], done[live]
            cache.keep(live)
        logits = step(tok, lens + t)
    return tokens[:, :t + 1], logprobs[:, :t + 1]


def sample_next(logits, temperature, top_k, top_p, generator):
    """logits (R, V) -> (token (R,), its log-prob (R,) under the distribution actually sampled from)."""
    if temperature == 0:
        tok = logits.argmax(-1)
        return tok, torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
    if temperature != 1:
        logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, -1)
        drop = probs.cumsum(-1) - probs >= top_p  # keep the smallest prefix reaching top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    logp = torch.log_softmax(logits, -1)
    # inverse-CDF sampling: one uniform per row instead of multinomial's one exponential per vocabulary entry; the
    # CDF summed in float64, and u kept below its total, so the first entry above u is a token of non-zero probability
    cdf = logp.exp().cumsum(-1, dtype=torch.float64)
    u = torch.rand(len(cdf), 1, generator=generator, dtype=torch.float64, device=logits.device)
    tok = torch.searchsorted(cdf, u * cdf[:, -1:] * (1 - 1e-9), right=True).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
