"""One formula: the one-head-a-tile reads of long inputs (core/head_maps.py, trace.pooled /
trace.head / head profiles) against the layer's full map from the explicit re-run, for every
family the loaders accept (tests/family_zoo.py), every layer and head, with the tiles made
small (TILE_ROWS = 4) so that the short test sentence spans several tiles.

The table this prints (largest difference in a weight per family) is the one of issue 40:
before the tiles called the network's own functions it read gpt_neox / gemma / phi3 ~1e-8,
qwen3 0.75, gemma2 0.84, gemma3_text 0.91, modernbert 0.96 and olmo2 raised IndexError."""

from __future__ import annotations

import pytest
import torch

import core.head_maps as hm
from family_zoo import FAMILIES, make_loader, self_maps, trace_of

pytest.importorskip("transformers")
TOL = 1e-5  # float32 rounding of the same operations in another order (tiles vs whole layer)
MAPS = ("weights", "masked", "scaled", "scores")


@pytest.fixture(scope="module")
def load(tmp_path_factory):
    return make_loader(tmp_path_factory)


def _diff(a, b):
    """max |a - b|, an infinity of the same sign in both counting as equal."""
    same_inf = torch.isinf(a) & torch.isinf(b) & (a.sign() == b.sign())
    return float((a - b).abs().masked_fill(same_inf, 0.0).max())


def worst_difference(trace, what="weights", size=None):
    """Over every self-attention layer and head that tiles: max |tiled - full| of the map
    `what`, read as one head's map (LayerMaps.head) when size is None, else as
    trace.pooled(name, size) against the block means of the full map (pool_full)."""
    worst = 0.0
    for stack, i in self_maps(trace):
        if not hm.tileable(trace, stack, "self_attn"):
            continue
        name = f"{stack}.{i}.self_attn.{what}"
        full = trace[name]
        if size is None:
            lm = hm.LayerMaps(trace, stack, i)
            got = torch.stack([lm.head(h, what) for h in range(full.shape[0])])
            ref = full
        else:
            got = trace.pooled(name, size=size)
            ref = torch.stack([hm.pool_full(full[h], size, what) for h in range(full.shape[0])])
        assert got.shape == ref.shape, name
        worst = max(worst, _diff(got, ref))
    return worst


@pytest.mark.parametrize("family", FAMILIES)
def test_tiles_match_the_full_map(load, family, monkeypatch):
    monkeypatch.setattr(hm, "TILE_ROWS", 4)
    _, ours = load(family)
    tr = trace_of(ours)
    if not any(hm.tileable(tr, s, "self_attn") for s, _ in self_maps(tr)):
        pytest.skip(f"{family}: its maps are read whole, never tiled (a relative position bias or a sparse selection)")
    w = worst_difference(tr, "weights", 1)
    print(f"\n{family}: largest difference in a weight {w:.2e}")
    assert w < TOL, f"{family}: pooled(size=1) differs from the full map by {w}"
    assert worst_difference(tr, "weights", 3) < TOL  # blocks that do not divide n
    for what in ("weights", "masked", "scaled", "scores"):  # one head's map, each step
        d = worst_difference(tr, what)
        assert d < (TOL if what == "weights" else 1e-4), f"{family}: one head's {what} differs by {d}"


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_tiles_match_with_padding(load, family, monkeypatch):
    monkeypatch.setattr(hm, "TILE_ROWS", 4)
    _, ours = load(family)
    n = len(ours.encode(trace_of.__globals__["TEXT"]).ids)
    tr = trace_of(ours, pad_to=n + 5)
    assert bool(torch.isinf(tr["encoder.0.self_attn.masked"]).any())
    assert worst_difference(tr, "weights", 1) < TOL
