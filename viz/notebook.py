"""viz figures inline in Jupyter with nothing loaded from a CDN.

    import viz.notebook
    viz.notebook.use_offline_renderer()   # once, near the top of the notebook

plotly's own "notebook" renderer embeds plotly.js in the notebook when it is activated
(offline), but adds `<script src="https://cdnjs.cloudflare.com/.../mathjax/...">` to every
figure it draws, so each output still reaches for a CDN (the blank-output trouble that
bertviz and CircuitsVis users report). `OfflineNotebookRenderer` is that renderer without
MathJax: plotly.js comes from the plotly package, once, and every figure is a `<div>` and a
`Plotly.newPlot` call. No figure of viz uses LaTeX, so nothing is lost.
"""

from __future__ import annotations

import plotly.io as pio
from plotly.io._base_renderers import NotebookRenderer

RENDERER = "attention_lab"


class OfflineNotebookRenderer(NotebookRenderer):
    """plotly's notebook renderer, plotly.js embedded, with no MathJax from a CDN."""

    def to_mimebundle(self, fig_dict):
        html = pio.to_html(
            fig_dict,
            config=self.config,
            auto_play=self.auto_play,
            include_plotlyjs=False,  # embedded once by activate() (connected=False)
            include_mathjax=False,
            post_script=self.post_script,
            full_html=False,
            animation_opts=self.animation_opts,
            default_width="100%",
            default_height=525,
            validate=False,
        )
        return {"text/html": html}


def use_offline_renderer() -> str:
    """Register the offline renderer and make it the default (this embeds plotly.js in the
    current cell's output); returns its name."""
    pio.renderers[RENDERER] = OfflineNotebookRenderer(connected=False)
    pio.renderers.default = RENDERER
    return RENDERER
