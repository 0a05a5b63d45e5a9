"""
Checkpoints: one safetensors file per checkpoint, never pickle.

`<name>.safetensors` holds the model weights (keys `model.*`), optionally the optimizer's tensors (`optim.<i>.<name>`)
and any extra state tensors such as RNG states (`state.<name>`), and in its header, as JSON, everything else: the model
config, the script's `vars(args)`, the step, metrics and the optimizer's hyper-parameters. Because it is one file written
to a temp name and renamed over the old one (`os.replace` is atomic on POSIX), a crash while saving leaves the previous
checkpoint intact, and weights and metadata can never disagree. A `<name>.json` sidecar repeats the metadata for humans
(and `jq`); loading reads only the safetensors file. Any module whose `.config` is a dataclass can be saved and resumed
(the GPT, and the video tokenizer while it trains); `load_model` builds GPTs only.

Paths in the metadata (the run's data folder, its --init, its tokenizer file) are written relative to the checkpoint's
folder when both lie inside the repository or the path lies inside that folder (`relative_path`), so a moved or cloned
repository still finds them; loading joins them to that folder (`recorded_path`; an absolute path, as older sidecars
hold, stays as it is).

No code runs from a file: tensors come through safetensors and everything else through JSON; a file that is not such a
checkpoint (a pickle named .safetensors, a truncated file, another model's weights) is one ValueError naming the file.
"""
import json
import os
from dataclasses import MISSING, asdict, fields
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from model import GPT, GPTConfig

FORMAT = "nanorlvr-1"
ROOT = Path(__file__).resolve().parent   # the repository: paths inside it are recorded relative


def atomic_write(path, write):
    """Write `path` all or nothing: `write(tmp)` fills a temp file beside it, which is then renamed over `path`
    (os.replace is atomic on POSIX), so a crash leaves the old file (or none), never half a file; the debris of a crashed
    write (`<name>.tmp`) is overwritten by the next one. One process writes a given file (rank 0 under torchrun)."""
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
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records))


def relative_path(path, folder):
    """`path` (absolute, or relative to the working directory) as a file in `folder` records it: relative to
    `folder` when it lies inside `folder`, or when both lie inside the repository (they move together); else
    absolute."""
    path, folder = Path(path).resolve(), Path(folder).resolve()
    if path.is_relative_to(folder) or (path.is_relative_to(ROOT) and folder.is_relative_to(ROOT)):
        return os.path.relpath(path, folder)
    return str(path)


def recorded_path(value, folder):
    """A path that a file in `folder` records -> a path to open: a relative one is relative to `folder`, an absolute
    one is used as it is."""
    return Path(folder) / value


def save_checkpoint(path, model, *, args=None, step=0, metrics=None, optimizer=None, state=None):
    """Write `path` (a .safetensors file) atomically. state: dict name -> tensor (e.g. generator.get_state())."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = getattr(model, "module", model)  # unwrap DDP
    sd = model.state_dict()
    if getattr(model.config, "tie_embeddings", False):
        sd.pop("lm_head.weight")  # the same storage as wte.weight; safetensors refuses shared tensors
    tensors = {"model." + k: v.detach().contiguous().cpu() for k, v in sd.items()}
    groups = None
    if optimizer is not None:
        osd = optimizer.state_dict()
        for i, st in osd["state"].items():
            for name, t in st.items():
                tensors[f"optim.{i}.{name}"] = t.detach().contiguous().cpu()
        groups = osd["param_groups"]
    for name, t in (state or {}).items():
        tensors["state." + name] = t.detach().contiguous().cpu()
    meta = {"format": FORMAT, "config": asdict(model.config), "args": args or {}, "step": step,
            "metrics": metrics or {}, "optimizer_groups": groups}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata={"nanorlvr": json.dumps(meta)}))
    write_json(path.with_suffix(".json"), meta)


def read_checkpoint(path):
    """-> (tensors: dict name -> tensor, meta: dict). A clear ValueError naming the file on any problem."""
    return _read(path, with_tensors=True)


def read_meta(path):
    """-> the metadata of a checkpoint, without reading its tensors (a quick check of a file before a run starts).
    The same ValueErrors as read_checkpoint."""
    return _read(path, with_tensors=False)[1]


def _read(path, with_tensors):
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
        raise ValueError(f"{path}: safetensors file without nanoRLVR metadata (an HF model? pass its directory)")
    try:
        meta = json.loads(header["nanorlvr"])
    except ValueError as e:
        raise ValueError(f"{path}: unreadable nanoRLVR metadata ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {meta.get('format') if isinstance(meta, dict) else meta!r}, "
                         f"expected {FORMAT!r}")
    missing = [k for k in ("config", "args", "step", "metrics", "optimizer_groups") if k not in meta]
    if missing:
        raise ValueError(f"{path}: checkpoint metadata lacks {missing}")
    return tensors, meta


def _model_state(tensors):
    return {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}


def load_model(path, device="cpu"):
    """Build the model a checkpoint describes and load its weights -> (model, meta)."""
    tensors, meta = read_checkpoint(path)
    try:
        model = GPT(GPTConfig(**meta["config"]))
    except (TypeError, ValueError, AssertionError) as e:
        raise ValueError(f"{path}: not a GPT checkpoint (config {meta['config']}: {e})") from None
    load_weights(model, tensors, path)
    return model.to(device), meta


def load_weights(model, tensors, path):
    sd = _model_state(tensors)
    result = model.load_state_dict(sd, strict=False)
    allowed = {"lm_head.weight"} if getattr(model.config, "tie_embeddings", False) else set()
    if set(result.missing_keys) - allowed or result.unexpected_keys:
        raise ValueError(f"{path}: weights do not fit this model (missing {result.missing_keys[:4]}, "
                         f"unexpected {result.unexpected_keys[:4]}); was it saved with another config?")


def resume(path, model, optimizer=None):
    """Load weights, optimizer and extra state from `path` into existing objects -> (meta, state tensors)."""
    tensors, meta = read_checkpoint(path)
    model = getattr(model, "module", model)
    ours = json.loads(json.dumps(asdict(model.config)))  # tuples become lists, as in the file
    # a field newer than the file (GPTConfig.rope_scaling) is there at its default
    defaults = {f.name: f.default for f in fields(model.config) if f.default is not MISSING}
    saved = json.loads(json.dumps(defaults)) | meta["config"]
    if saved != ours:
        diff = ", ".join(f"{k}={saved.get(k)!r} there, {ours.get(k)!r} here"
                         for k in sorted(saved.keys() | ours.keys()) if saved.get(k) != ours.get(k))
        raise ValueError(f"{path}: saved by a run with another model config ({diff})")
    load_weights(model, tensors, path)
    if optimizer is not None:
        if meta["optimizer_groups"] is None:
            raise ValueError(f"{path}: no optimizer state to resume from")
        state = {}
        for k, v in tensors.items():
            if k.startswith("optim."):
                _, i, name = k.split(".", 2)
                state.setdefault(int(i), {})[name] = v
        try:
            optimizer.load_state_dict({"state": state, "param_groups": meta["optimizer_groups"]})
        except (ValueError, KeyError, TypeError, RuntimeError) as e:
            raise ValueError(f"{path}: optimizer state does not fit this model ({e})") from None
    extra = {k[len("state."):]: v for k, v in tensors.items() if k.startswith("state.")}
    return meta, extra
