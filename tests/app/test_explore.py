"""viz.figures.model_view: pieces read as words, long maps drawn in blocks, layer ranges of the model view,
and the cap on decoder-only prompts. Pure functions, checked against the core's tensors."""

import json

import numpy as np
import pytest
import torch

import core
from conftest import grid_shape, grid_tile
from viz.figures import model_view
from viz.figures.select import View, attention_matrix

DEVICE = "cpu"  # the model fixtures (conftest.py) load on the CPU here


def test_blocks_keep_rows_summing_to_one():
    torch.manual_seed(0)
    m = torch.softmax(torch.randn(3, 300, 300), -1)
    z, ql, kl, fq, fk = model_view.reduce_map(m, [f"t{i}" for i in range(300)], [f"t{i}" for i in range(300)], max_side=128)
    assert (fq, fk) == (3, 3) and z.shape == (3, 100, 100)
    torch.testing.assert_close(z.sum(-1), torch.ones(3, 100))
    torch.testing.assert_close(z[1, 4, 7], m[1, 12:15, 21:24].sum(-1).mean())  # queries averaged, keys summed
    assert ql[0] == "t0… [0–2]" and len(kl) == 100
    small = torch.softmax(torch.randn(5, 5), -1)
    z, ql, _, fq, fk = model_view.reduce_map(small, list("abcde"), list("abcde"))
    assert z is small or torch.equal(z, small)
    assert (fq, fk) == (1, 1) and ql == list("abcde")
    assert model_view.blocks(10, 4) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_words_matrix_on_minilm(minilm):
    text = "Tokenization splits embeddings."
    tr = minilm.trace(text)
    view = View("encoder", "self_attn", 2, 5)
    m, q, k = model_view.word_matrix(tr, view, text)
    assert q == k == ["[CLS]", "Tokenization", "splits", "embeddings", ".", "[SEP]"]
    torch.testing.assert_close(m.sum(-1), torch.ones(len(q)))
    w = tr["encoder.2.self_attn.weights"][5]
    toks = tr.tokens("source")
    pos = {t: i for i, t in enumerate(toks)}
    emb = [pos["em"], pos["##bed"], pos["##ding"], pos["##s"]]
    assert m[3, 2].item() == pytest.approx(w[emb, pos["splits"]].mean().item(), abs=1e-6)
    assert m[2, 3].item() == pytest.approx(w[pos["splits"], emb].sum().item(), abs=1e-6)
    # hiding the specials drops [CLS] / [SEP] and renormalises
    m2, q2, _ = model_view.word_matrix(tr, view, text, hide_special=True)
    assert q2 == ["Tokenization", "splits", "embeddings", "."]
    torch.testing.assert_close(m2.sum(-1), torch.ones(4))
    stack = model_view.word_stack(tr, "encoder", "self_attn", [0, 2], text)
    assert len(stack) == 2 and stack[1].shape == (12, 6, 6)
    torch.testing.assert_close(stack[1][5], m)


def test_word_tokens_are_not_pieces():
    toy = core.load_model("toy-translate", device="cpu")
    assert not model_view.reads_pieces(toy)
    tr = toy.trace("the small dog sees the cat")
    m, q, k = model_view.word_matrix(tr, View("decoder", "cross_attn", 1, 0))
    expected, eq, ek = attention_matrix(tr, View("decoder", "cross_attn", 1, 0))
    torch.testing.assert_close(m, expected)
    assert q == eq and k == ek


def test_grid_of_a_layer_range_keeps_real_layer_numbers():
    torch.manual_seed(0)
    maps = [torch.softmax(torch.randn(3, 100, 100), -1) for _ in range(4)]
    fig = model_view.grid_figure(maps, 20, selected=(22, 1), max_side=25)
    spec = json.loads(fig.to_json())
    assert grid_shape(spec) == (4, 3) and len(fig.data) == 2  # one tiled heatmap + its click targets
    assert list(fig.layout.yaxis.ticktext) == ["L20", "L21", "L22", "L23"]
    tile = grid_tile(spec, 22, 1)
    assert tile.shape == (25, 25) and np.allclose(tile.sum(1), 1.0, atol=1e-5)  # thumbnails keep the 0-1 scale
    # block (2, 3) of layer 22 head 1: keys 12-15 summed, queries 8-11 averaged
    expected = maps[2][1][8:12, 12:16].sum(1).mean()
    assert tile[2, 3] == pytest.approx(float(expected), abs=1e-6)
    assert len(fig.layout.shapes) == 1  # the selected map is outlined
    # hover entropy is the full 100-token map's, not the 25 blocks' (which have less)
    w = maps[2][1].double()
    cd = [c for c in fig.data[1].customdata if (c[0], c[1]) == (22, 1)][0]
    assert cd[2] == pytest.approx(float((-(w * torch.log2(w)).sum(-1)).mean()), abs=1e-4)
    assert len(model_view.grid_figure(maps, 20, selected=(5, 0)).layout.shapes) == 0  # outside the range
    assert model_view.clamp_range((25, 40), 30) == (25, 29) and model_view.clamp_range("x", 30) == (0, 11)
    assert model_view.default_layer_range(6) == (0, 5)


def test_grid_click_targets_name_their_maps():
    """Each map has one click target at its centre; a selection point read back gives its
    (layer, head), from its customdata or from its category names; gaps give None."""
    torch.manual_seed(1)
    maps = [torch.softmax(torch.randn(3, 6, 6), -1) for _ in range(2)]
    fig = model_view.grid_figure(maps, 4)
    targets = fig.data[1]
    assert targets.type == "scatter" and len(targets.x) == 6
    for x, y, cd in zip(targets.x, targets.y, targets.customdata):
        assert model_view.grid_pick({"curve_number": 1, "x": x, "y": y, "customdata": list(cd)}) == (cd[0], cd[1])
        assert model_view.grid_pick({"curve_number": 1, "x": x, "y": y}) == (cd[0], cd[1])  # no customdata: names
    assert sorted((int(c[0]), int(c[1])) for c in targets.customdata) == [(li, h) for li in (4, 5) for h in range(3)]
    # hover names the map and its mean row entropy (bits), computed here independently
    w = maps[1][2].double()
    ent = float((-(w * torch.log2(w)).sum(-1)).mean())
    cd = [c for c in targets.customdata if (c[0], c[1]) == (5, 2)][0]
    assert cd[2] == pytest.approx(ent, abs=1e-5)
    assert model_view.grid_pick({"curve_number": 0, "x": "\u2009" + "0", "y": "layer 4 · query 0"}) is None


def test_block_ticks():
    from viz.figures.heatmaps import attention_heatmap

    m = torch.softmax(torch.randn(128, 128), -1)
    labels = [f"tok{i}… [{i}–{i + 3}]" for i in range(128)]
    fig = model_view.fit_block_ticks(attention_heatmap(m, labels, labels, title="t"), max_ticks=32)
    assert len(fig.layout.xaxis.tickvals) == 32 and fig.layout.xaxis.ticktext[1] == labels[4]
    assert len(fig.layout.yaxis.tickvals) == 64  # the query axis is left alone
    assert fig.layout.margin.t == 150


def test_hiding_special_tokens_renormalises_the_remaining_rows():
    """attention_matrix(hide_special=True): [CLS]/[SEP] rows and columns gone, each remaining
    row = its weights over the kept keys / their sum (computed here from the raw weights)."""
    if not core.MODELS["minilm"].available():
        pytest.skip("minilm's weight package is not installed")
    tr = core.load_model("minilm").trace("the river bank")
    view = View("encoder", "self_attn", 1, 3)
    m, q, k = attention_matrix(tr, view, hide_special=True)
    assert q == k == ["the", "river", "bank"]
    w = tr["encoder.1.self_attn.weights"][3][1:-1, 1:-1].double()
    torch.testing.assert_close(m.double(), w / w.sum(-1, keepdim=True), rtol=0, atol=1e-6)
