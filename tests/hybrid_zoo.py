"""What the parity tests of the token-mixer hybrids share (tests/parity/test_mixers.py,
test_olmo_hybrid.py, test_kimi_linear.py): a tiny checkpoint built, saved and loaded once a module
and traced on one sentence, and transformers' eager pass with hooks held on its modules."""

from __future__ import annotations

from typing import Callable, Dict, Iterable, Tuple

import pytest
import torch

import core

TEXT = "the small dog sees the old cat near the river bank because it was tired"


def zoo_getter(tmp_path_factory, build: Callable, hf_run: Callable, folders: Dict) -> Callable:
    """get(key) -> (hf, ours, trace of TEXT, its ids, hf_run(hf, ids)), made once a key:
    build(key, folder) returns (the transformers model, the folder it is saved in); folders[key]
    is that folder."""
    pytest.importorskip("transformers")
    cache = {}

    def get(key):
        if key not in cache:
            hf, folder = build(key, tmp_path_factory.mktemp(key))
            folders[key] = folder
            ours = core.load_model(str(folder), device="cpu")
            tr = ours.trace(TEXT)
            ids = tr.meta["target_ids"]
            cache[key] = (hf, ours, tr, ids, hf_run(hf, ids))
        return cache[key]

    return get


def saved(family: str, folder, **overrides):
    """tests/hf_builders.py's tiny `family` checkpoint, saved by transformers into folder:
    (the transformers model, the folder)."""
    from hf_builders import build

    hf, folder = build(family, folder, **overrides)
    hf.save_pretrained(str(folder))
    return hf, folder


def eager_run(hf, ids, hooks: Iterable[Tuple[torch.nn.Module, Callable]]):
    """transformers' eager pass over ids with forward hooks [(module, hook)] held during it:
    (logits (n x V), the full-attention layers' weights by layer)."""
    hf.config._attn_implementation = "eager"
    handles = [m.register_forward_hook(fn) for m, fn in hooks]
    try:
        with torch.no_grad():
            out = hf(torch.tensor([ids]), output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    full = [i for i, t in enumerate(hf.config.layer_types) if t == "full_attention"]
    return out.logits[0], dict(zip(full, [a[0] for a in out.attentions if a is not None]))


def greedy_three_ways(hf, ours, ids, new: int = 8):
    """Greedy decoding of TEXT: ours with the cache (the mixers' recurrent form), ours without,
    and transformers' generate. Returns (with_cache, without, theirs, the largest gap between
    our two runs' logits)."""
    with_cache, _, lc = ours.greedy_run(TEXT, max_new_tokens=new)
    without, _, ln = ours.greedy_run(TEXT, max_new_tokens=new, use_cache=False)
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([ids]), max_new_tokens=len(with_cache), do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    return with_cache, without, theirs, float((lc - ln).abs().max())
