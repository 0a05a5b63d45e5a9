"""
Checkpoints: one safetensors file per checkpoint, never pickle; `load_model`, the one loader of a
GPT, from our checkpoint or from an HF model directory (`load_hf`: GPT-2, Qwen2, Llama); and a
run's files: the config guard (`check_config`) and stages that resume exactly (`save_stage`).

`<name>.safetensors` holds the weights (`model.*`), optionally the optimizer's tensors
(`optim.<i>.<name>`) and RNG states (`state.<name>`), and in its header, as JSON, the model config,
`vars(args)`, the step, metrics and the optimizer's hyper-parameters, so weights and metadata never
disagree; a `<name>.json` sidecar repeats the metadata for humans. docs/engineering.md says more.
"""
import json
import os
from contextlib import ExitStack
from dataclasses import MISSING, asdict, fields
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file

from model import GPT, GPTConfig, rope_tables

FORMAT = "nanorlvr-1"
ROOT = Path(__file__).resolve().parent   # the repository: paths inside it are recorded relative


# -----------------------------------------------------------------------------
# files written whole or not at all, and the paths they record

def atomic_write(path, write):
    """Write `path` all or nothing: `write(tmp)` fills a temp file, then renamed over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path, text):
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path, obj):
    """Pretty JSON (indented, one trailing newline), atomically: eval results, run summaries."""
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def write_jsonl(path, records):
    """One compact JSON object per line, atomically: data splits."""
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n"
                                    for r in records))


def relative_path(path, folder):
    """`path` as `folder` records it: relative if inside it or both in the repository; absolute."""
    path, folder = Path(path).resolve(), Path(folder).resolve()
    if path.is_relative_to(folder) or (path.is_relative_to(ROOT) and folder.is_relative_to(ROOT)):
        return os.path.relpath(path, folder)
    return str(path)


def recorded_path(value, folder):
    """A path that a file in `folder` records -> a path to open (a relative one: in `folder`)."""
    return Path(folder) / value


# -----------------------------------------------------------------------------
# our checkpoints

def save_checkpoint(path, model, *, args=None, step=0, metrics=None, optimizer=None, state=None,
                    full=None):
    """Write `path` (.safetensors) atomically. state: name -> tensor; full: `gather_state`'s."""
    path = Path(path)
    sd = model.state_dict() if full is None else full[0]
    if getattr(model.config, "tie_embeddings", False):
        sd.pop("lm_head.weight")  # the same storage as wte.weight; safetensors refuses shared ones
    tensors = {"model." + k: v for k, v in sd.items()}
    groups = None
    if optimizer is not None:
        osd = optimizer.state_dict() if full is None else full[1]
        for i, st in osd["state"].items():
            tensors.update({f"optim.{i}.{name}": t for name, t in st.items()})
        groups = osd["param_groups"]
    tensors.update({"state." + name: t for name, t in (state or {}).items()})
    tensors = {k: t.detach().contiguous().cpu() for k, t in tensors.items()}
    meta = {"format": FORMAT, "config": asdict(model.config), "args": args or {}, "step": step,
            "metrics": metrics or {}, "optimizer_groups": groups}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={"nanorlvr": json.dumps(meta)}))
    write_json(path.with_suffix(".json"), meta)


def gather_state(model, optimizer=None):
    """An FSDP model's full weights and optimizer state (or None) on rank 0's CPU (all ranks)."""
    from torch.distributed.checkpoint import state_dict as dcp   # here: it takes a second to import
    full = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)   # to rank 0's CPU
    sd = dcp.get_model_state_dict(model, options=full)
    if optimizer is None:
        return sd, None
    osd = dcp.get_optimizer_state_dict(model, optimizer, options=full)   # by parameter name
    return sd, renamed(osd, {name: i for i, (name, _) in enumerate(model.named_parameters())})


def renamed(osd, name):
    """An optimizer state dict with each parameter's key k as name[k] (FSDP's names <-> numbers)."""
    return {"state": {name[k]: st for k, st in osd.get("state", {}).items()},
            "param_groups": [{**g, "params": [name[k] for k in g["params"]]}
                             for g in osd.get("param_groups", [])]}


def read_meta(path):
    """-> a checkpoint's metadata, its tensors unread; the same ValueErrors as read_checkpoint."""
    return read_checkpoint(path, with_tensors=False)[1]


def read_checkpoint(path, with_tensors=True):
    """-> (tensors, {} without with_tensors; meta). A ValueError naming the file on any problem."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: checkpoint file not found")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()} if with_tensors else {}
    except Exception as e:
        raise ValueError(f"{path}: not a readable safetensors checkpoint ({e})") from None
    if "nanorlvr" not in header:
        raise ValueError(f"{path}: no nanoRLVR metadata (an HF model? pass its directory)")
    try:
        meta = json.loads(header["nanorlvr"])
    except ValueError as e:
        raise ValueError(f"{path}: unreadable nanoRLVR metadata ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise ValueError(f"{path}: checkpoint format {found!r}, expected {FORMAT!r}")
    if missing := sorted({"config", "args", "step", "metrics", "optimizer_groups"} - meta.keys()):
        raise ValueError(f"{path}: checkpoint metadata lacks {missing}")
    return tensors, meta


def load_model(path, device="cpu", dtype=None):
    """Our checkpoint (.safetensors) or an HF model directory -> (GPT on `device`, meta). dtype: the
    weights' (None: as saved, float32 from HF); an HF meta names the directory as the tokenizer."""
    path = Path(path)
    if path.is_dir():
        return load_hf(path, device, dtype or torch.float32)
    tensors, meta = read_checkpoint(path)
    try:
        model = GPT(GPTConfig(**meta["config"]))
    except (TypeError, ValueError, AssertionError) as e:
        raise ValueError(f"{path}: not a GPT checkpoint (config {meta['config']}: {e})") from None
    load_weights(model, prefixed(tensors, "model."), path)
    return model.to(device=device, dtype=dtype), meta


def prefixed(tensors, prefix):
    """The tensors whose names start with `prefix` ("model.", "optim.", "state."), without it."""
    return {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}


def load_weights(model, sd, path, assign=False, ranks=False):
    """Put the state dict `sd` into `model` (assign: sd's tensors become the parameters, uncopied);
    a ValueError naming `path` unless its names and shapes are the model's. ranks: every rank
    calls it, rank 0 with `sd`, which it sends to the others (FSDP: each keeps its shards)."""
    ours = model.state_dict()
    if getattr(model.config, "tie_embeddings", False):
        ours.pop("lm_head.weight")   # wte.weight's, not saved
    missing, unused = sorted(ours.keys() - sd.keys()), sorted(sd.keys() - ours.keys())
    shapes = [f"{k} {tuple(sd[k].shape)} != {tuple(t.shape)}" for k, t in ours.items()
              if k in sd and sd[k].shape != t.shape]
    if (missing or unused or shapes) and not (ranks and dist.get_rank()):
        raise ValueError(f"{path}: weights do not fit the model (missing {missing[:4]}, unused "
                         f"{unused[:4]}, shapes {shapes[:4]}); saved with another config?")
    if ranks:   # one tensor at a time from rank 0, so no rank holds a second copy
        from torch.distributed.checkpoint import state_dict as dcp
        dcp.set_model_state_dict(model, sd, options=dcp.StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True, strict=False))
    else:
        model.load_state_dict(sd, strict=False, assign=assign)


def resume(path, model, optimizer=None):
    """Load weights, optimizer and extra state from `path` into these objects -> (meta, state).
    Under torchrun (every rank calls it) rank 0 alone reads `path` and sends each rank its part."""
    ranks = dist.is_initialized()
    tensors, meta = ({}, None) if ranks and dist.get_rank() else read_checkpoint(path)
    meta = from_rank0(meta)
    ours = json.loads(json.dumps(asdict(model.config)))  # tuples become lists, as in the file
    # a field newer than the file (GPTConfig.rope_scaling) is there at its default
    defaults = {f.name: f.default for f in fields(model.config) if f.default is not MISSING}
    saved = json.loads(json.dumps(defaults)) | meta["config"]
    if saved != ours:
        diff = ", ".join(f"{k}={saved.get(k)!r} there, {ours.get(k)!r} here"
                         for k in sorted(saved.keys() | ours.keys()) if saved.get(k) != ours.get(k))
        raise ValueError(f"{path}: saved by a run with another model config ({diff})")
    load_weights(model, prefixed(tensors, "model."), path, ranks=ranks)
    if optimizer is not None:
        if meta["optimizer_groups"] is None:
            raise ValueError(f"{path}: no optimizer state to resume from")
        state = {}
        for k, v in prefixed(tensors, "optim.").items():   # optim.<i>.<name>
            i, name = k.split(".", 1)
            state.setdefault(int(i), {})[name] = v
        osd = {"state": state, "param_groups": meta["optimizer_groups"]}
        try:
            if ranks:   # by parameter name, from rank 0 (FSDP: each rank its shards)
                from torch.distributed.checkpoint import state_dict as dcp
                osd = renamed(osd, [name for name, _ in model.named_parameters()])
                full = dcp.StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
                dcp.set_optimizer_state_dict(model, optimizer, osd if tensors else {}, options=full)
            else:
                optimizer.load_state_dict(osd)
        except (ValueError, KeyError, TypeError, RuntimeError) as e:
            raise ValueError(f"{path}: optimizer state does not fit this model ({e})") from None
    return meta, from_rank0(prefixed(tensors, "state."))


def from_rank0(obj):
    """Rank 0's `obj` on every rank under torchrun (all call it); else `obj`."""
    box = [obj]
    if dist.is_initialized():
        dist.broadcast_object_list(box, src=0)
    return box[0]


# -----------------------------------------------------------------------------
# a run's files: the config guard and stages that resume exactly (`run`: the script's runtime.Run)

CONFIG = "config.json"   # in out_dir: the flags of the run that trains there
# flags that cannot change the trained weights (docs/engineering.md, Reliability): how and where
# the run executes, how often it checkpoints and logs, what it does on a NaN, which stages run
FREE_FLAGS = {"device", "threads", "grad_ckpt", "ckpt_every", "on_nan", "eval_every", "stage",
              "control", "out_dir", "resume", "fsdp"}
# the final evaluation's flags: a re-run with other values evaluates the same trained models again
EVAL_FLAGS = {"final_eval", "eval_limit", "test_limit"}


def recorded_args(run):
    """vars(args) and `recorded` as config.json and checkpoints record them (paths relative)."""
    record = {**vars(run.args), **run.recorded}
    for name in run.path_flags:
        if record.get(name) not in (None, "auto", "scratch"):
            record[name] = relative_path(record[name], run.out_dir)
    return json.loads(json.dumps(record))   # as it reads back: lists for tuples


def check_config(run, stage_files):
    """May this run continue in out_dir? With --resume=1, out_dir/config.json must hold the same
    flags (but FREE_FLAGS, EVAL_FLAGS), an out_dir without it no `stage_files` -> the record."""
    record = recorded_args(run)
    path = run.out_dir / CONFIG
    ways_out = f"use a new --out_dir, or --resume=0 to start over in {run.out_dir}"
    if not run.args.resume:
        return record
    if not path.is_file():
        if found := [f for f in stage_files if (run.out_dir / f).is_file()]:
            run.fail(f"{run.out_dir} holds {', '.join(found)} but no {CONFIG} recording the "
                     f"flags they were trained with; {ways_out}")
        return record
    try:
        old = json.loads(path.read_text())
        if not isinstance(old, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        run.fail(f"{path}: unreadable ({e}); {ways_out}")
    # flags both records know (a flag added or removed since cannot be compared)
    changed = [k for k in sorted(old.keys() & record.keys()) if k not in FREE_FLAGS
               and flag_value(run, k, old[k]) != flag_value(run, k, record[k])]
    words = ", ".join(f"--{k} {flag_value(run, k, old[k], True)} -> "
                      f"{flag_value(run, k, record[k], True)}" for k in changed)
    if set(changed) - EVAL_FLAGS:
        run.fail(f"{run.out_dir} holds a run with other flags: {words}; {ways_out}")
    if changed:
        run.print0(f"{CONFIG}: the trained stages are reused and evaluated again with {words}")
    return record


def flag_value(run, name, value, shown=False):
    """A recorded flag value, comparable across records: a path flag as an absolute path (shown:
    as the user would type it, relative to the working directory when under it)."""
    if name not in run.path_flags or value in (None, "auto", "scratch"):
        return value
    path = recorded_path(value, run.out_dir).resolve()
    return os.path.relpath(path) if shown and path.is_relative_to(Path.cwd()) else str(path)


def save_config(run, record):
    """check_config's record to out_dir/config.json (rank 0), before any stage (False: none)."""
    if run.master and record:
        write_json(run.out_dir / CONFIG, record)


def save_stage(run, ckpt, model, opt, step, metrics, g, done):
    """Checkpoint a stage every --ckpt_every steps (weights, optimizer, every rank's generators,
    so a re-run resumes exactly) and when it is done (weights only)."""
    if step % run.args.ckpt_every and not done:
        return
    states = [(g.get_state(), torch.get_rng_state())] * run.world   # DDP: every rank's
    if run.ddp:
        torch.distributed.all_gather_object(states, states[0])
    # FSDP: every rank sends its shards, rank 0 gets the full weights and optimizer state
    full = gather_state(model, None if done else opt) if run.fsdp else None
    if run.master:
        state = {f"{name}{r}": t for r, pair in enumerate(states)
                 for name, t in zip(("rng", "torch_rng"), pair)}
        save_checkpoint(ckpt, model, args=recorded_args(run), step=step, full=full,
                        metrics={**metrics, "done": done}, optimizer=None if done else opt,
                        state=None if done else state)


def resume_stage(run, ckpt, model, opt, g, name):
    """-> (step to go on from, done?); restores weights (unfinished: optimizer, generators). Rank 0
    decides from its file system and sends the others their part (`resume`)."""
    try:
        meta = from_rank0(run.master and run.args.resume and ckpt.is_file() and read_meta(ckpt))
        if not meta:
            return 0, False
        done = meta["metrics"].get("done")
        meta, state = resume(ckpt, model, None if done else opt)
    except ValueError as e:
        run.fail(f"{e} (pass --resume=0 or another --out_dir to start over)")
    if done:
        run.print0(f"{name}: {ckpt} is complete, reusing it")
        return meta["step"], True
    if f"rng{run.rank}" not in state or f"rng{run.world}" in state:
        run.fail(f"{ckpt}: saved by another number of ranks; resume with the same torchrun size")
    g.set_state(state[f"rng{run.rank}"])
    if f"torch_rng{run.rank}" in state:   # (an older unfinished checkpoint has none)
        torch.set_rng_state(state[f"torch_rng{run.rank}"])
    run.print0(f"{name}: resuming from step {meta['step']}")
    return meta["step"], False


# -----------------------------------------------------------------------------
# HF model directories

def load_hf(path, device, dtype):
    """An HF model directory -> (GPT in `dtype` on `device`, meta); see load_model."""
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"{cfg_file}: missing (expected an HF model directory with config.json)")
    config = config_from_hf(hf := json.loads(cfg_file.read_text()), cfg_file)
    index = path / "model.safetensors.index.json"
    files = ["model.safetensors"] if not index.is_file() else \
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
    # the model's shapes without memory: its weights are the tensors read below
    with torch.device("meta"):
        model = GPT(config)
    with ExitStack() as stack:
        readers = {}   # HF name -> its reader, called when hf_to_ours takes that tensor
        for f in files:
            try:
                st = stack.enter_context(safe_open(str(path / f), "pt", device=str(device)))
            except Exception as e:
                raise ValueError(f"{path / f}: cannot read safetensors weights ({e})") from None
            readers.update({k: partial(read_as, st, k, dtype, path / f) for k in st.keys()})
        try:
            sd = hf_to_ours(readers, config, hf["model_type"])
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    load_weights(model, sd, path, assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.wte.weight   # assign replaced wte's parameter: tie them again
    if config.pos == "rope":
        # the RoPE tables are not in the files: computed again, off the meta device
        tables = rope_tables(config.head_dim, config.block_size, config.rope_theta,
                             config.rope_scaling)
        model.rope_cos, model.rope_sin = (t.to(device, dtype) for t in tables)
    return model, {"config": asdict(config), "args": {"tokenizer": str(path.resolve())}}


def read_as(st, name, dtype, file):
    """Tensor `name` of `file`, open as `st`, in `dtype`."""
    try:
        return st.get_tensor(name).to(dtype)
    except Exception as e:
        raise ValueError(f"{file.name}: cannot read tensor {name!r} ({e})") from None


def config_from_hf(hf, where):
    """HF's config.json (a dict) -> GPTConfig; a ValueError naming `where` if unsupported."""
    kind = hf.get("model_type")
    if kind == "gpt2":
        act = hf.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"{where}: activation_function {act!r} unsupported (want gelu_new)")
        return GPTConfig.gpt2(vocab_size=hf["vocab_size"], block_size=hf["n_positions"],
                              n_layer=hf["n_layer"], n_head=hf["n_head"], n_kv_head=hf["n_head"],
                              n_embd=hf["n_embd"], mlp_hidden=hf.get("n_inner") or 4 * hf["n_embd"],
                              norm_eps=hf["layer_norm_epsilon"])
    if kind not in ("qwen2", "llama"):
        raise ValueError(f"{where}: model_type {kind!r} unsupported (gpt2, qwen2, llama)")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{where}: hidden_act {hf['hidden_act']!r} unsupported (expected silu)")
    if hf.get("use_sliding_window") or hf.get("mlp_bias"):
        raise ValueError(f"{where}: sliding window and mlp_bias are not supported")
    theta = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    return GPTConfig.llama(vocab_size=hf["vocab_size"], block_size=hf["max_position_embeddings"],
                           n_layer=hf["num_hidden_layers"], n_head=hf["num_attention_heads"],
                           n_kv_head=hf.get("num_key_value_heads") or hf["num_attention_heads"],
                           n_embd=hf["hidden_size"], head_dim=hf.get("head_dim"),
                           mlp_hidden=hf["intermediate_size"], norm_eps=hf["rms_norm_eps"],
                           rope_theta=float(theta), rope_scaling=rope_scaling(hf, where),
                           qkv_bias=kind == "qwen2" or bool(hf.get("attention_bias")),
                           tie_embeddings=bool(hf.get("tie_word_embeddings", False)))


def rope_scaling(hf, where):
    """HF's RoPE scaling -> None, or the parameters of "linear" or "llama3" (Llama 3.1+)."""
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
    if kind == "llama3":   # the context the model was pretrained on, before scaling
        original = rope.get("original_max_position_embeddings", hf["max_position_embeddings"])
        out["original_max_position_embeddings"] = int(original)
    return out


def hf_to_ours(sd, config, kind):
    """Rename HF tensors to ours, explicitly. sd: HF name -> a function reading that tensor; out:
    our name -> tensor (an HF tensor we do not use appears as "unused:<name>", unread)."""
    out = {}

    def take(k):
        if k not in sd:
            raise ValueError(f"missing tensor {k!r}")
        return sd.pop(k)()   # read now, one tensor at a time

    if kind == "gpt2":
        # names with or without the "transformer." prefix; attn.bias buffers are causal masks
        sd = {k.removeprefix("transformer."): v for k, v in sd.items()
              if not k.endswith((".attn.bias", ".attn.masked_bias"))}
        out.update({k: take(k) for k in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias")})
        for i in range(config.n_layer):
            p = f"h.{i}."
            for name in ("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "attn.c_attn.bias",
                         "attn.c_proj.bias", "mlp.c_fc.bias", "mlp.c_proj.bias"):
                out[p + name] = take(p + name)
            # Conv1D stores (in, out), nn.Linear (out, in)
            for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
                out[p + name + ".weight"] = take(p + name + ".weight").t().contiguous()
    else:
        out["wte.weight"] = take("model.embed_tokens.weight")
        for i in range(config.n_layer):
            p, q = f"model.layers.{i}.", f"h.{i}."
            out[q + "ln_1.weight"] = take(p + "input_layernorm.weight")
            out[q + "ln_2.weight"] = take(p + "post_attention_layernorm.weight")
            for w in ("weight", "bias") if config.qkv_bias else ("weight",):
                out[q + f"attn.c_attn.{w}"] = torch.cat([take(p + f"self_attn.{x}_proj.{w}")
                                                        for x in "qkv"])
            out[q + "attn.c_proj.weight"] = take(p + "self_attn.o_proj.weight")
            out[q + "mlp.c_fc.weight"] = torch.cat([take(p + f"mlp.{x}_proj.weight")
                                                    for x in ("gate", "up")])
            out[q + "mlp.c_proj.weight"] = take(p + "mlp.down_proj.weight")
        out["ln_f.weight"] = take("model.norm.weight")
    if config.tie_embeddings:   # lm_head is wte (GPT-2 always)
        sd.pop("lm_head.weight", None)
    else:
        out["lm_head.weight"] = take("lm_head.weight")
    # anything left over is a tensor we do not understand
    out.update({"unused:" + k: v for k, v in sd.items()})
    return out
