"""A deterministic byte-level BPE trainer that writes tiktoken's format (GPT-2's split pattern, EOT last).

Why a trainer of our own: with GPT-2's 50k vocabulary the LM head dominates a tiny model's compute on CPU, so the
built-in CPU configs use ~8k tokens learned on the corpus itself.

Algorithm (the classic one, made fast enough in pure Python): split the text with the tokenizer's regex, count
unique pieces ("words"), then repeatedly merge the most frequent adjacent pair of token ids over the unique words,
updating pair counts incrementally for the words that contain the merged pair only. A lazy max-heap keyed on
(−count, left id, right id) picks the pair; ties go to the smallest (left id, right id), so the result depends on
nothing but the text. Ranks 0..255 are the single bytes in byte order.
"""
from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from typing import Iterable, Optional

import regex

from data.tokenizer import R50K_PAT


def count_words(texts: Iterable[str], pat_str: str = R50K_PAT, max_bytes: Optional[int] = None) -> Counter[str]:
    """Frequency of every pre-tokenized piece in `texts` (stops after about max_bytes of text)."""
    pat = regex.compile(pat_str)
    counts: Counter[str] = Counter()
    seen = 0
    for text in texts:
        counts.update(pat.findall(text))
        seen += len(text)
        if max_bytes is not None and seen >= max_bytes:
            break
    return counts


def train_bpe(word_counts: dict[str, int], vocab_size: int) -> dict[bytes, int]:
    """Mergeable ranks for a vocabulary of `vocab_size` tokens, the EOT included (it is not a rank: it gets id
    vocab_size - 1 when loaded). Raises ValueError when the text has fewer distinct pairs than merges needed."""
    n_ranks = vocab_size - 1
    if n_ranks <= 256:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for merges (256 bytes + EOT already)")
    vocab: list[bytes] = [bytes([i]) for i in range(256)]
    id_of: dict[bytes, int] = {b: i for i, b in enumerate(vocab)}
    # Sorted so that word indices (and hence everything below) do not depend on dict insertion order.
    items = sorted((w.encode("utf-8"), c) for w, c in word_counts.items() if c > 0)
    words: list[list[int]] = [list(w) for w, _ in items]
    freqs: list[int] = [c for _, c in items]

    pair_counts: defaultdict[tuple[int, int], int] = defaultdict(int)
    where: defaultdict[tuple[int, int], set[int]] = defaultdict(set)  # may hold stale words; checked on use
    for wi, w in enumerate(words):
        f = freqs[wi]
        for pair in zip(w, w[1:]):
            pair_counts[pair] += f
            where[pair].add(wi)
    heap = [(-c, a, b) for (a, b), c in pair_counts.items()]
    heapq.heapify(heap)

    while len(vocab) < n_ranks:
        if not heap:
            raise ValueError(f"the training text allows only {len(vocab) + 1} tokens, fewer than {vocab_size}; "
                             "use more text or a smaller vocab_size")
        neg, a, b = heapq.heappop(heap)
        if pair_counts.get((a, b), 0) != -neg:
            continue  # stale entry: the count changed after it was pushed
        merged = vocab[a] + vocab[b]
        new_id = id_of.get(merged)
        if new_id is None:  # the same bytes can arise from two different splits; keep one id per byte string
            new_id = len(vocab)
            vocab.append(merged)
            id_of[merged] = new_id
        changed: set[tuple[int, int]] = set()
        for wi in where.pop((a, b)):
            w = words[wi]
            f = freqs[wi]
            new_w = _merge(w, a, b, new_id)
            if new_w is None:
                continue
            for pair in zip(w, w[1:]):
                pair_counts[pair] -= f
                changed.add(pair)
            for pair in zip(new_w, new_w[1:]):
                pair_counts[pair] += f
                where[pair].add(wi)
                changed.add(pair)
            words[wi] = new_w
        pair_counts.pop((a, b), None)
        changed.discard((a, b))
        for pair in changed:
            c = pair_counts[pair]
            if c > 0:
                heapq.heappush(heap, (-c, pair[0], pair[1]))
            else:
                del pair_counts[pair]
    return {tok: i for i, tok in enumerate(vocab)}


def _merge(w: list[int], a: int, b: int, new_id: int) -> Optional[list[int]]:
    """w with every non-overlapping (a, b), left to right, replaced by new_id; None when w has no (a, b)."""
    out: list[int] = []
    i, n, hit = 0, len(w), False
    while i < n:
        if i + 1 < n and w[i] == a and w[i + 1] == b:
            out.append(new_id)
            i += 2
            hit = True
        else:
            out.append(w[i])
            i += 1
    return out if hit else None
