"""The recall models' accuracy as the key-value pairs grow (core/toy/recall_task.py: multi-query
associative recall), one line per token mixer: the figure Start here's stop 6 and the
Playground's recall tab both draw. A pure function of numbers; no Streamlit."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import plotly.graph_objects as go

MIXER_NAMES = {"softmax": "softmax attention", "gated_delta": "Gated DeltaNet", "mamba2": "Mamba2"}


def mixer_name(mixer: str) -> str:
    return MIXER_NAMES.get(mixer, mixer)


def recall_curve_figure(curves: Dict[str, Dict[int, float]], live: Optional[Dict[str, Tuple[int, float]]] = None,
                        height: int = 360) -> Optional[go.Figure]:
    """The shipped accuracy by number of key-value pairs, one line per mixer (trace name the
    mixer's name), and `live`: mixer -> (pairs, accuracy measured now) as a point each (trace
    name "<mixer's name>, now"). None when there is nothing to draw."""
    live = live or {}
    if not curves and not live:
        return None
    fig = go.Figure()
    for mixer, acc in curves.items():
        pairs = sorted(acc)
        fig.add_trace(go.Scatter(x=pairs, y=[acc[p] for p in pairs], mode="lines+markers", name=mixer_name(mixer),
                                 legendgroup=mixer,
                                 hovertemplate="%{x} pairs: %{y:.1%}<extra>" + mixer_name(mixer) + "</extra>"))
    for mixer, (pairs, acc) in live.items():
        fig.add_trace(go.Scatter(x=[pairs], y=[acc], mode="markers", name=f"{mixer_name(mixer)}, now",
                                 legendgroup=mixer, marker=dict(symbol="x", size=12, line=dict(width=2)),
                                 hovertemplate="%{x} pairs, measured now: %{y:.1%}<extra>" + mixer_name(mixer) + "</extra>"))
    fig.update_xaxes(title="key-value pairs in the context", dtick=2)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%", title="recall accuracy")
    fig.update_layout(title="multi-query associative recall: accuracy as the pairs grow", height=height,
                      legend=dict(orientation="h", y=-0.25), margin=dict(t=50, b=90))
    return fig


def curve_words(curves: Dict[str, Dict[int, float]], hold: float = 0.99) -> str:
    """What the shipped curves show, read from their numbers: per mixer, whether it holds (at or
    above `hold` at every pair count) or where it falls from and to. '' without curves."""
    parts = []
    order = list(MIXER_NAMES)
    for mixer, acc in sorted(curves.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)):
        if not acc:
            continue
        pairs = sorted(acc)
        lo, hi = pairs[0], pairs[-1]
        if min(acc.values()) >= hold:
            parts.append(f"{mixer_name(mixer)} holds ({acc[hi]:.1%} at {hi} pairs)")
        else:
            worst = min(pairs, key=lambda p: (acc[p], -p))
            parts.append(f"{mixer_name(mixer)} falls from {acc[lo]:.1%} at {lo} pairs to {acc[worst]:.1%} at {worst}")
    return "; ".join(parts) + "." if parts else ""
