"""Tokenizers share one small interface: encode(text) -> Encoded.

WordTokenizer serves the bundled toy-translate model: lower-case words, one id per word,
unknown words become <unk> and are reported, punctuation is dropped and reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple


@dataclass
class Encoded:
    ids: List[int]
    tokens: List[str]
    offsets: List[Tuple[int, int]]  # character span of each token in the typed text ((0, 0) for specials)
    special: List[bool]  # True for tokens the tokenizer added ([CLS], <start>, ...)
    unknown: List[str] = field(default_factory=list)  # typed words that became <unk>
    dropped: List[str] = field(default_factory=list)  # typed characters the tokenizer ignored
    truncated: int = 0  # how many tokens were cut to fit the model's maximum length
    word_ids: List[Optional[int]] = field(default_factory=list)  # typed word of each token (None: special)

    def __len__(self) -> int:
        return len(self.ids)


_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?|\d+|\S", re.UNICODE)


class WordTokenizer:
    def __init__(self, vocab: List[str], unk: str = "<unk>", lowercase: bool = True, max_len: Optional[int] = None):
        self.vocab = list(vocab)
        self.index: Dict[str, int] = {w: i for i, w in enumerate(self.vocab)}
        self.unk = unk
        self.lowercase = lowercase
        self.max_len = max_len

    def __len__(self) -> int:
        return len(self.vocab)

    def token_id(self, tok: str) -> int:
        return self.index.get(tok, self.index[self.unk])

    def encode(self, text: str) -> Encoded:
        enc = Encoded([], [], [], [])
        for m in _WORD.finditer(text):
            word = m.group(0).lower() if self.lowercase else m.group(0)
            if not any(ch.isalnum() for ch in word):
                enc.dropped.append(word)
                continue
            if word in self.index:
                enc.ids.append(self.index[word])
                enc.tokens.append(word)
            else:
                enc.ids.append(self.index[self.unk])
                enc.tokens.append(self.unk)
                enc.unknown.append(m.group(0))
            enc.offsets.append(m.span())
            enc.special.append(False)
            enc.word_ids.append(len(enc.word_ids))
        if self.max_len is not None and len(enc.ids) > self.max_len:
            enc.truncated = len(enc.ids) - self.max_len
            for name in ("ids", "tokens", "offsets", "special", "word_ids"):
                setattr(enc, name, getattr(enc, name)[: self.max_len])
        return enc

    def token_str(self, i: int) -> str:
        return self.vocab[i]

    def decode(self, ids: List[int]) -> List[str]:
        return [self.vocab[i] for i in ids]


class PieceTable:
    """A tokenizers.Tokenizer's vocabulary both ways, for the tokenizers read from checkpoint
    files (core.loaders.hf_tokenizer.HFTokenizer, core.loaders.byte_bpe.ByteBPETokenizer): `index` (the
    file's spelling -> id), `pieces` (id -> the file's spelling), len(), and `vocab`, every
    id's display string (token_str, which the subclass defines), built on first use."""

    def _read_pieces(self, tk) -> None:
        self.index: Dict[str, int] = tk.get_vocab(with_added_tokens=True)
        self.pieces: List[str] = [""] * (max(self.index.values()) + 1)
        for t, i in self.index.items():
            self.pieces[i] = t
        self._vocab: Optional[List[str]] = None

    def __len__(self) -> int:
        return len(self.pieces)

    @property
    def vocab(self) -> List[str]:
        """Display string of every id."""
        if self._vocab is None:
            self._vocab = [self.token_str(i) for i in range(len(self.pieces))]
        return self._vocab

    def token_str(self, i: int) -> str:
        raise NotImplementedError


# ------------------------------------------------------------------------------ byte pieces as text
def _hex(b: bytes) -> str:
    return " ".join(f"{x:02x}" for x in b)


def display_pieces(raw: List[Optional[bytes]], shown: List[str]) -> List[str]:
    """Display strings for a sequence of byte-level pieces: each piece as the text it stands for.

    raw[i] is piece i's bytes (None: a control token, shown as shown[i]). A character whose
    UTF-8 bytes are split over pieces is shown whole on each of them, marked with which part
    the piece holds ("😀(1/2)", "😀(2/2)"); bytes that make no character within the sequence
    (a lone piece of an emoji) are shown as hex, "⟨f0 9f…⟩" for a start, "⟨…98 80⟩" for an end.
    Only the display changes: ids, offsets and the text the pieces decode to do not.
    """
    out = list(shown)
    n = len(raw)
    i = 0
    while i < n:
        b = raw[i]
        if b is None:
            i += 1
            continue
        try:
            out[i] = b.decode("utf-8")
            i += 1
            continue
        except UnicodeDecodeError:
            pass
        # the shortest run of byte pieces from i that decodes cleanly (a character has at most 4 bytes)
        end, text = None, None
        for j in range(i + 1, min(n, i + 4) + 1):
            if raw[j - 1] is None:
                break
            try:
                text = b"".join(raw[i:j]).decode("utf-8")
                end = j
                break
            except UnicodeDecodeError:
                continue
        if end is None:
            out[i] = _lone(b)
            i += 1
            continue
        out[i:end] = _split_chars(raw[i:end], text)
        i = end
    return out


def _lone(b: bytes) -> str:
    """Bytes that are not a whole character: what decodes as text, the rest as hex."""
    text, k = "", 0
    while k < len(b):
        for w in (4, 3, 2, 1):
            try:
                text += b[k:k + w].decode("utf-8")
                k += w
                break
            except UnicodeDecodeError:
                continue
        else:
            rest = b[k:]
            lead = rest[0] >= 0xC0
            return text + ("⟨" + _hex(rest) + "…⟩" if lead else "⟨…" + _hex(rest) + "⟩")
    return text


def _split_chars(pieces: List[bytes], text: str) -> List[str]:
    """Per piece: the characters it touches; a character split over pieces marked (k/n)."""
    spans, pos = [], 0  # byte span of each character
    for ch in text:
        w = len(ch.encode("utf-8"))
        spans.append((pos, pos + w, ch))
        pos += w
    out, start = [], 0
    for p in pieces:
        a, b = start, start + len(p)
        parts = []
        for s, t, ch in spans:
            if t <= a or s >= b:
                continue
            if a <= s and t <= b:
                parts.append(ch)
            else:
                owners = [k for k, (x, y) in enumerate(_piece_spans(pieces)) if x < t and y > s]
                parts.append(f"{ch}({owners.index(len(out)) + 1}/{len(owners)})")
        out.append("".join(parts))
        start = b
    return out


def _piece_spans(pieces: List[bytes]):
    spans, pos = [], 0
    for p in pieces:
        spans.append((pos, pos + len(p)))
        pos += len(p)
    return spans
