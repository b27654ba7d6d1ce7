"""Greedy decoding for AttentionModel (core/api.py): one sentence with a KV cache, or a
padded batch (evaluation).

Encoder-decoder: the decoder starts from <start> and the encoder's output is computed once.
Decoder-only: the prompt is the prefix and generated tokens follow. Decoding stops at <end>,
after max_new tokens, or at the model's max_len.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from .net.head_ablation import Ablation
from .errors import InputError, cpu_fallback
from .tokens.tokenizer import Encoded


class GreedyDecoding:
    """AttentionModel's decoding methods. They use the model's net, config, device, kind,
    name, start_id, end_id, max_new_tokens, encode(), _ids() and target_strings()."""

    @torch.inference_mode()
    def _greedy(self, src: Optional[torch.Tensor], prefix: List[int], max_new: int,
                ablate: Optional[Ablation] = None, use_cache: bool = True,
                logits: Optional[list] = None) -> Tuple[List[int], bool]:
        """Greedy decoding: returns the generated ids (with <end> if reached) and whether it ended.

        Keeps each layer's keys and values between steps (a KV cache), so a step costs one
        position, not the whole prefix. Mean-ablation depends on every position, so it
        decodes without the cache; so does use_cache=False (each step runs the decoder on the
        whole prefix: the reference the KV cache is checked against). logits: a list that
        receives each step's next-token logits (V,), float32 on the CPU."""
        memory = self.net.encode(src, ablate=ablate) if src is not None else None
        seq = list(prefix)
        out: List[int] = []
        limit = self.config.max_len
        cache: Optional[dict] = None if (ablate and ablate.mode == "mean") or not use_cache else {}
        new = seq
        for _ in range(max_new):
            if len(seq) >= limit:
                break
            if cache is None:
                hidden = self.net.decode(self._ids(seq), memory, ablate=ablate)
            else:
                hidden = self.net.decode(self._ids(new), memory, ablate=ablate, cache=cache)
            step_logits = self.net.project(hidden[:, -1:])
            if logits is not None:
                logits.append(step_logits[0, 0].float().cpu())
            nxt = int(step_logits.argmax(-1).item())
            out.append(nxt)
            if nxt == self.end_id:
                return out, True
            seq.append(nxt)
            new = [nxt]
        return out, False

    @cpu_fallback
    def greedy_run(self, text: str, max_new_tokens: Optional[int] = None, use_cache: bool = True):
        """(generated ids with <end> if reached, whether it ended, each step's next-token logits
        T x V): the greedy decoding model.steps runs, through the KV cache or (use_cache=False)
        with the decoder run on the whole prefix at every step."""
        enc = self.encode(text)
        max_new = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        got: list = []
        if self.kind == "encoder-decoder":
            ids, ended = self._greedy(self._ids(enc.ids), [self.start_id], max_new, use_cache=use_cache, logits=got)
        elif self.kind == "decoder":
            ids, ended = self._greedy(None, list(enc.ids), max_new, use_cache=use_cache, logits=got)
        else:
            raise InputError(f"{self.name} is an encoder: it does not generate text")
        return ids, ended, torch.stack(got) if got else torch.zeros(0, 0)

    @cpu_fallback
    @torch.inference_mode()
    def forced_logits(self, text: str, ids: Sequence[int]) -> torch.Tensor:
        """Each step's next-token logits (T x V, float32 on the CPU) with no cache, for the steps
        that generated `ids`: ONE decoder pass over the prompt and ids[:-1], read at each step's
        position. Causal attention makes row P + k - 1 of that pass the last row of the pass over
        the first P + k positions, which is what greedy_run(use_cache=False) computes at step k; so
        while its argmax agrees with ids, this is the uncached run's logits in one pass instead of T."""
        enc = self.encode(text)
        ids = [int(i) for i in ids]
        if not ids:
            return torch.zeros(0, 0)
        if self.kind == "encoder-decoder":
            memory, prefix = self.net.encode(self._ids(enc.ids)), [self.start_id]
        elif self.kind == "decoder":
            memory, prefix = None, list(enc.ids)
        else:
            raise InputError(f"{self.name} is an encoder: it does not generate text")
        hidden = self.net.decode(self._ids(prefix + ids[:-1]), memory)
        rows = hidden[:, len(prefix) - 1: len(prefix) - 1 + len(ids)]
        return self.net.project(rows)[0].float().cpu()

    @cpu_fallback
    def generate(self, text: str, max_new_tokens: Optional[int] = None, ablate: Sequence = (),
                 ablation: str = "zero") -> Tuple[List[str], bool]:
        """Greedy output tokens (strings, without <end>) and whether <end> was reached.
        ablate / ablation: heads switched off, as in trace()."""
        enc = self.encode(text)
        ids, ended = self._generate_ids(enc, max_new_tokens, Ablation(ablate, ablation).check(self.net))
        if ended:
            ids = ids[:-1]
        return self.target_strings(ids), ended

    def _generate_ids(self, enc: Encoded, max_new_tokens: Optional[int], ablate: Optional[Ablation] = None):
        max_new = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        if self.kind == "encoder-decoder":
            return self._greedy(self._ids(enc.ids), [self.start_id], max_new, ablate)
        if self.kind == "decoder":
            return self._greedy(None, list(enc.ids), max_new, ablate)
        raise InputError(f"{self.name} is an encoder: it does not generate text")

    @cpu_fallback
    @torch.inference_mode()
    def greedy_batch(self, texts: Sequence[str], max_new_tokens: Optional[int] = None) -> List[List[str]]:
        """Batched greedy decoding with padding (encoder-decoder models); used by eval."""
        assert self.kind == "encoder-decoder"
        max_new = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        encs = [self.encode(t) for t in texts]
        n = max(len(e) for e in encs)
        pad = self.config.pad_id
        src = torch.full((len(encs), n), pad, dtype=torch.long, device=self.device)
        for b, e in enumerate(encs):
            src[b, : len(e)] = torch.tensor(e.ids)
        src_pad = src == pad
        memory = self.net.encode(src, src_pad)
        seq = torch.full((len(encs), 1), self.start_id, dtype=torch.long, device=self.device)
        done = torch.zeros(len(encs), dtype=torch.bool, device=self.device)
        for _ in range(max_new):
            hidden = self.net.decode(seq, memory, src_pad)
            nxt = self.net.project(hidden[:, -1]).argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, self.end_id), nxt)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
            done |= nxt == self.end_id
            if bool(done.all()):
                break
        outs = []
        for row in seq[:, 1:].tolist():
            if self.end_id in row:
                row = row[: row.index(self.end_id)]
            outs.append(self.target_strings(row))
        return outs
