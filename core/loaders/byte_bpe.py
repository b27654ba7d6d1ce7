"""Byte-level BPE (GPT-2's scheme) as GGUF files carry it: the byte <-> character table of
its pieces and ByteBPETokenizer, our tokenizer interface over it. core/loaders/gguf_reader.py
rebuilds the `tokenizers` object from a GGUF vocabulary (for smollm2 and gguf_file alike);
core/loaders/hf_tokenizer.py uses the byte table for tokenizer.json files.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional

from .gguf_reader import MAX_LEN
from ..tokens.tokenizer import Encoded, PieceTable, display_pieces


def _bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's byte -> printable character table (the spelling of byte-level BPE tokens)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_OF = {c: b for b, c in _bytes_to_unicode().items()}


_SURROGATE = re.compile("[\ud800-\udfff]")


class ByteBPETokenizer(PieceTable):
    """Byte-level BPE with the interface of core.tokens.tokenizer.WordTokenizer.

    encode(text) tokenizes the text as typed (no BOS, no template). tokens are display
    strings: each token's bytes decoded as UTF-8 ("Ġthe" -> " the", "Ċ" -> "\\n"); a character
    split over tokens shows whole on each, marked "😀(1/2)", and a lone part of one as hex
    ("⟨f0 9f…⟩"), see core.tokens.tokenizer.display_pieces.
    offsets are character spans in the typed text (a leading space belongs to its token);
    special marks control tokens (<|im_start|> ...) typed in the text; word_ids number the
    pre-tokenizer's words (a word's pieces share one id; None for control tokens); unknown is
    always empty (every byte has a token). Longer input keeps the first max_len tokens and
    reports the number cut in `truncated`.
    """

    def __init__(self, tk, info: dict, max_len: Optional[int] = MAX_LEN):
        self._tk = tk
        self._tk.no_padding()
        self._tk.no_truncation()
        self.info = dict(info)
        self.max_len = max_len
        self._read_pieces(tk)  # index: file spelling -> id; pieces: id -> file spelling
        self.control_ids = set(int(i) for i in info.get("control_ids", []))
        self.eos_id: Optional[int] = info.get("eos_id")
        self.bos_id: Optional[int] = info.get("bos_id")
        self._display: Dict[int, str] = {}

    def token_id(self, piece: str) -> int:
        """Id of a token in the file's spelling ("Ġthe", "<|im_end|>")."""
        return self.index[piece]

    def token_str(self, i: int) -> str:
        i = int(i)
        s = self._display.get(i)
        if s is None:
            piece = self.pieces[i]
            raw = self.piece_bytes(i)
            s = piece if raw is None else display_pieces([raw], [piece])[0]
            self._display[i] = s
        return s

    def piece_bytes(self, i: int) -> Optional[bytes]:
        """The bytes a piece stands for (None for a control token)."""
        piece = self.pieces[int(i)]
        if int(i) in self.control_ids or any(c not in BYTE_OF for c in piece):
            return None
        return bytes(BYTE_OF[c] for c in piece)

    def decode(self, ids: List[int]) -> List[str]:
        """Display strings of a sequence: a character split over pieces is shown whole, marked
        (core.tokens.tokenizer.display_pieces)."""
        return display_pieces([self.piece_bytes(i) for i in ids], [self.token_str(i) for i in ids])

    def decode_text(self, ids: List[int]) -> str:
        """The text of a sequence of ids (byte pieces joined before UTF-8 decoding)."""
        return self._tk.decode(list(ids), skip_special_tokens=False)

    def encode(self, text: str) -> Encoded:
        text = _SURROGATE.sub("\ufffd", str(text))  # lone surrogates cannot go to Rust; same length
        e = self._tk.encode(text, add_special_tokens=False)
        ids = list(e.ids)
        offsets = [tuple(o) for o in e.offsets]
        special = [i in self.control_ids for i in ids]
        word_ids = [None if s else w for w, s in zip(e.word_ids, special)]
        covered = bytearray(len(text))
        for s, t in offsets:
            covered[s:t] = b"\x01" * (t - s)
        dropped = [ch for ch, c in zip(text, covered) if not c]
        truncated = 0
        if self.max_len is not None and len(ids) > self.max_len:
            truncated = len(ids) - self.max_len
            ids, offsets, special, word_ids = (x[: self.max_len] for x in (ids, offsets, special, word_ids))
        return Encoded(
            ids=ids,
            tokens=self.decode(ids),
            offsets=offsets,
            special=special,
            unknown=[],
            dropped=dropped,
            truncated=truncated,
            word_ids=word_ids,
        )
