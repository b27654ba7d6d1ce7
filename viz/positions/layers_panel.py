"""The Positions page's layer strip: which layers of a RoPE model rotate their queries and keys
(with each one's RoPE base) and which have no positions at all (NoPE: SmolLM3, Llama 4), with a
link that opens Explore on a NoPE layer's map beside a RoPE layer's on the same sentence."""

from __future__ import annotations

import streamlit as st

from viz.positions import figures as vp
from viz.ui import charts, explore_links


def layers(model, model_name: str, text: str, stack: str) -> None:
    """The strip (vp.layer_positions_figure) for a model whose layers say what they are."""
    try:
        kinds = model.layer_kinds(stack)
    except (AttributeError, ValueError):
        return
    table = vp.layer_positions(kinds)
    charts.chart(vp.layer_positions_figure(table, model_name), key="positions-layers", width="stretch")
    nope = table.index[table["positions"] == "NoPE"].tolist()
    rope = table.index[table["positions"] == "RoPE"].tolist()
    bases = sorted({float(b) for b in table["RoPE base"].dropna()})
    if not nope:
        st.caption(f"Every layer rotates (RoPE base{'s' if len(bases) > 1 else ''} "
                   f"{', '.join(f'{b:g}' for b in bases)}).")
        return
    st.info(f"{len(nope)} of {len(table)} layers ({', '.join(f'L{i}' for i in nope)}) have **no positions** (NoPE): "
            "their queries and keys are used as projected, never rotated, so q_i · k_j does not depend on the offset "
            "i − j there; only the causal mask and what earlier layers wrote into the stream tell positions apart. "
            + (f"The other layers rotate (RoPE base {', '.join(f'{b:g}' for b in bases)})." if rope else ""))
    if rope:
        explore_links.link(st, f"Explore: layer {nope[0]}'s map (NoPE) beside layer {rope[0]}'s (RoPE) on this sentence",
                           {"model": model_name, "text": text, "attn": f"{stack}.self_attn", "layer": str(rope[0]),
                            "beside": str(nope[0])}, icon=":material/compare:")
