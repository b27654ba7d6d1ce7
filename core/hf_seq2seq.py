"""Encoder-decoder checkpoints from a Hugging Face folder: Marian, BART and T5.

    model = core.hf_seq2seq.load(Path("opus-mt-en-de"))      # -> AttentionModel
    trace = model.trace("The cat sat on the mat.", target="Die Katze saß auf der Matte.")

A folder holds config.json (its model_type picks the family), the weights as *.safetensors
(one file, or shards listed in model.safetensors.index.json) and the tokenizer. Tensors are
read through safetensors' memory map, one at a time, and converted to float32 (the
computation dtype on every device; on CUDA the float32 network is moved to the GPU). Pickle
(pytorch_model.bin) is never loaded: such a folder gets a message saying how to convert it.
A tensor the family needs that is missing, has the wrong shape, or a tensor left over that
nothing reads, is an error that names it -- never a silently random layer.

Families (our Transformer, core/model.py, configured by ModelConfig):

    marian  post-norm, sinusoidal positions laid out sin | cos by halves (not interleaved),
            token embeddings times sqrt(d) (scale_embedding), swish (silu) FFN, output
            projection tied to the shared embedding plus final_logits_bias; the decoder
            starts from <pad>. Tokens: source.spm (source) and target.spm (target) with
            sentencepiece, pieces mapped to ids through vocab.json, </s> appended.
    bart    post-norm, learned positions stored with an offset of 2 (rows 2.. are positions
            0..), LayerNorm after the embedding sum (layernorm_embedding), gelu, tied output
            projection plus final_logits_bias. Tokens: tokenizer.json (<s> ... </s>).
    t5      pre-norm with RMS norms (no mean, no bias), no position vectors: a bucketed
            relative position bias, learned in layer 0 of each stack and shared by its layers,
            is added to the scores (bidirectional buckets in the encoder, backwards only in the
            decoder; trace name {stack}.{i}.self_attn.position_bias), no 1/sqrt(d_k) on the
            scores, relu or gated-gelu FFN, no biases, final norms; with tied embeddings the
            last hidden state is scaled by d^-0.5 before the output projection. The decoder
            starts from <pad>. Tokens: tokenizer.json, else spiece.model (sentencepiece);
            </s> appended.

Weight names (checkpoint -> ours; a leading "model." is dropped; i = layer; "|" lists
alternatives, the first one present is used; Linear and LayerNorm rows stand for .weight
and .bias):

    bart / marian
        encoder.embed_tokens | shared               -> src_embed.tok
        decoder.embed_tokens | shared               -> tgt_embed.tok
        lm_head | decoder.embed_tokens | shared     -> out_proj.weight;  final_logits_bias -> out_proj.bias
        {encoder,decoder}.embed_positions           -> {src,tgt}_embed.pos   (bart: rows 2..)
        {encoder,decoder}.layernorm_embedding       -> {src,tgt}_embed.norm  (bart)
        {stack}.layers.{i}.self_attn.{q,k,v,out}_proj -> {stack}.{i}.self_attn.w_{q,k,v,o}
        {stack}.layers.{i}.self_attn_layer_norm     -> {stack}.{i}.norms.0
        decoder.layers.{i}.encoder_attn.*_proj      -> decoder.{i}.cross_attn.w_*
        decoder.layers.{i}.encoder_attn_layer_norm  -> decoder.{i}.norms.1
        {stack}.layers.{i}.fc1 / fc2                -> {stack}.{i}.ffn.w_1 / w_2
        {stack}.layers.{i}.final_layer_norm         -> {stack}.{i}.norms.1 (encoder) / .2 (decoder)
    t5
        shared | encoder.embed_tokens / decoder.embed_tokens -> src_embed.tok / tgt_embed.tok
        lm_head | shared                            -> out_proj.weight
        {stack}.block.0.layer.0.SelfAttention.relative_attention_bias -> {stack}_bias.emb
        {stack}.block.{i}.layer.0.SelfAttention.{q,k,v,o} -> {stack}.{i}.self_attn.w_{q,k,v,o}
        {stack}.block.{i}.layer.0.layer_norm        -> {stack}.{i}.norms.0
        decoder.block.{i}.layer.1.EncDecAttention.* -> decoder.{i}.cross_attn.*;  layer.1.layer_norm -> norms.1
        {stack}.block.{i}.layer.{f}.DenseReluDense.wi | wi_0 / wi_1 / wo -> ffn.w_1 / w_3 / w_2
        {stack}.block.{i}.layer.{f}.layer_norm      -> {stack}.{i}.norms.{f}   (f = 1 encoder, 2 decoder)
        {stack}.final_layer_norm                    -> {stack}_norm
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .api import AttentionModel
from .checkpoint import CheckpointError, open_checkpoint, read_config
from .config import ModelConfig
from .device import pick_device
from .model import Transformer
from .positional import sinusoidal_encoding
from .tokenizer import Encoded

FAMILIES = ("marian", "bart", "t5")

EXAMPLES = [
    "The cat sat on the mat.",
    "The animal didn't cross the street because it was too tired.",
    "I would like a cup of coffee, please.",
]


# ------------------------------------------------------------------------------ files
class _Weights:
    """The checkpoint's tensors by name, a leading "model." dropped; core.checkpoint reads them
    on demand from the memory-mapped safetensors files (never a pickle)."""

    def __init__(self, folder: Path):
        self._ckpt = open_checkpoint(folder, auto_class="AutoModelForSeq2SeqLM")
        self.where: Dict[str, str] = {(key[len("model."):] if key.startswith("model.") else key): key
                                      for key in self._ckpt.names()}

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def names(self) -> List[str]:
        return list(self.where)

    def get(self, name: str) -> torch.Tensor:
        return self._ckpt.get(self.where[name], dtype=None)


# (our name, checkpoint names -- the first present is used, optional transform)
Row = Tuple[str, Sequence[str], Optional[Callable[[torch.Tensor], torch.Tensor]]]


def _fill(net: Transformer, weights: _Weights, table: List[Row], ignore: re.Pattern) -> None:
    """Put the checkpoint's tensors into `net` (built on the meta device), or say which are
    missing, of the wrong shape, or left over."""
    want = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    state: Dict[str, torch.Tensor] = {}
    used, missing, wrong = set(), [], []
    read: Dict[str, torch.Tensor] = {}  # a tensor read once, shared where the model ties it
    for ours, theirs, fn in table:
        name = next((n for n in theirs if n in weights), None)
        if name is None:
            missing.append(theirs[0])
            continue
        used.add(name)
        if name not in read:
            read[name] = weights.get(name).to(torch.float32)
        t = read[name]
        t = fn(t) if fn is not None else t
        if tuple(t.shape) != want[ours]:
            wrong.append(f"{name} {tuple(t.shape)} (expected {want[ours]})")
            continue
        state[ours] = t
    left = [n for n in weights.names() if n not in used and not ignore.match(n)]
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if wrong:
        problems.append(f"tensors of the wrong shape: {', '.join(wrong)}")
    if left:
        problems.append(f"tensors this loader does not know (another architecture?): {', '.join(left[:8])}"
                        + (f" and {len(left) - 8} more" if len(left) > 8 else ""))
    if problems:
        raise CheckpointError("the checkpoint does not fit its config.json: " + "; ".join(problems))
    unfilled = sorted(set(want) - set(state))
    if unfilled:  # a table that forgets a parameter is a bug here, not in the checkpoint
        raise RuntimeError(f"parameters not filled from the checkpoint: {unfilled}")
    net.load_state_dict(state, strict=True, assign=True)


def _same(hf: dict, *keys):
    vals = {k: hf.get(k) for k in keys}
    if len({v for v in vals.values() if v is not None}) > 1:
        raise CheckpointError(f"encoder and decoder differ in {vals}; only equal sizes are supported")
    return next((v for v in vals.values() if v is not None), None)


# ------------------------------------------------------------------------------ bart / marian
_BART_ACT = {"gelu": "gelu", "relu": "relu", "swish": "silu", "silu": "silu", "gelu_new": "gelu_tanh"}


def _bart_config(hf: dict, family: str) -> ModelConfig:
    act = hf.get("activation_function", "gelu")
    if act not in _BART_ACT:
        raise CheckpointError(f"unsupported activation_function {act!r} (supported: {', '.join(_BART_ACT)})")
    if hf.get("normalize_before") or hf.get("add_final_layer_norm"):
        raise CheckpointError("pre-norm BART variants (normalize_before) are not supported")
    if family == "marian" and hf.get("share_encoder_decoder_embeddings") is False:
        raise CheckpointError("Marian checkpoints with separate source and target vocabularies are not supported")
    d = hf["d_model"]
    vocab = hf["vocab_size"]
    return ModelConfig(
        kind="encoder-decoder",
        d_model=d,
        n_heads=_same(hf, "encoder_attention_heads", "decoder_attention_heads"),
        d_ff=_same(hf, "encoder_ffn_dim", "decoder_ffn_dim"),
        n_layers=hf["encoder_layers"],
        n_decoder_layers=hf["decoder_layers"],
        src_vocab_size=vocab,
        tgt_vocab_size=hf.get("decoder_vocab_size") or vocab,
        max_len=hf.get("max_position_embeddings", 1024),
        positional="sinusoidal" if family == "marian" else "learned",
        sinusoid_layout="half",
        norm="layernorm",
        norm_eps=1e-5,
        norm_placement="post",
        final_norm=False,
        activation=_BART_ACT[act],
        bias=True,
        out_bias=True,
        embed_scale=bool(hf.get("scale_embedding", False)),
        embed_norm=family == "bart",
        pad_id=hf.get("pad_token_id", 1),
        extra={"family": family},
    )


def _bart_table(cfg: ModelConfig, family: str) -> List[Row]:
    rows: List[Row] = [
        ("src_embed.tok.weight", ["encoder.embed_tokens.weight", "shared.weight"], None),
        ("tgt_embed.tok.weight", ["decoder.embed_tokens.weight", "shared.weight"], None),
        ("out_proj.weight", ["lm_head.weight", "decoder.embed_tokens.weight", "shared.weight"], None),
        ("out_proj.bias", ["final_logits_bias"], lambda t: t.reshape(-1)),
    ]
    if family == "bart":
        for ours, theirs in (("src_embed", "encoder"), ("tgt_embed", "decoder")):
            rows.append((f"{ours}.pos.weight", [f"{theirs}.embed_positions.weight"], lambda t: t[2:]))
            rows += [(f"{ours}.norm.{p}", [f"{theirs}.layernorm_embedding.{p}"], None) for p in ("weight", "bias")]
    proj = [("q_proj", "w_q"), ("k_proj", "w_k"), ("v_proj", "w_v"), ("out_proj", "w_o")]
    for stack, n in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(n):
            a, b = f"{stack}.layers.{i}", f"{stack}.{i}"
            pairs = [(f"{a}.self_attn.{t}", f"{b}.self_attn.{o}") for t, o in proj]
            pairs += [(f"{a}.self_attn_layer_norm", f"{b}.norms.0"),
                      (f"{a}.fc1", f"{b}.ffn.w_1"), (f"{a}.fc2", f"{b}.ffn.w_2")]
            if stack == "decoder":
                pairs += [(f"{a}.encoder_attn.{t}", f"{b}.cross_attn.{o}") for t, o in proj]
                pairs += [(f"{a}.encoder_attn_layer_norm", f"{b}.norms.1"), (f"{a}.final_layer_norm", f"{b}.norms.2")]
            else:
                pairs += [(f"{a}.final_layer_norm", f"{b}.norms.1")]
            rows += [(f"{o}.{p}", [f"{t}.{p}"], None) for t, o in pairs for p in ("weight", "bias")]
    return rows


# Marian's sinusoids are computed, never read (older files may still carry them); "shared"
# is the tied table, also saved under the encoder's and decoder's names in some files.
_BART_IGNORE = re.compile(r"^((encoder|decoder)\.(version|embed_positions\.weight)|shared\.weight)$")
_BART_IGNORE_LEARNED = re.compile(r"^((encoder|decoder)\.version|shared\.weight)$")


# ------------------------------------------------------------------------------ t5
def _t5_config(hf: dict) -> ModelConfig:
    proj = hf.get("feed_forward_proj", "relu")
    acts = {"relu": "relu", "gated-gelu": "geglu_tanh", "gelu": "gelu", "gated-silu": None}
    if acts.get(proj) is None:
        raise CheckpointError(f"unsupported feed_forward_proj {proj!r} (supported: relu, gelu, gated-gelu)")
    d = hf["d_model"]
    scale_out = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True) is not False)
    return ModelConfig(
        kind="encoder-decoder",
        d_model=d,
        n_heads=hf["num_heads"],
        d_head=hf["d_kv"],
        d_ff=hf["d_ff"],
        n_layers=hf["num_layers"],
        n_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
        src_vocab_size=hf["vocab_size"],
        tgt_vocab_size=hf["vocab_size"],
        max_len=hf.get("n_positions", 512),
        positional="relative",
        rel_buckets=hf.get("relative_attention_num_buckets", 32),
        rel_max_distance=hf.get("relative_attention_max_distance", 128),
        attn_scale=1.0,
        norm="rmsnorm",
        norm_eps=hf.get("layer_norm_epsilon", 1e-6),
        norm_placement="pre",
        final_norm=True,
        activation=acts[proj],
        bias=False,
        out_bias=False,
        logit_scale=d**-0.5 if scale_out else 1.0,
        pad_id=hf.get("pad_token_id", 0),
        extra={"family": "t5"},
    )


def _t5_table(cfg: ModelConfig) -> List[Row]:
    rows: List[Row] = [
        ("src_embed.tok.weight", ["shared.weight", "encoder.embed_tokens.weight"], None),
        ("tgt_embed.tok.weight", ["shared.weight", "decoder.embed_tokens.weight"], None),
        ("out_proj.weight", ["lm_head.weight", "shared.weight"], None),
        ("encoder_norm.weight", ["encoder.final_layer_norm.weight"], None),
        ("decoder_norm.weight", ["decoder.final_layer_norm.weight"], None),
        ("encoder_bias.emb.weight", ["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"], None),
        ("decoder_bias.emb.weight", ["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"], None),
    ]
    proj = [("q", "w_q"), ("k", "w_k"), ("v", "w_v"), ("o", "w_o")]
    ffn = [("wo", "w_2")] + ([("wi_0", "w_1"), ("wi_1", "w_3")] if cfg.activation == "geglu_tanh" else [("wi", "w_1")])
    for stack, n in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
        f = 2 if stack == "decoder" else 1
        for i in range(n):
            a, b = f"{stack}.block.{i}.layer", f"{stack}.{i}"
            pairs = [(f"{a}.0.SelfAttention.{t}", f"{b}.self_attn.{o}") for t, o in proj]
            pairs += [(f"{a}.0.layer_norm", f"{b}.norms.0"), (f"{a}.{f}.layer_norm", f"{b}.norms.{f}")]
            pairs += [(f"{a}.{f}.DenseReluDense.{t}", f"{b}.ffn.{o}") for t, o in ffn]
            if stack == "decoder":
                pairs += [(f"{a}.1.EncDecAttention.{t}", f"{b}.cross_attn.{o}") for t, o in proj]
                pairs += [(f"{a}.1.layer_norm", f"{b}.norms.1")]
            rows += [(f"{o}.weight", [f"{t}.weight"], None) for t, o in pairs]
    return rows


# (T5 ties both stacks' token tables to "shared"; some files also save them under their own names.)
_T5_IGNORE = re.compile(
    r"^(decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight"
    r"|(encoder|decoder)\.embed_tokens\.weight)$"
)


# ------------------------------------------------------------------------------ tokenizers
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
    interface of core.tokenizer.WordTokenizer; </s> is appended.

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


def _tokenizers(folder: Path, family: str, hf: dict, cfg: ModelConfig):
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


# ------------------------------------------------------------------------------ loading
def load_net(folder: Path) -> Transformer:
    """Our Transformer with the folder's weights (float32)."""
    folder = Path(folder)
    hf = read_config(folder)
    family = hf.get("model_type")
    if family not in FAMILIES:
        raise CheckpointError(
            f"model_type {family!r} is not an encoder-decoder family read here ({', '.join(FAMILIES)})")
    weights = _Weights(folder)  # first: a pickle-only folder hears about converting, whatever its config
    try:
        cfg = _t5_config(hf) if family == "t5" else _bart_config(hf, family)
    except KeyError as e:
        raise CheckpointError(f"{folder / 'config.json'} lacks {e.args[0]!r}") from None
    if family == "t5":
        table, ignore = _t5_table(cfg), _T5_IGNORE
    else:
        table = _bart_table(cfg, family)
        ignore = _BART_IGNORE if family == "marian" else _BART_IGNORE_LEARNED
    with torch.device("meta"):  # no random init of weights that are overwritten anyway
        net = Transformer(cfg)
    _fill(net, weights, table, ignore)
    if cfg.positional == "sinusoidal":  # the non-persistent table was built on meta too
        for emb in (net.src_embed, net.tgt_embed):
            emb.pe = sinusoidal_encoding(cfg.max_len, cfg.d_model, layout=cfg.sinusoid_layout)
    return net


def load(folder: Path, device=None) -> AttentionModel:
    """A Marian, BART or T5 checkpoint folder as an AttentionModel (encoder-decoder)."""
    folder = Path(folder)
    hf = read_config(folder)
    net = load_net(folder)
    family = hf["model_type"]
    src_tok, tgt_tok = _tokenizers(folder, family, hf, net.cfg)
    pad = net.cfg.pad_id
    start = hf.get("decoder_start_token_id")
    start = pad if start is None else start
    end = hf.get("eos_token_id")
    end = tgt_tok.eos_id if end is None else end
    size = sum({p.data_ptr(): p.numel() for p in net.parameters()}.values())  # tied tables once
    return AttentionModel(
        folder.name,
        net,
        src_tok,
        target_tokenizer=tgt_tok,
        device=pick_device(device),
        description=f"{family} encoder-decoder from {folder.name} ({net.cfg.n_layers}+{net.cfg.n_decoder_layers} "
        f"layers, {net.cfg.n_heads} heads, d={net.cfg.d_model})",
        start_id=start,
        end_id=end,
        max_new_tokens=min(64, net.cfg.max_len - 1),
        examples=EXAMPLES,
        info={"checkpoint": str(folder), "family": family, "parameters": size},
    )
