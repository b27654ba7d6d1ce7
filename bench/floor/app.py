"""The floor under the decoder step's figure (bench/browser/floor.py, scenario "floor" of bench.browser_bench).

A Streamlit fragment with a Next button, a line that names the step and FLOOR_CHARTS plain
plotly heatmaps with their values written in the cells (the decoder step's kind of chart),
each with a caption: no model, no trace, none of the app's code. Each Next grows the maps by
one row and column, as the decoder's Next does. What a click costs here is what Streamlit and
plotly.js cost on the machine, which the app's own figure cannot go under."""

import os

import numpy as np
import plotly.graph_objects as go
import streamlit as st

N_CHARTS = int(st.query_params.get("charts", os.environ.get("FLOOR_CHARTS", "5")))  # ?charts=N: first loads
SIDES = range(2, 9)


def _next() -> None:
    st.session_state["floor-step"] = st.session_state.get("floor-step", 0) + 1


@st.fragment
def step() -> None:
    st.button("Next", key="floor-next", on_click=_next)
    n = SIDES[st.session_state.get("floor-step", 0) % len(SIDES)]
    st.markdown(f"**Maps of {n} × {n}**")
    cols = st.columns(3)
    for i in range(N_CHARTS):
        z = np.random.default_rng(10 * n + i).random((n, n))
        fig = go.Figure(go.Heatmap(z=z, text=np.round(z, 2), texttemplate="%{text}"),
                        layout=dict(height=400, title=f"map {i}"))
        with cols[i % 3]:
            st.plotly_chart(fig, key=f"floor-{i}")
            st.caption("A caption under the chart.")


def floor() -> None:
    st.title("Streamlit floor")
    step()


def bare() -> None:
    floor()


st.navigation([st.Page(floor, title="Floor", default=True), st.Page(bare, title="Bare", url_path="bare")],
              position="hidden").run()
