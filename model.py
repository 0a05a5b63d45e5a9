"""
One GPT for every task in nanoRLVR: a decoder-only transformer in two families.
- GPT-2: LayerNorm (with bias), learned absolute positions, GELU (tanh) MLP, biases everywhere,
  tied input and output embeddings;
- Llama / Qwen2: RMSNorm, rotary positions (RoPE), SwiGLU MLP, grouped-query attention
  (n_kv_head < n_head), optional q/k/v bias (Qwen2 has it, Llama does not), tied or untied output.
q, k and v share one Linear (`c_attn`), as do SwiGLU's gate and up (`c_fc`): fewer matmuls.
Read it top down: the config, the blocks bottom up, `GPT` with its plain `forward(idx, targets)`
and `generate`, `sample_next`, then the fast path: `forward(idx, prompts=)` runs each prompt once
for all the rows continuing it (the GRPO update); last the sampler's pieces (`prefill`, `KVCache`,
`decode_step`), which engine.py's loop and engine_static.py's static-shape path share.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


@dataclass
class GPTConfig:
    vocab_size: int = 1024
    block_size: int = 1024          # longest sequence (learned positions / RoPE table size)
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None    # < n_head: grouped-query attention; default n_head
    n_embd: int = 128
    head_dim: int | None = None     # default n_embd // n_head
    mlp_hidden: int | None = None   # default 4 * n_embd
    norm: str = "rmsnorm"           # "layernorm" | "rmsnorm"
    norm_eps: float = 1e-5
    pos: str = "rope"               # "learned" | "rope"
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # RoPE stretched to longer contexts, HF's {"rope_type": ...}
    mlp: str = "swiglu"             # "gelu" | "swiglu"
    bias: bool = False              # bias on every Linear and LayerNorm (GPT-2)
    qkv_bias: bool = False          # bias on q, k, v only (Qwen2)
    tie_embeddings: bool = True

    def __post_init__(self):
        assert self.norm in ("layernorm", "rmsnorm"), \
            f"norm must be layernorm|rmsnorm, got {self.norm!r}"
        assert self.pos in ("learned", "rope"), f"pos must be learned|rope, got {self.pos!r}"
        assert self.mlp in ("gelu", "swiglu"), f"mlp must be gelu|swiglu, got {self.mlp!r}"
        scaled = self.rope_scaling and self.rope_scaling.get("rope_type")
        assert scaled in (None, "linear", "llama3"), \
            f"rope_scaling's rope_type must be linear|llama3, got {self.rope_scaling!r}"
        self.n_kv_head = self.n_kv_head or self.n_head
        assert self.n_head % self.n_kv_head == 0, "n_head must be a multiple of n_kv_head"
        self.head_dim = self.head_dim or self.n_embd // self.n_head
        self.mlp_hidden = self.mlp_hidden or 4 * self.n_embd

    @staticmethod
    def gpt2(**kw):
        family = dict(norm="layernorm", pos="learned", mlp="gelu", bias=True, tie_embeddings=True)
        return GPTConfig(**{**family, **kw})

    @staticmethod
    def llama(**kw):
        return GPTConfig(**{**dict(norm="rmsnorm", pos="rope", mlp="swiglu", bias=False), **kw})


# -----------------------------------------------------------------------------
# building blocks, bottom up

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # x / RMS(x) in float32 as HF does (no mean subtracted), then a learned gain per channel
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def make_norm(config):
    if config.norm == "rmsnorm":
        return RMSNorm(config.n_embd, config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)


def rope_tables(head_dim, length, theta, scaling=None):
    """cos and sin (length, head_dim) of RoPE's angles: position x one frequency per dim pair."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if scaling is not None:
        inv_freq = scale_frequencies(inv_freq, scaling)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)  # (length, hd/2)
    angles = torch.cat([angles, angles], dim=-1)                               # (length, hd)
    return angles.cos(), angles.sin()


def scale_frequencies(inv_freq, s):
    """RoPE's frequencies stretched to a longer context, as HF computes them: "linear" slows all
    by s["factor"], "llama3" (Llama 3.1+) only the slow ones (wavelengths near the old context)."""
    if s["rope_type"] == "linear":
        return inv_freq / s["factor"]   # position p reads as p / factor
    old, lo, hi = s["original_max_position_embeddings"], s["low_freq_factor"], s["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    # 0: wavelength over old / lo, slowed by factor; 1: under old / hi, kept; in between: blended
    smooth = ((old / wavelen - lo) / (hi - lo)).clamp(0, 1)
    return (1 - smooth) * inv_freq / s["factor"] + smooth * inv_freq


def apply_rope(x, cos, sin):
    # x: (B, nh, T, hd); cos/sin: (B, 1, T, hd). HF's "rotate half" layout: pairs are (i, i + hd/2)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Causal self-attention; with grouped-query attention, n_head queries share n_kv_head keys."""
    def __init__(self, config):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.head_dim
        qkv_out = (config.n_head + 2 * config.n_kv_head) * config.head_dim
        self.c_attn = nn.Linear(config.n_embd, qkv_out, bias=config.bias or config.qkv_bias)
        self.c_proj = nn.Linear(config.n_head * config.head_dim, config.n_embd, bias=config.bias)

    def qkv(self, x, rope):
        """x (B, T, C) -> q (B, nh, T, hd), k and v (B, nkv, T, hd); rope None: no rotation."""
        B, T, _ = x.size()
        hd, nh, nkv = self.head_dim, self.n_head, self.n_kv_head
        q, k, v = self.c_attn(x).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        q = q.view(B, T, nh, hd).transpose(1, 2)                          # (B, nh, T, hd)
        k, v = (t.view(B, T, nkv, hd).transpose(1, 2) for t in (k, v))    # (B, nkv, T, hd)
        # RoPE: positions enter as rotations of q and k, so scores depend on distance only
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return q, k, v

    def attend(self, q, k, v, mask=None):
        """Each query's mix of the values -> (B, T, C). q (B, nh, T, hd); k, v (B, nkv, S, hd);
        mask None: causal (S = T), else (B, 1, T, S) added to the scores (0 or -inf)."""
        B, nh, T, hd = q.size()
        nkv = self.n_kv_head
        # grouped-query attention: each kv head serves nh // nkv query heads
        if nkv != nh:
            k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        y = y.transpose(1, 2).contiguous().view(B, T, nh * hd)  # the heads side by side
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.swiglu = config.mlp == "swiglu"
        fc_out = (2 if self.swiglu else 1) * config.mlp_hidden
        self.c_fc = nn.Linear(config.n_embd, fc_out, bias=config.bias)
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)

    def forward(self, x):
        h = self.c_fc(x)  # (B, T, hidden), or SwiGLU's gate and up side by side
        if self.swiglu:   # the gate decides how much of each up channel passes
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:             # GPT-2's "gelu_new"
            h = F.gelu(h, approximate="tanh")
        return self.c_proj(h)


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1, self.attn = make_norm(config), Attention(config)
        self.ln_2, self.mlp = make_norm(config), MLP(config)

    def forward(self, x, rope, mask=None, cache=None, layer=None, rows=None):
        """x (B, T, C) -> (B, T, C); with cache (a PromptCache, run_cached) the keys and values pass
        through it as `layer`'s, and mask (B, 1, T, P + T) is added to the scores."""
        # pre-norm residuals: tokens talk to each other, then each token thinks on its own
        q, k, v = self.attn.qkv(self.ln_1(x), rope)
        if cache is not None and rows is None:   # a prompt pass keeps its keys and values
            cache.k[layer], cache.v[layer] = k.contiguous(), v.contiguous()
        elif cache is not None:   # a continuation pass puts each row's prompt's first: P + T
            k = torch.cat([cache.k[layer][rows], k], dim=2)
            v = torch.cat([cache.v[layer][rows], v], dim=2)
        x = x + self.attn.attend(q, k, v, mask)
        return x + self.mlp(self.ln_2(x))


# -----------------------------------------------------------------------------
# the model

class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.pos == "learned" \
            else None
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = make_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # tied: one matrix reads tokens in and writes logits out
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        if config.pos == "rope":
            cos, sin = rope_tables(config.head_dim, config.block_size, config.rope_theta,
                                   config.rope_scaling)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.grad_ckpt = False   # activation checkpointing per block (run_block), a run's choice
        # GPT-2's init: N(0, 0.02) weights, zero biases, ...
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        # ... and the residual projections scaled down by the depth
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def num_params(self):
        """Parameters but the embeddings (scaling laws' convention: lookups, not compute)."""
        n = sum(p.numel() for p in self.parameters()) - self.wte.weight.numel()
        return n - (self.wpe.weight.numel() if self.wpe is not None else 0)

    def embed(self, idx, pos):
        """Token ids idx at positions pos (same shape) -> (embeddings, RoPE's cos, sin or None)."""
        x = self.wte(idx)
        # GPT-2: a learned vector per position, added once
        if self.wpe is not None:
            return x + self.wpe(pos), None
        # RoPE: cos and sin at each token's position, applied in every attention
        cos, sin = self.rope_cos[pos].unsqueeze(1), self.rope_sin[pos].unsqueeze(1)  # (B, 1, T, hd)
        return x, (cos.to(x.dtype), sin.to(x.dtype))

    def forward(self, idx, targets=None, prompts=None, at=None):
        """idx (N, T) -> logits (N, T, vocab); with targets (N, T) also the mean cross-entropy
        (targets -1 are ignored). prompts: forward_shared_prompts's, row n of idx continuing prompt
        rows[n]. at: None, or a bool (N, T): the logits (k, vocab) and loss of those positions."""
        if prompts is not None:   # the fast path (below)
            logits = forward_shared_prompts(self, idx, prompts, at)
        else:
            N, T = idx.size()
            assert T <= self.config.block_size, \
                f"sequence of {T} tokens > block_size {self.config.block_size}"
            pos = torch.arange(T, device=idx.device).expand(N, T)
            x, rope = self.embed(idx, pos)            # (N, T, C)
            for block in self.h:
                x = self.run_block(block, x, rope)
            if at is not None:
                x = x[at]                             # (k, C)
            logits = self.lm_head(self.ln_f(x))       # (N, T, vocab) or (k, vocab)
        loss = None
        if targets is not None:   # float32 cross-entropy even under autocast
            targets = targets if at is None else targets[at]
            flat = logits.float().view(-1, logits.size(-1))
            loss = F.cross_entropy(flat, targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def run_block(self, fn, *inputs):
        """fn(*inputs), a block's forward; grad_ckpt: its activations recomputed in the backward."""
        if self.grad_ckpt and self.training and torch.is_grad_enabled():
            return checkpoint(fn, *inputs, use_reentrant=False)
        return fn(*inputs)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, eos_id=None,
                 generator=None):
        """Continue idx (B, T) by <= max_new_tokens tokens, until all drew eos_id -> (B, T + n)."""
        T = idx.size(1)
        for _ in range(max_new_tokens):
            # the model sees at most block_size tokens: crop the oldest ones
            logits, _ = self(idx[:, -self.config.block_size:])
            # only the last position predicts the next token
            tok, _ = sample_next(logits[:, -1].float(), temperature, top_k, top_p, generator)
            idx = torch.cat([idx, tok[:, None]], dim=1)
            if eos_id is not None and bool((idx[:, T:] == eos_id).any(1).all()):
                break
        return idx


def is_fsdp(model):
    """Sharded by FSDP (runtime.Run.wrap, --fsdp=1): each rank holds shards of the weights."""
    return hasattr(model, "unshard")


def finite_weights(model):
    """The weights this rank holds are finite (FSDP: its shards, no collective: one rank alone)."""
    return bool(torch.stack([torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()
                             for p in model.parameters()]).all())


def sample_next(logits, temperature, top_k, top_p, generator, u=None):
    """logits (R, V) -> (token (R,), its log-prob (R,) under the distribution sampled from).
    temperature 0: greedy (the log-prob is the model's at T=1); top_k, top_p: None or the filter.
    u: None (drawn here from generator), or the float64 uniforms (R, 1), drawn ahead as here."""
    if temperature == 0:
        tok = logits.argmax(-1)
        return tok, torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
    if temperature != 1:
        logits = logits / temperature
    # top-k: keep the k largest logits
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    # top-p: keep the smallest prefix of the sorted distribution reaching top_p
    if top_p is not None:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, -1)
        drop = probs.cumsum(-1) - probs >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    logp = torch.log_softmax(logits, -1)
    # inverse-CDF sampling: one uniform per row. The CDF is summed in float64 and u kept below its
    # total, so the first entry above u has non-zero probability. u is drawn where the generator
    # lives (a CPU generator cannot draw on a GPU), then moved: the same stream on every device.
    cdf = logp.exp().cumsum(-1, dtype=torch.float64)
    if u is None:
        where = generator.device if generator is not None else logits.device
        u = torch.rand(len(cdf), 1, generator=generator, dtype=torch.float64, device=where)
        u = u.to(logits.device)
    tok = torch.searchsorted(cdf, u * cdf[:, -1:] * (1 - 1e-9), right=True).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


# =============================================================================
# the fast path: prompts run once, their keys and values kept for the rows that continue them
# (GPT.forward(prompts=) in the GRPO update, the sampler's prefill below)
ROW_PASSES = 4   # forward(prompts=, at=): the rows by length in 4 passes, less padding


class PromptCache:
    """Keys and values of a batch of prompts, k[layer] and v[layer] (B, n_kv_head, P, head_dim),
    kept by a prompt pass (`rows` None); then `rows` (N,): row n continues prompt rows[n]."""
    def __init__(self, n_layer):
        self.k, self.v, self.rows = [None] * n_layer, [None] * n_layer, None


def additive(allowed, dtype):
    """A bool mask (True = may attend) as the float mask added to attention scores: 0 or -inf."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, float("-inf"))


def run_cached(model, idx, pos, mask, cache, last=False, at=None):
    """GPT.forward's layers on idx (B, T) at positions pos (B, T), keys and values passed through
    cache (a PromptCache); mask: None (causal) or added to the scores; last: the last position's."""
    x, rope = model.embed(idx, pos)
    for layer, block in enumerate(model.h):
        # rows passed as they are now: a checkpointed block recomputes the same pass
        x = model.run_block(block, x, rope, mask, cache, layer, cache.rows)
    if last:
        x = x[:, -1:]
    if at is not None:
        x = x[at]
    return model.lm_head(model.ln_f(x))


def forward_shared_prompts(model, idx, prompts, at=None):
    """GPT.forward(idx, prompts=(prompt_idx (B, L) right-padded, prompt_len (B,), rows (N,))): each
    prompt runs once, however many rows continue it, then the N rows with its keys and values; with
    `at`, in ROW_PASSES passes of rows of like length, each cut to its longest."""
    prompt_idx, prompt_len, rows = prompts
    (B, L), (N, T), device = prompt_idx.size(), idx.size(), idx.device
    assert L + T <= model.config.block_size, \
        f"prompt {L} + {T} tokens > block_size {model.config.block_size}"
    # the prompt pass fills the cache, causally (the right padding comes after the real tokens)
    cache = PromptCache(model.config.n_layer)
    prompt_pos = torch.arange(L, device=device).expand(B, L)
    run_cached(model, prompt_idx, prompt_pos, None, cache, last=True)
    # passes of rows of like length (to a row's last position with a target; no `at`: T), one if
    # all have one length (nothing to cut) or under FSDP (the same passes on every rank)
    length = idx.new_full((N,), T) if at is None else \
        (at * torch.arange(1, T + 1, device=device)).amax(1)
    order, out = length.argsort(stable=True), []
    one = bool((length == length[0]).all()) or is_fsdp(model)
    for sel in order.tensor_split(1 if one else min(N, ROW_PASSES)):
        t, cache.rows = max(int(length[sel].max()), 1), rows[sel]   # cut to the pass's longest
        # row n attends to prompt rows[n]'s real tokens, then causally to its own
        causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
        seen = torch.arange(L, device=device) < prompt_len[cache.rows].unsqueeze(1)   # (n, L)
        allowed = torch.cat([seen.unsqueeze(1).expand(-1, t, L), causal.expand(len(sel), t, t)], 2)
        mask = additive(allowed.unsqueeze(1), model.wte.weight.dtype)          # (n, 1, t, L + t)
        # a row's tokens go on from its prompt's length
        pos = prompt_len[cache.rows].unsqueeze(1) + torch.arange(t, device=device)     # (n, t)
        out.append(run_cached(model, idx[sel, :t], pos, mask, cache,
                              at=None if at is None else at[sel, :t]))
    # back in the rows' order (a stable sort keeps each row's positions in order)
    owner = order if at is None else order.repeat_interleave(at[order].sum(1))
    return torch.cat(out)[owner.argsort(stable=True)]


# =============================================================================
# the sampler's pieces, shared by engine.py's loop and engine_static.py's static-shape path

class KVCache:
    """What the decode steps attend to, for R decoding rows, each sample s of one of B prompts
    (at first all N = B * S, row b * S + s). The prompts' part, kept once per prompt:
      prompt_k[layer], prompt_v[layer]  (B * nkv, P, hd)     one matrix per (prompt, kv head)
      prompt_mask                       (B * nkv, S * g, P)  -inf at the prompts' left padding
    The generated part, one entry per decoding row, written in place:
      kv    (n_layer, 2, R, nkv, max_new, hd)  keys [:, 0], values [:, 1]; `length` written
      live  (R,) the grid rows still decoding, in order (all N until rows finish)"""
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
        samples): to_prompt gives a finished row's place any row (its results are dropped)."""
        self.to_prompt = self.to_row = None
        if self.S == 1:   # one sample a prompt: the two orders are one (None: no index_select)
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
