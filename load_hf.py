"""
HF checkpoints -> ours: an HF model directory (GPT2LMHeadModel, Qwen2ForCausalLM,
LlamaForCausalLM; config.json + safetensors, sharded or not) loaded into model.py's GPT, and its
byte-level BPE tokenizer.json into tokenizer_text.py's Tokenizer, apart from the training path.

The model. `load_pretrained` reads the config (`config_from_hf`: HF's names -> GPTConfig) and the
tensors, and `hf_to_ours` renames them to ours, explicitly: GPT-2's Conv1D weights are transposed,
and Qwen2 / Llama's separate q, k, v (and SwiGLU's gate and up) are concatenated into our fused
Linears. The model is built on the meta device and the tensors are read one at a time, onto the
device and into the dtype they are kept in: no full float32 copy on the host. Llama 3.1's
RoPE scaling (and "linear") becomes GPTConfig.rope_scaling. `GPT.from_pretrained(path)` calls it;
tools/export_hf.py writes the other way.

The tokenizer and the bytes<->unicode mapping. HF `tokenizers` (GPT-2, Qwen2, ...) store the
vocabulary as JSON strings, and raw bytes such as 0x0A or 0xE4 are not printable. GPT-2 therefore
maps each byte to one printable unicode character: printable Latin-1 bytes map to themselves, the
other 68 bytes to chr(256), chr(257), ... in byte order. A space (0x20) becomes "Ġ", a newline "Ċ".
`load_hf_tokenizer` inverts this mapping to recover each token's bytes and builds tiktoken's
`mergeable_ranks` {token bytes: id}. That only reproduces HF when ids grow in merge order (true for
GPT-2, Qwen2 and anything BpeTrainer writes), so it is checked, not assumed; the tests compare ids
with HF on varied text. `load_tokenizer` reads a checkpoint's tokenizer in either format: an HF
tokenizer.json or our .tiktoken file.
"""
import json
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import tiktoken
import torch

from model import GPT, GPTConfig, rope_tables
from tokenizer_text import EOT, GPT2_PAT, Tokenizer, check_bytes

# =============================================================================
# the model

def load_pretrained(path, dtype=torch.float32, device="cpu"):
    """An HF model directory (config.json + safetensors, sharded or not) -> GPT in `dtype` on
    `device`; ValueError naming the file on anything we cannot read or map. Each tensor is read
    alone, straight to `device` in `dtype`: no full float32 copy of the model on the host."""
    from safetensors import safe_open
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"{cfg_file}: missing (expected an HF model directory with config.json + "
                         f"safetensors)")
    hf = json.loads(cfg_file.read_text())
    config = config_from_hf(hf, cfg_file)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    # the model's shapes without memory: its weights are the tensors read below
    with torch.device("meta"):
        model = GPT(config)
    with ExitStack() as stack:
        # each HF name -> its reader, which hf_to_ours calls when it takes that tensor
        sd = {}
        for f in files:
            try:
                st = stack.enter_context(safe_open(str(path / f), "pt", device=str(device)))
            except Exception as e:
                raise ValueError(f"{path / f}: cannot read safetensors weights ({e})") from None
            sd.update({k: partial(read_as, st, k, dtype, path / f) for k in st.keys()})
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
            raise ValueError(f"{path}: tensor {k} has shape {tuple(v.shape)}, "
                             f"expected {tuple(ours[k].shape)}")
    # the read tensors become the parameters, uncopied
    model.load_state_dict(mapped, strict=not config.tie_embeddings, assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.wte.weight   # assign replaced wte's parameter: tie them again
    if config.pos == "rope":
        # the RoPE tables are not in the files: computed again, off the meta device
        tables = rope_tables(config.head_dim, config.block_size, config.rope_theta,
                             config.rope_scaling)
        model.rope_cos, model.rope_sin = (t.to(device, dtype) for t in tables)
    return model


def read_as(st, name, dtype, file):
    """Tensor `name` of `file`, open as `st`, in `dtype` on the device it was opened for."""
    try:
        t = st.get_tensor(name)
    except Exception as e:
        raise ValueError(f"{file.name}: cannot read tensor {name!r} ({e})") from None
    return t.to(dtype)


def config_from_hf(hf, where):
    kind = hf.get("model_type")
    if kind == "gpt2":
        act = hf.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"{where}: activation_function {act!r} unsupported "
                             f"(GPT-2 uses gelu_new)")
        return GPTConfig.gpt2(vocab_size=hf["vocab_size"], block_size=hf["n_positions"],
                              n_layer=hf["n_layer"], n_head=hf["n_head"], n_kv_head=hf["n_head"],
                              n_embd=hf["n_embd"], mlp_hidden=hf.get("n_inner") or 4 * hf["n_embd"],
                              norm_eps=hf["layer_norm_epsilon"])
    if kind in ("qwen2", "llama"):
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{where}: hidden_act {hf['hidden_act']!r} unsupported "
                             f"(expected silu)")
        if hf.get("use_sliding_window") or hf.get("mlp_bias"):
            raise ValueError(f"{where}: sliding window and mlp_bias are not supported")
        theta = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return GPTConfig.llama(vocab_size=hf["vocab_size"],
                               block_size=hf["max_position_embeddings"],
                               n_layer=hf["num_hidden_layers"], n_head=hf["num_attention_heads"],
                               n_kv_head=hf.get("num_key_value_heads") or hf["num_attention_heads"],
                               n_embd=hf["hidden_size"], head_dim=hf.get("head_dim"),
                               mlp_hidden=hf["intermediate_size"], norm_eps=hf["rms_norm_eps"],
                               rope_theta=float(theta), rope_scaling=rope_scaling(hf, where),
                               qkv_bias=kind == "qwen2" or bool(hf.get("attention_bias")),
                               tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
    raise ValueError(f"{where}: model_type {kind!r} unsupported (gpt2, qwen2, llama)")


def rope_scaling(hf, where):
    """HF's RoPE scaling -> GPTConfig.rope_scaling: None, or the parameters of "linear" or
    "llama3" (Llama 3.1+); refused if another kind."""
    # "rope_scaling" in transformers 4 (older files say "type"), "rope_parameters" in 5
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    keys = dict(default=(), linear=("factor",),
                llama3=("factor", "low_freq_factor", "high_freq_factor"))
    if kind not in keys:
        raise ValueError(f"{where}: rope scaling {kind!r} unsupported (default, linear, llama3)")
    if kind == "default":
        return None
    try:
        out = {"rope_type": kind, **{k: float(rope[k]) for k in keys[kind]}}
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{where}: rope scaling {kind!r} needs numbers {keys[kind]}") from None
    if kind == "llama3":
        # the context the model was pretrained on, before scaling
        original = rope.get("original_max_position_embeddings", hf["max_position_embeddings"])
        out["original_max_position_embeddings"] = int(original)
    return out


def hf_to_ours(sd, config, kind):
    """Rename HF tensors to ours, explicitly. GPT-2's Conv1D stores (in, out): transposed here.
    sd: HF name -> a function reading that tensor; out: our name -> tensor (an unknown HF tensor
    appears as "unused:<name>", unread)."""
    # GPT-2: names with or without the "transformer." prefix; attn.bias buffers are causal masks
    if kind == "gpt2":
        sd = {k.removeprefix("transformer."): v for k, v in sd.items()
              if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    out = {}

    def take(k):
        if k not in sd:
            raise ValueError(f"missing tensor {k!r}")
        return sd.pop(k)()   # read now, one tensor at a time

    if kind == "gpt2":
        out["wte.weight"], out["wpe.weight"] = take("wte.weight"), take("wpe.weight")
        for i in range(config.n_layer):
            p = f"h.{i}."
            for ln in ("ln_1", "ln_2"):
                out[p + ln + ".weight"] = take(p + ln + ".weight")
                out[p + ln + ".bias"] = take(p + ln + ".bias")
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
            qkv = [take(p + f"self_attn.{x}_proj.weight") for x in "qkv"]
            out[q + "attn.c_attn.weight"] = torch.cat(qkv)
            if config.qkv_bias:
                qkv = [take(p + f"self_attn.{x}_proj.bias") for x in "qkv"]
                out[q + "attn.c_attn.bias"] = torch.cat(qkv)
            out[q + "attn.c_proj.weight"] = take(p + "self_attn.o_proj.weight")
            gate_up = [take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]
            out[q + "mlp.c_fc.weight"] = torch.cat(gate_up)
            out[q + "mlp.c_proj.weight"] = take(p + "mlp.down_proj.weight")
        out["ln_f.weight"] = take("model.norm.weight")
        if config.tie_embeddings:
            sd.pop("lm_head.weight", None)
        else:
            out["lm_head.weight"] = take("lm_head.weight")
    # anything left over is a tensor we do not understand
    for k in sd:
        out["unused:" + k] = sd[k]
    return out


# =============================================================================
# the tokenizer

def bytes_to_unicode():
    """GPT-2's byte -> printable character table (see module docstring)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def load_hf_tokenizer(path):
    """Load a byte-level BPE tokenizer.json (a HF directory holding it, or the file itself) as a
    Tokenizer. All added tokens become tiktoken specials; HF's post-processor is ignored (encode()
    never adds BOS/EOS)."""
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    try:
        spec = json.loads(file.read_text(encoding="utf-8"))
        model = spec["model"]
        if not isinstance(model, dict) or not isinstance(model["vocab"], dict):
            raise TypeError("'model' and 'model.vocab' must be JSON objects")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read HF tokenizer {file}: {e!r}") from e

    def unsupported(why):
        return ValueError(f"{file}: unsupported tokenizer ({why}); "
                          f"only byte-level BPE (GPT-2, Qwen2) is")

    if model.get("type") != "BPE":
        raise unsupported(f"model type {model.get('type')!r}")
    if model.get("dropout") or model.get("byte_fallback") \
            or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise unsupported("BPE dropout, byte fallback or subword prefix/suffix")
    normalizer = spec.get("normalizer")
    if normalizer not in (None, {"type": "NFC"}):
        raise unsupported(f"normalizer {normalizer.get('type')!r}")
    pat_str = _hf_pattern(spec.get("pre_tokenizer"), unsupported)

    byte_of = {c: b for b, c in bytes_to_unicode().items()}

    def to_bytes(token):
        try:
            return bytes(byte_of[c] for c in token)
        except KeyError:
            raise unsupported(f"token {token!r} is not in the byte-level alphabet") from None

    specials = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    special_ids = set(specials.values())
    # Added tokens can also sit in the vocab (GPT-2's <|endoftext|>); they stay specials only.
    ranks = {to_bytes(tok): i for tok, i in model["vocab"].items() if i not in special_ids}
    check_bytes(ranks, file)
    # tiktoken merges by rank == id, HF by position in `merges`: they agree when ids grow in merge
    # order. Each token above the bytes is made by one merge or, as tools/export_hf.py writes, by
    # several listed side by side.
    merges = [m.split(" ") if isinstance(m, str) else m for m in model.get("merges", [])]
    merged_ids = [ranks.get(to_bytes(a) + to_bytes(b), -1) for a, b in merges]
    if -1 in merged_ids or len(set(merged_ids)) != len(ranks) - 256 \
            or any(x > y for x, y in zip(merged_ids, merged_ids[1:])):
        raise unsupported("vocab ids do not follow the merge order, which tiktoken needs")

    eos = EOT
    config = file.parent / "tokenizer_config.json"
    if config.is_file():
        try:
            eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token") or EOT
        except (OSError, ValueError, AttributeError) as e:
            raise ValueError(f"cannot read {config}: {e!r}") from e
        if isinstance(eos, dict):  # older configs store an AddedToken dict
            eos = eos.get("content")
    if eos not in specials:
        raise ValueError(f"{file}: eos token {eos!r} is not among the added tokens "
                         f"{sorted(specials)}")
    enc = tiktoken.Encoding(f"hf:{file.parent.name}", pat_str=pat_str, mergeable_ranks=ranks,
                            special_tokens=specials)
    return Tokenizer(enc, specials[eos], nfc=normalizer is not None)


def _hf_pattern(pre, unsupported):
    """The split regex of a byte-level pre-tokenizer: ByteLevel(use_regex=True) as GPT-2 has, or
    Sequence[Split(Regex, Isolated), ByteLevel(use_regex=False)] as Qwen2 has."""
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre]
    types = [s and s.get("type") for s in steps]
    if any(s and s.get("type") == "ByteLevel" and s.get("add_prefix_space") for s in steps):
        raise unsupported("ByteLevel add_prefix_space=True")
    if types == ["ByteLevel"] and steps[0].get("use_regex", True):
        return GPT2_PAT
    if types == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        split = steps[0]
        if "Regex" in split.get("pattern", {}) and split.get("behavior") == "Isolated" \
                and not split.get("invert"):
            return split["pattern"]["Regex"]
    raise unsupported(f"pre-tokenizer {types}")


def load_tokenizer(path):
    """A HF directory with tokenizer.json or a tokenizer.json -> load_hf_tokenizer; a .tiktoken
    file -> Tokenizer.from_tiktoken_file."""
    p = Path(path)
    if (p.is_dir() and (p / "tokenizer.json").is_file()) or p.name == "tokenizer.json":
        return load_hf_tokenizer(p)
    if p.suffix == ".tiktoken":
        return Tokenizer.from_tiktoken_file(p)
    raise ValueError(f"{path}: not a tokenizer (want a HF dir with tokenizer.json, "
                     f"a tokenizer.json or a .tiktoken)")
