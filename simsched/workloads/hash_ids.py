"""Prompt blocks named by hash ids (Mooncake-style traces) as prefix-cache content segments.

A trace's ``hash_ids`` name a prompt's blocks of ``hash_block_size`` tokens (the last one
partial): equal ids at equal positions mean equal tokens.
"""

from __future__ import annotations

import json

import numpy as np


def parse_hash_ids(value):
    """One row's hash ids (a list, tuple, array or string) as a tuple of ints >= 0; None if bad."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith("[") else text.replace(";", " ").split()
        except json.JSONDecodeError:
            return None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        return None
    out = []
    for v in value:
        try:
            i = int(v)
        except (TypeError, ValueError):
            return None
        if i < 0 or isinstance(v, bool) or (isinstance(v, float) and v != i):
            return None
        out.append(i)
    return tuple(out)


def hash_segments(hash_ids, num_tokens: int, block_tokens: int) -> tuple:
    """Prompt segments ``((hash_id, tokens), ...)`` of a prompt of ``num_tokens`` tokens.

    Each id names one block of ``block_tokens`` tokens, the last one partial; ids beyond the
    prompt are ignored. Raises ValueError if there are too few ids to cover the prompt.
    """
    need = -(-num_tokens // block_tokens)
    if len(hash_ids) < need:
        raise ValueError(f"{len(hash_ids)} hash_ids cover {len(hash_ids) * block_tokens} tokens "
                         f"of blocks of {block_tokens}, the prompt has {num_tokens}")
    last = num_tokens - (need - 1) * block_tokens
    return tuple((h, block_tokens) for h in hash_ids[:need - 1]) + ((hash_ids[need - 1], last),)


def merged_hash_segments(hash_ids, prompts, block_tokens: int) -> list:
    """:func:`hash_segments` of every row, with trace blocks merged where the data never branch.

    If every prompt that continues past a chain of blocks continues with the same next block,
    the two are one segment (the first block's id, the summed length): two prompts then still
    share exactly the tokens they shared before (a radix tree's path compression, done once for
    the whole table), and a prefix cache tracks a handful of segments per prompt instead of one
    per 512 tokens. Rows without ids (None) give None.
    """
    multi = object()
    follows: dict = {}
    cut = []
    for ids, p in zip(hash_ids, prompts):
        if ids is None:
            cut.append(None)
            continue
        need = -(-int(p) // block_tokens)
        if len(ids) < need:
            raise ValueError(f"{len(ids)} hash_ids cover {len(ids) * block_tokens} tokens of "
                             f"blocks of {block_tokens}, the prompt has {p}")
        ids = ids[:need]
        cut.append(ids)
        key = 0
        for t in range(need - 1):
            key = hash((key, ids[t]))
            nxt = ids[t + 1]
            if follows.setdefault(key, nxt) != nxt:
                follows[key] = multi
    out = []
    for ids, p in zip(cut, prompts):
        if ids is None:
            out.append(None)
            continue
        segments = []
        head, length, key = ids[0], 0, 0
        last = len(ids) - 1
        for t, h in enumerate(ids):
            length += block_tokens
            key = hash((key, h))
            if t < last and follows[key] is multi:
                segments.append((head, length))
                head, length = ids[t + 1], 0
        segments.append((head, length - (last + 1) * block_tokens + int(p)))
        out.append(tuple(segments))
    return out
