"""tokenizer.json, read with the `tokenizers` package, as our tokenizer (HFTokenizer)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional

from .byte_bpe import BYTE_OF
from .checkpoint import CheckpointError
from ..tokens.tokenizer import Encoded, PieceTable, display_pieces

_SURROGATE = re.compile("[\ud800-\udfff]")


class HFTokenizer(PieceTable):
    """Any tokenizer.json (WordPiece, byte-level BPE, SentencePiece-style BPE/Unigram) with the
    interface of core.tokens.tokenizer.WordTokenizer.

    encode(text) applies the file's own post-processor (BERT's [CLS] .. [SEP], Llama's <s>
    ...); special marks the tokens it added; tokens are display strings (byte-level pieces
    decoded to text, SentencePiece's "▁" shown as a space); offsets are character spans;
    word_ids come from the pre-tokenizer; unknown lists the typed words that became the unknown
    token. Longer input keeps the first max_len tokens (and a closing special token).
    """

    def __init__(self, path, max_len: int = 512):
        from tokenizers import Tokenizer, decoders

        try:
            self._tk = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise CheckpointError(f"{Path(path).name} cannot be read by the tokenizers package ({exc})") from None
        self._tk.no_padding()
        self._tk.no_truncation()
        self.max_len = max_len
        self._read_pieces(self._tk)
        self.byte_level = isinstance(self._tk.decoder, decoders.ByteLevel)
        self._byte_of = BYTE_OF
        self.mask_token = next((t for t in ("[MASK]", "<mask>") if t in self.index), None)
        self.mask_id = self.index.get(self.mask_token) if self.mask_token else None
        unk = next((t for t in ("[UNK]", "<unk>", "<|endoftext|>") if t in self.index), None)
        self.unk_id = self.index.get(unk) if unk in ("[UNK]", "<unk>") else None

    def token_id(self, tok: str) -> int:
        return self.index[tok] if tok in self.index else self.unk_id

    def token_str(self, i: int) -> str:
        i = int(i)
        if not 0 <= i < len(self.pieces):  # checkpoints often pad the embedding past the tokenizer's vocabulary
            return f"<id {i}>"
        piece = self.pieces[i]
        raw = self.piece_bytes(i)
        if raw is not None:
            return display_pieces([raw], [piece])[0]
        return piece.replace("\u2581", " ")

    def piece_bytes(self, i: int) -> Optional[bytes]:
        """The bytes a byte-level piece stands for (None otherwise)."""
        i = int(i)
        piece = self.pieces[i] if 0 <= i < len(self.pieces) else ""
        if self.byte_level and piece and all(c in self._byte_of for c in piece):
            return bytes(self._byte_of[c] for c in piece)
        return None

    def decode(self, ids: List[int]) -> List[str]:
        """Display strings of a sequence: a character split over pieces is shown whole, marked
        (core.tokens.tokenizer.display_pieces)."""
        return display_pieces([self.piece_bytes(i) for i in ids], [self.token_str(i) for i in ids])

    def encode(self, text: str) -> Encoded:
        from .minilm import _uncovered

        text = _SURROGATE.sub("\ufffd", str(text))
        e = self._tk.encode(text, add_special_tokens=True)
        ids, offsets = list(e.ids), [tuple(o) for o in e.offsets]
        special = [bool(s) for s in e.special_tokens_mask]
        word_ids = [None if s else w for w, s in zip(e.word_ids, special)]
        dropped = _uncovered(text, [o for o, s in zip(offsets, special) if not s])
        unknown = [text[s:t] for i, (s, t) in zip(ids, offsets) if self.unk_id is not None and i == self.unk_id]
        truncated = 0
        if self.max_len is not None and len(ids) > self.max_len:
            truncated = len(ids) - self.max_len
            keep = list(range(self.max_len - 1)) + [len(ids) - 1] if special[-1] else list(range(self.max_len))
            ids, offsets, special, word_ids = ([x[k] for k in keep] for x in (ids, offsets, special, word_ids))
        return Encoded(ids=ids, tokens=self.decode(ids), offsets=offsets, special=special,
                       unknown=unknown, dropped=dropped, truncated=truncated, word_ids=word_ids)
