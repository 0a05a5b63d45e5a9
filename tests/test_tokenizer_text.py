"""Tests for tokenizer_text.py (its BPE trainer, .tiktoken files, HF tokenizer loading): id parity with HF `tokenizers`
(the oracle) on GPT-2- and Qwen2-style byte-level BPE files built offline, .tiktoken round trips, the trainer (against
a naive reference trainer), and clear errors."""

import json
import random
import re
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from tokenizer_text import GPT2_PAT, Tokenizer, load_hf_tokenizer, load_tokenizer

QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
             r"|\s+(?!\S)|\s+")

SAMPLES = [
    "Hello world! It's a test, isn't it? We'll see; they've done it, I'd say, you're right, I'm sure.",
    "IT'S LOUD. DON'T SHOUT'LL",
    "numbers: 7 42 123 2024 31415926 0.5 -17 1e10 3,000,000",
    "  leading spaces\tand\ttabs\n\n\nthree newlines   \n  trailing   ",
    "\r\nwindows\r\nlines\r\n",
    "中文分词测试：你好，世界！日本語のテキストも。한국어 문장.",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧 flags 🇫🇷 mixed😀text",
    "café naïve résumé Ångström — “quotes” «guillemets» …",
    json.dumps({"name": "sink (ID: 5)", "uuid": 5, "properties": {"isOpen": False, "temp": -3.25}, "contains": []}),
    '{"modified": [{"uuid": 12, "type": "Tool"}], "removed": [3, 4], "score": {}}',
    "def f(x):\n\tif x>=10:\n\t\treturn x**2  # comment\n    pass\n",
    "",
    " ",
    "a",
    "!!!???...;;;",
]


def corpus():
    rng = random.Random(0)
    words = ["the", "sink", "is", "open", "it's", "don't", "garden", "water", "tree", "objects", "中文",
             "你好", "世界", "😀", "🎉", "café", "résumé", "score", "gameOver", "\t", "  ", "\n", "\n\n", "123", "4567"]
    texts = list(SAMPLES)
    for i in range(400):
        texts.append(" ".join(rng.choice(words) for _ in range(rng.randrange(3, 15))))
        texts.append(json.dumps({"uuid": i, "name": rng.choice(words), "value": round(rng.uniform(-100, 100), 2),
                                 "flags": [rng.random() < 0.5 for _ in range(3)]}, ensure_ascii=False))
    return texts


def train_hf(pre_tokenizer, normalizer, specials, extra_specials, tmp_dir):
    hf = HFTokenizer(models.BPE())
    hf.normalizer = normalizer
    hf.pre_tokenizer = pre_tokenizer
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(corpus(), trainer)
    hf.add_special_tokens(extra_specials)
    tmp_dir.mkdir()
    hf.save(str(tmp_dir / "tokenizer.json"))
    return hf


@pytest.fixture(scope="module")
def gpt2_style(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf") / "gpt2"
    hf = train_hf(pre_tokenizers.ByteLevel(add_prefix_space=False), None, ["<|endoftext|>"], [], d)
    return hf, d


@pytest.fixture(scope="module")
def qwen2_style(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf") / "qwen2"
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_PAT), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf = train_hf(pre, normalizers.NFC(), [], ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], d)
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}}))
    return hf, d


@pytest.mark.parametrize("style", ["gpt2_style", "qwen2_style"])
def test_hf_parity(style, request):
    hf, d = request.getfixturevalue(style)
    tok = load_hf_tokenizer(d)
    assert tok.n_vocab == hf.get_vocab_size()
    for text in SAMPLES:
        ids = tok.encode(text)
        assert ids == hf.encode(text).ids, text
        assert tok.decode(ids) == text
    decomposed = "cafe\u0301 A\u030angstro\u0308m"  # Qwen2 normalizes to NFC ("café Ångström"), GPT-2 does not
    assert tok.encode(decomposed) == hf.encode(decomposed).ids
    # Specials: encode() treats them as plain text; the Encoding maps them to HF's ids when allowed.
    text = "<|endoftext|>hi <|im_start|>x<|im_end|>" if style == "qwen2_style" else "a<|endoftext|>b"
    assert tok.enc.encode(text, allowed_special="all") == hf.encode(text).ids
    assert hf.token_to_id("<|endoftext|>") not in tok.encode(text)
    assert tok.decode(tok.encode(text)) == text


def test_hf_eos_and_paths(gpt2_style, qwen2_style):
    hf, d = gpt2_style
    assert load_hf_tokenizer(d / "tokenizer.json").eos_id == hf.token_to_id("<|endoftext|>") == 0
    hf, d = qwen2_style
    assert load_tokenizer(d).eos_id == hf.token_to_id("<|im_end|>")


@pytest.fixture(scope="module")
def both_styles(gpt2_style, qwen2_style):
    return [(hf, load_hf_tokenizer(d)) for hf, d in (gpt2_style, qwen2_style)]


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=60))
def test_hf_parity_random_text(both_styles, text):
    for hf, tok in both_styles:
        assert tok.encode(text) == hf.encode(text).ids


def test_gpt2_pattern_is_tiktokens():
    from tiktoken_ext.openai_public import r50k_pat_str  # a constant; nothing is downloaded

    assert GPT2_PAT == r50k_pat_str


@pytest.fixture(scope="module")
def trained():
    return Tokenizer.train(corpus(), 700)


def test_train_vocab_determinism_and_compression(trained):
    assert trained.n_vocab == 701 and trained.eos_id == 700
    assert len(trained.enc.token_byte_values()) == 700
    again = Tokenizer.train(corpus(), 700)
    assert ranks(again) == ranks(trained)
    text = "\n".join(corpus())
    assert len(text.encode()) / len(trained.encode(text)) > 2.5


def ranks(tok):
    return {t: tok.enc.encode_single_token(t) for t in tok.enc.token_byte_values()}


def naive_train(texts, vocab_size):
    """Reference: recount every pair of every pre-token occurrence at each merge (slow, obviously right)."""
    import regex

    words = [list(w.encode()) for t in texts for w in regex.findall(GPT2_PAT, t)]
    tokens = [bytes([b]) for b in range(256)]
    while len(tokens) < vocab_size:
        counts = Counter(p for w in words for p in zip(w, w[1:]))
        best = min(counts, key=lambda p: (-counts[p], p))
        tokens.append(tokens[best[0]] + tokens[best[1]])
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == best:
                    w[i:i + 2] = [len(tokens) - 1]
                i += 1
    return tokens


def test_train_matches_naive_trainer():
    texts = corpus()[:120]
    tok = Tokenizer.train(texts, 400)
    assert sorted(tok.enc.token_byte_values(), key=tok.enc.encode_single_token) == naive_train(texts, 400)


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_train_round_trip_unseen(trained, text):
    assert trained.decode(trained.encode(text)) == text


def test_tiktoken_file_round_trip(trained, tmp_path):
    path = tmp_path / "mine.tiktoken"
    trained.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.tiktoken"]  # no temp file left behind
    tok = load_tokenizer(path)
    assert tok.eos_id == 700 == len(path.read_text().splitlines())
    for text in SAMPLES + ["<|endoftext|> 中文 😀"]:
        assert tok.encode(text) == trained.encode(text)
    assert tok.enc.encode("<|endoftext|>", allowed_special="all") == [700]


def test_decode_is_lenient(trained):
    cut = trained.enc.encode_single_token(bytes([0xE4]))  # first byte of a 3-byte CJK character
    assert trained.decode([cut]) == "\ufffd"


def test_errors_name_the_path(tmp_path, gpt2_style, trained):
    missing = tmp_path / "nope"
    for load in (load_hf_tokenizer, Tokenizer.from_tiktoken_file, load_tokenizer):
        with pytest.raises(ValueError, match="nope"):
            load(missing)
    corrupt = tmp_path / "bad" / "tokenizer.json"
    corrupt.parent.mkdir()
    corrupt.write_text('{"model": {"type": "BPE", "vocab": ')
    with pytest.raises(ValueError, match=re.escape(str(corrupt))):
        load_tokenizer(corrupt.parent)
    bad_ranks = tmp_path / "bad.tiktoken"
    bad_ranks.write_text("!!notbase64 0\n")
    with pytest.raises(ValueError, match="bad.tiktoken"):
        load_tokenizer(bad_ranks)
    with pytest.raises(ValueError, match="vocab_size"):
        Tokenizer.train(["abc"], 100)
    with pytest.raises(ValueError, match="too small"):
        Tokenizer.train(["abc"], 300)


def edited(gpt2_dir, tmp_path, edit):
    spec = json.loads((gpt2_dir / "tokenizer.json").read_text())
    edit(spec)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    return path


def test_unsupported_tokenizers(tmp_path, gpt2_style):
    hf, d = gpt2_style

    def swap_merged_ids(spec):
        vocab = spec["model"]["vocab"]
        a, b = ("".join(m) if isinstance(m, list) else m.replace(" ", "") for m in spec["model"]["merges"][:2])
        vocab[a], vocab[b] = vocab[b], vocab[a]

    cases = {
        "merge order": swap_merged_ids,
        "WordLevel": lambda s: s["model"].update(type="WordLevel"),
        "Whitespace": lambda s: s.update(pre_tokenizer={"type": "Whitespace"}),
        "add_prefix_space": lambda s: s["pre_tokenizer"].update(add_prefix_space=True),
        "Lowercase": lambda s: s.update(normalizer={"type": "Lowercase"}),
        "eos": lambda s: s["added_tokens"][0].update(content="<|other|>"),
    }
    for message, edit in cases.items():
        path = edited(d, tmp_path, edit)
        with pytest.raises(ValueError, match=message) as err:
            load_hf_tokenizer(path)
        assert str(path) in str(err.value)
    # Sanity: an unedited copy loads, so the failures above come from the edits.
    assert load_hf_tokenizer(edited(d, tmp_path, lambda s: None)).n_vocab == hf.get_vocab_size()
    with pytest.raises(ValueError, match="not a tokenizer"):
        load_tokenizer(tmp_path / "weights.bin")
