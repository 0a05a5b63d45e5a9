"""Text tokenizers: byte-level BPE, always run by tiktoken, never touching the network.

Byte-level BPE. Text is UTF-8 encoded, so every string is a sequence of bytes and the 256 single bytes are
the base tokens: nothing is ever out of vocabulary. A regex first splits the text into pre-tokens (words,
numbers, punctuation runs, whitespace runs); BPE then works inside each pre-token. Training repeatedly
fuses the most frequent adjacent pair of tokens into a new token; the order of those merges is the token's
*rank*. Encoding replays it: within a pre-token, keep fusing the adjacent pair whose concatenation has the
lowest rank until no pair is in the vocabulary. tiktoken does exactly this in Rust, with token id == rank.

The bytes<->unicode mapping. HF `tokenizers` (GPT-2, Qwen2, ...) store the vocabulary as JSON strings, and
raw bytes such as 0x0A or 0xE4 are not printable. GPT-2 therefore maps each byte to one printable unicode
character: printable Latin-1 bytes map to themselves, the other 68 bytes to chr(256), chr(257), ... in byte
order. A space (0x20) becomes "Ġ", a newline "Ċ". `from_hf` inverts this mapping to recover each token's
bytes and builds tiktoken's `mergeable_ranks` {token bytes: id}. That only reproduces HF when ids grow in
merge order (true for GPT-2, Qwen2 and anything BpeTrainer writes), so it is checked, not assumed; the
tests compare ids with HF on varied text.

The way back (`save_hf`, used by tools/export_hf.py). tiktoken keeps no merge list: inside a pre-token it
fuses whichever adjacent pair concatenates to the lowest-ranked token, while HF fuses only the pairs its
`merges` list holds, the earliest listed first. Listing every split of every token into two tokens, in the
rank order of the tokens they make, makes the two agree; HF's `ignore_merges` copies tiktoken's shortcut of
emitting a pre-token that is itself a token whole. One tie remains: two different pairs that make the same
token side by side (ab|a|ba) fuse left first in tiktoken and list first in HF; no text of the tests meets it.
HF also finds special tokens such as "<|endoftext|>" in the text it encodes, where `encode` never does.

Fast training. The naive trainer re-scans the whole corpus for every merge: tiktoken's `_educational`
trainer took 12 minutes for 1000 merges on 1 MB here. The trick: pre-tokens never interact, so count each
*distinct* pre-token once with its frequency (JSON-like text has a few thousand distinct words for
millions of bytes), keep a count per adjacent pair and, for each pair, the set of words containing it. A
merge then only rewrites the words that contain the chosen pair and adjusts their pair counts; a heap with
lazily discarded stale entries yields the next most frequent pair. Ties go to the smallest (left id,
right id), so training is deterministic. Measured here: 2.0 MB of JSON-like text to vocab 1024 in 0.4 s on
one core, two thirds of it in the regex pre-tokenization (command below; prints bytes, seconds, bytes/token):

  python -c "import json,random,time; from tokenizer_text import Tokenizer; r=random.Random(0); \
t=[json.dumps({'name':r.choice(['apple','oven','red sink','door']), 'uuid':r.randrange(10**4), \
'properties':{'isOpen':r.random()<.5, 'temperature':round(r.uniform(-5,250),1)}}) for _ in range(24000)]; \
t0=time.time(); tok=Tokenizer.train(t, 1024); s=''.join(t); \
print(len(s), time.time()-t0, len(s)/len(tok.encode(s)))"

Files: `save` writes tiktoken's `.tiktoken` format (base64 token, space, rank; one per line). Special
tokens are not part of that format; `from_tiktoken_file` adds `<|endoftext|>` with id = number of ranks,
as GPT-2 does (50256).
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

# GPT-2's pre-tokenizer, as tiktoken's gpt2/r50k encoding writes it (possessive quantifiers: same splits as
# GPT-2's original `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`, faster).
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
EOT = "<|endoftext|>"


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (see module docstring)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _check_bytes(ranks, where):
    if sum(len(token) == 1 for token in ranks) != 256:
        raise ValueError(f"{where}: the vocabulary lacks some of the 256 single-byte tokens (not byte-level)")


class Tokenizer:
    """A `tiktoken.Encoding` (`.enc`) plus the eos id; `nfc` applies the NFC normalizer (Qwen2) before encoding."""

    def __init__(self, enc, eos_id, nfc=False):
        self.enc, self.eos_id, self.nfc = enc, int(eos_id), nfc
        self.n_vocab = enc.n_vocab

    def encode(self, text):
        """Ordinary text -> ids; text such as "<|endoftext|>" is encoded as plain text, never as a special."""
        if self.nfc:
            text = unicodedata.normalize("NFC", text)
        return self.enc.encode_ordinary(text)

    def decode(self, ids):
        """Ids -> text; byte sequences that are not valid UTF-8 (a cut-off character) become U+FFFD."""
        return self.enc.decode(list(ids), errors="replace")

    def save(self, path):
        """Write the ranks as a `.tiktoken` file, atomically (temp file, then rename)."""
        path = Path(path)
        by_rank = sorted((self.enc.encode_single_token(t), t) for t in self.enc.token_byte_values())
        atomic_write_text(path, "".join(f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in by_rank))

    def save_hf(self, directory):
        """Write this tokenizer as HF byte-level BPE into `directory`: tokenizer.json (vocab, merges derived from
        the ranks as the module docstring explains, the split regex, the specials) and tokenizer_config.json
        (the eos token), for HF `tokenizers`, `transformers.AutoTokenizer` and `from_hf`."""
        directory = Path(directory)
        to_char = bytes_to_unicode()

        def text(token):   # token bytes -> the printable string HF stores
            return "".join(to_char[b] for b in token)

        ranks = {t: self.enc.encode_single_token(t) for t in self.enc.token_byte_values()}
        merges = []
        for token, _ in sorted(ranks.items(), key=lambda kv: kv[1]):   # a merge's place in the list is its rank
            splits = [(token[:i], token[i:]) for i in range(1, len(token))]
            splits = sorted((ranks[a], ranks[b], a, b) for a, b in splits if a in ranks and b in ranks)
            merges += [[text(a), text(b)] for _, _, a, b in splits]
        specials = sorted((self.enc.encode_single_token(s), s) for s in self.enc.special_tokens_set)
        spec = {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True} for i, s in specials],
            "normalizer": {"type": "NFC"} if self.nfc else None,
            # tiktoken's regex splits the text into pre-tokens, then ByteLevel maps their bytes to characters
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": self.enc._pat_str}, "behavior": "Isolated",
                 "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
            "post_processor": None,   # encoding adds no BOS / EOS, as `encode` adds none
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": True,   # a pre-token that is a token stays whole, as in tiktoken
                      "vocab": {text(t): i for t, i in sorted(ranks.items(), key=lambda kv: kv[1])},
                      "merges": merges},
        }
        eos = next(s for i, s in specials if i == self.eos_id)
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos,
                  "clean_up_tokenization_spaces": False}
        atomic_write_text(directory / "tokenizer.json", json.dumps(spec, ensure_ascii=False, indent=2) + "\n")
        atomic_write_text(directory / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")

    @classmethod
    def from_tiktoken_file(cls, path):
        path = Path(path)
        try:
            ranks = {}
            for line in path.read_bytes().splitlines():
                if line.strip():
                    token, rank = line.split()
                    ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (OSError, ValueError) as e:  # binascii.Error is a ValueError
            raise ValueError(f"cannot read tiktoken ranks file {path}: {e}") from e
        if sorted(ranks.values()) != list(range(len(ranks))):
            raise ValueError(f"{path}: ranks must be exactly 0..N-1, each once")
        _check_bytes(ranks, path)
        n = len(ranks)
        enc = tiktoken.Encoding(path.stem, pat_str=GPT2_PAT, mergeable_ranks=ranks, special_tokens={EOT: n})
        return cls(enc, n)

    @classmethod
    def from_hf(cls, path):
        """Load a byte-level BPE tokenizer.json (a HF directory holding it, or the file itself). All added tokens
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
            return ValueError(f"{file}: unsupported tokenizer ({why}); only byte-level BPE (GPT-2, Qwen2) is")

        if model.get("type") != "BPE":
            raise unsupported(f"model type {model.get('type')!r}")
        if model.get("dropout") or model.get("byte_fallback") or model.get("continuing_subword_prefix") \
                or model.get("end_of_word_suffix"):
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
        _check_bytes(ranks, file)
        # tiktoken merges by rank == id, HF by position in `merges`: they agree when ids grow in merge order.
        # Each token above the bytes is made by one merge or, as save_hf writes, by several listed side by side.
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
            raise ValueError(f"{file}: eos token {eos!r} is not among the added tokens {sorted(specials)}")
        enc = tiktoken.Encoding(f"hf:{file.parent.name}", pat_str=pat_str, mergeable_ranks=ranks,
                                special_tokens=specials)
        return cls(enc, specials[eos], nfc=normalizer is not None)

    @classmethod
    def train(cls, texts, vocab_size, pat_str=GPT2_PAT):
        """Train byte-level BPE on an iterable of strings: `vocab_size` ranks, then eos = vocab_size."""
        if vocab_size < 256:
            raise ValueError(f"vocab_size must be >= 256 (the byte tokens), got {vocab_size}")
        pattern = regex.compile(pat_str)
        counts = Counter()
        for text in texts:
            counts.update(pattern.findall(text))
        words = [list(w.encode("utf-8")) for w in counts]  # each distinct pre-token once, as token ids
        freqs = list(counts.values())

        tokens = [bytes([b]) for b in range(256)]  # id -> bytes
        ranks = {t: i for i, t in enumerate(tokens)}
        pairs, where = Counter(), defaultdict(set)  # pair -> weighted count, pair -> indices of words having it
        for i, w in enumerate(words):
            for pair in zip(w, w[1:]):
                pairs[pair] += freqs[i]
                where[pair].add(i)
        heap = [(-c, pair) for pair, c in pairs.items()]
        heapq.heapify(heap)

        while len(tokens) < vocab_size:
            if not heap:
                raise ValueError(f"training text too small: all pre-tokens are single tokens at size {len(tokens)}")
            neg_count, pair = heapq.heappop(heap)
            if pairs.get(pair) != -neg_count:
                continue  # stale heap entry: the pair's count changed since it was pushed
            merged = tokens[pair[0]] + tokens[pair[1]]
            new_id = ranks.get(merged)  # rarely, another pair already built these bytes: reuse that token
            if new_id is None:
                new_id = ranks[merged] = len(tokens)
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
        enc = tiktoken.Encoding(f"bpe{vocab_size}", pat_str=pat_str, mergeable_ranks=ranks,
                                special_tokens={EOT: vocab_size})
        return cls(enc, vocab_size)


def _merge(word, pair, new_id):
    """Replace each non-overlapping occurrence of `pair` in `word`, left to right, by `new_id`."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


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
        if "Regex" in split.get("pattern", {}) and split.get("behavior") == "Isolated" and not split.get("invert"):
            return split["pattern"]["Regex"]
    raise unsupported(f"pre-tokenizer {types}")


def load_tokenizer(path):
    """A HF directory with tokenizer.json or a tokenizer.json -> from_hf; a .tiktoken file -> from_tiktoken_file."""
    p = Path(path)
    if (p.is_dir() and (p / "tokenizer.json").is_file()) or p.name == "tokenizer.json":
        return Tokenizer.from_hf(p)
    if p.suffix == ".tiktoken":
        return Tokenizer.from_tiktoken_file(p)
    raise ValueError(f"{path}: not a tokenizer (want a HF dir with tokenizer.json, a tokenizer.json or a .tiktoken)")
