"""The tokenizers of encoder-decoder checkpoint folders (core/loaders/hf_seq2seq.py), with the
interface of core.tokens.tokenizer.WordTokenizer: Marian's source.spm / target.spm (with
vocab.json), T5's tokenizer.json or spiece.model, BART's tokenizer.json.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List, Optional

from .checkpoint import CheckpointError
from ..net.config import ModelConfig
from ..tokens.tokenizer import Encoded


def _char_offsets(text: str) -> List[int]:
    """Character index of each UTF-8 byte offset of `text` (one entry past the end too)."""
    out: List[int] = []
    for ci, ch in enumerate(text):
        out += [ci] * len(ch.encode("utf-8", "surrogatepass"))
    out.append(len(text))
    return out


_SURROGATE = re.compile("[\ud800-\udfff]")


class _Pieces:
    """What the wrappers share: an id <-> string table and the Encoded assembly."""

    vocab: List[str]
    index: Dict[str, int]
    unk_id: int
    eos_id: int
    max_len: int

    def __len__(self) -> int:
        return len(self.vocab)

    def token_id(self, tok: str) -> int:
        return self.index.get(tok, self.unk_id)

    def token_str(self, i: int) -> str:
        return self.vocab[i] if 0 <= i < len(self.vocab) else f"<{i}>"

    def decode(self, ids: List[int]) -> List[str]:
        return [self.token_str(i) for i in ids]

    def _finish(self, text, ids, tokens, offsets, word_ids, special, unknown) -> Encoded:
        truncated = max(len(ids) - self.max_len, 0)
        if truncated:  # keep the closing special token
            keep = list(range(self.max_len - 1)) + [len(ids) - 1] if special[-1] else list(range(self.max_len))
            ids, tokens, offsets, word_ids, special = (
                [s[i] for i in keep] for s in (ids, tokens, offsets, word_ids, special))
        return Encoded(ids=ids, tokens=tokens, offsets=offsets, special=special, unknown=unknown,
                       truncated=truncated, word_ids=word_ids)


class SentencePieceTokenizer(_Pieces):
    """A sentencepiece model (Marian's source.spm / target.spm, T5's spiece.model) with the
    interface of core.tokens.tokenizer.WordTokenizer; </s> is appended.

    vocab: the model's ids (Marian's vocab.json: piece -> id; a piece not in it is <unk>);
    None uses the sentencepiece model's own ids (T5), padded to `size` with T5's
    <extra_id_N> names.
    """

    def __init__(self, spm_path: Path, vocab: Optional[Dict[str, int]] = None, *, eos: str = "</s>",
                 unk: str = "<unk>", max_len: int = 512, size: Optional[int] = None):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_file=str(spm_path))
        if vocab is None:
            pieces = [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]
            n = max(size or 0, len(pieces))
            pieces += [f"<extra_id_{n - 1 - i}>" for i in range(len(pieces), n)]
            vocab = {p: i for i, p in enumerate(pieces)}
            self.own_ids = True
        else:
            self.own_ids = False
        self.index = dict(vocab)
        self.vocab = [""] * (max(self.index.values()) + 1)
        for p, i in self.index.items():
            self.vocab[i] = p
        self.unk_id = self.index.get(unk, self.sp.unk_id())
        self.eos, self.eos_id = eos, self.index[eos]
        self.max_len = max_len

    def encode(self, text: str) -> Encoded:
        text = _SURROGATE.sub("\ufffd", str(text))
        proto = self.sp.encode(text, return_type="proto")
        chars = _char_offsets(text)
        ids, tokens, offsets, word_ids, unknown = [], [], [], [], []
        word = -1
        for p in proto.pieces:
            i = p.id if self.own_ids else self.index.get(p.piece, self.unk_id)
            if self.own_ids and i == self.sp.unk_id():
                i = self.unk_id
            s, t = chars[min(p.begin, len(chars) - 1)], chars[min(p.end, len(chars) - 1)]
            if p.piece.startswith("\u2581") or word < 0:
                word += 1
            ids.append(i)
            tokens.append(p.piece if i != self.unk_id else self.vocab[i])
            offsets.append((s, t))
            word_ids.append(word)
            if i == self.unk_id:
                unknown.append(text[s:t])
        n = len(ids)
        return self._finish(text, ids + [self.eos_id], tokens + [self.eos], offsets + [(0, 0)],
                            word_ids + [None], [False] * n + [True], unknown)


class JsonTokenizer(_Pieces):
    """A tokenizer.json (BART, T5) read with `tokenizers`, its own special tokens added
    (BART: <s> ... </s>; T5: ... </s>)."""

    def __init__(self, path: Path, *, eos: str = "</s>", unk: str = "<unk>", max_len: int = 512):
        from tokenizers import Tokenizer

        self._tk = Tokenizer.from_file(str(path))
        self._tk.no_padding()
        self._tk.no_truncation()
        self.index = self._tk.get_vocab(with_added_tokens=True)
        self.vocab = [""] * (max(self.index.values()) + 1)
        for p, i in self.index.items():
            self.vocab[i] = p
        self.unk_id = self.index.get(unk, -1)
        self.eos_id = self.index.get(eos, -1)
        self.max_len = max_len

    def encode(self, text: str) -> Encoded:
        text = _SURROGATE.sub("\ufffd", str(text))
        e = self._tk.encode(text, add_special_tokens=True)
        special = [bool(s) for s in e.special_tokens_mask]
        offsets = [(0, 0) if s else tuple(o) for o, s in zip(e.offsets, special)]
        word_ids = [None if s else w for w, s in zip(e.word_ids, special)]
        unknown = [text[a:b] for i, (a, b) in zip(e.ids, offsets) if i == self.unk_id]
        return self._finish(text, list(e.ids), list(e.tokens), offsets, word_ids, special, unknown)


def tokenizers_for(folder: Path, family: str, hf: dict, cfg: ModelConfig):
    """(source tokenizer, target tokenizer) for the folder."""
    max_len = cfg.max_len
    if family == "marian":
        need = [n for n in ("source.spm", "target.spm", "vocab.json") if not (folder / n).is_file()]
        if need:
            raise CheckpointError(f"{folder} lacks the Marian tokenizer files {', '.join(need)}")
        vocab = json.loads((folder / "vocab.json").read_text())
        return tuple(SentencePieceTokenizer(folder / n, vocab, max_len=max_len) for n in ("source.spm", "target.spm"))
    if (folder / "tokenizer.json").is_file():
        tok = JsonTokenizer(folder / "tokenizer.json", max_len=max_len)
        return tok, tok
    if family == "t5" and (folder / "spiece.model").is_file():
        tok = SentencePieceTokenizer(folder / "spiece.model", None, max_len=max_len, size=cfg.tgt_vocab_size)
        return tok, tok
    wanted = "tokenizer.json or spiece.model" if family == "t5" else "tokenizer.json"
    raise CheckpointError(f"{folder} has no tokenizer: {wanted} is needed")
