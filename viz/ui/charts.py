"""Every chart of the app goes through `chart()`: figures for papers, PNG at 2x and SVG.

The chart's own camera button (plotly's modebar) downloads a PNG at twice the shown size;
an "SVG" button under the chart downloads the same figure as SVG, drawn by plotly's own
export (viz.figures.export, kaleido and Chromium) only when it is clicked. Where no browser is
installed the SVG button is disabled and its tooltip says what to install.
"""

from __future__ import annotations

import streamlit as st

from viz.figures import export

PNG_SCALE = 2


def modebar_config(name: str) -> dict:
    """plotly.js config: the camera button saves `<name>.png` at PNG_SCALE x the shown size."""
    return {"toImageButtonOptions": {"format": "png", "scale": PNG_SCALE, "filename": name},
            "displaylogo": False}


def chart(fig, key: str, where=None, name: str = "", **kwargs):
    """st.plotly_chart(fig, key=key, **kwargs) in `where` (default: the page), with the
    2x PNG camera button and an SVG download under it, both files named `name` (what the
    figure shows, as its CSV is; default: the key). Returns plotly_chart's value."""
    where = st if where is None else where
    name = name or key
    event = where.plotly_chart(fig, key=key, config=modebar_config(name), **kwargs)
    try:
        export.find_browser()
        missing = None
    except export.ExportError as exc:
        missing = str(exc)
    where.download_button(
        "SVG", data=lambda: export.to_bytes(fig, "svg"), file_name=f"{name}.svg", mime="image/svg+xml",
        key=f"{key}-svg", on_click="ignore", type="tertiary", icon=":material/download:",
        disabled=missing is not None,
        help=missing or "Download this figure as SVG (vector, for papers); the camera icon on the chart gives a PNG at 2x.")
    return event
