"""
One GPT for every task in nanoRLVR, a decoder-only transformer in two families:
- GPT-2: LayerNorm (with bias), learned absolute positions, GELU (tanh) MLP, biases everywhere, tied embeddings;
- Llama / Qwen2: RMSNorm, rotary positions (RoPE), SwiGLU MLP, grouped-query attention (n_kv_head < n_head), optional
  q/k/v bias (Qwen2 has it, Llama does not), tied or untied output embedding.
q, k and v share one Linear (`c_attn`), SwiGLU's gate and up one (`c_fc`): fewer matmuls, which matters on small CPUs
(`from_pretrained` concatenates HF's separate tensors). Training batches are right-padded, so they need no attention
mask. The GRPO update runs each prompt once for all the samples that continue it (`forward(prompts=)`), with the same
logits as the concatenated sequences: most of a text-game sequence is its prompt. Sampling (KV cache, `generate`)
lives in engine.py, as nanochat keeps its engine apart from its model; this file is the training path.
"""
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


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
    mlp: str = "swiglu"             # "gelu" | "swiglu"
    bias: bool = False              # bias on every Linear and LayerNorm (GPT-2)
    qkv_bias: bool = False          # bias on q, k, v only (Qwen2)
    tie_embeddings: bool = True

    def __post_init__(self):
        assert self.norm in ("layernorm", "rmsnorm"), f"norm must be layernorm|rmsnorm, got {self.norm!r}"
        assert self.pos in ("learned", "rope"), f"pos must be learned|rope, got {self.pos!r}"
        assert self.mlp in ("gelu", "swiglu"), f"mlp must be gelu|swiglu, got {self.mlp!r}"
        self.n_kv_head = self.n_kv_head or self.n_head
        assert self.n_head % self.n_kv_head == 0, "n_head must be a multiple of n_kv_head"
        self.head_dim = self.head_dim or self.n_embd // self.n_head
        self.mlp_hidden = self.mlp_hidden or 4 * self.n_embd

    @staticmethod
    def gpt2(**kw):
        return GPTConfig(**{**dict(norm="layernorm", pos="learned", mlp="gelu", bias=True, tie_embeddings=True), **kw})

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
        xf = x.float()                                                       # normalise in float32, as HF does
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)  # x / RMS(x): no mean subtracted
        return self.weight * xf.to(x.dtype)                                  # a learned gain per channel


def make_norm(config):
    if config.norm == "rmsnorm":
        return RMSNorm(config.n_embd, config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)


def rope_tables(head_dim, length, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))  # one per pair
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)  # (length, head_dim/2)
    angles = torch.cat([angles, angles], dim=-1)                                 # (length, head_dim)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    # x: (B, nh, T, hd); cos/sin: (B, 1, T, hd). HF's "rotate half" layout: pairs are (i, i + hd/2).
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        qkv_out = (config.n_head + 2 * config.n_kv_head) * config.head_dim
        self.c_attn = nn.Linear(config.n_embd, qkv_out, bias=config.bias or config.qkv_bias)
        self.c_proj = nn.Linear(config.n_head * config.head_dim, config.n_embd, bias=config.bias)

    def forward(self, x, rope, mask, cache, layer):
        B, T, _ = x.size()
        hd, nh, nkv = self.head_dim, self.n_head, self.n_kv_head
        q, k, v = self.c_attn(x).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        q = q.view(B, T, nh, hd).transpose(1, 2)    # (B, nh, T, hd)
        k, v = (t.view(B, T, nkv, hd).transpose(1, 2) for t in (k, v))   # (B, nkv, T, hd) each
        if rope is not None:   # positions enter as rotations of q and k, so scores depend on distance
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None and cache.rows is None:  # a prompt pass: keep its keys and values for what follows
            cache.k[layer], cache.v[layer] = k.contiguous(), v.contiguous()
        elif cache is not None:  # rows continuing the prompts cache.rows: their prompt's keys and values come first
            k = torch.cat([cache.k[layer][cache.rows], k], dim=2)  # (B, nkv, Lp + T, hd)
            v = torch.cat([cache.v[layer][cache.rows], v], dim=2)
        if nkv != nh:   # grouped-query attention: each kv head serves nh // nkv query heads
            k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)  # (B, nh, T_all, hd)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)  # (B, nh, T, hd)
        y = y.transpose(1, 2).contiguous().view(B, T, nh * hd)  # (B, T, nh*hd)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.swiglu = config.mlp == "swiglu"
        self.c_fc = nn.Linear(config.n_embd, (2 if self.swiglu else 1) * config.mlp_hidden, bias=config.bias)
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)

    def forward(self, x):
        h = self.c_fc(x)                   # (B, T, hidden), or gate and up side by side for SwiGLU
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up          # the gate decides how much of each up channel passes
        else:
            h = F.gelu(h, approximate="tanh")  # GPT-2's "gelu_new"
        return self.c_proj(h)


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1, self.attn = make_norm(config), Attention(config)
        self.ln_2, self.mlp = make_norm(config), MLP(config)

    def forward(self, x, rope, mask, cache, layer):
        x = x + self.attn(self.ln_1(x), rope, mask, cache, layer)   # pre-norm residual: tokens talk to each other
        return x + self.mlp(self.ln_2(x))                           # ... then each token thinks on its own


def additive(allowed, dtype):
    """A bool mask (True = may attend) as the float mask the attention adds to its scores: 0 or -inf."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


class PromptCache:
    """Keys and values of a batch of prompts, (B, n_kv_head, P, head_dim) per layer, kept by a prompt pass (`rows`
    None) so that other rows can continue the prompts without running them again: `forward(prompts=)` sets `rows`
    (N,) long, row n continuing prompt rows[n]; engine.py's sampler attends to them from its decode step."""

    def __init__(self, n_layer):
        self.k, self.v, self.rows = [None] * n_layer, [None] * n_layer, None


# -----------------------------------------------------------------------------
# the model

class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.pos == "learned" else None
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = make_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:   # one matrix reads tokens in and writes logits out
            self.lm_head.weight = self.wte.weight
        if config.pos == "rope":
            cos, sin = rope_tables(config.head_dim, config.block_size, config.rope_theta)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):   # GPT-2's N(0, 0.02) weights, zero biases
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding=True):
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:   # the convention of scaling laws: embeddings are lookups, not compute
            n -= self.wte.weight.numel() + (self.wpe.weight.numel() if self.wpe is not None else 0)
        return n

    def flops_per_token(self, T):
        """Training FLOPs per token (forward + backward) at sequence length T, as in the PaLM paper's appendix B."""
        c = self.config
        return 6 * self.num_params(non_embedding=True) + 6 * c.vocab_size * c.n_embd + 12 * c.n_layer * c.n_head * c.head_dim * T

    def _run(self, idx, pos, mask=None, cache=None, last=False):
        # idx, pos: (B, T) long; mask: None (causal) or (B, 1, T, T_all) float, added to the attention scores (0 where
        # a query may attend, -inf where not); cache: an empty PromptCache to run prompts into, or a filled one with
        # rows set to continue them; last: logits of the last position only (B, 1, vocab)
        x = self.wte(idx)                                    # (B, T, C)
        rope = None
        if self.wpe is not None:   # GPT-2: a learned vector per position, added once
            x = x + self.wpe(pos)
        else:                      # RoPE: cos / sin at each token's position, applied in every attention
            rope = (self.rope_cos[pos].unsqueeze(1).to(x.dtype), self.rope_sin[pos].unsqueeze(1).to(x.dtype))  # (B, 1, T, hd)
        for i, block in enumerate(self.h):
            x = block(x, rope, mask, cache, i)
        if last:   # prefill only needs the next token's logits
            x = x[:, -1:]
        return self.lm_head(self.ln_f(x))                    # (B, T, vocab)

    def forward(self, idx, targets=None, prompts=None):
        """idx (N, T) -> logits (N, T, vocab); with targets (N, T) also the mean cross-entropy (targets -1 ignored).

        prompts: None, or (prompt_idx (B, L) right-padded, prompt_len (B,), rows (N,)): row n of idx continues prompt
        rows[n] (its first prompt_len tokens), so idx holds only the continuations. Each prompt is run once however many
        rows continue it (GRPO's G samples of a prompt), and the logits equal those of the concatenated sequences."""
        (N, T), device = idx.size(), idx.device
        if prompts is None:
            assert T <= self.config.block_size, f"sequence of {T} tokens > block_size {self.config.block_size}"
            logits = self._run(idx, torch.arange(T, device=device).expand(N, T))
        else:
            prompt_idx, prompt_len, rows = prompts
            B, L = prompt_idx.size()
            assert L + T <= self.config.block_size, f"prompt {L} + {T} tokens > block_size {self.config.block_size}"
            cache = PromptCache(self.config.n_layer)   # the prompts' keys and values, once per prompt
            self._run(prompt_idx, torch.arange(L, device=device).expand(B, L), None, cache, last=True)  # fills cache
            cache.rows = rows   # row n attends to prompt rows[n]'s real tokens, then causally to its own
            causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
            seen = torch.arange(L, device=device) < prompt_len[rows].unsqueeze(1)          # (N, L) real prompt keys
            allowed = torch.cat([seen.unsqueeze(1).expand(N, T, L), causal.expand(N, T, T)], dim=2)  # (N, T, L + T)
            pos = prompt_len[rows].unsqueeze(1) + torch.arange(T, device=device)           # (N, T)
            logits = self._run(idx, pos, additive(allowed.unsqueeze(1), self.wte.weight.dtype), cache)
        loss = None
        if targets is not None:   # float32 cross-entropy even under autocast; -1 marks tokens nobody scores
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    @classmethod
    def from_pretrained(cls, path, dtype=torch.float32):
        """An HF GPT-2 / Qwen2 / Llama directory -> GPT (the loader is this file's last section)."""
        return load_pretrained(path, dtype)


# =============================================================================
# loading pretrained HF-format weights (GPT2LMHeadModel, Qwen2ForCausalLM, LlamaForCausalLM): not on the training path

def load_pretrained(path, dtype=torch.float32):
    """An HF model directory (config.json + safetensors, sharded or not) -> GPT in `dtype`; ValueError naming the
    file on anything we cannot read or map."""
    from safetensors.torch import load_file
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"{cfg_file}: missing (expected an HF model directory with config.json + safetensors)")
    hf = json.loads(cfg_file.read_text())
    config = config_from_hf(hf, cfg_file)
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    sd = {}
    for f in files:
        try:
            sd.update(load_file(str(path / f)))
        except Exception as e:
            raise ValueError(f"{path / f}: cannot read safetensors weights ({e})") from None
    model = GPT(config)
    try:
        mapped = hf_to_ours(sd, config, hf["model_type"])
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    ours = model.state_dict()
    if config.tie_embeddings:
        ours.pop("lm_head.weight")
    missing, unused = sorted(set(ours) - set(mapped)), sorted(set(mapped) - set(ours))
    if missing or unused:
        raise ValueError(f"{path}: missing tensors {missing[:5]}, unused tensors {unused[:5]}")
    for k, v in mapped.items():
        if v.shape != ours[k].shape:
            raise ValueError(f"{path}: tensor {k} has shape {tuple(v.shape)}, expected {tuple(ours[k].shape)}")
    model.load_state_dict(mapped, strict=not config.tie_embeddings)
    return model.to(dtype)


def config_from_hf(hf, where):
    kind = hf.get("model_type")
    if kind == "gpt2":
        act = hf.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"{where}: activation_function {act!r} unsupported (GPT-2 uses gelu_new)")
        return GPTConfig.gpt2(vocab_size=hf["vocab_size"], block_size=hf["n_positions"], n_layer=hf["n_layer"],
                              n_head=hf["n_head"], n_kv_head=hf["n_head"], n_embd=hf["n_embd"],
                              mlp_hidden=hf.get("n_inner") or 4 * hf["n_embd"], norm_eps=hf["layer_norm_epsilon"])
    if kind in ("qwen2", "llama"):
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{where}: hidden_act {hf['hidden_act']!r} unsupported (expected silu)")
        if hf.get("use_sliding_window") or hf.get("mlp_bias") or (hf.get("rope_scaling") or {}).get("rope_type", "default") != "default":
            raise ValueError(f"{where}: sliding window, mlp_bias and rope scaling are not supported")
        theta = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return GPTConfig.llama(vocab_size=hf["vocab_size"], block_size=hf["max_position_embeddings"],
                               n_layer=hf["num_hidden_layers"], n_head=hf["num_attention_heads"],
                               n_kv_head=hf.get("num_key_value_heads") or hf["num_attention_heads"],
                               n_embd=hf["hidden_size"], head_dim=hf.get("head_dim"), mlp_hidden=hf["intermediate_size"],
                               norm_eps=hf["rms_norm_eps"], rope_theta=float(theta),
                               qkv_bias=kind == "qwen2" or bool(hf.get("attention_bias")),
                               tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
    raise ValueError(f"{where}: model_type {kind!r} unsupported (gpt2, qwen2, llama)")


def hf_to_ours(sd, config, kind):
    """Rename HF tensors to ours, explicitly. GPT-2's Conv1D stores (in, out): transposed here."""
    if kind == "gpt2":  # names with or without the "transformer." prefix; attn.bias buffers are causal masks
        sd = {k.removeprefix("transformer."): v for k, v in sd.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    out = {}

    def take(k):
        if k not in sd:
            raise ValueError(f"missing tensor {k!r}")
        return sd.pop(k)

    if kind == "gpt2":
        out["wte.weight"], out["wpe.weight"] = take("wte.weight"), take("wpe.weight")
        for i in range(config.n_layer):
            p = f"h.{i}."
            for ln in ("ln_1", "ln_2"):
                out[p + ln + ".weight"], out[p + ln + ".bias"] = take(p + ln + ".weight"), take(p + ln + ".bias")
            for hf_name, ours in (("attn.c_attn", "attn.c_attn"), ("attn.c_proj", "attn.c_proj"),
                                  ("mlp.c_fc", "mlp.c_fc"), ("mlp.c_proj", "mlp.c_proj")):
                out[p + ours + ".weight"] = take(p + hf_name + ".weight").t().contiguous()
                out[p + ours + ".bias"] = take(p + hf_name + ".bias")
        out["ln_f.weight"], out["ln_f.bias"] = take("ln_f.weight"), take("ln_f.bias")
        sd.pop("lm_head.weight", None)  # tied to wte
    else:
        out["wte.weight"] = take("model.embed_tokens.weight")
        for i in range(config.n_layer):
            p, q = f"model.layers.{i}.", f"h.{i}."
            out[q + "ln_1.weight"] = take(p + "input_layernorm.weight")
            out[q + "ln_2.weight"] = take(p + "post_attention_layernorm.weight")
            out[q + "attn.c_attn.weight"] = torch.cat([take(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
            if config.qkv_bias:
                out[q + "attn.c_attn.bias"] = torch.cat([take(p + f"self_attn.{x}_proj.bias") for x in "qkv"])
            out[q + "attn.c_proj.weight"] = take(p + "self_attn.o_proj.weight")
            out[q + "mlp.c_fc.weight"] = torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")])
            out[q + "mlp.c_proj.weight"] = take(p + "mlp.down_proj.weight")
        out["ln_f.weight"] = take("model.norm.weight")
        if config.tie_embeddings:
            sd.pop("lm_head.weight", None)
        else:
            out["lm_head.weight"] = take("lm_head.weight")
    for k in sd:  # anything left over is a tensor we do not understand
        out["unused:" + k] = sd[k]
    return out
