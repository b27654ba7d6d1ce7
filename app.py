"""Attention Lab: page configuration and navigation. Nothing else lives here."""

import streamlit as st

st.set_page_config(page_title="Attention Lab", page_icon="🔍", layout="wide")

PAGES = [
    st.Page("viz/pages/explore.py", title="Explore", url_path="explore", icon="🔍", default=True),
    st.Page("viz/pages/inside.py", title="Inside a head", url_path="inside", icon="🧮"),
    st.Page("viz/pages/positions.py", title="Positions", url_path="positions", icon="〰️"),
    st.Page("viz/pages/decoder.py", title="Decoder stepper", url_path="decoder", icon="⏭️"),
    st.Page("viz/pages/compare.py", title="Compare", url_path="compare", icon="⚖️"),
    st.Page("viz/pages/playground.py", title="Playground", url_path="playground", icon="🧪"),
]

st.navigation(PAGES, position="sidebar").run()
