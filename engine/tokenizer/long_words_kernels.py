"""The numba kernels behind long_words: a span-hash table of merges and llama.cpp's pair-queue merge loop.

Imported only when a word of LONG_WORD code points or more arrives (numba's import and its cache load are not
free). All hashing is uint64 arithmetic that wraps; every hash hit is confirmed code point by code point, so a
collision costs a probe, never a wrong merge. The queue is a binary heap of int64 keys, priority << 32 | left
(the left symbol's start; for SPM also the pair's length); see merge_word for when a popped pair is current.
"""
from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_LOW32 = np.int64(0xFFFFFFFF)


@njit(cache=True, inline="always")
def _mix(h, tag):
    """splitmix-style finaliser of a span hash and its split tag."""
    x = h ^ (np.uint64(tag) * _GOLDEN)
    x ^= x >> np.uint64(33)
    x *= _M1
    x ^= x >> np.uint64(33)
    x *= _M2
    x ^= x >> np.uint64(33)
    return x


@njit(cache=True)
def build_table(flat, offsets, tags, any_split, mul):
    """Open-addressing table (int64 entry index, -1 empty) of every string flat[offsets[e]:offsets[e + 1]]."""
    n = offsets.shape[0] - 1
    size = 16
    while size < 2 * n:
        size *= 2
    mask = np.uint64(size - 1)
    table = np.full(size, -1, dtype=np.int64)
    for e in range(n):
        h = np.uint64(0)
        for j in range(offsets[e], offsets[e + 1]):
            h = h * mul + np.uint64(flat[j]) + np.uint64(1)
        tag = 0 if any_split else tags[e]
        slot = _mix(h, tag) & mask
        while table[slot] != -1:
            slot = (slot + np.uint64(1)) & mask
        table[slot] = e
    return table


@njit(cache=True)
def _find(prefix, powers, cps, a, mid, b, table, flat, offsets, tags, any_split, max_len):
    """The table entry whose string is cps[a:b] (split at mid unless any_split), or -1."""
    length = b - a
    if length > max_len:
        return -1
    h = prefix[b] - prefix[a] * powers[length]
    tag = 0 if any_split else mid - a
    mask = np.uint64(table.shape[0] - 1)
    slot = _mix(h, tag) & mask
    while True:
        e = table[slot]
        if e < 0:
            return -1
        start = offsets[e]
        if offsets[e + 1] - start == length and (any_split or tags[e] == tag):
            same = True
            for j in range(length):
                if flat[start + j] != cps[a + j]:
                    same = False
                    break
            if same:
                return e
        slot = (slot + np.uint64(1)) & mask


_MEMO_BITS = 12  # a direct-mapped memo of recent lookups: degenerate words repeat the same few spans


@njit(cache=True)
def _find_memo(prefix, powers, cps, a, mid, b, table, flat, offsets, tags, any_split, max_len, memo_key, memo):
    """_find through a small memo (the big table's cache misses dominate on repetitive words). A memo hit is
    confirmed against the word's own earlier span (same code points, same split), so it is never wrong."""
    length = b - a
    if length > max_len:
        return -1
    h = prefix[b] - prefix[a] * powers[length]
    tag = 0 if any_split else mid - a
    key = _mix(h, tag)
    slot = np.int64(key >> np.uint64(64 - _MEMO_BITS))
    if memo_key[slot] == key and memo[slot, 0] == length and memo[slot, 1] == tag:
        start = memo[slot, 2]
        same = True
        for j in range(length):
            if cps[start + j] != cps[a + j]:
                same = False
                break
        if same:
            return memo[slot, 3]
    e = _find(prefix, powers, cps, a, mid, b, table, flat, offsets, tags, any_split, max_len)
    memo_key[slot] = key
    memo[slot, 0] = length
    memo[slot, 1] = tag
    memo[slot, 2] = a
    memo[slot, 3] = e
    return e


@njit(cache=True)
def _sift_down(keys, size, i):
    while True:
        child = 2 * i + 1
        if child >= size:
            return
        if child + 1 < size and keys[child + 1] < keys[child]:
            child += 1
        if keys[i] <= keys[child]:
            return
        keys[i], keys[child] = keys[child], keys[i]
        i = child


@njit(cache=True)
def _sift_up(keys, i):
    while i > 0:
        parent = (i - 1) // 2
        if keys[parent] <= keys[i]:
            return
        keys[i], keys[parent] = keys[parent], keys[i]
        i = parent


@njit(cache=True)
def merge_word(cps, table, flat, offsets, tags, priorities, any_split, max_len, mul):
    """llama.cpp's merge loop on one word; returns (starts, lengths, table entries or -1) of the final symbols."""
    n = cps.shape[0]
    prefix = np.zeros(n + 1, dtype=np.uint64)
    for i in range(n):
        prefix[i + 1] = prefix[i] * mul + np.uint64(cps[i]) + np.uint64(1)
    powers = np.ones(max_len + 2, dtype=np.uint64)
    for i in range(1, max_len + 2):
        powers[i] = powers[i - 1] * mul
    memo_key = np.zeros(1 << _MEMO_BITS, dtype=np.uint64)
    memo = np.full((1 << _MEMO_BITS, 4), -1, dtype=np.int64)  # length, tag, span start, entry
    lens = np.ones(n, dtype=np.int64)
    last = np.full(n, -1, dtype=np.int64)  # the table entry a merged symbol's string is (-1: one code point)
    nxt = np.arange(1, n + 1)
    prv = np.arange(-1, n - 1)
    if n > 0:
        nxt[n - 1] = -1
    # SPM (any split) with short tokens: the key carries the pair's total length, priority << 40 | left << 8 |
    # total, and a popped pair is current when the symbols now at `left` still add up to it (any split of the
    # same span is the same token, so the same priority); otherwise priority << 32 | left and a lookup decides
    packed = any_split and max_len < 256 and n < (1 << 32)
    # the first pairs (all of two one-code-point symbols) wait in one sorted array; only pairs that merges
    # create go through the heap, so most pops cost no sifting
    first = np.empty(max(n - 1, 0), dtype=np.int64)
    n_first = 0
    for i in range(n - 1):
        e = _find_memo(prefix, powers, cps, i, i + 1, i + 2, table, flat, offsets, tags, any_split, max_len,
                       memo_key, memo)
        if e >= 0:
            first[n_first] = ((priorities[e] << 40) | (i << 8) | 2) if packed else ((priorities[e] << 32) | i)
            n_first += 1
    first = np.sort(first[:n_first])
    pos = 0
    keys = np.empty(1024, dtype=np.int64)
    size = 0
    while size > 0 or pos < n_first:
        if size == 0 or (pos < n_first and first[pos] < keys[0]):
            key = first[pos]
            pos += 1
        else:
            key = keys[0]
            size -= 1
            keys[0] = keys[size]
            _sift_down(keys, size, 0)
        if packed:
            left = (key >> 8) & _LOW32
            right = nxt[left] if lens[left] > 0 else -1
            if right < 0 or lens[left] + lens[right] != (key & 0xFF):
                continue  # outdated: the symbols at `left` changed since this pair was queued
        else:
            left = key & _LOW32
            if lens[left] == 0:
                continue  # merged into its left neighbour since this pair was queued
            right = nxt[left]
            if right < 0:
                continue
            # current when the pair now at `left` has the queued priority: for BPE (one rank per merge) the
            # same pair; for SPM a pair of equal score at the same place, which llama.cpp's queue pops next
            e = _find_memo(prefix, powers, cps, left, right, right + lens[right], table, flat, offsets, tags,
                           any_split, max_len, memo_key, memo)
            if e < 0 or priorities[e] != key >> 32:
                continue
            last[left] = e
        lens[left] += lens[right]
        lens[right] = 0
        after = nxt[right]
        nxt[left] = after
        if after >= 0:
            prv[after] = left
        for a, b in ((prv[left], left), (left, after)):
            if a < 0 or b < 0:
                continue
            e = _find_memo(prefix, powers, cps, a, b, b + lens[b], table, flat, offsets, tags, any_split, max_len,
                           memo_key, memo)
            if e < 0:
                continue
            if size == keys.shape[0]:
                keys = np.concatenate((keys, np.empty_like(keys)))
            if packed:
                keys[size] = (priorities[e] << 40) | (a << 8) | (lens[a] + lens[b])
            else:
                keys[size] = (priorities[e] << 32) | a
            _sift_up(keys, size)
            size += 1
    count = 0
    i = 0 if n > 0 else -1
    while i >= 0:
        count += 1
        i = nxt[i]
    starts = np.empty(count, dtype=np.int64)
    out_lens = np.empty(count, dtype=np.int64)
    entries = np.empty(count, dtype=np.int64)
    i = 0 if n > 0 else -1
    k = 0
    while i >= 0:
        starts[k] = i
        out_lens[k] = lens[i]
        if packed and lens[i] > 1:  # the token this symbol is, looked up once at the end
            entries[k] = _find(prefix, powers, cps, i, i + 1, i + lens[i], table, flat, offsets, tags, any_split,
                               max_len)
        else:
            entries[k] = last[i]
        k += 1
        i = nxt[i]
    return starts, out_lens, entries
