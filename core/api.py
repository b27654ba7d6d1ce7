"""AttentionModel: a Transformer with its tokenizers, and the Python API of docs/design.md.

    model = core.load_model("toy-translate")
    trace = model.trace("the small dog sees the cat")   # greedy target for encoder-decoders
    steps = model.steps("the small dog sees the cat")   # one Trace per generated token

Encoder-decoder: the decoder input is <start> y_1 .. y_T; position t predicts y_{t+1}, the
last one predicts <end>. Decoder-only: the prompt is the prefix; generated tokens follow.
Everything runs under torch.inference_mode(); traces hold CPU tensors. Greedy decoding is
core/decoding.py; what a trace does not store, the LayerRunner (core/layer_runner.py)
recomputes.
"""

from __future__ import annotations

import time
from typing import List, Optional, Sequence

import torch

from .net.head_ablation import Ablation
from .decoding import GreedyDecoding
from .device import device_name
from .errors import InputError, cpu_fallback
from .layer_runner import LayerRunner
from .net.hooks import Hooks
from .net.model import Transformer
from .net.recorder import Recorder
from .tokens.tokenizer import Encoded
from . import trace_names as tn
from .trace import Trace


class AttentionModel(GreedyDecoding):
    def __init__(
        self,
        name: str,
        net: Transformer,
        tokenizer,
        *,
        device: torch.device,
        description: str = "",
        target_tokenizer=None,
        start_id: Optional[int] = None,
        end_id: Optional[int] = None,
        max_new_tokens: int = 32,
        examples: Sequence[str] = (),
        info: Optional[dict] = None,
    ):
        self.name = name
        self.net = net.to(device).eval()
        self.config = net.cfg
        self.tokenizer = tokenizer
        self.target_tokenizer = target_tokenizer or tokenizer
        self.device = torch.device(device)
        self.description = description
        self.start_id = start_id
        self.end_id = end_id
        self.max_new_tokens = max_new_tokens
        self.examples = list(examples)
        self.info = dict(info or {})
        self.fallback_note: Optional[str] = None
        self.input_limit: Optional[int] = None  # a caller's cap on input tokens (below the model's own)

    def to_device(self, device: torch.device) -> None:
        self.net.to(device)
        self.device = torch.device(device)

    @property
    def kind(self) -> str:
        return self.config.kind

    def layer_kinds(self, stack: Optional[str] = None) -> List[dict]:
        """One small dict per self-attention layer of `stack` (default: the decoder, or an
        encoder's own stack), what each layer is (Transformer.layer_info): mixer, mask
        ("causal", "sliding W", "chunked C", "global", "local W"), positions ("rope", "none",
        ...), sink, qk_norm, scale ("fixed" / "per position"), ffn ("dense" / "moe")."""
        if stack is None:
            stack = "encoder" if self.kind == "encoder" else "decoder"
        if stack not in ("encoder", "decoder") or (stack == "encoder" and not self.config.has_encoder) or (
                stack == "decoder" and not self.config.has_decoder):
            raise ValueError(f"this {self.kind} model has no {stack!r} stack")
        return self.net.layer_info(stack)

    # ------------------------------------------------------------------ tokens
    def encode(self, text: str) -> Encoded:
        if text is None or not str(text).strip():
            raise InputError("The text is empty: type a sentence.")
        enc = self.tokenizer.encode(str(text))
        if not any(not s for s in enc.special):
            raise InputError("The tokenizer found no words in that text: type a sentence with letters.")
        limit = self.input_limit
        if limit is not None and len(enc) > limit:
            keep_last = enc.special[-1]  # e.g. BERT's closing [SEP]
            n_before = len(enc.ids)
            idx = list(range(limit - 1)) + [len(enc) - 1] if keep_last else list(range(limit))
            for name in ("ids", "tokens", "offsets", "special", "word_ids"):
                seq = getattr(enc, name)
                if seq:
                    setattr(enc, name, [seq[i] for i in idx])
            enc.truncated += n_before - limit
        return enc

    @property
    def max_input_tokens(self) -> int:
        own = getattr(self.tokenizer, "max_len", None) or self.config.max_len
        return min(own, self.input_limit) if self.input_limit else own

    def target_strings(self, ids: Sequence[int]) -> List[str]:
        """Display strings of a token sequence (a character split over byte pieces shows whole)."""
        return self.target_tokenizer.decode(list(ids))

    def alternative_strings(self, ids: Sequence[int]) -> List[str]:
        """Display strings of alternatives (top-k candidates): each token on its own."""
        return [self.target_tokenizer.token_str(i) for i in ids]

    def source_strings(self, enc: Encoded) -> List[str]:
        return list(enc.tokens)

    def _meta(self, enc: Encoded, **extra) -> dict:
        meta = {
            "model": self.name,
            "kind": self.kind,
            "config": self.config.to_dict(),
            "device": str(self.device),
            "device_name": device_name(self.device),
            "unknown": list(enc.unknown),
            "dropped": list(enc.dropped),
            "truncated": enc.truncated,
            "offsets": [list(o) for o in enc.offsets],
            "word_ids": list(enc.word_ids),
            "special": list(enc.special),
            "max_input_tokens": self.max_input_tokens,
        }
        kinds = self.net.layer_kinds() if hasattr(self.net, "layer_kinds") else None
        if kinds:  # per-layer attention kind, 'local' (sliding window) or 'global' (Gemma 2/3, ModernBERT)
            meta["layer_kinds"] = kinds
        meta.update(extra)
        return meta

    def _ids(self, ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor([list(ids)], dtype=torch.long, device=self.device)  # (1, n)

    # ------------------------------------------------------------------ tracing
    @torch.inference_mode()
    def _run_traced(self, src_ids, tgt_ids, src_pad=None, top_k: int = 10, ablate: Optional[Ablation] = None,
                    progress=None):
        """One pass on the fast path (fused attention), storing only what is O(n d): see
        core/trace.py. Returns the stored tensors (CPU), the forward time in ms, and the
        LayerRunner that recomputes the rest."""
        n_all = len(src_ids or []) + len(tgt_ids or [])
        kv = self.config.n_kv_heads or self.config.n_heads
        keep_qk = n_all * self.config.n_layers * (self.config.n_heads + 2 * kv) * self.config.d_head * 4 <= QK_KEEP_BYTES
        rec = inner = Recorder(names=_stored_or_qk if keep_qk else tn.is_stored, maps=False)
        if progress is not None:  # progress(done, total) as each layer starts (hook points {stack}.{i}.in)
            rec = Hooks(_progress_hooks(self.net, progress), inner=inner)
        sync = self.device.type == "cuda"
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        src = self._ids(src_ids) if src_ids is not None else None
        tgt = self._ids(tgt_ids) if tgt_ids is not None else None
        pad = None if src_pad is None else torch.tensor([src_pad], device=self.device)
        memory = self.net.encode(src, pad, rec, ablate=ablate) if self.config.has_encoder else None
        if self.config.has_decoder:
            hidden = self.net.decode(tgt, memory, pad, rec=rec, ablate=ablate)[0]  # (t, d)
            k = min(top_k, self.config.tgt_vocab_size)
            ids, probs = [], []
            for r in range(0, hidden.shape[0], LOGIT_ROWS):  # n x V at once would be the largest tensor
                p = torch.softmax(self.net.project(hidden[r : r + LOGIT_ROWS]), dim=-1)
                top = torch.topk(p, k)
                ids.append(top.indices)
                probs.append(top.values)
            rec(tn.TOPK_IDS, torch.cat(ids), batched=False)
            rec(tn.TOPK_PROBS, torch.cat(probs), batched=False)
            rec(tn.LAST_PROBS, p[-1], batched=False)
            rec(tn.NEXT_IDS, inner.tensors[tn.TOPK_IDS][-1], batched=False)
            rec(tn.NEXT_PROBS, inner.tensors[tn.TOPK_PROBS][-1], batched=False)
        if sync:
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1000
        if progress is not None:
            progress(1, 1)
        tensors = {n: t.to("cpu") for n, t in inner.tensors.items()}
        qk = {n: tensors.pop(n) for n in [n for n in tensors if n.endswith(_QK)]}
        return tensors, ms, LayerRunner(self, pad, ablate, qk=qk)

    def _finish(self, tensors, tokens, meta, runner) -> Trace:
        if tn.NEXT_IDS in tensors:
            tokens["next"] = self.alternative_strings(tensors[tn.NEXT_IDS].tolist())
        return Trace(tensors, tokens, meta, runner=runner, names=runner.ordered_names(tensors))

    @cpu_fallback
    def trace(self, text: str, target: Optional[str] = None, pad_to: Optional[int] = None, top_k: int = 10,
              ablate: Sequence = (), ablation: str = "zero", progress=None) -> Trace:
        """Every intermediate of one forward pass on `text` (stored or recomputed on access:
        see core/trace.py).

        Encoder-decoder: `target` (teacher forcing) or the greedy translation. Decoder-only:
        the prompt, followed by `target` if given. `pad_to` pads the source with <pad> to a
        fixed length (the padding mask then shows in every encoder mask). `ablate`: heads
        switched off, as (stack, layer, head) or (stack, layer, head, "cross_attn"), their
        slice of Concat(heads) zeroed (ablation="zero") or replaced by its mean over
        positions ("mean") before W_o; the greedy translation is that of the ablated model.
        progress: called progress(done, total) as each layer of the traced pass starts (a
        long input takes minutes on a CPU) and (1, 1) at its end.
        """
        abl = Ablation(ablate, ablation).check(self.net)
        enc = self.encode(text)
        src_ids, src_tokens, src_pad = list(enc.ids), self.source_strings(enc), None
        if pad_to is not None and pad_to > len(src_ids):
            if self.kind == "decoder":
                raise InputError("padding the prompt is shown on encoder models only")
            extra = pad_to - len(src_ids)
            src_pad = [False] * len(src_ids) + [True] * extra
            src_ids += [self.config.pad_id] * extra
            src_tokens += [self.tokenizer.token_str(self.config.pad_id)] * extra
        meta_extra: dict = {"ablate": [list(s) for s in _ablated_list(abl)], "ablation": abl.mode} if abl else {}
        if self.kind == "encoder":
            tensors, ms, runner = self._run_traced(src_ids, None, src_pad, top_k, abl, progress)
            tokens = {"source": src_tokens}
        elif self.kind == "encoder-decoder":
            if target is None:
                gen, ended = self._greedy(self._ids(enc.ids), [self.start_id], self.max_new_tokens, abl)
                body = gen[:-1] if ended else gen
                meta_extra.update(mode="greedy", ended=ended)
            else:
                tenc = self.target_tokenizer.encode(target)
                body = list(tenc.ids)[: self.config.max_len - 1]  # room for <start>
                meta_extra.update(mode="teacher-forcing", target_unknown=list(tenc.unknown),
                                  target_truncated=tenc.truncated + len(tenc.ids) - len(body))
            dec_in = [self.start_id] + body
            tensors, ms, runner = self._run_traced(src_ids, dec_in, src_pad, top_k, abl, progress)
            tokens = {"source": src_tokens, "target": self.target_strings(dec_in)}
            meta_extra["target_ids"] = list(dec_in)
        else:  # decoder-only: the prompt is the decoder's input
            dec_in = list(enc.ids)
            meta_extra["mode"] = "prompt"
            if target:
                tenc = self.tokenizer.encode(target)
                dec_in += [i for i, s in zip(tenc.ids, tenc.special) if not s]
                meta_extra["mode"] = "teacher-forcing"
            dec_in = dec_in[: self.config.max_len]
            tensors, ms, runner = self._run_traced(None, dec_in, None, top_k, abl, progress)
            tokens = {"source": src_tokens, "target": self.target_strings(dec_in)}
            meta_extra["target_ids"] = list(dec_in)
        meta = self._meta(enc, timings={"forward_ms": ms}, **meta_extra)
        return self._finish(tensors, tokens, meta, runner)

    @cpu_fallback
    def trace_decoder_input(self, text: str, target_ids: Sequence[int], top_k: int = 10) -> Trace:
        """The decoder run on exactly `target_ids` (an encoder-decoder's from <start>, over the
        source `text`; a decoder-only model's prompt and continuation, `text` its prompt), in a
        forward pass of its own: what inference computes at the step whose input this is.
        Ids, not a string, so the input is the same whatever the tokenizer would round-trip."""
        if self.kind not in ("encoder-decoder", "decoder"):
            raise InputError(f"{self.name} is an encoder: it has no decoder")
        dec_in = [int(i) for i in target_ids]
        if not dec_in or len(dec_in) > self.config.max_len:
            raise InputError(f"a decoder input of {len(dec_in)} tokens (1 to {self.config.max_len})")
        enc = self.encode(text)
        src_ids = list(enc.ids) if self.kind == "encoder-decoder" else None
        tensors, ms, runner = self._run_traced(src_ids, dec_in, None, top_k)
        tokens = {"source": self.source_strings(enc), "target": self.target_strings(dec_in)}
        meta = self._meta(enc, timings={"forward_ms": ms}, mode="decoder-input", target_ids=dec_in)
        return self._finish(tensors, tokens, meta, runner)

    @cpu_fallback
    def steps(self, text: str, max_new_tokens: Optional[int] = None, top_k: int = 10) -> List[Trace]:
        """One Trace per generated token (greedy decoding): step t is the decoder on the
        prefix that ends at its t-th input token (<start> for t = 1 in an encoder-decoder)
        and its choice of the next token.

        Generation runs with a KV cache; then ONE traced pass over prompt + generated
        tokens, and step t is a view of that pass's first rows (Trace.prefix): under the
        look-ahead mask, row j of a longer pass is row j of the shorter one (tests compare
        the views with step-by-step passes). All steps together cost about one trace."""
        enc = self.encode(text)
        if self.kind == "encoder-decoder":
            src_ids, prefix0 = list(enc.ids), [self.start_id]
        elif self.kind == "decoder":
            src_ids, prefix0 = None, list(enc.ids)
        else:
            raise InputError(f"{self.name} is an encoder: it does not generate text")
        max_new = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        max_new = max(0, min(max_new, self.config.max_len - len(prefix0) + 1))
        t0 = time.perf_counter()
        gen, ended = self._greedy(self._ids(src_ids) if src_ids is not None else None, prefix0, max_new)
        gen_ms = (time.perf_counter() - t0) * 1000
        full = prefix0 + gen[:-1]  # the inputs of the last step (its own choice is never an input)
        tensors, ms, runner = self._run_traced(src_ids, full, None, top_k)
        whole = self._finish(tensors, {"source": self.source_strings(enc), "target": self.target_strings(full)},
                             self._meta(enc, timings={"forward_ms": ms, "generate_ms": gen_ms}), runner)
        traces = []
        for t, nxt in enumerate(gen):
            n_in = len(prefix0) + t
            ids = whole[tn.TOPK_IDS][n_in - 1].tolist()
            tokens = {"source": self.source_strings(enc), "target": self.target_strings(full[:n_in]),
                      "next": self.alternative_strings(ids)}
            meta = self._meta(
                enc,
                timings={"forward_ms": ms, "generate_ms": gen_ms},
                mode="step",
                step=t + 1,
                n_steps=len(gen),
                chosen=self.alternative_strings([nxt])[0],
                chosen_id=nxt,
                ended=ended,
                prefix_len=len(prefix0),
                target_ids=list(full[:n_in]),
            )
            traces.append(whole.prefix(n_in, tokens, meta))
        return traces


LOGIT_ROWS = 256  # next-token distributions computed this many positions at a time
QK_KEEP_BYTES = 32 * 2**20  # a traced pass keeps every self-attention's q, k and v up to this size
_QK = tuple("." + tn.local(tn.SELF, s) for s in ("q", "k", "v"))  # the ends of the self-attentions' q, k, v


def _progress_hooks(net, progress) -> dict:
    """Hook functions on every layer's input that report progress(layers started, layers) and
    pass the value on unchanged."""
    stacks = [s for s in ("encoder", "decoder") if hasattr(net, s)]
    names = [tn.layer_in(s, i) for s in stacks for i in range(len(net.layers(s)))]
    total = len(names)

    def tick(k):
        def fn(t):
            progress(k, total)
            return t
        return fn

    return {name: tick(k) for k, name in enumerate(names)}


def _stored_or_qk(name: str) -> bool:
    """tn.is_stored, and the self-attentions' q, k and v (short inputs: a weights or value_norms read reuses them)."""
    return tn.is_stored(name) or name.endswith(_QK)


def _ablated_list(abl: Ablation) -> List[tuple]:
    return [(s, l, h) if k == "self_attn" else (s, l, h, k) for (s, l, k), hs in sorted(abl.sites.items()) for h in hs]
