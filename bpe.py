"""Byte-level BPE training: the ranks of a vocabulary learned from text (`Tokenizer.train` in
tokenizer_text.py wraps them in a tiktoken encoding).

Training repeatedly fuses the most frequent adjacent pair of tokens into a new token; the order of
those merges is the token's rank. The naive trainer re-scans the whole corpus for every merge:
tiktoken's `_educational` trainer took 12 minutes for 1000 merges on 1 MB here. The trick:
pre-tokens never interact, so count each *distinct* pre-token once with its frequency (JSON-like
text has a few thousand distinct words for millions of bytes), keep a count per adjacent pair and,
for each pair, the set of words containing it. A merge then only rewrites the words that contain
the chosen pair and adjusts their pair counts; a heap with lazily discarded stale entries yields the
next most frequent pair. Ties go to the smallest (left id, right id), so training is deterministic.
Measured here: 2.0 MB of JSON-like text to vocab 1024 in 0.4 s on one core, two thirds of it in the
regex pre-tokenization (command below; prints bytes, seconds, bytes/token):

  python -c "import json,random,time; from tokenizer_text import Tokenizer; r=random.Random(0); \
t=[json.dumps({'name':r.choice(['apple','oven','red sink','door']), 'uuid':r.randrange(10**4), \
'properties':{'isOpen':r.random()<.5, 'temperature':round(r.uniform(-5,250),1)}}) \
for _ in range(24000)]; t0=time.time(); tok=Tokenizer.train(t, 1024); s=''.join(t); \
print(len(s), time.time()-t0, len(s)/len(tok.encode(s)))"
"""
import heapq
from collections import Counter, defaultdict

import regex  # a dependency of tiktoken; supports \p{L} and possessive quantifiers


def train_ranks(texts, vocab_size, pat_str):
    """Byte-level BPE trained on an iterable of strings, split into pre-tokens by the regex
    `pat_str` -> tiktoken's mergeable ranks {token bytes: rank}, `vocab_size` of them."""
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
            raise ValueError(f"training text too small: all pre-tokens are single tokens at size "
                             f"{len(tokens)}")
        neg_count, pair = heapq.heappop(heap)
        if pairs.get(pair) != -neg_count:
            continue  # stale heap entry: the pair's count changed since it was pushed
        merged = tokens[pair[0]] + tokens[pair[1]]
        # rarely, another pair already built these bytes: reuse that token
        new_id = ranks.get(merged)
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
    return ranks


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
