"""Downloads under a map, in one "Download this map's data" popover: the map (CSV), its layer
(NPZ), the whole trace (NPZ), each labelled with what it holds and its size, and named for it; a file over the download budget
(viz.ui.download_sizes.download_budget) is not offered, and the page says why.

Every deferred download (a file built when its button is clicked) holds what it needs: `later` binds
the function and its inputs at the run that offers the button. A lambda over a page's globals does
not: Streamlit calls it after the page run has ended, and by then admission.page_run has dropped the
page's heavy globals (a frame, a figure), so it failed with a NameError and no file came. A trace is
never bound (it would stay alive outside the memory budget while the tab is open): a download that
reads one takes result_getter.getter(trace), as `offer` does."""

from __future__ import annotations

import io
from typing import Callable

import streamlit as st

from viz.ui import download_sizes as vd
from viz.ui import result_getter
from viz.figures.heatmaps import attention_frame

WHOLE_WARN_BYTES = 100 * 2**20  # above this, say that the whole trace takes a while to write


def later(build: Callable, *inputs) -> Callable[[], bytes]:
    """A deferred download's data function: build(*inputs) when the button is clicked, with the
    inputs bound now (never read from the page's globals then). A trace among the inputs is a
    TypeError: pass result_getter.getter(trace) instead, which does not keep it alive."""
    from core.trace import Trace

    if any(isinstance(v, Trace) for v in inputs):
        raise TypeError("a deferred download must not hold a trace: pass result_getter.getter(trace)")
    return lambda: build(*inputs)


def _csv(table: Callable, frame) -> bytes:
    return (frame if table is None else table(frame)).to_csv(index=False).encode()


def csv_later(frame, table: Callable | None = None) -> Callable[[], bytes]:
    """A deferred CSV of table(frame) (of frame itself without `table`), without the index. Holds
    the frame only: when `table` is None its attrs (a KV cache run's kept keys, its maps) are left
    behind, as the CSV writes none of them."""
    if table is None:
        import pandas as pd

        frame = pd.DataFrame(frame)  # the same columns (copy on write), none of the attrs (frame.copy copies them)
    return later(_csv, table, frame)


def _base(model: str, stack: str, kind: str, layer: int) -> str:
    return f"{model}-{stack}-{kind.replace('_', '-')}-layer{layer}"


def map_name(*, model: str, stack: str, kind: str, layer: int, head, suffix: str = "") -> str:
    """The file name (without extension) of one map, the same for its CSV, SVG and PNG
    (head None: the mean over heads)."""
    head_part = "mean-of-heads" if head is None else f"head{head}"
    return f"{_base(model, stack, kind, layer)}-{head_part}{suffix}-map"


def offer(trace, matrix, q_tokens, k_tokens, *, model: str, stack: str, kind: str, layer: int, head, key: str,
          suffix: str = "") -> None:
    """head None: the map is the mean over heads. The files are built when clicked, from
    result_getter.getter(trace): Streamlit keeps a deferred file's function until the session's next run,
    and that must not keep the trace alive outside the memory budget."""
    get = result_getter.getter(trace)
    base = _base(model, stack, kind, layer)
    sizes = vd.trace_bytes(trace, at={stack: layer})
    # One popover: a closed popover mounts nothing, so the page's first view has one button here, not three.
    box = st.popover("Download this map's data", icon=":material/download:", key=f"{key}-pop")
    if matrix is not None:
        def csv() -> bytes:  # built only when clicked
            return attention_frame(matrix, q_tokens, k_tokens).to_csv().encode()

        box.download_button(f"This map (CSV, {matrix.shape[-2]}×{matrix.shape[-1]})", csv,
                            file_name=map_name(model=model, stack=stack, kind=kind, layer=layer, head=head,
                                               suffix=suffix) + ".csv", mime="text/csv",
                            key=f"{key}-csv", on_click="ignore")
    layer_size = sizes.get(f"layer:{stack}", 0)
    budget, why = vd.download_budget()
    box.download_button(f"Layer {layer}, all heads (NPZ, ≈{vd.human(layer_size)})",
                        lambda: vd.layer_npz(get(), stack, layer), file_name=f"{base}-all-heads.npz",
                        mime="application/octet-stream", key=f"{key}-layer", on_click="ignore",
                        disabled=layer_size > budget,
                        help="Every tensor of this layer (each head's queries, keys, values, scores and "
                             "weights) and the tokens." + (f" Not offered: it is over the download budget of "
                                                       f"{why}." if layer_size > budget else ""))

    def npz() -> bytes:  # built only when clicked
        buf = io.BytesIO()
        get().save(buf)
        return buf.getvalue()

    total = sizes["total"]
    n_layers = sum(trace.layers(s) for s in trace.stacks())
    if total > budget:  # the file is built in memory before it is sent: offer what fits
        box.caption(f"**Whole trace not offered**: it would be ≈{vd.human(total)} (uncompressed), over the "
                    f"download budget of {why}, and it is built in this server's memory before it is sent. "
                    f"Download it layer by layer instead: ≈{vd.human(layer_size)} each, {n_layers} layers.")
        return
    box.download_button(f"Whole trace, every layer (NPZ, ≈{vd.human(total)})", npz,
                        file_name=f"{model}-whole-trace-all-layers.npz", mime="application/octet-stream",
                        key=f"{key}-npz", on_click="ignore",
                        help="Every layer's tensors, recomputed layer by layer while the file is written.")
    if total > WHOLE_WARN_BYTES:
        box.caption(f"The whole trace is about {vd.human(total)} (uncompressed): writing it recomputes every layer "
                    "and can take a minute before the download starts. The layer alone is "
                    f"{vd.human(layer_size)}.")
