"""Every chart whose axis counts layers (or heads) labels its ticks with the numbers they stand
for: a tick sits on a whole layer and reads that layer's number, a chosen range of layers reads
its own numbers (layers 12-23 as 12 ... 23, not 0 ... 11), and a deep model's last layer is
named. Each figure is built from small arrays (no model) and its tick labels read back."""

import re

import numpy as np
import pandas as pd
import pytest

from viz.circuits import figures as cf
from viz.figures import long_maps
from viz.heads import figures as hf
from viz.kvcache import figures as kf
from viz.patching import figures as pf


def ticks(axis: dict) -> dict:
    """tick value -> tick label of a figure's axis (as plotly's JSON holds them)."""
    vals, text = axis.get("tickvals"), axis.get("ticktext")
    assert vals is not None and text is not None, f"the axis has no labelled ticks: {axis}"
    assert len(vals) == len(text)
    return dict(zip(vals, text))


def number(label: str) -> int:
    """The layer (or head) number a tick label reads: '7', 'L7', 'H7'."""
    m = re.fullmatch(r"[LH]?(\d+)", str(label))
    assert m, f"tick label {label!r} is not a layer's number"
    return int(m.group(1))


def assert_whole_layers(axis: dict, layers, offset: int = 0, last: bool = True):
    """Each tick sits on a whole row and reads the layer drawn there (row + offset); the
    first and (where `last`) the last row are named."""
    t = ticks(axis)
    for v, label in t.items():
        assert float(v).is_integer(), f"a tick between two layers: {v} ({label!r})"
        assert number(label) == int(v) + offset, (v, label)
    rows = sorted(int(v) for v in t)
    assert rows[0] == min(layers) and (not last or rows[-1] == max(layers)), rows


@pytest.mark.parametrize("n_layers", [2, 3, 30])
def test_kvcache_mass_and_sink_maps_tick_whole_layers_and_heads(n_layers):
    mass = np.random.default_rng(0).random((n_layers, 9))
    for fig in (kf.mass_heatmap(mass), kf.sink_heatmap(mass, 4)):
        layout = fig.to_plotly_json()["layout"]
        assert_whole_layers(layout["yaxis"], range(n_layers), last=n_layers <= 16)
        assert_whole_layers(layout["xaxis"], range(9))


@pytest.mark.parametrize("n_layers", [2, 13, 30])
def test_rollout_rows_read_the_layers_after_which_they_are(n_layers):
    rollout = np.random.default_rng(1).random((n_layers, 4, 4))
    fig = hf.rollout_heatmap(rollout, ["a", "b", "c", "d"], query=3).to_plotly_json()
    assert_whole_layers(fig["layout"]["yaxis"], range(n_layers))


@pytest.mark.parametrize("n_layers", [3, 30])
def test_head_scores_and_patching_name_the_last_layer(n_layers):
    rows = [(l, h) for l in range(n_layers) for h in range(4)]
    scores = pd.DataFrame({"stack": "decoder", "layer": [l for l, _ in rows], "head": [h for _, h in rows],
                           "induction": np.linspace(0, 1, len(rows))})
    assert_whole_layers(hf.score_heatmap(scores, "induction", "decoder").to_plotly_json()["layout"]["yaxis"],
                        range(n_layers))
    df = pd.DataFrame({"layer": [l for l, _ in rows], "head": [h for _, h in rows],
                       "position": -1, "restored": np.linspace(-1, 1, len(rows))})
    assert_whole_layers(pf.restored_heatmap(df).to_plotly_json()["layout"]["yaxis"], range(n_layers))


def test_head_profiles_of_a_chosen_layer_range_read_those_layers():
    """The long document's head profiles over layers 12-23: the rows read 12 ... 23."""
    rng = np.random.default_rng(2)
    prof = {k: rng.random((12, 9)) for k in ("distance", "first", "local")}
    layout = long_maps.profile_figure(prof, first_layer=12).to_plotly_json()["layout"]
    for y in ("yaxis", "yaxis2", "yaxis3"):
        t = ticks(layout[y])
        assert all(float(v).is_integer() and number(lab) == int(v) for v, lab in t.items()), t
        assert min(t) == 12, t  # the range's first layer, by its own number
    for x in ("xaxis", "xaxis2", "xaxis3"):
        assert_whole_layers(layout[x], range(9))


def test_a_circuit_reads_layers_by_number_and_the_embeddings_as_such():
    edges = pd.DataFrame({"source": ["L0H1", "embed", "L1.mlp"], "target": ["L2H3", "L2H3", "L2H3"],
                          "side": ["key", "query", "value"], "weight": [0.5, -0.2, 0.1],
                          "share": [0.6, -0.3, 0.1], "depth": [1, 1, 1]})
    layout = cf.circuit_figure(edges, (2, 3), n_heads=4).to_plotly_json()["layout"]
    t = ticks(layout["yaxis"])
    assert t.pop(-1) == "embed"  # the row below layer 0 is the embeddings, not a layer -1
    assert_whole_layers({"tickvals": list(t), "ticktext": list(t.values())}, range(3))
    assert_whole_layers(layout["xaxis"], range(4))  # heads only: no tick left of head 0
