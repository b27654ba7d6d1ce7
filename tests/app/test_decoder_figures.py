"""viz.decoder.figures: the stepper's figure functions and bookkeeping, without a browser or Streamlit."""

import math

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

import core
from core import ModelConfig
from viz.decoder import figures as decoder_figures
from viz.ui import prefix_check as pc
from viz.figures.heatmaps import matrix_heatmap

DEVICE = "cpu"  # the model fixtures (conftest.py) load on the CPU here

NEG = float("-inf")


def _z(fig, i=0):
    return np.asarray(fig.data[i].z, dtype=float)


@pytest.fixture(scope="module")
def toy_steps(toy):
    return toy.steps("the small dog sees the cat")


@pytest.fixture(scope="module")
def tiny_decoder():
    """A random decoder-only model (Llama-like: RoPE, RMSNorm, pre-norm, GQA): no cross-attention,
    the prompt is the prefix."""
    cfg = ModelConfig(kind="decoder", d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2, max_len=64,
                      positional="rope", norm="rmsnorm", norm_placement="pre", activation="swiglu", bias=False)
    return core.load_model("random", device="cpu", config=cfg, seed=3)


# ------------------------------------------------------------------ figures
def test_look_ahead_mask_figure_draws_zero_and_minus_infinity():
    mask = core.causal_mask(4)
    fig = decoder_figures.look_ahead_mask_figure(mask, ["<start>", "a", "b", "c"], highlight_row=3)
    z = _z(fig)
    above = np.triu(np.ones((4, 4), bool), 1)
    assert np.all(np.isnan(z[above]))  # -inf cells are drawn blank (grey background) ...
    assert np.all(z[~above] == 0)
    text = np.asarray(fig.data[0].text)
    assert np.all(text[above] == "-∞")  # ... and read '-∞', as the notes write them
    assert np.all(text[~above] == "0")
    rect = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(rect) == 1 and rect[0].y0 == 2.5 and rect[0].y1 == 3.5  # the newest row outlined
    # token labels are escaped: "<start>" stays visible text, not markup
    assert "&lt;start&gt;" in list(fig.layout.yaxis.ticktext)


def test_large_mask_keeps_colours_but_drops_cell_text():
    n = decoder_figures.MASK_TEXT_UP_TO + 5
    fig = decoder_figures.look_ahead_mask_figure(core.causal_mask(n), [f"t{i}" for i in range(n)])
    assert fig.data[0].text is None and fig.data[0].texttemplate is None  # no text element per cell
    assert np.isnan(_z(fig)[0, 1]) and _z(fig)[1, 0] == 0


def test_large_masked_scores_draw_no_text_per_cell():
    """Beyond NEG_INF_TEXT_UP_TO rows the '-∞' cells are grey without text: plotly draws one
    SVG text per cell, which took seconds for the stepper's 96 x 96 block maps."""
    from viz.figures.heatmaps import NEG_INF_TEXT_UP_TO

    for n, written in ((NEG_INF_TEXT_UP_TO, True), (NEG_INF_TEXT_UP_TO + 1, False)):
        masked = torch.randn(n, n) + core.causal_mask(n)
        fig = decoder_figures.masked_scores_figure(masked, [f"t{i}" for i in range(n)])
        assert (fig.data[0].texttemplate is not None) is written
        if written:
            assert np.asarray(fig.data[0].text)[0, n - 1] == "-∞"


def test_masked_scores_figure_shows_minus_infinity_cells():
    torch.manual_seed(0)
    scaled = torch.randn(3, 3)
    masked = scaled + core.causal_mask(3)
    fig = decoder_figures.masked_scores_figure(masked, ["x", "y", "z"], highlight_row=2)
    z = _z(fig)
    assert np.isnan(z[0, 1]) and np.isnan(z[0, 2]) and np.isnan(z[1, 2])
    np.testing.assert_allclose(z[np.tril_indices(3)], scaled.numpy()[np.tril_indices(3)], rtol=1e-6)
    text = np.asarray(fig.data[0].text)
    assert text[0, 2] == "-∞"
    assert text[2, 0] == f"{scaled[2, 0].item():.2f}"  # values written, like the notes' tables
    # colour scale symmetric about 0 so the sign reads at a glance
    assert fig.data[0].zmin == -fig.data[0].zmax


def test_weights_figure_keeps_exact_zeros_above_diagonal():
    masked = torch.tensor([[1.0, NEG, NEG], [0.5, 2.0, NEG], [0.1, 0.2, 0.3]])
    w = torch.softmax(masked, -1)
    fig = decoder_figures.weights_figure(w, ["<start>", "a", "b"], highlight_row=1)
    z = _z(fig)
    assert z.shape == (3, 3)
    assert np.all(z[np.triu_indices(3, 1)] == 0)
    np.testing.assert_allclose(z.sum(1), 1, atol=1e-6)
    assert fig.data[0].zmin == 0 and fig.data[0].zmax == 1


def test_cross_attention_figure_rows_are_target_and_columns_source():
    w = torch.softmax(torch.randn(2, 5), -1)
    fig = decoder_figures.cross_attention_figure(w, ["<start>", "le"], list("abcde"), highlight_row=1)
    assert _z(fig).shape == (2, 5)
    assert list(fig.layout.xaxis.ticktext) == list("abcde")
    assert fig.layout.shapes[0].y0 == 0.5


def test_next_token_figure_marks_chosen_and_teacher():
    fig = decoder_figures.next_token_figure(["le", "ba", "<end>"], [0.6, 0.3, 0.1], chosen="le", forced="ba")
    bar = fig.data[0]
    assert isinstance(bar, go.Bar) and bar.orientation == "h"
    assert list(bar.x) == [0.6, 0.3, 0.1]
    assert bar.marker.color[0] == decoder_figures.CHOSEN_COLOUR and bar.marker.color[1] == decoder_figures.FORCED_COLOUR
    assert bar.marker.color[2] == decoder_figures.BAR_COLOUR
    assert "chosen" in bar.text[0] and "teacher" in bar.text[1]
    assert "&lt;end&gt;" in list(fig.layout.yaxis.ticktext)
    # a teacher token outside the top k is added as its own bar
    fig2 = decoder_figures.next_token_figure(["le", "ba"], [0.6, 0.3], chosen="le", forced="zu", forced_prob=0.001)
    assert list(fig2.data[0].x) == [0.6, 0.3, 0.001]
    assert fig2.data[0].marker.color[2] == decoder_figures.FORCED_COLOUR
    # chosen equal to the teacher's token: one bar says both
    fig3 = decoder_figures.next_token_figure(["le"], [0.9], chosen="le", forced="le")
    assert "chosen = teacher" in fig3.data[0].text[0]


def test_figures_from_a_real_step(toy_steps):
    s = toy_steps[1]
    toks = s.tokens("target")
    row = decoder_figures.newest_row(s)
    assert row == 1 == len(toks) - 1
    w = decoder_figures.head_matrix(s, "decoder.0.self_attn.weights", 2)
    assert w.shape == (2, 2)
    np.testing.assert_array_equal(w, s["decoder.0.self_attn.weights"][2].numpy())
    assert decoder_figures.head_matrix(s, "decoder.0.self_attn.mask", 2).shape == (2, 2)  # 2-D tensors as they are
    fig = decoder_figures.weights_figure(w, toks, highlight_row=row)
    np.testing.assert_allclose(_z(fig).sum(1), 1, atol=1e-5)


# ------------------------------------------------------------------ bookkeeping
def test_step_rows_and_counts():
    assert decoder_figures.step_row(1, 1) == 0 and decoder_figures.step_row(3, 1) == 2  # encoder-decoder: <start> is row 0
    assert decoder_figures.step_row(1, 5) == 4 and decoder_figures.step_row(2, 5) == 5  # decoder-only: the prompt's last token
    assert decoder_figures.n_teacher_steps(6, 1) == 6
    assert decoder_figures.n_teacher_steps(8, 5) == 4
    assert decoder_figures.n_teacher_steps(1, 1) == 1


def test_top_k_is_sorted_and_exact():
    p = torch.tensor([0.1, 0.5, 0.05, 0.35])
    ids, probs = decoder_figures.top_k(p, 3)
    assert ids == [1, 3, 0]
    assert probs == pytest.approx([0.5, 0.35, 0.1])
    assert decoder_figures.top_k(p, 10)[0] == [1, 3, 0, 2]


def test_ending_message():
    level, msg = decoder_figures.ending_message(6, True, 63)
    assert level == "success" and "<end>" in msg and "6 steps" in msg
    level, msg = decoder_figures.ending_message(63, False, 63)
    assert level == "warning" and "maximum length" in msg and "63" in msg
    assert "<|im_end|>" in decoder_figures.ending_message(3, True, 32, end_token="<|im_end|>")[1]


def test_chips_markdown_is_literal_and_marks_current():
    md = decoder_figures.chips_markdown(["<start>", "a`b", "\n", " "], current=1)
    assert md.split(" ")[0] == "`<start>`"
    assert "**`aˋb`**" in md  # a backtick cannot close the code span
    assert "`\\n`" in md and "`␣`" in md
    long = decoder_figures.chips_markdown([f"t{i}" for i in range(100)], max_chips=10)
    assert long.startswith("…") and long.endswith("`t99`") and "`t89`" not in long


def test_generated_and_output_tokens(toy, toy_steps):
    gen = decoder_figures.generated_tokens(toy_steps)
    assert gen[-1] == "<end>"
    assert decoder_figures.output_tokens(toy_steps) == toy.greedy_batch(["the small dog sees the cat"])[0]
    assert toy.target_strings(decoder_figures.generated_ids(toy_steps)) == gen


def test_prefix_difference_against_the_prefix_run_alone(toy, toy_steps):
    """Each step's rows, and the same rows of the teacher-forced pass on the whole output, equal
    the decoder run on that step's prefix alone (its own pass), over every layer and head."""
    text = "the small dog sees the cat"
    out = decoder_figures.output_tokens(toy_steps)
    full = toy.trace(text, target=" ".join(out))
    keys = {"self-attention weights", "cross-attention weights", "top-k next-token probabilities",
            "next-token distribution"}
    for s in toy_steps:
        alone = toy.trace_decoder_input(text, s.meta["target_ids"])
        assert alone.tokens("target") == s.tokens("target")
        for rows in (s, full):
            c = pc.prefix_difference(rows, alone)
            assert set(c.diffs) == keys and c.n_rows == len(s.tokens("target"))
            assert (c.n_layers, c.n_heads) == (3, 4)
            assert c.worst == max(c.diffs.values()) < 1e-5 and c.ok
    # another target shares only the first decoder input (<start>) with the greedy output
    other = toy.trace(text, target="zu zu zu zu zu zu")
    assert pc.prefix_difference(other, toy.trace_decoder_input(text, toy_steps[0].meta["target_ids"])).ok
    if out[0] != "zu":
        with pytest.raises(ValueError):
            pc.prefix_difference(other, toy.trace_decoder_input(text, toy_steps[1].meta["target_ids"]))


def test_prefix_difference_fails_on_different_computations(toy, toy_steps):
    """The check can fail: the same decoder input over another source sentence gives other
    cross-attention rows (and everything after them), reported with where the worst one is."""
    s = toy_steps[2]
    alone = toy.trace_decoder_input("the big cat sees the dog", s.meta["target_ids"])
    c = pc.prefix_difference(s, alone)
    assert not c.ok and c.worst > 1e-2 and c.worst == max(c.diffs.values())
    assert c.where.startswith(("cross-attention weights, layer", "self-attention weights, layer",
                               "top-k next-token probabilities", "next-token distribution")), c.where
    # a NaN anywhere never passes
    assert not pc.PrefixCheck(3, {"self-attention weights": float("nan")}, float("nan"), "", 3, 4).ok
    # a shorter prefix alone is compared with the step's first rows: step 3's first two are step 2's
    short = toy.trace_decoder_input("the small dog sees the cat", s.meta["target_ids"][:2])
    c = pc.prefix_difference(s, short)
    assert c.n_rows == 2 and c.ok and c.worst < 1e-5


def test_teacher_forcing_rows_and_cross_entropy():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    frame, ce = decoder_figures.teacher_forcing_rows(probs, ["<start>", "a"], ["a", "<end>"], [0, 2], ["a", "<end>"])
    assert list(frame["input"]) == ["<start>", "a"]
    assert list(frame["argmax = teacher"]) == [True, True]
    assert ce == pytest.approx(-(math.log(0.7) + math.log(0.8)) / 2)
    frame, ce = decoder_figures.teacher_forcing_rows(probs, ["x", "y"], ["y", None], [1, None], ["x", "z"])
    assert ce == pytest.approx(-math.log(0.2))
    assert frame["p(teacher's next)"].isna().tolist() == [False, True]


# ------------------------------------------------------------------ decoder-only (generic)
def test_decoder_only_steps_have_no_cross_attention(tiny_decoder):
    prompt = "the small dog"
    steps = tiny_decoder.steps(prompt, max_new_tokens=4)
    assert steps
    p = steps[0].meta["prefix_len"]
    assert p == 3  # the prompt is the prefix
    for s in steps:
        assert not decoder_figures.has_cross_attention(s)
        assert decoder_figures.newest_row(s) == decoder_figures.step_row(s.meta["step"], p)
    # teacher forcing on the generated continuation reproduces every step's rows
    out = decoder_figures.output_tokens(steps)
    full = tiny_decoder.trace(prompt, target=" ".join(out))
    assert decoder_figures.n_teacher_steps(len(full.tokens("target")), p) == len(out) + 1
    for s in steps:
        alone = tiny_decoder.trace_decoder_input(prompt, s.meta["target_ids"])  # the step's prefix, alone
        for rows in (s, full):
            d = pc.prefix_difference(rows, alone)
            assert "cross-attention weights" not in d.diffs and "self-attention weights" in d.diffs
            assert d.worst < 1e-5 and d.ok
    w = decoder_figures.head_matrix(steps[-1], "decoder.1.self_attn.weights", 3)
    fig = decoder_figures.weights_figure(w, steps[-1].tokens("target"), highlight_row=decoder_figures.newest_row(steps[-1]))
    assert np.all(_z(fig)[np.triu_indices(w.shape[0], 1)] == 0)


def test_long_prefixes_are_drawn_in_blocks():
    """A 200-position causal map in blocks of 3: weights rows sum to 1, the block means of
    the scores and the mask are those of a direct loop, blocks wholly above the diagonal -inf."""
    import core
    from viz.decoder import figures as decoder_figures

    n = 200
    g = torch.Generator().manual_seed(0)
    mask = core.causal_mask(n).numpy()
    masked = torch.randn(n, n, generator=g).numpy() + mask
    weights = torch.softmax(torch.from_numpy(masked), dim=-1).numpy()
    tokens = [f"t{i}" for i in range(n)]
    m, s, w, labels, row = decoder_figures.in_blocks(mask, masked, weights, tokens, n - 1, max_side=96)
    f = 3
    assert w.shape == s.shape == m.shape == (67, 67) and len(labels) == 67 and row == (n - 1) // f
    np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-9)
    for bi, bj in [(0, 0), (10, 4), (66, 66), (30, 29)]:
        cells = masked[bi * f:(bi + 1) * f, bj * f:(bj + 1) * f]
        fin = cells[np.isfinite(cells)]
        assert s[bi, bj] == pytest.approx(fin.mean())
    assert np.isneginf(s[0, 5]) and np.isneginf(m[3, 40])
    assert labels[1] == "t3… [3–5]"


def _block_maps(n: int = 300, repeat: bool = False):
    mask = core.causal_mask(n).numpy()
    masked = torch.randn(n, n, generator=torch.Generator().manual_seed(1)).numpy() + mask
    weights = torch.softmax(torch.from_numpy(masked), dim=-1).numpy()
    tokens = [("the" if repeat else f"t{i}") for i in range(n)]
    return decoder_figures.in_blocks(mask, masked, weights, tokens, n - 1, max_side=96)


def test_block_maps_hover_from_their_axes_not_from_per_cell_labels():
    """Block labels are distinct, so the 96-block scores and weights carry them once per axis
    (category axes) instead of two per cell; ticks and the outlined row stay where they were."""
    _, s, w, labels, row = _block_maps()
    for fig in (decoder_figures.masked_scores_figure(s, labels, highlight_row=row), decoder_figures.weights_figure(w, labels, highlight_row=row)):
        t = fig.data[0]
        assert t.customdata is None
        assert list(t.x) == list(t.y) == labels
        assert fig.layout.xaxis.type == fig.layout.yaxis.type == "category"
        assert "%{y}" in t.hovertemplate and "%{x}" in t.hovertemplate
        ax = fig.layout.xaxis  # category i sits at i: numeric ticks still name their own block
        assert len(ax.tickvals) > 10 and list(ax.ticktext) == [labels[int(i)] for i in ax.tickvals]
        assert fig.layout.shapes[0].y0 == row - 0.5
    per_cell = matrix_heatmap(w, labels, labels, highlight_row=row)  # the same map with two labels per cell
    assert per_cell.data[0].customdata is not None
    assert len(fig.to_json()) < 0.3 * len(per_cell.to_json())


def test_maps_with_repeated_labels_keep_per_cell_hover_labels():
    """Repeated tokens on an axis cannot be category values (they would merge): per-cell labels."""
    n = 40
    z = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    fig = decoder_figures.weights_figure(z, ["the"] * n)
    assert fig.data[0].customdata is not None and fig.layout.xaxis.type is None
    assert list(fig.data[0].x) == list(range(n))


def test_maps_have_fixed_margins_and_their_outline():
    """What matrix_heatmap's one constructor call and _tidy's one layout update must carry: the
    outlined row, the axes without automargin, margins that fit the `fit` labels (the whole
    run's, so they stay put as the map grows) and no gaps hovered on large maps."""
    toks = ["<start>", "le", "chat"]
    run = toks + ["a_much_longer_token"]
    w = torch.softmax(torch.randn(3, 3) + core.causal_mask(3), dim=-1).numpy()
    fig = decoder_figures.weights_figure(w, toks, highlight_row=2, height=400, fit=(run, run))
    (shape,) = fig.layout.shapes
    assert (shape.y0, shape.y1, shape.x0, shape.x1) == (1.5, 2.5, -0.5, 2.5)
    for ax in (fig.layout.xaxis, fig.layout.yaxis):
        assert ax.automargin is False and ax.ticklabeloverflow == "allow" and ax.zeroline is False
    from viz.figures.heatmaps import label_margins

    assert fig.layout.margin.l == label_margins(run, run)["l"] > label_margins(toks, toks)["l"]
    assert fig.layout.title.yref == "container" and fig.layout.yaxis.autorange == "reversed"
    assert fig.data[0].hoverongaps is None
    big = matrix_heatmap(np.zeros((201, 3)))
    assert big.data[0].hoverongaps is False


def test_fix_margins_fixes_every_axis_of_a_figure_with_subplots():
    from plotly.subplots import make_subplots

    from viz.figures.heatmaps import fix_margins

    fig = make_subplots(rows=1, cols=2)
    fig.add_trace(go.Heatmap(z=[[1, 2]]), row=1, col=1)
    fig.add_trace(go.Heatmap(z=[[3, 4]]), row=1, col=2)
    fix_margins(fig, ["query"], ["key"])
    for ax in (fig.layout.xaxis, fig.layout.xaxis2, fig.layout.yaxis, fig.layout.yaxis2):
        assert ax.automargin is False and ax.ticklabeloverflow == "allow"


def test_space_tokens_show_a_visible_space():
    """A next token that is a space reads as the token chips show it (␣), not as the quoted ' '."""
    from viz.explore import knockout
    from viz.figures.text import token_text

    fig = decoder_figures.next_token_figure([" ", "the", "  "], [0.5, 0.3, 0.2])
    assert list(fig.layout.yaxis.ticktext) == ["␣", "the", "␣␣"]
    assert list(fig.data[0].customdata) == ["␣", "the", "␣␣"]
    table = knockout.next_token_table([" ", "a"], [0.7, 0.3], ["a", " "], [0.6, 0.4], k=2)
    assert list(table["before"]) == ["␣", "a"] and list(table["after"]) == ["a", "␣"]
    assert token_text(" ") == "␣" and token_text("\n") == "\\n" and token_text(" the") == " the"


# ------------------------------------------------------------------ the check reads what the page drew
def _drawn_as_the_page_draws(tr, layer: int, head: int, rows: int) -> pc.Drawn:
    """The step view's three maps of `tr` as viz/decoder/view_panel.py draws them (in blocks past
    decoder_figures.MAX_SIDE), read back from the figures, and the next-token bars of row rows - 1."""
    from viz.figures.model_view import blocks

    names = [f"decoder.{layer}.self_attn.{w}" for w in ("mask", "masked", "weights")]
    mask, masked, weights = (decoder_figures.head_matrix(tr, name, head) for name in names)
    toks = tr.tokens("target")
    groups = None
    if len(toks) > decoder_figures.MAX_SIDE:
        mask, masked, weights, toks, _ = decoder_figures.in_blocks(mask, masked, weights, toks, rows - 1)
        groups = blocks(len(tr.tokens("target")), decoder_figures.MAX_SIDE)
    figs = {"mask": decoder_figures.look_ahead_mask_figure(mask, toks), "masked": decoder_figures.masked_scores_figure(masked, toks),
            "weights": decoder_figures.weights_figure(weights, toks)}
    ids, p = decoder_figures.top_k(tr["probs"][rows - 1], 5)
    bars = decoder_figures.next_token_figure([str(i) for i in ids], p)
    return pc.Drawn(layer, head, rows, {k: _z(f) for k, f in figs.items()}, groups=groups,
                    bars=list(zip(ids, bars.data[0].x)), top=len(ids))


@pytest.mark.parametrize("tiled", [False, True])
def test_the_step_check_compares_the_drawn_maps_and_fails_when_they_are_shifted(monkeypatch, tiled):
    """The check holds the arrays the step view drew (here 120 positions, drawn in blocks, and a short
    prefix drawn cell by cell) against the decoder run on the prefix alone: it passes as drawn, and a
    view that draws its rows one position late (the trace behind it unchanged) fails at the drawn
    weights. tiled: the prefix run's maps read one head and a tile of rows at a time (a long prefix)."""
    import core.head_maps as hm

    if tiled:
        monkeypatch.setattr(hm, "LONG_LAYER_BYTES", 0)
    cfg = ModelConfig(kind="decoder", d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, n_layers=2, max_len=160,
                      positional="rope", norm="rmsnorm", norm_placement="pre", activation="swiglu", bias=False)
    model = core.load_model("random", device="cpu", config=cfg, seed=5)
    prompt = " ".join(["the small dog sees the old cat near the river"] * 12)
    steps = model.steps(prompt, max_new_tokens=2)
    full = model.trace(prompt, target=" ".join(decoder_figures.output_tokens(steps)))
    assert len(steps[-1].tokens("target")) > decoder_figures.MAX_SIDE  # drawn in blocks
    for rows_from, n in ((steps[-1], len(steps[-1].tokens("target"))), (full, 7)):
        alone = model.trace_decoder_input(prompt, rows_from.meta["target_ids"][:n])
        assert pc.tiles_layers(rows_from, alone) == tiled
        drawn = _drawn_as_the_page_draws(rows_from, 1, 1, n)
        assert (drawn.groups is not None) == (len(rows_from.tokens("target")) > decoder_figures.MAX_SIDE)
        c = pc.prefix_difference(rows_from, alone, drawn=drawn)
        assert {"drawn mask", "drawn masked scores", "drawn weights", "drawn next-token bars"} <= set(c.diffs)
        assert c.ok and c.worst < 1e-5, (c.worst, c.where)
        shifted = pc.Drawn(drawn.layer, drawn.head, drawn.rows, {**drawn.maps, "weights": np.roll(drawn.maps["weights"], 1, 0)},
                           drawn.groups, drawn.bars, drawn.top)
        bad = pc.prefix_difference(rows_from, alone, drawn=shifted)
        assert not bad.ok and bad.where.startswith("drawn weights (layer 1, head 1)"), bad.where
        assert bad.diffs["self-attention weights"] < 1e-5  # the trace behind the view is right: only the drawing is not
        wrong_bar = pc.Drawn(drawn.layer, drawn.head, drawn.rows, drawn.maps, drawn.groups,
                             [(drawn.bars[0][0], drawn.bars[0][1] * 0.9)] + drawn.bars[1:], drawn.top)
        assert not pc.prefix_difference(rows_from, alone, drawn=wrong_bar).ok
    # the reference's own block reduction, on a matrix small enough to write out: keys summed, queries averaged
    w = np.arange(16, dtype=float).reshape(4, 4)
    got = pc.reference_blocks(lambda r0, r1: w[r0:r1], 4, 4, [[0, 1], [2, 3]], "weights")
    assert got.tolist() == [[(0 + 1 + 4 + 5) / 2, (2 + 3 + 6 + 7) / 2], [(8 + 9 + 12 + 13) / 2, (10 + 11 + 14 + 15) / 2]]
    m = np.where(np.tril(np.ones((4, 4))) > 0, w, -np.inf)
    got = pc.reference_blocks(lambda r0, r1: m[r0:r1], 2, 4, [[0, 1], [2, 3]], "masked")
    assert got[0].tolist() == [(0 + 4 + 5) / 3, -np.inf] and np.isnan(got[1]).all()  # rows past the prefix: not compared


def test_a_long_layer_s_step_maps_are_one_head_computed_alone(tiny_decoder, monkeypatch):
    """Past LONG_LAYER_BYTES the step view reads one head's maps a tile of rows at a time and the mask from
    the layer's rule: the same numbers as the whole layer gives, and no layer of H maps made or kept."""
    import core.head_maps as hm

    prompt = "the small dog sees the old cat near the river"
    whole = tiny_decoder.steps(prompt, max_new_tokens=3)[-1]
    names = [f"decoder.1.self_attn.{w}" for w in ("mask", "masked", "weights")]
    expected = [decoder_figures.head_matrix(whole, name, 2, rows_from=1) for name in names]  # short: from the layer
    monkeypatch.setattr(hm, "LONG_LAYER_BYTES", 0)
    view = tiny_decoder.steps(prompt, max_new_tokens=3)[-1]  # a fresh pass: nothing cached
    got = [decoder_figures.head_matrix(view, name, 2, rows_from=1) for name in names]
    for e, g in zip(expected, got):
        assert e.shape == g.shape
        assert np.array_equal(np.isneginf(e), np.isneginf(g))
        assert np.allclose(np.where(np.isfinite(e), e, 0), np.where(np.isfinite(g), g, 0), atol=1e-6)
    base = view._base
    assert not base._cache, list(base._cache)  # no layer made for one head's view
