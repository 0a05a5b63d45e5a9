"""Text tokenizers: byte-level BPE, always run by tiktoken, never touching the network.

Byte-level BPE. Text is UTF-8 encoded, so every string is a sequence of bytes and the 256 single
bytes are the base tokens: nothing is ever out of vocabulary. A regex first splits the text into
pre-tokens (words, numbers, punctuation runs, whitespace runs); BPE then works inside each
pre-token. Training repeatedly fuses the most frequent adjacent pair of tokens into a new token; the
order of those merges is the token's *rank*. Encoding replays it: within a pre-token, keep fusing
the adjacent pair whose concatenation has the lowest rank until no pair is in the vocabulary.
tiktoken does exactly this in Rust, with token id == rank.

This file is the `Tokenizer` (encode, decode) and its own file format. Training the ranks is
bpe.py's job (`Tokenizer.train` calls it); reading HF tokenizer files, and `load_tokenizer`, which
reads either format, are load_hf.py's; writing HF files is tools/export_hf.py's.

Files: `save` writes tiktoken's `.tiktoken` format (base64 token, space, rank; one per line).
Special tokens are not part of that format; `from_tiktoken_file` adds `<|endoftext|>` with id =
number of ranks, as GPT-2 does (50256).
"""

import base64
import unicodedata
from pathlib import Path

import tiktoken

from bpe import train_ranks
from checkpoint import atomic_write_text

# GPT-2's pre-tokenizer, as tiktoken's gpt2/r50k encoding writes it (possessive quantifiers: same
# splits as GPT-2's original
# `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`, faster).
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
EOT = "<|endoftext|>"


def check_bytes(ranks, where):
    """A ValueError naming `where` unless the ranks hold all 256 single-byte tokens."""
    if sum(len(token) == 1 for token in ranks) != 256:
        raise ValueError(f"{where}: the vocabulary lacks some of the 256 single-byte tokens "
                         f"(not byte-level)")


class Tokenizer:
    """A `tiktoken.Encoding` (`.enc`) plus the eos id; `nfc` applies the NFC normalizer (Qwen2)
    before encoding."""

    def __init__(self, enc, eos_id, nfc=False):
        self.enc, self.eos_id, self.nfc = enc, int(eos_id), nfc
        self.n_vocab = enc.n_vocab

    def encode(self, text):
        """Ordinary text -> ids; text such as "<|endoftext|>" is encoded as plain text, never as a
        special."""
        if self.nfc:
            text = unicodedata.normalize("NFC", text)
        return self.enc.encode_ordinary(text)

    def decode(self, ids):
        """Ids -> text; byte sequences that are not valid UTF-8 (a cut-off character) become
        U+FFFD, and ids that are no token (a model's embedding padded past its tokenizer, as
        Qwen2's is) are dropped: decoding never raises on model output."""
        return self.enc.decode([t for t in ids if 0 <= t < self.n_vocab], errors="replace")

    def save(self, path):
        """Write the ranks as a `.tiktoken` file, atomically (temp file, then rename)."""
        path = Path(path)
        by_rank = sorted((self.enc.encode_single_token(t), t) for t in self.enc.token_byte_values())
        atomic_write_text(path, "".join(f"{base64.b64encode(t).decode()} {rank}\n"
                                        for rank, t in by_rank))

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
        check_bytes(ranks, path)
        n = len(ranks)
        enc = tiktoken.Encoding(path.stem, pat_str=GPT2_PAT, mergeable_ranks=ranks,
                                special_tokens={EOT: n})
        return cls(enc, n)

    @classmethod
    def train(cls, texts, vocab_size, pat_str=GPT2_PAT):
        """Train byte-level BPE on an iterable of strings (bpe.py): `vocab_size` ranks, then
        eos = vocab_size."""
        ranks = train_ranks(texts, vocab_size, pat_str)
        enc = tiktoken.Encoding(f"bpe{vocab_size}", pat_str=pat_str, mergeable_ranks=ranks,
                                special_tokens={EOT: vocab_size})
        return cls(enc, vocab_size)
