"""examples/quickstart.ipynb runs top to bottom in a fresh kernel, offline, and its figures
need nothing from a CDN."""

import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def _html_outputs(nb):
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            html = out.get("data", {}).get("text/html")
            if html:
                yield "".join(html) if isinstance(html, list) else html


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    work = tmp_path_factory.mktemp("notebook")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env_path) if p)  # the kernel imports this checkout
    try:
        client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                         resources={"metadata": {"path": str(work)}})
        client.execute()  # raises CellExecutionError on the first cell that fails
    finally:
        os.environ["PYTHONPATH"] = env_path
    return nb, work


@pytest.mark.slow
def test_quickstart_runs_and_shows_every_view(executed):
    nb, work = executed
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    html = list(_html_outputs(nb))
    figures = [h for h in html if "plotly-graph-div" in h]
    assert len(figures) >= 5  # heatmap, model view, head view, decoder step, next tokens
    assert any("<table" in h and "weight" in h for h in html)  # the pandas table of frame()
    assert any("<table" in h and "previous_token" in h and "induction" in h for h in html)  # head scores
    printed = "".join("".join(o.get("text", "")) for c in nb.cells for o in c.get("outputs", []))
    assert "plain:" in printed and "ablated:" in printed  # the ablation cell ran
    assert "perplexity: full cache" in printed and "sinks removed:" in printed  # the KV cache cells ran
    assert any("<table" in h and "mass_lost" in h for h in html)
    assert "path patching L16H0 -> L18H6 (key)" in printed  # the circuits cell ran and drew its graph
    assert any("plotly-graph-div" in h and "L16H0" in h and "components" in h for h in html)
    assert (work / "cross-attention.svg").is_file() or any(
        "install Debian's Chromium" in "".join(o.get("text", "")) for c in nb.cells for o in c.get("outputs", []))


@pytest.mark.slow
def test_quickstart_loads_nothing_from_a_cdn(executed):
    from plotly.offline import get_plotlyjs

    nb, _ = executed
    bundle = get_plotlyjs()
    html = list(_html_outputs(nb))
    assert sum(h.count(bundle) for h in html) == 1  # plotly.js embedded once, from the plotly package
    for h in html:
        rest = h.replace(bundle, "")  # the library's own source mentions URLs (map tiles, docs)
        assert "cdn.plot.ly" not in rest and "cdnjs" not in rest and "jsdelivr" not in rest
        assert "https://" not in rest and "http://" not in rest, rest[:300]
        assert not re.search(r"<script[^>]*\bsrc\s*=", rest) and not re.search(r"import\s*[\"']", rest)


def test_offline_renderer_drops_the_cdn_script_plotly_adds():
    """plotly's own notebook renderer puts MathJax from a CDN in every figure; ours does not."""
    import plotly.graph_objects as go
    import plotly.io as pio

    from viz.notebook import OfflineNotebookRenderer

    fig = go.Figure(go.Heatmap(z=[[0.2, 0.8], [0.5, 0.5]])).to_dict()
    stock = pio.renderers["notebook"].to_mimebundle(fig)["text/html"]
    ours = OfflineNotebookRenderer(connected=False).to_mimebundle(fig)["text/html"]
    assert re.search(r"<script[^>]*\bsrc\s*=\s*\"https://", stock)  # what the offline renderer exists for
    assert "plotly-graph-div" in ours and "Plotly.newPlot" in ours
    assert "https://" not in ours and not re.search(r"<script[^>]*\bsrc\s*=", ours)
