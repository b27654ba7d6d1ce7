"""Every model family the loaders accept, as a tiny random checkpoint built by transformers
at test time (tests/hf_builders.py, tests/gemma_builders.py, tests/parity/test_hf_seq2seq.py) and
loaded through core.load_model: one list, shared by the formula and conformance tests.

FAMILIES maps a case name to how it is built; `zoo(tmp_path_factory)` returns a loader that
builds each case once per test session: load(case) -> (transformers model or None, ours)."""

from __future__ import annotations

from pathlib import Path

import torch

# case -> (builder module, family, config overrides)
HF = ["bert", "roberta", "distilbert", "gpt2", "llama", "mistral", "qwen2", "gpt_neox", "qwen3", "phi3", "olmo2"]
NEW = ["gpt_oss", "smollm3", "olmo3", "exaone4", "llama4_text",  # the 2025-26 attentions (tests/hf_builders.py NEW)
       "deepseek_v3", "deepseek_v32"]
HF += NEW
# Gated DeltaNet hybrids (tests/hf_builders.py HYBRID): not in FAMILIES, whose tests read every layer's
# softmax attention; the conformance matrix has them as rows of their own
HYBRID = ["qwen3_5_text", "qwen3_next", "olmo_hybrid"]  # olmo_hybrid: tests/hf_builders.py OLMO_HYBRID
GEMMA = ["gemma", "gemma2", "gemma3_text", "gemma4_text", "modernbert"]
SEQ2SEQ = ["marian", "bart", "t5"]
OVERRIDES = {"mistral": {"sliding_window": 4}}  # a window shorter than the test sentences
FAMILIES = HF + GEMMA + SEQ2SEQ

# sentences long enough for the windows (3-4 keys) and for several tiles of TILE_ROWS=4
TEXT = "the small dog sees the old cat near the river, and alice gave the tired cat a book because it asked"
SOURCE, TARGET = "the small dog sees the cat near the river bank", "the old cat sat on the mat"


def build(case: str, folder: Path):
    """(transformers model in eval mode, folder holding its checkpoint)."""
    if case in GEMMA:
        from gemma_builders import build as b
        hf, folder = b(case, folder, **OVERRIDES.get(case, {}))
        hf.save_pretrained(str(folder))
        return hf, folder
    if case in SEQ2SEQ:
        from test_hf_seq2seq import _build
        folder.mkdir(parents=True, exist_ok=True)
        return _build(case, folder), folder
    from hf_builders import build as b
    hf, folder = b(case, folder, **OVERRIDES.get(case, {}))
    hf.save_pretrained(str(folder))
    return hf, folder


def make_loader(tmp_path_factory):
    import core

    cache = {}

    def load(case: str):
        if case not in cache:
            torch.manual_seed(0)
            hf, folder = build(case, tmp_path_factory.mktemp(case))
            if case in SEQ2SEQ:
                from core.loaders import hf_seq2seq
                ours = hf_seq2seq.load(folder, device="cpu")
            else:
                ours = core.load_model(str(folder), device="cpu")
            cache[case] = (hf, ours)
        return cache[case]

    return load


def trace_of(ours, pad_to=None):
    """A trace of the test text: encoder-decoders translate SOURCE with TARGET forced."""
    if ours.kind == "encoder-decoder":
        return ours.trace(SOURCE, target=TARGET)
    return ours.trace(TEXT, pad_to=pad_to) if pad_to else ours.trace(TEXT)


def self_maps(trace):
    """(stack, layer) of every self-attention in the trace."""
    out = []
    for stack in ("encoder", "decoder"):
        try:
            L = trace.layers(stack)
        except Exception:
            continue
        out += [(stack, i) for i in range(L)]
    return out
