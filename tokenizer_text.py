"""Text tokenizers: byte-level BPE, always run by tiktoken, never touching the network.

Text is UTF-8 encoded, so the 256 single bytes are the base tokens: nothing is ever out of
vocabulary. A regex first splits the text into pre-tokens (words, numbers, punctuation runs,
whitespace runs); BPE then works inside each pre-token. Training repeatedly fuses the most frequent
adjacent pair of tokens into a new token; the order of those merges is the token's *rank*.
Encoding replays it: within a pre-token, keep fusing the adjacent pair whose concatenation has the
lowest rank. tiktoken does exactly this in Rust, with token id == rank.

Training (`train_ranks`) fast: pre-tokens never interact, so each *distinct* pre-token is counted
once with its frequency, with a count per adjacent pair and, per pair, the words containing it. A
merge rewrites only those words; a heap with lazily discarded stale entries yields the next most
frequent pair: seconds for megabytes, where re-scanning the corpus for every merge (tiktoken's
`_educational` trainer) takes many minutes. Files: our `.tiktoken` (`save`, `from_tiktoken_file`)
and HF's tokenizer.json (`load_hf_tokenizer`); `load_tokenizer` reads either.
"""
import base64
import heapq
import json
import unicodedata
from collections import Counter, defaultdict
from pathlib import Path

import regex  # a dependency of tiktoken; supports \p{L} and possessive quantifiers
import tiktoken

from checkpoint import atomic_write_text

# GPT-2's pre-tokenizer as tiktoken writes it: GPT-2's splits, with faster possessive quantifiers
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
EOT = "<|endoftext|>"
# the special tokens transformers hands a chat template (its special_tokens_map), by name
CHAT_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
               "mask_token")


def check_bytes(ranks, where):
    """A ValueError naming `where` unless the ranks hold all 256 single-byte tokens."""
    if sum(len(token) == 1 for token in ranks) != 256:
        raise ValueError(f"{where}: the vocabulary lacks some of the 256 single-byte tokens")


class Tokenizer:
    """A `tiktoken.Encoding` (`.enc`) plus the eos id; `nfc`: NFC-normalize first (Qwen2)."""
    def __init__(self, enc, eos_id, nfc=False, chat=None):
        self.enc, self.eos_id, self.nfc, self.n_vocab = enc, int(eos_id), nfc, enc.n_vocab
        self.chat = chat   # an HF chat model's (compiled chat template, its special tokens)

    def encode(self, text):
        """Text -> ids; "<|endoftext|>" in the text is plain text, never the special token."""
        return self.enc.encode_ordinary(unicodedata.normalize("NFC", text) if self.nfc else text)

    def prompt(self, text):
        """A prompt's ids: encode(text), or, for a chat model, the text as one user message and the
        generation prompt, rendered by the chat template (its special tokens read as such)."""
        if self.chat is None:
            return self.encode(text)
        template, tokens = self.chat
        text = template.render(messages=[{"role": "user", "content": text}],
                               add_generation_prompt=True, **tokens)
        return self.enc.encode(unicodedata.normalize("NFC", text) if self.nfc else text,
                               allowed_special="all")

    def decode(self, ids):
        """Ids -> text, never raising on model output: invalid UTF-8 becomes U+FFFD, and ids that
        are no token (a model's embedding padded past its tokenizer, as Qwen2's is) are dropped."""
        return self.enc.decode([t for t in ids if 0 <= t < self.n_vocab], errors="replace")

    def save(self, path):
        """Write the ranks as tiktoken's `.tiktoken` file (a base64 token, a space, its rank)."""
        by_rank = sorted((self.enc.encode_single_token(t), t) for t in self.enc.token_byte_values())
        atomic_write_text(path, "".join(f"{base64.b64encode(t).decode()} {rank}\n"
                                        for rank, t in by_rank))

    @classmethod
    def from_tiktoken_file(cls, path):
        """Our `.tiktoken` file (see `save`) -> Tokenizer, eos <|endoftext|> after the ranks."""
        path = Path(path)
        try:
            lines = [line.split() for line in path.read_bytes().splitlines() if line.strip()]
            ranks = {base64.b64decode(token, validate=True): int(rank) for token, rank in lines}
        except (OSError, ValueError) as e:  # binascii.Error is a ValueError
            raise ValueError(f"cannot read tiktoken ranks file {path}: {e}") from e
        if sorted(ranks.values()) != list(range(len(ranks))):
            raise ValueError(f"{path}: ranks must be exactly 0..N-1, each once")
        check_bytes(ranks, path)
        return cls.from_ranks(ranks, path.stem)

    @classmethod
    def train(cls, texts, vocab_size, pat_str=GPT2_PAT):
        """Byte-level BPE trained on an iterable of strings: vocab_size ranks, eos = vocab_size."""
        return cls.from_ranks(train_ranks(texts, vocab_size, pat_str), f"bpe{vocab_size}", pat_str)

    @classmethod
    def from_ranks(cls, ranks, name, pat_str=GPT2_PAT):
        """tiktoken's ranks {token bytes: rank}, then <|endoftext|> as the eos."""
        enc = tiktoken.Encoding(name, pat_str=pat_str, mergeable_ranks=ranks,
                                special_tokens={EOT: len(ranks)})
        return cls(enc, len(ranks))


# ----------------------------------------------------------------------------- training

def train_ranks(texts, vocab_size, pat_str):
    """Byte-level BPE on strings split by the regex `pat_str` -> `vocab_size` mergeable ranks."""
    if vocab_size < 256:
        raise ValueError(f"vocab_size must be >= 256 (the byte tokens), got {vocab_size}")
    pattern = regex.compile(pat_str)
    counts = Counter(word for text in texts for word in pattern.findall(text))
    words = [list(w.encode("utf-8")) for w in counts]  # each distinct pre-token once, as token ids
    freqs = list(counts.values())
    tokens = [bytes([b]) for b in range(256)]  # id -> bytes
    ranks = {t: i for i, t in enumerate(tokens)}
    # pair -> weighted count, pair -> indices of words having it
    pairs, where = Counter(), defaultdict(set)
    for i, w in enumerate(words):
        for pair in zip(w, w[1:]):
            pairs[pair] += freqs[i]
            where[pair].add(i)
    heap = [(-c, pair) for pair, c in pairs.items()]
    heapq.heapify(heap)
    while len(tokens) < vocab_size:
        if not heap:
            raise ValueError(f"training text too small: every pre-token one token at {len(tokens)}")
        neg_count, pair = heapq.heappop(heap)
        if pairs.get(pair) != -neg_count:
            continue  # stale heap entry: the pair's count changed since it was pushed
        merged = tokens[pair[0]] + tokens[pair[1]]
        # a new token, or, rarely, the one that another pair already built from these bytes
        new_id = ranks.setdefault(merged, len(tokens))
        if new_id == len(tokens):
            tokens.append(merged)
        changed = set()
        for i in sorted(where.pop(pair)):
            old = words[i]
            new = _merge(old, pair, new_id)
            if len(new) == len(old):
                continue
            for p in zip(old, old[1:]):
                pairs[p] -= freqs[i]
                changed.add(p)
            for p in zip(new, new[1:]):
                pairs[p] += freqs[i]
                where[p].add(i)
                changed.add(p)
            words[i] = new
        for p in changed:
            if pairs[p] > 0:
                heapq.heappush(heap, (-pairs[p], p))
            else:
                del pairs[p]
    return ranks


def _merge(word, pair, new_id):
    """Replace each non-overlapping occurrence of `pair` in `word`, left to right, by `new_id`."""
    out, i = [], 0
    while i < len(word):
        hit = i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]
        out.append(new_id if hit else word[i])
        i += 2 if hit else 1
    return out


# ----------------------------------------------------------------------------- HF tokenizer files

def bytes_to_unicode():
    """GPT-2's byte -> printable character table of HF tokenizer.json files: printable Latin-1 bytes
    themselves and the other 68 chr(256), chr(257), ... (a space is "Ġ")."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}


def load_hf_tokenizer(path):
    """A byte-level BPE tokenizer.json (or a HF directory holding it) -> Tokenizer. Added tokens
    become tiktoken specials; HF's post-processor is ignored (encode() never adds BOS/EOS)."""
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
    pat_str = hf_pattern(spec.get("pre_tokenizer"), unsupported)
    specials = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    ranks = hf_ranks(model, set(specials.values()), file, unsupported)
    config, tokens = hf_config(file)
    eos = tokens.get("eos_token") or EOT
    if eos not in specials:
        raise ValueError(f"{file}: eos token {eos!r} is no added token {sorted(specials)}")
    enc = tiktoken.Encoding(f"hf:{file.parent.name}", pat_str=pat_str, mergeable_ranks=ranks,
                            special_tokens=specials)
    # a chat model's template renders its prompts: compiled in the sandboxed jinja2 environment
    # transformers' apply_chat_template uses (jinja2 comes with torch)
    template, chat = config.get("chat_template"), None
    if isinstance(template, str):
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        chat = (env.from_string(template), tokens)
    return Tokenizer(enc, specials[eos], nfc=normalizer is not None, chat=chat)


def hf_ranks(model, special_ids, file, unsupported):
    """tiktoken's ranks (token bytes -> id) of a HF BPE "model" object, special_ids left out."""
    byte_of = {c: b for b, c in bytes_to_unicode().items()}

    def to_bytes(token):
        try:
            return bytes(byte_of[c] for c in token)
        except KeyError:
            raise unsupported(f"token {token!r} is not in the byte-level alphabet") from None

    # added tokens can also sit in the vocab (GPT-2's <|endoftext|>): they stay specials only
    ranks = {to_bytes(t): i for t, i in model["vocab"].items() if i not in special_ids}
    check_bytes(ranks, file)
    # tiktoken merges by rank == id, HF by place in `merges`: they agree when ids grow in merge
    # order (a token made by several merges, as tools/export_hf.py writes, has them side by side)
    merges = [m.split(" ") if isinstance(m, str) else m for m in model.get("merges", [])]
    merged_ids = [ranks.get(to_bytes(a) + to_bytes(b), -1) for a, b in merges]
    if -1 in merged_ids or len(set(merged_ids)) != len(ranks) - 256 \
            or merged_ids != sorted(merged_ids):
        raise unsupported("vocab ids do not follow the merge order, which tiktoken needs")
    return ranks


def hf_config(file):
    """The tokenizer_config.json beside `file` ({} if none) and its special tokens (CHAT_TOKENS)."""
    config_file, config, tokens = file.parent / "tokenizer_config.json", {}, {}
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
            # the special tokens by name; older configs store an AddedToken dict
            tokens = {k: v.get("content") if isinstance(v, dict) else v for k, v in config.items()
                      if k in CHAT_TOKENS and v}
        except (OSError, ValueError, AttributeError) as e:
            raise ValueError(f"cannot read {config_file}: {e!r}") from e
    return config, tokens


def hf_pattern(pre, unsupported):
    """The split regex of GPT-2's ByteLevel pre-tokenizer, or of Qwen2's Split then ByteLevel."""
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre]
    types = [s and s.get("type") for s in steps]
    if any(t == "ByteLevel" and s.get("add_prefix_space") for t, s in zip(types, steps)):
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
    """A tokenizer file: an HF directory or its tokenizer.json, or our .tiktoken -> Tokenizer."""
    p = Path(path)
    if (p.is_dir() and (p / "tokenizer.json").is_file()) or p.name == "tokenizer.json":
        return load_hf_tokenizer(p)
    if p.suffix == ".tiktoken":
        return Tokenizer.from_tiktoken_file(p)
    raise ValueError(f"{path}: not a tokenizer (an HF dir with tokenizer.json, or a .tiktoken)")
