"""Checkpoint round trip (bit-exact, optimizer and RNG state included), atomicity, clear errors, and paths recorded
relative to the recording file."""
import json
import os
from pathlib import Path

import pytest
import torch

from checkpoint import (ROOT, load_model, read_checkpoint, read_meta, recorded_path, relative_path, resume,
                        save_checkpoint)
from model import GPT, GPTConfig
from tokenizer_vq import VQConfig, VQVAE

torch.set_num_threads(1)


def trained(config):
    torch.manual_seed(0)
    m = GPT(config)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    idx = torch.randint(0, config.vocab_size, (2, 8))
    for _ in range(3):
        opt.zero_grad()
        m(idx, idx)[1].backward()
        opt.step()
    return m, opt, idx


@pytest.mark.parametrize("config", [GPTConfig.gpt2(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16),
                                    GPTConfig.llama(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_kv_head=1,
                                                    n_embd=16, tie_embeddings=False)])
def test_round_trip_is_bit_exact(tmp_path, config):
    m, opt, idx = trained(config)
    g = torch.Generator().manual_seed(5)
    g.manual_seed(7)
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, m, args={"lr": 0.01}, step=3, metrics={"loss": 1.5}, optimizer=opt,
                    state={"rng": g.get_state()})
    m2, meta = load_model(path)
    for (k, a), (_, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), k
    assert meta["step"] == 3 and meta["args"] == {"lr": 0.01} and meta["metrics"] == {"loss": 1.5}
    half = load_model(path, dtype=torch.bfloat16)[0]
    assert all(t.dtype == torch.bfloat16 for t in half.state_dict().values())
    assert json.loads(path.with_suffix(".json").read_text())["step"] == 3
    # resume into fresh objects, then one more identical step on both sides
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
    _, extra = resume(path, m2, opt2)
    g2 = torch.Generator()
    g2.set_state(extra["rng"])
    assert torch.equal(torch.rand(3, generator=g), torch.rand(3, generator=g2))
    for model, o in ((m, opt), (m2, opt2)):
        o.zero_grad()
        model(idx, idx)[1].backward()
        o.step()
    for (k, a), (_, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), k


def test_truncated_file_is_one_clear_error(tmp_path):
    m, _, _ = trained(GPTConfig.llama(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16))
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, m)
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(ValueError, match="ckpt.safetensors") as e:
        load_model(path)
    assert "\n" not in str(e.value)


def test_weights_of_another_shape_are_one_clear_error(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file
    m, _, _ = trained(GPTConfig.llama(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16))
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, m)
    with safe_open(str(path), framework="pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["nanorlvr"])
    meta["config"]["vocab_size"] = 40   # the header says another model than the tensors hold
    save_file(tensors, str(path), metadata={"nanorlvr": json.dumps(meta)})
    with pytest.raises(ValueError, match=r"ckpt\.safetensors: weights do not fit the model .*wte\.weight \(32, 16\)"):
        load_model(path)


def test_other_config_is_refused(tmp_path):
    m, _, _ = trained(GPTConfig.llama(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16))
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, m)
    other = GPT(GPTConfig.llama(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=16))
    with pytest.raises(ValueError, match="config"):
        resume(path, other)


def test_failed_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    m, _, _ = trained(GPTConfig.llama(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16))
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, m, step=1)
    import checkpoint

    def crash(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(checkpoint, "save_file", crash)
    with pytest.raises(OSError):
        save_checkpoint(path, m, step=2)
    assert read_checkpoint(path)[1]["step"] == 1


def test_any_dataclass_configured_module_resumes_but_only_gpts_load_as_models(tmp_path):
    torch.manual_seed(0)
    vq = VQVAE(VQConfig(channels=(4, 4, 8), n_codes=16))     # tuples in its config become JSON lists
    opt = torch.optim.Adam(vq.parameters(), lr=1e-3)
    vq(torch.rand(2, 3, 64, 64))[0].sum().backward()
    opt.step()
    path = tmp_path / "vq.safetensors"
    save_checkpoint(path, vq, step=4, optimizer=opt)
    other = VQVAE(VQConfig(channels=(4, 4, 8), n_codes=16))
    resume(path, other, torch.optim.Adam(other.parameters(), lr=1e-3))
    assert all(torch.equal(a, b) for a, b in zip(vq.state_dict().values(), other.state_dict().values()))
    with pytest.raises(ValueError, match=r"vq\.safetensors: saved by a run with another model config \(n_codes=16 "
                                         r"there, 32 here\)"):
        resume(path, VQVAE(VQConfig(channels=(4, 4, 8), n_codes=32)))
    with pytest.raises(ValueError, match=r"vq\.safetensors: not a GPT checkpoint"):
        load_model(path)


def test_optimizer_of_another_model_is_one_clear_error(tmp_path):
    m, opt, _ = trained(GPTConfig.llama(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16))
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, m, optimizer=opt)
    m2 = GPT(m.config)
    sgd = torch.optim.SGD(list(m2.parameters())[:2], lr=0.1)
    with pytest.raises(ValueError, match=r"ckpt\.safetensors: optimizer state does not fit this model"):
        resume(path, m2, sgd)


def test_paths_are_recorded_relative_to_the_file_that_records_them(tmp_path):
    root = ROOT
    # both inside the repository: relative, so a moved or cloned repository still finds the path
    assert relative_path(root / "data" / "textgame", root / "out" / "x") == os.path.join("..", "..", "data", "textgame")
    assert relative_path(tmp_path / "o" / "tok.tiktoken", tmp_path / "o") == "tok.tiktoken"   # inside the folder
    assert relative_path(tmp_path / "data", root / "out" / "x") == str(tmp_path.resolve() / "data")   # elsewhere
    assert relative_path(root / "data", tmp_path) == str(root / "data")   # the folder outside the repository
    folder = root / "checkpoints" / "textgame"
    assert recorded_path("../../data/textgame", folder).resolve() == root / "data" / "textgame"
    assert recorded_path("/abs/data", folder) == Path("/abs/data")        # older sidecars: absolute paths
    # the shipped sidecars record no absolute path of the machine that made them
    for sidecar in root.joinpath("checkpoints").rglob("*.json"):
        args = json.loads(sidecar.read_text())["args"]
        assert not any(isinstance(v, str) and v.startswith("/") for v in args.values()), sidecar


def test_read_meta_reads_the_header_only(tmp_path):
    m, _, _ = trained(GPTConfig.llama(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16))
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, m, args={"vq": "video_vq.safetensors"}, step=3)
    assert read_meta(path)["args"] == {"vq": "video_vq.safetensors"} and read_meta(path)["step"] == 3
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"ckpt\.safetensors: not a readable safetensors checkpoint"):
        read_meta(path)


def test_checkpoint_from_before_a_config_field_loads_and_resumes(tmp_path):
    """A checkpoint written before GPTConfig.rope_scaling existed (its config lacks the key) still loads, and resumes
    a run of today's code: the missing field counts as its default, not as another config."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    m, opt, _ = trained(GPTConfig.llama(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16))
    path = tmp_path / "old.safetensors"
    save_checkpoint(path, m, step=2, optimizer=opt)
    with safe_open(str(path), framework="pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["nanorlvr"])
    del meta["config"]["rope_scaling"]
    save_file(tensors, str(path), metadata={"nanorlvr": json.dumps(meta)})
    assert torch.equal(load_model(path)[0].rope_cos, m.rope_cos)
    m2 = GPT(m.config)
    assert resume(path, m2, torch.optim.AdamW(m2.parameters(), lr=1e-2))[0]["step"] == 2
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values()))


def test_metadata_is_read_without_the_tensors(tmp_path, monkeypatch):
    """read_meta reads the header only (a file's tensors cannot be read here), and the scripts that only want a
    checkpoint's metrics call it rather than read_checkpoint."""
    import checkpoint
    from safetensors import safe_open

    class HeaderOnly:   # safe_open whose tensors cannot be read
        def __init__(self, *a, **k):
            self.f = safe_open(*a, **k)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def metadata(self):
            return self.f.metadata()

        def keys(self):
            return self.f.keys()

        def get_tensor(self, name):
            raise AssertionError(f"read tensor {name}")

    m, _, _ = trained(GPTConfig.llama(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16))
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, m, step=3, metrics={"done": True})
    monkeypatch.setattr(checkpoint, "safe_open", HeaderOnly)
    assert read_meta(path)["metrics"] == {"done": True}
    with pytest.raises(ValueError, match="read tensor"):
        read_checkpoint(path)
    for script in ("runtime.py", "train_lang.py", "train_video.py", "mle.py"):   # they want metrics only
        assert "read_checkpoint" not in (ROOT / script).read_text(), f"{script}: read_meta reads the metadata"
