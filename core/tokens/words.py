"""Word-level attention: word pieces merged back into the words that were typed.

A word-piece tokenizer splits "embeddings" into "em", "##bed", "##ding", "##s". To read
attention in words, each n_q x n_k matrix A (or H x n_q x n_k stack) becomes W_q x W_k:

    key side   (columns): SUM   over the pieces of a word.  How much a query attends to a
                          word is the total weight it gives to that word's pieces, so every
                          row still sums to 1.
    query side (rows):    MEAN  over the pieces of a word.  A word's row is the average of
                          its pieces' rows; an average of rows that sum to 1 sums to 1.

    A_words[a, b] = (1 / |a|) * sum_{i in a} sum_{j in b} A[i, j]      i.e.  A_words = M A S

with M (W_q x n_q) holding 1/|a| for the pieces i of word a and S (n_k x W_k) holding 1 for
the pieces j of word b. Special tokens ([CLS], [SEP], <start>, padding, ...) have no typed
word and stay their own "word"; so does any position the metadata does not describe (the
padding a trace adds with pad_to). Words are ordered by their first piece.

Groups come from the tokenizer's `word_ids` (one id per piece, None for specials), which
a Trace keeps in trace.meta["word_ids"] with "special" and "offsets". Labels are the typed
text of each word (from the character offsets), or its pieces joined when the text is not
at hand. Pure torch and Python: no Streamlit.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

Groups = List[List[int]]


def word_groups(word_ids: Sequence[Optional[int]], n: Optional[int] = None, special: Optional[Sequence[bool]] = None) -> Groups:
    """Token positions of each word, in order of each word's first piece.

    word_ids[i] is the typed word of token i (None: a special token, its own group).
    `special` (optional) marks tokens that are their own group whatever their word id.
    n (default len(word_ids)) is the number of positions; positions beyond word_ids are
    their own groups.
    """
    n = len(word_ids) if n is None else n
    groups: Groups = []
    where = {}
    for i in range(n):
        w = word_ids[i] if i < len(word_ids) else None
        is_special = w is None or (special is not None and i < len(special) and special[i])
        if is_special:
            groups.append([i])
        elif w in where:
            groups[where[w]].append(i)
        else:
            where[w] = len(groups)
            groups.append([i])
    return groups


def _matrices(groups: Groups, n: int, dtype, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """M (W x n): 1/|group| on the group's positions; S (n x W): 1 on them."""
    w = len(groups)
    mean = torch.zeros(w, n, dtype=dtype, device=device)
    total = torch.zeros(n, w, dtype=dtype, device=device)
    for g, pos in enumerate(groups):
        if any(p < 0 or p >= n for p in pos):
            raise ValueError(f"group {g} has positions outside 0..{n - 1}: {pos}")
        mean[g, pos] = 1.0 / len(pos)
        total[pos, g] = 1.0
    covered = total.sum(1)
    if not torch.all(covered == 1):
        raise ValueError("every position must belong to exactly one group")
    return mean, total


def merge_attention(attn: torch.Tensor, query_groups: Groups, key_groups: Optional[Groups] = None) -> torch.Tensor:
    """Word-level attention from piece-level attention.

    attn: (..., n_q, n_k), e.g. one head (n x n) or all heads (H x n x n).
    query_groups: positions of each query word (rows: MEAN over a word's pieces).
    key_groups: positions of each key word (columns: SUM); default query_groups
    (self-attention). Returns (..., W_q, W_k); rows that summed to 1 still do.
    """
    n_q, n_k = attn.shape[-2], attn.shape[-1]
    key_groups = query_groups if key_groups is None else key_groups
    dtype = attn.dtype if attn.is_floating_point() else torch.float32
    mean_q, _ = _matrices(query_groups, n_q, dtype, attn.device)
    _, sum_k = _matrices(key_groups, n_k, dtype, attn.device)
    return mean_q @ attn.to(dtype) @ sum_k


def word_attention(
    attn: torch.Tensor,
    word_ids: Sequence[Optional[int]],
    special: Optional[Sequence[bool]] = None,
) -> torch.Tensor:
    """Self-attention (..., n, n) merged to words (..., W, W) from one token list's word_ids."""
    groups = word_groups(word_ids, attn.shape[-1], special)
    return merge_attention(attn, groups)


def word_labels(
    groups: Groups,
    tokens: Sequence[str],
    offsets: Optional[Sequence[Sequence[int]]] = None,
    text: Optional[str] = None,
    continuation: str = "##",
) -> List[str]:
    """The label of each group: the typed text of the word (text[first start : last end])
    when `text` and `offsets` are given, else its pieces joined (continuation prefix
    removed). Special tokens and positions without offsets keep their token string."""
    labels = []
    for pos in groups:
        spans = []
        if text is not None and offsets is not None:
            spans = [tuple(offsets[p]) for p in pos if p < len(offsets) and tuple(offsets[p]) != (0, 0)]
        if spans:
            labels.append(text[min(s for s, _ in spans) : max(e for _, e in spans)])
        elif len(pos) == 1:
            labels.append(tokens[pos[0]])
        else:
            parts = [tokens[p] for p in pos]
            labels.append(parts[0] + "".join(t[len(continuation) :] if t.startswith(continuation) else t for t in parts[1:]))
    return labels


def trace_words(trace, text: Optional[str] = None) -> Tuple[Groups, List[str]]:
    """Groups and labels of a Trace's source tokens (from meta: word_ids, special, offsets);
    pass the typed `text` for labels in its own spelling (a Trace does not keep the text)."""
    tokens = trace.tokens("source")
    meta = trace.meta
    groups = word_groups(meta.get("word_ids", []), len(tokens), meta.get("special"))
    return groups, word_labels(groups, tokens, meta.get("offsets"), text)
