"""
HF checkpoints -> our GPT: an HF model directory (GPT2LMHeadModel, Qwen2ForCausalLM,
LlamaForCausalLM; config.json + safetensors, sharded or not) loaded into model.py's GPT, apart
from the training path.

`load_pretrained` reads the config (`config_from_hf`: HF's names -> GPTConfig) and the tensors,
and `hf_to_ours` renames them to ours, explicitly: GPT-2's Conv1D weights are transposed, and
Qwen2 / Llama's separate q, k, v (and SwiGLU's gate and up) are concatenated into our fused
Linears. `GPT.from_pretrained(path)` calls it; tools/export_hf.py writes the other way.
"""
import json
from pathlib import Path

import torch

from model import GPT, GPTConfig


def load_pretrained(path, dtype=torch.float32):
    """An HF model directory (config.json + safetensors, sharded or not) -> GPT in `dtype`;
    ValueError naming the file on anything we cannot read or map."""
    from safetensors.torch import load_file
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
            raise ValueError(f"{path}: tensor {k} has shape {tuple(v.shape)}, "
                             f"expected {tuple(ours[k].shape)}")
    model.load_state_dict(mapped, strict=not config.tie_embeddings)
    return model.to(dtype)


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
        unsupported = (hf.get("use_sliding_window") or hf.get("mlp_bias")
                       or (hf.get("rope_scaling") or {}).get("rope_type", "default") != "default")
        if unsupported:
            msg = "sliding window, mlp_bias and rope scaling are not supported"
            raise ValueError(f"{where}: {msg}")
        theta = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return GPTConfig.llama(vocab_size=hf["vocab_size"],
                               block_size=hf["max_position_embeddings"],
                               n_layer=hf["num_hidden_layers"], n_head=hf["num_attention_heads"],
                               n_kv_head=hf.get("num_key_value_heads") or hf["num_attention_heads"],
                               n_embd=hf["hidden_size"], head_dim=hf.get("head_dim"),
                               mlp_hidden=hf["intermediate_size"], norm_eps=hf["rms_norm_eps"],
                               rope_theta=float(theta),
                               qkv_bias=kind == "qwen2" or bool(hf.get("attention_bias")),
                               tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
    raise ValueError(f"{where}: model_type {kind!r} unsupported (gpt2, qwen2, llama)")


def hf_to_ours(sd, config, kind):
    """Rename HF tensors to ours, explicitly. GPT-2's Conv1D stores (in, out): transposed here."""
    # GPT-2: names with or without the "transformer." prefix; attn.bias buffers are causal masks
    if kind == "gpt2":
        sd = {k.removeprefix("transformer."): v for k, v in sd.items()
              if not k.endswith((".attn.bias", ".attn.masked_bias"))}
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
