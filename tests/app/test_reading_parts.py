"""The pure parts behind what a reader sees (no app run): a token is escaped for HTML once, the
path's links fit the model, a mask has two colours, the KV cache sweep's axes follow its data,
the long text wraps, the page guide has every page and the README one line a page."""

import html
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from viz.figures.heatmaps import mask_heatmap, matrix_heatmap
from viz.figures.text import html_text
from viz.home import figures as home_figures
from viz.home import path as hp
from viz.kvcache import figures as kf
from viz.ui import page_guide, registry

ROOT = Path(__file__).resolve().parents[2]


def test_a_token_is_escaped_once_on_every_path_figure(toy):
    assert html_text("<unk>") == "&lt;unk&gt;" and html_text("a & b") == "a &amp; b"
    fig = matrix_heatmap(np.zeros((1, 1)), ["<unk>"], ["<b>"])
    assert list(fig.layout.yaxis.ticktext) == ["&lt;unk&gt;"] and list(fig.layout.xaxis.ticktext) == ["&lt;b&gt;"]
    tr = toy.trace("the teacher gave a test")  # mostly <unk> to toy-translate
    toks = tr.tokens("source")
    assert "<unk>" in toks
    for fig in (home_figures.scores_figure(tr)[0], home_figures.mask_figure(tr)[0],
                home_figures.own_weights_figure(tr)[0]):
        for ax in (fig.layout.xaxis, fig.layout.yaxis):
            shown = [html.unescape(t) for t in ax.ticktext]  # what plotly draws
            assert not [t for t in shown if "&lt;" in t or "&amp;" in t], shown
    assert [html.unescape(t) for t in home_figures.scores_figure(tr)[0].layout.xaxis.ticktext] == toks


def test_the_path_grows_with_the_sentence():
    assert home_figures.figure_height(4) == home_figures.SMALL
    assert home_figures.figure_height(22) >= 22 * 15 + 100  # 12 px labels need ~15 px a row, plus the margins


def test_links_fit_the_model_or_say_where_they_go():
    avail = {"smollm2": "decoder", "toy-translate": "encoder-decoder"}
    assert hp.link_target("decoder", "toy-translate", "encoder-decoder", False, avail) == ("toy-translate", "")
    to, why = hp.link_target("decoder", "minilm", "encoder", False, avail)
    assert to == "smollm2" and "minilm is an encoder" in why and "smollm2" in why
    assert hp.link_target("attribution", "bert", "encoder", True, avail)[0] == "bert"  # a masked-LM head: an output
    assert hp.link_target("kvcache", "toy-translate", "encoder-decoder", False, avail)[0] == "smollm2"
    assert hp.link_target("explore", "minilm", "encoder", False, avail) == ("minilm", "")
    to, why = hp.link_target("lens", "minilm", "encoder", False, {})
    assert to is None and "not for minilm" in why


def test_a_mask_has_two_colours_and_no_bar():
    m = np.triu(np.full((4, 4), -np.inf), 1)
    fig = mask_heatmap(m, list("abcd"), list("abcd"))
    heat = fig.data[0]
    assert heat.showscale is False
    assert np.array_equal(np.asarray(heat.z), np.isfinite(m).astype(float))
    assert [t.name for t in fig.data[1:]] == ["allowed (0)", "masked (−∞)"]


def test_the_sweep_axes_follow_the_data():
    sweep = pd.DataFrame({"policy": ["window"] * 3 + ["streaming"] * 3, "budget": [8, 16, 32] * 2,
                          "perplexity": [948.0, 120.0, 30.0, 40.0, 25.0, 21.0]})
    fig = kf.ppl_figure(sweep, 18.5)
    lo, hi = fig.layout.yaxis.range
    assert math.log10(18.5) - 0.3 < lo <= math.log10(18.5) and math.log10(948) <= hi < math.log10(948) + 0.3
    assert list(fig.layout.xaxis.tickvals) == [8, 16, 32] and list(fig.layout.xaxis.ticktext) == ["8", "16", "32"]
    full = [t for t in fig.data if t.meta == "full-cache"]
    assert len(full) == 1 and list(full[0].y) == [18.5, 18.5]
    assert not fig.layout.annotations  # an annotation's y on a log axis is read as a power of 10


def test_the_text_shaded_by_loss_wraps_whole_tokens():
    toks = ["The", " architecture", " of", "\n", " the"] + [" word"] * 40
    df = pd.DataFrame({"position": range(len(toks)), "token": toks,
                       "logprob_full": np.zeros(len(toks)), "logprob": -np.linspace(0, 1, len(toks))})
    bars = kf.loss_text_figure(df, line_chars=40).data[0]
    assert list(bars.text[:3]) == ["The", " architecture", " of"] and bars.text[3] == "↵"
    assert bars.y[4] == bars.y[3] + 1  # the newline ends its line
    assert max(bars.y) >= 4 and all(b + w <= 40 for b, w in zip(bars.base, bars.x))  # wraps at 40 characters


def test_the_page_guide_has_every_page_and_the_readme_one_line_each():
    for p in registry.PAGES:
        assert len(page_guide.section(p.title).split()) > 10, p.title
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for p in registry.PAGES:
        path = "/" if p.default else f"/{p.key}"
        line = next(ln for ln in readme.splitlines() if ln.startswith(f"- [{p.title}]"))
        assert f"(`{path}`)" in line and len(line.split()) <= 40, line
        anchor = re.search(r"docs/pages\.md#([\w-]+)", line).group(1)
        assert anchor == re.sub(r"[^a-z0-9 -]", "", f"{p.title} {path}".lower()).replace(" ", "-")
    assert "docs/pages.md" in readme and "make run" in readme and "make test" in readme
