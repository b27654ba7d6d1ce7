"""viz.decoder_steps: every inference step in one figure, stepped by its own slider.

Each step's three maps are read back from the slider's restyle (what the browser applies)
and compared with an independent pass: the whole greedy output fed at once (teacher
forcing), whose rows up to a step are that step's rows under the look-ahead mask. The
shown weights are also the softmax of the shown scores, row by row."""

import numpy as np
import pytest

from viz import decoder as dv
from viz import decoder_steps as ds
from viz.figures import safe_labels

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
    # independent: the greedy output as one teacher-forced pass (decoder input = <start> + output)
    full = toy.trace(TEXT, target=" ".join(dv.output_tokens(steps)))
    return steps, maps, fig, full


def test_every_step_equals_the_teacher_forced_rows(run):
    steps, maps, fig, full = run
    side = len(steps[-1].tokens("target"))
    name = f"decoder.{LAYER}.self_attn."
    w_full = dv.head_matrix(full, name + "weights", HEAD)
    s_full = dv.head_matrix(full, name + "masked", HEAD)
    assert len(fig.layout.sliders[0].steps) == len(steps) > 3
    for t in range(len(steps)):
        n = t + 1  # step t+1 reads <start> and t generated tokens
        z = [_arr(c) for c in ds.slider_step(fig, t)["z"]]
        assert all(m.shape == (side, side) for m in z)
        mask, scores, weights = z
        for m in z:  # positions not generated yet are blank
            assert np.isnan(m[n:]).all() and np.isnan(m[:, n:]).all()
        upper = np.triu(np.ones((n, n), bool), 1)
        np.testing.assert_array_equal(mask[:n, :n], upper.astype(float))  # 1 = -inf (grey), 0 = may look
        np.testing.assert_allclose(weights[:n, :n], w_full[:n, :n], atol=1e-4)
        assert np.isnan(scores[:n, :n][upper]).all()
        np.testing.assert_allclose(scores[:n, :n][~upper], s_full[:n, :n][~upper], atol=1e-4)
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
    steps, maps, fig, _ = run
    side = len(steps[-1].tokens("target"))
    for t, s in enumerate(steps):
        layout = fig.layout.sliders[0].steps[t].args[1]
        ticks = layout["xaxis3.ticktext"]
        assert len(ticks) == side
        assert ticks[: t + 1] == safe_labels(s.tokens("target")) and ticks[t + 1:] == [""] * (side - t - 1)
        assert f"chooses {safe_labels([s.meta['chosen']])[0]}" in layout["title.text"]
        for i in range(3):  # the newest row (t), outlined over the step's t + 1 keys
            assert (layout[f"shapes[{i}].y0"], layout[f"shapes[{i}].y1"], layout[f"shapes[{i}].x1"]) == (t - 0.5, t + 0.5,
                                                                                                       t + 0.5)


def test_numbers_in_the_cells_only_while_they_fit(toy):
    steps = toy.steps(TEXT)
    short = ds.step_data(ds.inference_steps(steps[:1], layer=0, head=0)[0], side=3)
    assert short["text"][0] == [["0", "", ""], ["", "", ""], ["", "", ""]]
    assert short["text"][2][0][0] == "1.00"
    wide = ds.step_data(ds.inference_steps(steps[:1], layer=0, head=0)[0], side=ds.MASK_TEXT_UP_TO + 1)
    assert wide["text"] == [None, None, None]


def test_runs_longer_than_one_figure_are_refused(toy):
    assert ds.fits(ds.UP_TO) and not ds.fits(ds.UP_TO + 1)
    m = ds.inference_steps(toy.steps(TEXT)[:1], layer=0, head=0)[0]
    long = ds.StepMaps(m.mask, m.masked, m.weights, ["x"] * (ds.UP_TO + 1), 0, "x")
    with pytest.raises(ValueError, match="do not fit"):
        ds.steps_figure([long])
    with pytest.raises(ValueError, match="at least one step"):
        ds.steps_figure([])
