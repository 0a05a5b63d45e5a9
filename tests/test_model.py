"""model.py against HF transformers (the oracle), loaded by checkpoint.load_model: logits of both families, the
shared-prompt pass, loading errors, RoPE scaling; the plain GPT.generate; no import circle in the core. engine.py's
sampler, held equal to GPT.generate, is tested in test_engine.py."""
import pytest
import torch

from checkpoint import config_from_hf, load_model
from model import GPT, GPTConfig

torch.set_num_threads(1)
transformers = pytest.importorskip("transformers")


def hf_gpt2(tmp_path):
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    m.save_pretrained(tmp_path, safe_serialization=True)
    return m


def hf_qwen2(tmp_path, tie=False):
    cfg = transformers.Qwen2Config(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rope_theta=1000.0, rms_norm_eps=1e-6, tie_word_embeddings=tie)
    torch.manual_seed(0)
    m = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # random (non-zero) biases so the q/k/v bias path is really exercised
        for n, p in m.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.1)
    m.save_pretrained(tmp_path, safe_serialization=True)
    return m


def test_logits_match_hf(pair):
    hf, ours = pair
    idx = torch.randint(0, 90, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(idx).logits
        got, _ = ours(idx)
    assert got.shape == ref.shape
    assert torch.allclose(got, ref, atol=1e-4, rtol=0), (got - ref).abs().max()


def test_shared_prompt_pass_equals_concatenated(pair):
    _, ours = pair  # forward(prompts=): each prompt run once for the rows continuing it, same logits as the full rows
    g = torch.Generator().manual_seed(0)
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12, 13]]
    conts = torch.randint(0, 90, (5, 6), generator=g)
    rows = torch.tensor([0, 0, 1, 1, 1])
    L = max(map(len, prompts))
    prompt_idx = torch.tensor([p + [0] * (L - len(p)) for p in prompts])
    with torch.no_grad():
        shared, _ = ours(conts, prompts=(prompt_idx, torch.tensor([3, 7]), rows))
        for n in range(5):
            p = prompts[int(rows[n])]
            full, _ = ours(torch.tensor([p + conts[n].tolist()]))
            assert torch.allclose(shared[n], full[0, len(p):], atol=1e-5)
        # at: the rows run by length in passes (model.ROW_PASSES), each cut to its longest; the
        # logits of the positions at, in row order. Rows of 6, 1, 0, 4 and 2 positions
        at = torch.arange(6) < torch.tensor([6, 1, 0, 4, 2])[:, None]
        at[3, 1] = False   # a gap: a row's length runs to its last position with a target
        passes, _ = ours(conts, prompts=(prompt_idx, torch.tensor([3, 7]), rows), at=at)
        assert passes.shape == (int(at.sum()), shared.size(-1))
        assert torch.allclose(passes, shared[at], atol=1e-5)


def test_plain_generate_crops_to_the_block_and_stops_at_eos():
    torch.manual_seed(0)
    m = GPT(GPTConfig.gpt2(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16)).eval()
    out = m.generate(torch.tensor([[1, 2, 3, 4, 5, 6]]), 10, temperature=0)
    assert out.shape == (1, 16)   # past block_size: the model sees the last 8 tokens
    for t in range(6, 16):
        logits, _ = m(out[:, max(0, t - 8):t])
        assert int(out[0, t]) == int(logits[0, -1].argmax())
    prompts = torch.tensor([[1, 2], [3, 4]])
    out = m.generate(prompts, 40, eos_id=5, generator=torch.Generator().manual_seed(0))
    drew_eos = (out[:, 2:] == 5).any(1)
    assert out.size(1) < 42 and drew_eos.all() and (out[:, -1] == 5).any()  # stopped once both did


def test_training_loss_and_counts():
    m = GPT(GPTConfig.llama(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=32))
    idx, targets = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    logits, loss = m(idx, targets)
    assert logits.shape == (2, 16, 64) and abs(loss.item() - torch.log(torch.tensor(64.0)).item()) < 0.5
    assert m.num_params() == sum(p.numel() for p in m.parameters()) - 64 * 32   # the (tied) embedding left out


def test_missing_tensor_is_a_clear_error(tmp_path):
    from safetensors.torch import load_file, save_file
    hf_qwen2(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    sd.pop("model.layers.1.mlp.up_proj.weight")
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="up_proj"):
        load_model(tmp_path)


def test_truncated_weights_name_the_file(tmp_path):
    hf_gpt2(tmp_path)
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(ValueError, match="model.safetensors"):
        load_model(tmp_path)


def test_sharded_checkpoint_loads(tmp_path):
    hf = hf_qwen2(tmp_path / "src")
    hf.save_pretrained(tmp_path / "sharded", safe_serialization=True, max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ours, meta = load_model(tmp_path / "sharded")
    assert meta["args"]["tokenizer"] == str((tmp_path / "sharded").resolve())   # as our checkpoints name theirs
    ours.eval()
    idx = torch.randint(0, 90, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(ours(idx)[0], hf(idx).logits, atol=1e-4, rtol=0)


LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}


def hf_llama(tmp_path, rope_scaling):
    """A tiny Llama whose RoPE is stretched from 32 to 128 positions: with head_dim 16 its frequencies fall in all
    three bands of llama3's scaling (kept, blended, slowed)."""
    cfg = transformers.LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                   rms_norm_eps=1e-6, rope_scaling=dict(rope_scaling))  # HF writes into it
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg).eval()
    m.save_pretrained(tmp_path, safe_serialization=True)
    return m


@pytest.mark.parametrize("rope_scaling", [LLAMA3, {"rope_type": "linear", "factor": 4.0}])
def test_rope_scaling_matches_hf(tmp_path, rope_scaling):
    hf = hf_llama(tmp_path, rope_scaling)
    ours = load_model(tmp_path)[0].eval()
    assert ours.config.rope_scaling == rope_scaling
    idx = torch.randint(0, 101, (2, 100), generator=torch.Generator().manual_seed(3))   # past the original 32
    with torch.no_grad():
        ref, got = hf(idx).logits, ours(idx)[0]
    assert torch.allclose(got, ref, atol=1e-4, rtol=0), (got - ref).abs().max()
    plain = GPT(GPTConfig(**{**vars(ours.config), "rope_scaling": None}))   # the scaling changes the tables
    assert not torch.allclose(plain.rope_cos, ours.rope_cos, atol=1e-3)


def test_rope_scaling_spellings_and_refusals():
    base = dict(model_type="llama", vocab_size=16, max_position_embeddings=64, num_hidden_layers=1,
                num_attention_heads=2, hidden_size=16, intermediate_size=32, rms_norm_eps=1e-6)
    old = {k: v for k, v in LLAMA3.items() if k != "rope_type"}
    for hf in ({"rope_scaling": LLAMA3},                                       # transformers 4
               {"rope_scaling": {"type": "llama3", **old}},                    # older files
               {"rope_parameters": {**LLAMA3, "rope_theta": 500.0}}):          # transformers 5
        assert config_from_hf({**base, **hf}, "config.json").rope_scaling == LLAMA3
    assert config_from_hf({**base, "rope_scaling": {"type": "linear", "factor": 2}}, "c").rope_scaling \
        == {"rope_type": "linear", "factor": 2.0}
    assert config_from_hf({**base, "rope_parameters": {"rope_type": "default"}}, "c").rope_scaling is None
    with pytest.raises(ValueError, match=r"^config\.json: rope scaling 'yarn' unsupported") as e:
        config_from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "config.json")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"^config\.json: rope scaling 'llama3' needs numbers"):
        config_from_hf({**base, "rope_scaling": {"rope_type": "llama3", "factor": 4.0}}, "config.json")


def test_loaded_model_is_whole_in_its_dtype(pair, tmp_path):
    """The loader builds the model on the meta device and reads the tensors into it: nothing is left on meta, tied
    embeddings stay one parameter, the RoPE tables are a fresh model's, and a bfloat16 load holds bfloat16 tensors."""
    _, ours = pair
    tensors = dict(ours.named_parameters()) | dict(ours.named_buffers())
    assert not any(t.is_meta for t in tensors.values())
    assert (ours.lm_head.weight is ours.wte.weight) == ours.config.tie_embeddings
    fresh = GPT(ours.config)
    for name, t in fresh.named_buffers():
        assert torch.equal(t, tensors[name]), name
    half = load_model(tmp_path, device="cpu", dtype=torch.bfloat16)[0]
    assert all(t.dtype == torch.bfloat16 for t in half.state_dict().values())
    for name, t in ours.state_dict().items():
        assert torch.equal(half.state_dict()[name], t.to(torch.bfloat16)), name


def test_core_imports_form_no_circle():
    """model.py imports nothing of the project, and the top-level files' imports (those inside functions too) form no
    circle: checkpoint.py loads models, tokenizer_text.py tokenizers, and neither needs the other's importer."""
    import ast
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    core = {p.stem: p for p in root.glob("*.py")}
    deps = {}
    for name, path in core.items():
        found, tree = set(), ast.parse(path.read_text())
        # a script's `if __name__ == "__main__":` block runs only as the program, a module of its own (__main__):
        # its imports (eval.py's dispatch to video_eval.py) close no circle
        main = {id(n) for top in tree.body if isinstance(top, ast.If)
                and ast.unparse(top.test) == "__name__ == '__main__'" for n in ast.walk(top)}
        for n in ast.walk(tree):
            if id(n) in main:
                continue
            if isinstance(n, ast.Import):
                found |= {a.name.split(".")[0] for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                found.add(n.module.split(".")[0])
        assert "research" not in found, f"{name}.py imports research/"
        deps[name] = found & core.keys() - {name}
    assert deps["model"] == set()
    done, path = set(), []

    def visit(name):   # depth first; a module met again on the current path closes a circle
        assert name not in path, "import circle: " + " -> ".join(path[path.index(name):] + [name])
        if name not in done:
            path.append(name)
            for d in sorted(deps[name]):
                visit(d)
            path.pop()
            done.add(name)
    for name in sorted(deps):
        visit(name)
