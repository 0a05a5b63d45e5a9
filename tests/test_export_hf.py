"""tools/export_hf.py: HF transformers / tokenizers (the oracles) read the exported directory with
our logits and ids, our loaders (what `train_lang.py --init=OUT_DIR` uses) read it back exactly, and
bad inputs are one-line errors that write nothing."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from checkpoint import save_checkpoint  # noqa: E402
from tasks import load_lang_model  # noqa: E402
from data.textgame import task  # noqa: E402
from data.textgame.simulator import generate_split  # noqa: E402
from engine import generate  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from tokenizer_text import EOT, Tokenizer, load_hf_tokenizer, load_tokenizer  # noqa: E402
from tools.export_hf import export, save_hf_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXTGAME = ROOT / "checkpoints" / "textgame" / "mle.safetensors"
TIKTOKEN = ROOT / "checkpoints" / "textgame" / "tokenizer.tiktoken"
UNICODE = ["café naïve — “quotes” … 中文分词 你好，世界！ 한국어 😀🎉👍🏽 👨‍👩‍👧",
           "  leading spaces\tand tabs\n\n\nthree newlines   \n  trailing   ",
           "it's DON'T 3,000 -17 1e10", ""]


@pytest.fixture(scope="module")
def records():
    """Three real text-game transitions (the simulator's first test records): two change the state,
    one does not."""
    recs = generate_split("test", 6, seed=0)
    changed = [r for r in recs if task.is_changed(r)]
    return changed[:2] + [next(r for r in recs if not task.is_changed(r))]


def texts(records):
    return [task.prompt_text(r) + task.target_text(r) for r in records]


@pytest.fixture(scope="module")
def textgame_hf(tmp_path_factory):
    return export(TEXTGAME, tmp_path_factory.mktemp("export") / "textgame")


def tiny_checkpoint(directory, config):
    """A random GPT of ours saved as a checkpoint beside the shipped text-game tokenizer, every norm
    weight and bias moved off its initial 1 / 0 so that a misplaced tensor changes the logits."""
    torch.manual_seed(0)
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    shutil.copyfile(TIKTOKEN, directory / "tokenizer.tiktoken")
    save_checkpoint(directory / "tiny.safetensors", model, args={"tokenizer": "tokenizer.tiktoken"})
    return directory / "tiny.safetensors"


TINY = {   # vocab 452 > the tokenizer's 449 ids: padded embeddings, as an HF base model may have
    "gpt2": GPTConfig.gpt2(vocab_size=452, block_size=64, n_layer=2, n_head=4, n_embd=32),
    "llama": GPTConfig.llama(vocab_size=452, block_size=64, n_layer=2, n_head=4, n_kv_head=2,
                             n_embd=32, head_dim=16, mlp_hidden=48, rope_theta=500.0, norm_eps=1e-6,
                             tie_embeddings=False),
    "qwen2": GPTConfig.llama(vocab_size=452, block_size=64, n_layer=2, n_head=4, n_kv_head=2,
                             n_embd=32, qkv_bias=True),
    # Llama 3.1's RoPE scaling, its frequencies in all three bands (kept, blended, slowed)
    "llama_scaled": GPTConfig.llama(vocab_size=452, block_size=64, n_layer=2, n_head=4, n_embd=32,
                                    head_dim=16, rope_theta=500.0, tie_embeddings=False,
                                    rope_scaling={"rope_type": "llama3", "factor": 4.0,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 32}),
}


def assert_hf_matches_ours(ours, tok, out, prompts):
    """transformers' logits equal ours (< 1e-4) on `prompts` (cut to block_size), and our loaders
    read `out` back to identical logits and ids."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    back, back_tok, _ = load_lang_model(out)
    for text in prompts:
        ids = tok.encode(text) + [tok.eos_id]
        x = torch.tensor([ids[:ours.config.block_size]])
        with torch.no_grad():
            want = ours(x)[0]
            got = hf(x).logits
            assert torch.allclose(got, want, atol=1e-4, rtol=0), (got - want).abs().max()
            assert torch.equal(back.eval()(x)[0], want)
        assert back_tok.encode(text) == tok.encode(text) and back_tok.eos_id == tok.eos_id
    return hf


def test_textgame_checkpoint(textgame_hf, records):
    ours, tok, _ = load_lang_model(TEXTGAME)
    hf = assert_hf_matches_ours(ours.eval(), tok, textgame_hf, texts(records))
    assert hf.config.model_type == "llama" and hf.config.eos_token_id == tok.eos_id == 448
    ids = tok.encode(task.prompt_text(records[0]))   # greedy continuations agree, EOS included
    out, _ = generate(ours, [ids], 60, temperature=0.0, eos_id=tok.eos_id)
    mine = [t for t in out[0].tolist() if t >= 0]   # -1 pads after the EOS
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([ids]), max_new_tokens=60, do_sample=False)[0, len(ids):]
    assert theirs.tolist() == mine and mine[-1] == tok.eos_id


def test_tokenizer_ids(textgame_hf, records):
    tok = Tokenizer.from_tiktoken_file(TIKTOKEN)
    raw = tokenizers.Tokenizer.from_file(str(textgame_hf / "tokenizer.json"))
    auto = transformers.AutoTokenizer.from_pretrained(textgame_hf)
    for text in texts(records) + UNICODE:
        want = tok.encode(text) + [tok.eos_id]   # the training data's EOS, written as its text
        assert raw.encode(text + EOT).ids == want
        assert auto(text + EOT)["input_ids"] == want
        assert auto.decode(want, skip_special_tokens=True) == tok.decode(want[:-1])
    assert auto.eos_token_id == tok.eos_id and raw.get_vocab_size() == tok.n_vocab


def test_trained_and_hf_tokenizers_round_trip(tmp_path):
    """Any tokenizer of ours exports: one trained here on unicode text, and a Qwen2-style HF one
    (NFC, its own regex, several specials, <|im_end|> as EOS) whose export encodes as the original
    does."""
    from test_tokenizer_text import QWEN2_PAT, SAMPLES, corpus, train_hf
    trained = Tokenizer.train(corpus(), 600)
    pre = tokenizers.pre_tokenizers.Sequence([
        tokenizers.pre_tokenizers.Split(tokenizers.Regex(QWEN2_PAT), behavior="isolated"),
        tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    original = train_hf(pre, tokenizers.normalizers.NFC(), [], [EOT, "<|im_start|>", "<|im_end|>"],
                        tmp_path / "qwen2")
    (tmp_path / "qwen2" / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>"}')
    qwen = load_hf_tokenizer(tmp_path / "qwen2")
    for name, tok in (("trained", trained), ("qwen", qwen)):
        save_hf_tokenizer(tok, tmp_path / name)
        raw = tokenizers.Tokenizer.from_file(str(tmp_path / name / "tokenizer.json"))
        back = load_tokenizer(tmp_path / name)
        assert back.eos_id == tok.eos_id and back.nfc == tok.nfc
        for text in SAMPLES + UNICODE:
            assert raw.encode(text).ids == tok.encode(text) == back.encode(text), (name, text)
            if name == "qwen":
                assert original.encode(text).ids == tok.encode(text)
    assert qwen.eos_id == raw.token_to_id("<|im_end|>")


@pytest.mark.parametrize("family", sorted(TINY))
def test_tiny_models(family, tmp_path, records):
    ckpt = tiny_checkpoint(tmp_path, TINY[family])
    out = export(ckpt, tmp_path / "hf")
    ours, tok, _ = load_lang_model(ckpt)
    hf = assert_hf_matches_ours(ours.eval(), tok, out, texts(records) + UNICODE[:1])
    assert hf.config.model_type == family.removesuffix("_scaled")
    assert load_lang_model(out)[0].config == ours.config   # rope_scaling written and read back


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="nope.safetensors: checkpoint file not found"):
        export(tmp_path / "nope.safetensors", tmp_path / "a")
    with pytest.raises(ValueError, match="video world model"):
        export(ROOT / "checkpoints" / "video_cond_mle.safetensors", tmp_path / "a")
    odd = GPTConfig(vocab_size=452, block_size=64, n_layer=1, n_head=2, n_embd=16, pos="learned")
    with pytest.raises(ValueError, match="no HF model type fits"):
        export(tiny_checkpoint(tmp_path, odd), tmp_path / "a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.json", "tiny.safetensors",
                                                          "tokenizer.tiktoken"]   # nothing written
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    ckpt = tiny_checkpoint(tmp_path, TINY["qwen2"])
    with pytest.raises(ValueError, match="not empty.*--force"):
        export(ckpt, full)
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    with pytest.raises(ValueError, match="holds the checkpoint"):   # even --force keeps the source
        export(ckpt, tmp_path, force=True)
    export(ckpt, full, force=True)   # replaced whole; no temp directories left beside it
    assert not (full / "keep.txt").exists() and (full / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cli_errors_are_one_line(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "export_hf.py"),
                          str(tmp_path / "nope.safetensors"), str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode != 0 and "nope.safetensors" in run.stderr
    assert run.stderr.strip().count("\n") == 0   # one line, no traceback
    assert not (tmp_path / "out").exists()
