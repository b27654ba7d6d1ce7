"""viz.decoder.steps: every inference step in one figure, stepped by its own slider.

Each step's three maps are read back from the slider's restyle (what the browser applies)
and compared with an independent pass per step: the decoder run on that step's prefix alone
(model.trace_decoder_input), not a view of the pass the steps come from. The shown weights are
also the softmax of the shown scores, row by row."""

import numpy as np
import pytest

from viz.decoder import figures as decoder_figures
from viz.decoder import steps as ds
from viz.figures.heatmaps import safe_labels

DEVICE = "cpu"  # the model fixtures (conftest.py) load on the CPU here
TEXT = "the small dog sees the cat"
LAYER, HEAD = 1, 2


def _arr(cells) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in cells], dtype=float)


@pytest.fixture(scope="module")
def run(toy):
    steps = toy.steps(TEXT)
    maps = ds.inference_steps(steps, layer=LAYER, head=HEAD)
    fig = ds.steps_figure(maps, where=f"layer {LAYER} · head {HEAD}", active=2)
    # independent: each step's decoder input run alone, in a forward pass of its own
    alone = [toy.trace_decoder_input(TEXT, s.meta["target_ids"]) for s in steps]
    return steps, maps, fig, alone


def test_every_step_equals_its_prefix_run_alone(run):
    steps, maps, fig, alone = run
    side = len(steps[-1].tokens("target"))
    name = f"decoder.{LAYER}.self_attn."
    assert len(fig.layout.sliders[0].steps) == len(steps) > 3
    for t in range(len(steps)):
        n = t + 1  # step t+1 reads <start> and t generated tokens
        assert alone[t].tokens("target") == steps[t].tokens("target")
        w_alone = decoder_figures.head_matrix(alone[t], name + "weights", HEAD)  # n x n
        s_alone = decoder_figures.head_matrix(alone[t], name + "masked", HEAD)
        assert w_alone.shape == (n, n)
        z = [_arr(c) for c in ds.slider_step(fig, t)["z"]]
        assert all(m.shape == (side, side) for m in z)
        mask, scores, weights = z
        for m in z:  # positions not generated yet are blank
            assert np.isnan(m[n:]).all() and np.isnan(m[:, n:]).all()
        upper = np.triu(np.ones((n, n), bool), 1)
        np.testing.assert_array_equal(mask[:n, :n], upper.astype(float))  # 1 = -inf (grey), 0 = may look
        np.testing.assert_allclose(weights[:n, :n], w_alone[:n, :n], atol=1e-4)
        assert np.isnan(scores[:n, :n][upper]).all()
        np.testing.assert_allclose(scores[:n, :n][~upper], s_alone[:n, :n][~upper], atol=1e-4)
        # the figure's own numbers: softmax of each shown row of scores is the shown row of weights
        e = np.exp(np.where(np.isnan(scores[:n, :n]), -np.inf, scores[:n, :n]) - np.nanmax(scores[:n, :n], 1)[:, None])
        np.testing.assert_allclose(e / e.sum(1, keepdims=True), weights[:n, :n], atol=1e-3)


def test_the_figure_opens_on_the_active_step(run):
    steps, maps, fig, _ = run
    first = ds.slider_step(fig, 2)
    for i in range(3):
        np.testing.assert_array_equal(_arr(fig.data[i].z), _arr(first["z"][i]))
    assert fig.layout.sliders[0].active == 2
    assert fig.layout.title.text.startswith(f"Step 3 of {len(steps)}")
    assert fig.layout.shapes[2].y0 == 1.5 and fig.layout.shapes[2].x1 == 2.5  # row 2, over its 3 keys


def test_labels_name_only_the_tokens_seen_so_far(run):
    """The axes are categories carried by the data: the step's tokens (a repeated one kept
    apart by zero-width spaces), then blank names; no axis is relaid out between steps."""
    steps, maps, fig, _ = run
    side = len(steps[-1].tokens("target"))
    for t, s in enumerate(steps):
        data, layout = fig.layout.sliders[0].steps[t].args
        for axis in data["x"] + data["y"]:
            assert len(axis) == side == len(set(axis))
            assert [a.replace(ds.ZWSP, "") for a in axis] == safe_labels(s.tokens("target")) + [""] * (side - t - 1)
        assert not any("axis" in k for k in layout)
        assert f"chooses {safe_labels([s.meta['chosen']])[0]}" in layout["title.text"]
        for i in range(3):  # the newest row (t), outlined over the step's t + 1 keys
            assert (layout[f"shapes[{i}].y0"], layout[f"shapes[{i}].y1"], layout[f"shapes[{i}].x1"]) == (t - 0.5, t + 0.5,
                                                                                                       t + 0.5)


def test_numbers_in_the_cells_only_while_they_fit(toy):
    steps = toy.steps(TEXT)
    first = ds.inference_steps(steps[:1], layer=0, head=0)[0]
    short = ds.step_data(first, 3, 3)
    assert short["text"][0] == [["0", "", ""], ["", "", ""], ["", "", ""]]
    assert short["text"][2][0][0] == "1.00"
    wide = ds.step_data(first, ds.MASK_TEXT_UP_TO + 1, ds.MASK_TEXT_UP_TO + 1)
    assert wide["text"] == [None, None, None]


def test_a_long_run_shows_each_steps_last_rows_and_sums_the_keys_before(run):
    """With a window of 3 rows, step t (t + 1 positions) shows rows t-2..t; its first column is
    the weights of the keys before them in the step's prefix run alone, summed, and the scores' mean."""
    steps, _, _, alone = run
    name = f"decoder.{LAYER}.self_attn."
    maps = ds.inference_steps(steps, layer=LAYER, head=HEAD, size=3)
    fig = ds.steps_figure(maps)
    for t, m in enumerate(maps):
        n = t + 1
        w_alone = decoder_figures.head_matrix(alone[t], name + "weights", HEAD)
        s_alone = decoder_figures.head_matrix(alone[t], name + "masked", HEAD)
        s = max(0, n - 3)
        assert (m.first, m.earlier) == (s, s)
        assert m.q_labels == steps[t].tokens("target")[s:]
        if s:
            assert m.k_labels == [f"Σ keys 0–{s - 1}"] + m.q_labels
            np.testing.assert_allclose(m.weights[:, 0], w_alone[s:n, :s].sum(1), atol=1e-5)
            np.testing.assert_allclose(m.masked[:, 0], s_alone[s:n, :s].mean(1), atol=1e-4)
            assert (m.mask[:, 0] == 0).all()
        np.testing.assert_allclose(m.weights[:, -min(n, 3):], w_alone[s:n, s:n], atol=1e-5)
        np.testing.assert_allclose(m.weights.sum(1), 1, atol=1e-5)
        z = _arr(ds.slider_step(fig, t)["z"][2])
        assert z.shape == (3, 4 if len(steps) > 3 else 3)
        np.testing.assert_allclose(z[: m.weights.shape[0], : m.weights.shape[1]], m.weights, atol=1e-4)
        if s:
            assert f"column 0 sums keys 0–{s - 1}" in fig.layout.sliders[0].steps[t].args[1]["title.text"]


def test_repeated_tokens_keep_their_own_columns():
    names = ds._distinct(["the", "cat", "the", "<s>"], 6)
    assert len(set(names)) == 6
    assert [n.replace(ds.ZWSP, "") for n in names] == ["the", "cat", "the", "&lt;s&gt;", "", ""]


def test_window_reads_whole_maps_or_their_last_rows_alike():
    rng = np.random.default_rng(0)
    n, size = 60, 48
    scores = rng.normal(size=(n, n))
    mask = np.where(np.triu(np.ones((n, n), bool), 1), -np.inf, 0.0)
    masked = scores + mask
    weights = np.exp(masked - masked.max(1, keepdims=True))
    weights /= weights.sum(1, keepdims=True)
    tokens = [f"t{i}" for i in range(n)]
    whole = ds.window(mask, masked, weights, tokens, "x", size)
    rows = ds.window(mask[-size:], masked[-size:], weights[-size:], tokens, "x", size)
    for a, b in ((whole.mask, rows.mask), (whole.masked, rows.masked), (whole.weights, rows.weights)):
        np.testing.assert_array_equal(a, b)
    assert whole.weights.shape == (size, size + 1) and whole.row == size - 1 and whole.first == 12
    np.testing.assert_allclose(whole.weights.sum(1), 1)
    with pytest.raises(ValueError, match="at least one step"):
        ds.steps_figure([])


def test_a_play_mark_left_by_a_lost_fragment_rerun_pauses_the_next_full_run(monkeypatch):
    """Play marks its next fragment rerun; a page switch during Play's delay wins over that rerun and
    leaves the mark set. Opened again (a full run), the page must pause, not play on to the end."""
    from types import SimpleNamespace

    from viz.decoder import stepper_panel as sp

    ss = {}
    monkeypatch.setattr(sp, "st", SimpleNamespace(session_state=ss))
    for fragment_ids, mark, resumed in [([], "fragment", False), (["f1"], "fragment", True), ([], "page", True),
                                        ([], "click", True), (["f1"], "click", True), (["f1"], None, False)]:
        monkeypatch.setattr(sp, "get_script_run_ctx", lambda ids=fragment_ids: SimpleNamespace(fragment_ids_this_run=ids))
        if mark is not None:
            ss[sp.RESUME] = mark
        assert sp._resumed() is resumed, (fragment_ids, mark)
        assert sp.RESUME not in ss  # a mark counts for one run only
