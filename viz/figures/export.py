"""Figures for papers: any plotly figure to SVG, PDF or PNG with plotly's own export (kaleido).

    from viz import export
    export.save(fig, "heatmap.svg")          # the format from the suffix: .svg .pdf .png
    svg = export.to_bytes(fig, "svg")

Kaleido draws the figure with the plotly.js that ships inside the plotly package, in a
headless Chrome or Chromium: Debian's `chromium` (/usr/bin/chromium, which
scripts/setup.sh --test installs), or the executable named by `browser=` or the
`BROWSER_PATH` variable. Nothing is fetched from the network (MathJax, which kaleido would
load from a CDN, is switched off). With no browser, `ExportError` says what to install.
PNG is drawn at scale 2 by default (twice the figure's pixel size).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Optional

import plotly.graph_objects as go

LOG = logging.getLogger("attention_lab.export")
FORMATS = ("svg", "pdf", "png")
DEBIAN_CHROMIUM = "/usr/bin/chromium"
INSTALL_HINT = ("install Debian's Chromium (`sudo apt-get install chromium`, or `bash scripts/setup.sh --test`), "
                "or set BROWSER_PATH to a Chrome or Chromium executable")
DEFAULT_SIZE = (700, 500)  # plotly's own default width and height


class ExportError(RuntimeError):
    """A figure could not be exported (no browser, or an unknown format)."""


class _SkippedPipeMessage(logging.Filter):
    """choreographer, kaleido's link to its browser, logs a message from the browser it cannot
    decode with a full traceback, at ERROR, and goes on without it. That is the library's own
    recovery, not a failure of the export: it is logged as one WARNING line. Were the skipped
    message the one the export waits for, kaleido's timeout raises, and to_bytes draws the
    figure once more in a new browser (then raises if that fails too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("JSONError decoding message"):
            record.msg, record.args = "kaleido's browser pipe: one message did not decode and was skipped", ()
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _skip_pipe_tracebacks() -> None:
    """Install _SkippedPipeMessage on choreographer's pipe logger, once. Called after kaleido is
    imported: choreographer's loggers are logistro's own class, made at its import (a logger asked
    for by name before then would be a plain one, without the levels choreographer logs at)."""
    import choreographer.channels.pipe  # noqa: F401 - makes the logger, of logistro's class

    log = logging.getLogger("choreographer.channels.pipe")
    if not any(isinstance(f, _SkippedPipeMessage) for f in log.filters):
        log.addFilter(_SkippedPipeMessage())


def _is_exe(path) -> bool:
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def find_browser(browser: Optional[str] = None) -> str:
    """The browser kaleido will use: `browser`, else $BROWSER_PATH, else Debian's chromium,
    else chromium / chromium-browser / google-chrome on the PATH. ExportError if none."""
    for label, path in (("browser=", browser), ("BROWSER_PATH=", os.environ.get("BROWSER_PATH"))):
        if path:
            if _is_exe(path):
                return str(path)
            raise ExportError(f"no browser at {label}{path!r}: figure export needs Chrome or Chromium; {INSTALL_HINT}")
    if _is_exe(DEBIAN_CHROMIUM):
        return DEBIAN_CHROMIUM
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    raise ExportError(f"no Chrome or Chromium found for figure export; {INSTALL_HINT}")


def format_of(path) -> str:
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ExportError(f"{path}: export writes {', '.join('.' + f for f in FORMATS)}, not {Path(path).suffix or 'no suffix'}")
    return fmt


def to_bytes(fig: go.Figure, fmt: str = "svg", scale: float = 2, width: Optional[int] = None,
             height: Optional[int] = None, browser: Optional[str] = None) -> bytes:
    """The figure drawn as `fmt` (svg, pdf or png) by plotly.js in a headless browser."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown figure format {fmt!r}; one of {', '.join(FORMATS)}")
    path = find_browser(browser)
    try:
        import kaleido
        from kaleido.errors import ChromeNotFoundError
    except ImportError as exc:  # pragma: no cover - kaleido is a pinned dependency
        raise ExportError("figure export needs kaleido: pip install kaleido==1.5.0") from exc
    _skip_pipe_tracebacks()
    fig_dict = go.Figure(fig).to_plotly_json()
    layout = fig_dict.get("layout", {})
    opts = dict(format=fmt, scale=scale,
                width=width or layout.get("width") or DEFAULT_SIZE[0],
                height=height or layout.get("height") or DEFAULT_SIZE[1])
    for attempt in (1, 2):
        try:
            data = kaleido.calc_fig_sync(fig_dict, opts=opts, kopts={"path": path, "mathjax": False})
            break
        except ChromeNotFoundError as exc:
            raise ExportError(f"the browser at {path!r} could not be started for figure export; {INSTALL_HINT}") from exc
        except Exception as exc:  # noqa: BLE001 - one more browser, then the error as it is
            # Each call starts its own browser. On a loaded machine choreographer can lose a message
            # of that browser's (see _SkippedPipeMessage) and kaleido then waits out its timeout:
            # the second browser draws the same figure. A figure that cannot be drawn fails twice.
            if attempt == 2:
                raise
            LOG.warning("figure export: %s: %s; drawing it again in a new browser", type(exc).__name__, exc)
    return well_formed(data) if fmt == "svg" else data


# Characters XML 1.0 forbids (C0 controls but tab, newline and return). A token can be one (a byte-level
# vocabulary holds "\x10"), and plotly writes it into the SVG as it is: no XML reader opens that file.
_XML_ILLEGAL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def well_formed(svg: bytes) -> bytes:
    """The SVG with each control character XML forbids drawn as its Unicode control picture
    (\x10 as U+2410, "␐"). In UTF-8 these bytes are never part of a longer character."""
    return _XML_ILLEGAL.sub(lambda m: chr(0x2400 + m.group()[0]).encode(), svg)


def save(fig: go.Figure, path, scale: float = 2, width: Optional[int] = None, height: Optional[int] = None,
         browser: Optional[str] = None) -> Path:
    """Write the figure to `path` as SVG, PDF or PNG (from the suffix); returns the path."""
    path = Path(path)
    data = to_bytes(fig, format_of(path), scale=scale, width=width, height=height, browser=browser)
    path.write_bytes(data)
    return path
