"""Export a language checkpoint of ours as a Hugging Face model directory, for transformers, vLLM
and any other tool that reads one.

    python tools/export_hf.py checkpoints/textgame/mle.safetensors out/textgame_hf
    python -c "from transformers import AutoModelForCausalLM as M, AutoTokenizer as T; \
m, t = M.from_pretrained('out/textgame_hf'), T.from_pretrained('out/textgame_hf')"

OUT_DIR gets config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
generation_config.json. Our RMSNorm / RoPE / SwiGLU family becomes a `llama` model (`qwen2` when q,
k and v have biases: Llama's attention_bias would put one on the output projection too), the GPT-2
family a `gpt2` one. The tensor names are checkpoint.py's `hf_to_ours` run backwards: the fused q|k|v
projection (`c_attn`) and SwiGLU's gate|up (`c_fc`) are split into HF's separate Linears, and
GPT-2's weights are transposed into its Conv1D's (in, out) layout. RoPE needs no reordering:
model.py rotates HF's way ("rotate half"). `save_hf_tokenizer` writes the tiktoken ranks as HF
byte-level BPE; <|endoftext|> is both EOS and BOS, as in GPT-2 (our sequences start without one).

The tokenizer's merges. tiktoken keeps no merge list: inside a pre-token it fuses whichever adjacent
pair concatenates to the lowest-ranked token, while HF fuses only the pairs its `merges` list holds,
the earliest listed first. Listing every split of every token into two tokens, in the rank order of
the tokens they make, makes the two agree; HF's `ignore_merges` copies tiktoken's shortcut of
emitting a pre-token that is itself a token whole. One tie remains: two different pairs that make
the same token side by side (ab|a|ba) fuse left first in tiktoken and list first in HF; no text of
the tests meets it. HF also finds special tokens such as "<|endoftext|>" in the text it encodes,
where `encode` never does.

`checkpoint.load_model(OUT_DIR)` and `load_tokenizer(OUT_DIR)` read the directory back, as
`train_lang.py --init=OUT_DIR` and `eval.py` do; the export reads it back that way and checks every
tensor before moving it into place. It is written whole or not at all (a temp directory beside
OUT_DIR, then a rename); an OUT_DIR that holds anything is replaced only with --force.
"""
import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from checkpoint import atomic_write_text, load_model, recorded_path, write_json  # noqa: E402
from tokenizer_text import bytes_to_unicode, load_tokenizer  # noqa: E402


def load_language_checkpoint(path):
    """Our .safetensors language checkpoint -> (GPT, Tokenizer); else a ValueError naming the file.
    The tokenizer is found as tasks.py's load_lang_model finds it: the file the checkpoint's
    args name, relative to the checkpoint's folder (or absolute: the HF dir a run began from)."""
    path = Path(path)
    model, meta = load_model(path)
    args = meta["args"]
    if "vq" in args:   # train_video.py's checkpoints name their frame tokenizer here
        raise ValueError(f"{path}: a video world model (its tokens are frame codes, not text); "
                         f"only language checkpoints export")
    if not args.get("tokenizer"):
        raise ValueError(f"{path}: checkpoint names no tokenizer")
    tok = load_tokenizer(recorded_path(args["tokenizer"], path.parent))
    if tok.n_vocab > model.config.vocab_size:
        raise ValueError(f"{path}: tokenizer has {tok.n_vocab} ids, the model only "
                         f"{model.config.vocab_size}")
    return model, tok


def hf_family(c):
    """The HF model_type our GPTConfig `c` is, or a ValueError saying why none is."""
    if (c.norm, c.pos, c.mlp) == ("layernorm", "learned", "gelu"):
        if not c.bias or c.qkv_bias or c.n_kv_head != c.n_head \
                or c.head_dim * c.n_head != c.n_embd or not c.tie_embeddings:
            raise ValueError("a GPT-2-family model needs biases everywhere, n_kv_head == n_head, "
                             "head_dim == n_embd / n_head and tied embeddings, as GPT-2 has")
        return "gpt2"
    if (c.norm, c.pos, c.mlp) == ("rmsnorm", "rope", "swiglu"):
        if c.bias:
            raise ValueError("a Llama-family model has no biases outside q/k/v (bias=True)")
        return "qwen2" if c.qkv_bias else "llama"
    raise ValueError(f"norm={c.norm}, pos={c.pos}, mlp={c.mlp} is neither GPT-2 "
                     f"(layernorm, learned, gelu) nor Llama (rmsnorm, rope, swiglu)")


def hf_config(c, kind, eos_id, dtype):
    """config.json for GPTConfig `c` as HF model_type `kind` (all config_from_hf reads back)."""
    common = dict(vocab_size=c.vocab_size, bos_token_id=eos_id, eos_token_id=eos_id,
                  tie_word_embeddings=c.tie_embeddings, initializer_range=0.02, use_cache=True,
                  dtype=str(dtype).removeprefix("torch."))
    if kind == "gpt2":
        return dict(architectures=["GPT2LMHeadModel"], model_type="gpt2", n_positions=c.block_size,
                    n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head, n_inner=c.mlp_hidden,
                    activation_function="gelu_new", layer_norm_epsilon=c.norm_eps,
                    attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0, scale_attn_weights=True,
                    scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False, **common)
    arch = dict(llama="LlamaForCausalLM", qwen2="Qwen2ForCausalLM")[kind]
    extra = (dict(attention_bias=False, mlp_bias=False, pretraining_tp=1) if kind == "llama" else
             dict(use_sliding_window=False, sliding_window=None, max_window_layers=c.n_layer))
    return dict(architectures=[arch], model_type=kind, hidden_size=c.n_embd,
                intermediate_size=c.mlp_hidden, num_hidden_layers=c.n_layer,
                num_attention_heads=c.n_head, num_key_value_heads=c.n_kv_head, head_dim=c.head_dim,
                max_position_embeddings=c.block_size, hidden_act="silu", rms_norm_eps=c.norm_eps,
                # transformers 4 reads rope_theta and rope_scaling, transformers 5 rope_parameters
                rope_theta=c.rope_theta, rope_scaling=c.rope_scaling,
                rope_parameters={"rope_type": "default", **(c.rope_scaling or {}),
                                 "rope_theta": c.rope_theta},
                attention_dropout=0.0, **extra, **common)


def hf_tensors(model, kind):
    """Our state dict under HF's tensor names (hf_to_ours inverted) -> dict name -> tensor."""
    c, sd = model.config, model.state_dict()
    out = {}
    if kind == "gpt2":
        for name in ("wte.weight", "wpe.weight"):
            out["transformer." + name] = sd[name]
        for i in range(c.n_layer):
            p = f"h.{i}."
            for name in ("ln_1", "ln_2"):
                for x in ("weight", "bias"):
                    out[f"transformer.{p}{name}.{x}"] = sd[f"{p}{name}.{x}"]
            for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
                # Conv1D stores (in, out), nn.Linear (out, in)
                out[f"transformer.{p}{name}.weight"] = sd[f"{p}{name}.weight"].t()
                out[f"transformer.{p}{name}.bias"] = sd[f"{p}{name}.bias"]
        for name in ("ln_f.weight", "ln_f.bias"):
            out["transformer." + name] = sd[name]
    else:
        out["model.embed_tokens.weight"] = sd["wte.weight"]
        # c_attn's rows: the query heads, then the key heads, then the value heads
        qkv = [c.n_head * c.head_dim, c.n_kv_head * c.head_dim, c.n_kv_head * c.head_dim]
        for i in range(c.n_layer):
            p, q = f"model.layers.{i}.", f"h.{i}."
            out[p + "input_layernorm.weight"] = sd[q + "ln_1.weight"]
            out[p + "post_attention_layernorm.weight"] = sd[q + "ln_2.weight"]
            for x, w in zip("qkv", sd[q + "attn.c_attn.weight"].split(qkv)):
                out[p + f"self_attn.{x}_proj.weight"] = w
            if c.qkv_bias:
                for x, b in zip("qkv", sd[q + "attn.c_attn.bias"].split(qkv)):
                    out[p + f"self_attn.{x}_proj.bias"] = b
            out[p + "self_attn.o_proj.weight"] = sd[q + "attn.c_proj.weight"]
            gate, up = sd[q + "mlp.c_fc.weight"].chunk(2)   # gate rows first, as in MLP.forward
            out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gate, up
            out[p + "mlp.down_proj.weight"] = sd[q + "mlp.c_proj.weight"]
        out["model.norm.weight"] = sd["ln_f.weight"]
        if not c.tie_embeddings:
            out["lm_head.weight"] = sd["lm_head.weight"]
    # slices share their parent's storage, which safetensors refuses: each tensor gets its own copy
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def write_hf_dir(model, tok, directory):
    """Write the HF files of `model` and `tok` into the existing, empty `directory`."""
    directory = Path(directory)
    kind = hf_family(model.config)
    dtype = model.wte.weight.dtype
    write_json(directory / "config.json", hf_config(model.config, kind, tok.eos_id, dtype))
    save_file(hf_tensors(model, kind), str(directory / "model.safetensors"),
              metadata={"format": "pt"})   # transformers wants to know the framework
    write_json(directory / "generation_config.json",
               dict(bos_token_id=tok.eos_id, eos_token_id=tok.eos_id, pad_token_id=tok.eos_id))
    save_hf_tokenizer(tok, directory)


def save_hf_tokenizer(tok, directory):
    """Write the Tokenizer `tok` as HF byte-level BPE into `directory`: tokenizer.json (vocab,
    merges derived from the ranks as the module docstring explains, the split regex, the specials)
    and tokenizer_config.json (the eos token), for HF `tokenizers`, `transformers.AutoTokenizer`
    and tokenizer_text.py's `load_tokenizer`."""
    directory = Path(directory)
    to_char = bytes_to_unicode()

    def text(token):   # token bytes -> the printable string HF stores
        return "".join(to_char[b] for b in token)

    ranks = {t: tok.enc.encode_single_token(t) for t in tok.enc.token_byte_values()}
    merges = []
    # a merge's place in the list is its rank
    for token, _ in sorted(ranks.items(), key=lambda kv: kv[1]):
        splits = [(token[:i], token[i:]) for i in range(1, len(token))]
        splits = sorted((ranks[a], ranks[b], a, b) for a, b in splits if a in ranks and b in ranks)
        merges += [[text(a), text(b)] for _, _, a, b in splits]
    specials = sorted((tok.enc.encode_single_token(s), s) for s in tok.enc.special_tokens_set)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": False}
    spec = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, s in specials],
        "normalizer": {"type": "NFC"} if tok.nfc else None,
        # tiktoken's regex splits the text into pre-tokens, then ByteLevel maps their bytes to
        # characters
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": tok.enc._pat_str}, "behavior": "Isolated",
             "invert": False},
            byte_level]},
        "post_processor": None,   # encoding adds no BOS / EOS, as `encode` adds none
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": True,   # a pre-token that is a token stays whole, as in tiktoken
                  "vocab": {text(t): i for t, i in sorted(ranks.items(), key=lambda kv: kv[1])},
                  "merges": merges},
    }
    eos = next(s for i, s in specials if i == tok.eos_id)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos,
              "clean_up_tokenization_spaces": False}
    atomic_write_text(directory / "tokenizer.json",
                      json.dumps(spec, ensure_ascii=False, indent=2) + "\n")
    atomic_write_text(directory / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")


def check_round_trip(model, directory):
    """Read `directory` back with our HF loader: every tensor must equal the checkpoint's."""
    back = load_model(directory, dtype=model.wte.weight.dtype)[0].state_dict()
    for name, t in model.state_dict().items():
        if not torch.equal(back[name], t):
            raise ValueError(f"{directory}: tensor {name} does not read back as written")


def export(ckpt, out_dir, force=False):
    """Export checkpoint `ckpt` to the HF directory `out_dir`, all or nothing; ValueError (one
    line) on a missing or non-language checkpoint, a model with no HF equivalent, or an occupied
    out_dir."""
    out_dir = Path(os.path.abspath(out_dir))   # "out/" or "." get a name to put a temp dir beside
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{out_dir}: exists and is not a directory")
    if Path(ckpt).resolve().is_relative_to(out_dir.resolve()):   # --force would delete the source
        raise ValueError(f"{out_dir}: holds the checkpoint {ckpt} itself; choose another OUT_DIR")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ValueError(f"{out_dir}: exists and is not empty (pass --force to replace it)")
    model, tok = load_language_checkpoint(ckpt)
    try:
        hf_family(model.config)
    except ValueError as e:
        raise ValueError(f"{ckpt}: no HF model type fits this model: {e}") from None
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")   # beside out_dir: the rename stays on one disk
    shutil.rmtree(tmp, ignore_errors=True)              # debris of an export that crashed
    tmp.mkdir(parents=True)
    try:
        write_hf_dir(model, tok, tmp)
        check_round_trip(model, tmp)
        if out_dir.exists():   # --force (or an empty directory): set the old one aside, then swap
            old = tmp.with_name(tmp.name + ".old")
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)   # gone already after a successful rename
    return out_dir


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("ckpt", metavar="CKPT", help="a language checkpoint of ours (.safetensors)")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the HF model directory to write")
    p.add_argument("--force", action="store_true", help="replace OUT_DIR if it holds anything")
    args = p.parse_args()
    torch.set_num_threads(1)
    try:
        out = export(args.ckpt, args.out_dir, args.force)
    except (ValueError, OSError) as e:
        sys.exit(f"error: {e}")
    cfg = json.loads((out / "config.json").read_text())
    print(f"wrote {out}: {cfg['model_type']} model, vocab {cfg['vocab_size']}; "
          f"load it with transformers' AutoModelForCausalLM / AutoTokenizer, or --init={out}")


if __name__ == "__main__":
    main()
