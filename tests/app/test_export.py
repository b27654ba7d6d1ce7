"""Figures for papers: viz.figures.export (kaleido + Chromium) and the app's chart downloads."""

import base64
import io
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from plotly.colors import convert_colors_to_same_type, unlabel_rgb

from browser_utils import SKIP_VAR
from conftest import assert_no_exception
from viz.figures import export
from viz.figures.heatmaps import attention_heatmap

ROOT = Path(__file__).resolve().parents[2]
SVG_NS = "{http://www.w3.org/2000/svg}"
XLINK = "{http://www.w3.org/1999/xlink}href"

# A 4 x 4 map with ones at chosen (query, key) cells and zeros elsewhere.
ONES = [(0, 1), (1, 3), (2, 0), (3, 2)]


def _browser_or_skip():
    """The browser export draws with. Like the browser tests, a missing one fails with what to
    install (skipped only with ATTENTION_LAB_SKIP_BROWSER=1, tests/browser_utils.py)."""
    if os.environ.get(SKIP_VAR, "") not in ("", "0"):
        pytest.skip(f"{SKIP_VAR}={os.environ[SKIP_VAR]}: the browser tests are skipped on request")
    try:
        return export.find_browser()
    except export.ExportError as exc:
        pytest.fail(f"figure export cannot run: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def heatmap_svg(tmp_path_factory):
    _browser_or_skip()
    w = np.zeros((4, 4))
    for q, k in ONES:
        w[q, k] = 1.0
    # a key that is a control character, as a byte-level vocabulary has ("\x10"): XML forbids it in a file
    fig = attention_heatmap(w, ["a", "b", "c", "d"], ["w", "x", "\x10", "z"], title="export test")
    path = export.save(fig, tmp_path_factory.mktemp("export") / "map.svg")
    return fig, path


def _rgb(colour):
    return np.array(unlabel_rgb(convert_colors_to_same_type(colour, "rgb")[0][0]), dtype=float)


def test_svg_is_valid_and_holds_the_cells(heatmap_svg):
    fig, path = heatmap_svg
    root = ET.parse(path).getroot()  # raises on anything that is not well-formed XML
    assert root.tag == SVG_NS + "svg"
    texts = " ".join(t.text or "" for t in root.iter(SVG_NS + "text"))
    assert "export test" in texts and "key" in texts and "query" in texts
    assert "\u2410" in texts  # the control character, drawn as its control picture (export.well_formed)
    layers = [g for g in root.iter(SVG_NS + "g") if "heatmaplayer" in g.get("class", "")]
    assert len(layers) == 1
    images = list(layers[0].iter(SVG_NS + "image"))
    assert len(images) == 1
    href = images[0].get(XLINK) or images[0].get("href")
    m = re.match(r"data:image/png;base64,(.*)", href)
    assert m, href[:40]
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(base64.b64decode(m.group(1)))).convert("RGB"), dtype=float)
    h, w = img.shape[:2]
    # the colour scale's two ends, from the figure itself
    scale = fig.data[0].colorscale
    lo, hi = _rgb(scale[0][1]), _rgb(scale[-1][1])
    assert np.abs(lo - hi).max() > 50
    assert fig.layout.yaxis.autorange == "reversed"  # query 0 is the top row
    for q in range(4):
        for k in range(4):
            px = img[int((q + 0.5) * h / 4), int((k + 0.5) * w / 4)]
            want = hi if (q, k) in ONES else lo
            assert np.abs(px - want).max() <= 3, (q, k, px, want)


def test_well_formed_draws_forbidden_controls_as_pictures():
    raw = "<svg><text>a\x10b\x00\té</text></svg>".encode()
    with pytest.raises(ET.ParseError):
        ET.fromstring(raw)
    assert ET.fromstring(export.well_formed(raw)).find("text").text == "a\u2410b\u2400\té"  # a tab is legal: kept


def test_png_is_twice_the_size(tmp_path):
    _browser_or_skip()
    from PIL import Image

    fig = attention_heatmap(np.eye(3), list("abc"), list("abc"), height=300)
    fig.update_layout(width=400)
    path = export.save(fig, tmp_path / "map.png")
    assert Image.open(path).size == (800, 600)


def test_missing_browser_says_what_to_install(monkeypatch, tmp_path):
    fig = attention_heatmap(np.eye(2), list("ab"), list("ab"))
    with pytest.raises(export.ExportError, match=r"no browser at browser='/nonexistent/chromium'.*apt-get install chromium"):
        export.save(fig, tmp_path / "x.svg", browser="/nonexistent/chromium")
    monkeypatch.setenv("BROWSER_PATH", "/nonexistent/chrome")
    with pytest.raises(export.ExportError, match=r"BROWSER_PATH='/nonexistent/chrome'.*chromium"):
        export.to_bytes(fig, "svg")
    monkeypatch.delenv("BROWSER_PATH")
    monkeypatch.setattr(export, "DEBIAN_CHROMIUM", str(tmp_path / "no-chromium"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(export.ExportError, match=r"no Chrome or Chromium found.*apt-get install chromium"):
        export.to_bytes(fig, "pdf")
    assert not (tmp_path / "x.svg").exists()


def test_unknown_suffix_is_refused(tmp_path):
    fig = attention_heatmap(np.eye(2), list("ab"), list("ab"))
    with pytest.raises(export.ExportError, match=r"\.svg, \.pdf, \.png"):
        export.save(fig, tmp_path / "x.jpg")


def test_every_page_chart_goes_through_the_helper():
    """No page (nor a part of one, viz/ui) calls plotly_chart itself: the helper is the one place
    that sets the downloads."""
    streamlit_side = [*(ROOT / "viz" / "pages").glob("*.py"), *(ROOT / "viz" / "ui").glob("*.py")]
    assert (ROOT / "viz" / "ui" / "charts.py") in streamlit_side
    offenders = [p.name for p in streamlit_side if p.name != "charts.py" and "plotly_chart(" in p.read_text()]
    assert not offenders


def test_app_charts_offer_png_2x_and_svg(app_test):
    at = app_test("positions")
    at.run()
    assert_no_exception(at)
    charts = at.get("plotly_chart")
    assert len(charts) >= 3
    svg_buttons = {b.proto.id: b for b in at.get("download_button") if b.proto.label == "SVG"}
    for chart in charts:
        config = json.loads(chart.proto.config)
        assert config["toImageButtonOptions"]["scale"] == 2
        assert config["toImageButtonOptions"]["format"] == "png"
        key = config["toImageButtonOptions"]["filename"]
        assert key in chart.proto.id
        assert any(f"{key}-svg" in i for i in svg_buttons), key
    assert len(svg_buttons) == len(charts)


def test_a_pipe_message_choreographer_skips_is_one_warning_and_other_errors_stay(caplog):
    """choreographer's recovered decode failure (logged with a traceback) reads as one warning line;
    any other error of the library is still an error."""
    import logging

    from viz.figures import export

    export._skip_pipe_tracebacks()
    export._skip_pipe_tracebacks()  # once, however often an export runs
    log = logging.getLogger("choreographer.channels.pipe")
    assert hasattr(log, "debug2") and len(log.filters) == 1  # still choreographer's own logger class
    with caplog.at_level(logging.DEBUG, logger="choreographer.channels.pipe"):
        try:
            raise ValueError("Expecting property name enclosed in double quotes")
        except ValueError:
            log.exception("JSONError decoding message. Ignoring")
        log.error("Error in trying to decode JSON off our read.")
    (skipped, other) = caplog.records
    assert (skipped.levelno, skipped.exc_info, "skipped" in skipped.getMessage()) == (logging.WARNING, None, True)
    assert other.levelno == logging.ERROR


def test_a_figure_the_first_browser_gave_no_answer_for_is_drawn_by_a_second(monkeypatch, caplog):
    """kaleido waits out its timeout when a browser's answer is lost: the export starts one more
    browser, says so in the log, and raises only when that one fails too."""
    import logging

    import kaleido
    import plotly.graph_objects as go

    from viz.figures import export

    calls = []

    def flaky_once(fig, opts, kopts):
        calls.append(opts["format"])
        if len(calls) == 1:
            raise TimeoutError("no answer")
        return b"<svg xmlns='http://www.w3.org/2000/svg'><g/></svg>"

    monkeypatch.setattr(export, "find_browser", lambda browser=None: "/usr/bin/chromium")
    monkeypatch.setattr(kaleido, "calc_fig_sync", flaky_once)
    with caplog.at_level(logging.WARNING, logger="attention_lab.export"):
        assert export.to_bytes(go.Figure(), "svg").startswith(b"<svg")
    assert calls == ["svg", "svg"] and "drawing it again" in caplog.text

    def never(fig, opts, kopts):
        calls.append(opts["format"])
        raise TimeoutError("no answer")

    calls.clear()
    monkeypatch.setattr(kaleido, "calc_fig_sync", never)
    with pytest.raises(TimeoutError):
        export.to_bytes(go.Figure(), "svg")
    assert calls == ["svg", "svg"]
