"""Head ablation against transformers: our model.trace(text, ablate=...) equals transformers'
forward with a forward pre-hook on the output projection that zeroes (or mean-replaces) the
head's slice of Concat(heads), for smollm2 (LlamaForCausalLM) and minilm (BertModel).
Also the pure helpers of viz.explore.knockout (URL form, toggling, what changed)."""

from __future__ import annotations


import numpy as np
import plotly.graph_objects as go
import pytest
import torch

import core
from viz.explore import knockout

TOL = 1e-4


def _need(name):
    if not core.MODELS[name].available():
        pytest.skip(f"{name}'s weight package is not installed")
    pytest.importorskip("transformers")


def _slice_hook(heads, d_head, mode):
    """A forward pre-hook for an output projection: heads' slices of its input zeroed or
    replaced by their mean over positions."""

    def hook(module, args):
        x = args[0].clone()  # (B, n, H * d_head)
        for h in heads:
            s = slice(h * d_head, (h + 1) * d_head)
            x[..., s] = 0.0 if mode == "zero" else x[..., s].mean(dim=1, keepdim=True)
        return (x,) + tuple(args[1:])

    return hook


def _with_hooks(modules_by_layer, ablate, d_head, mode):
    by_layer = {}
    for _, layer, head in ablate:
        by_layer.setdefault(layer, []).append(head)
    return [modules_by_layer[l].register_forward_pre_hook(_slice_hook(hs, d_head, mode)) for l, hs in by_layer.items()]


# ------------------------------------------------------------------ smollm2 / LlamaForCausalLM
@pytest.fixture(scope="module")
def smollm2():
    _need("smollm2")
    return core.load_model("smollm2", device="cpu")


@pytest.fixture(scope="module")
def llama():
    """transformers' LlamaForCausalLM (eager, float32) from the same GGUF (as tests/parity/test_smollm2.py)."""
    _need("smollm2")
    from hf_builders import smollm2_llama

    return smollm2_llama()


SMOL_TEXT = "The capital of France is Paris. The capital of Italy is"
SMOL_HEADS = [("decoder", 3, 4), ("decoder", 17, 4), ("decoder", 18, 6)]


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_smollm2_ablation_matches_llama_hook(smollm2, llama, mode, capsys):
    ids = smollm2.tokenizer.encode(SMOL_TEXT).ids
    ours = smollm2.trace(SMOL_TEXT, ablate=SMOL_HEADS, ablation=mode)["logits"]
    hooks = _with_hooks([l.self_attn.o_proj for l in llama.model.layers], SMOL_HEADS, 64, mode)
    try:
        with torch.inference_mode():
            ref = llama(torch.tensor([ids]), use_cache=False).logits[0]
    finally:
        for h in hooks:
            h.remove()
    with torch.inference_mode():
        plain = llama(torch.tensor([ids]), use_cache=False).logits[0]
    d = (ours - ref).abs().max().item()
    moved = (plain - ref).abs().max().item()
    with capsys.disabled():
        print(f"\nsmollm2 {mode}-ablation of {knockout.format_ablate(SMOL_HEADS)}: max|ours - hooked llama| {d:.2e} "
              f"(the ablation moves the logits by up to {moved:.2f})")
    assert moved > 100 * TOL  # the heads matter, so the comparison can fail
    assert d < TOL


def test_empty_ablation_is_the_plain_trace(smollm2):
    plain = smollm2.trace(SMOL_TEXT)
    empty = smollm2.trace(SMOL_TEXT, ablate=[])
    assert torch.equal(plain["logits"], empty["logits"])
    assert torch.equal(plain["decoder.5.self_attn.weights"], empty["decoder.5.self_attn.weights"])


# ------------------------------------------------------------------ minilm / BertModel
MINI_TEXT = "I swam across the river to get to the other bank."
MINI_HEADS = [("encoder", 0, 2), ("encoder", 2, 9), ("encoder", 2, 3)]


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_minilm_ablation_matches_bert_hook(mode):
    _need("minilm")
    from transformers import BertModel

    from core.loaders.minilm import model_dir

    model = core.load_model("minilm", device="cpu")
    bert = BertModel.from_pretrained(str(model_dir()), attn_implementation="eager").eval()
    ids = model.tokenizer.encode(MINI_TEXT).ids
    ours = model.trace(MINI_TEXT, ablate=MINI_HEADS, ablation=mode)
    hooks = _with_hooks([l.attention.output.dense for l in bert.encoder.layer], MINI_HEADS, 32, mode)
    try:
        with torch.inference_mode():
            ref = bert(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    with torch.inference_mode():
        plain = bert(torch.tensor([ids])).last_hidden_state[0]
    assert (plain - ref.last_hidden_state[0]).abs().max().item() > 100 * TOL
    assert (ours["encoder.5.out"] - ref.last_hidden_state[0]).abs().max().item() < TOL
    # downstream attention maps are the ablated model's
    assert (ours["encoder.4.self_attn.weights"] - ref.attentions[4][0]).abs().max().item() < TOL


# ------------------------------------------------------------------ viz.explore.knockout
SIZES = {"decoder": (30, 9)}


def test_ablate_url_round_trip():
    heads = knockout.parse_ablate("decoder.5.1, decoder.3.4,decoder.3.4,", SIZES)
    assert heads == [("decoder", 3, 4), ("decoder", 5, 1)]
    assert knockout.format_ablate(heads) == "decoder.3.4,decoder.5.1"
    assert knockout.parse_ablate(knockout.format_ablate(heads), SIZES) == heads
    assert knockout.parse_ablate("", SIZES) == []
    for bad in ("decoder.30.0", "decoder.1.9", "encoder.1.1", "decoder.x.1", "decoder.1", "1.2.3"):
        with pytest.raises(ValueError):
            knockout.parse_ablate(bad, SIZES)


def test_toggle():
    heads = knockout.toggle([], ("decoder", 3, 4))
    heads = knockout.toggle(heads, ("decoder", 1, 2))
    assert heads == [("decoder", 1, 2), ("decoder", 3, 4)]
    assert knockout.toggle(heads, ("decoder", 3, 4)) == [("decoder", 1, 2)]


def test_cosines_and_table():
    a = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    b = np.array([[2.0, 0.0], [1.0, 1.0], [-3.0, -4.0]])
    np.testing.assert_allclose(knockout.token_cosines(a, b), [1.0, 1 / np.sqrt(2), -1.0], atol=1e-12)
    fig = knockout.cosine_figure(knockout.token_cosines(a, b), ["x", "y", "z"])
    np.testing.assert_allclose(np.asarray(fig.data[0].y, dtype=float), [1.0, 1 / np.sqrt(2), -1.0])
    t = knockout.next_token_table(["a", "b"], [0.7, 0.2], ["b", "a"], [0.5, 0.4])
    assert list(t["before"]) == ["a", "b"] and list(t["p after"]) == [0.5, 0.4]


def test_mark_grid_crosses_out_only_ablated_heads():
    from viz.figures.grid import tiled_head_grid

    maps = [torch.softmax(torch.randn(3, 4, 4), -1) for _ in range(2)]
    fig = tiled_head_grid(maps, first_layer=0)
    knockout.mark_grid(fig, [("decoder", 1, 2), ("decoder", 0, 0), ("encoder", 1, 1)], "decoder")
    marks = fig.data[2]
    got = sorted((int(r[0]), int(r[1])) for r in np.asarray(marks.customdata))
    assert got == [(0, 0), (1, 2)]
    centres = {(int(r[0]), int(r[1])): (x, y) for r, x, y in zip(fig.data[1].customdata, fig.data[1].x, fig.data[1].y)}
    for r, x, y in zip(marks.customdata, marks.x, marks.y):
        assert centres[(int(r[0]), int(r[1]))] == (x, y)
    assert len(knockout.mark_grid(go.Figure(fig), [], "decoder").data) == 3
