"""Attention Lab: process setup, page configuration and navigation. Nothing else lives here."""

import streamlit as st

from viz.ui.models import setup_process
from viz.ui.history import one_entry_per_action

setup_process()

# An emoji favicon is drawn in the browser; a ":material/...:" one is fetched from fonts.gstatic.com.
st.set_page_config(page_title="Attention Lab", page_icon="👀", layout="wide")
one_entry_per_action()  # Back undoes one action (a page switch included), not half of one

PAGES = [
    st.Page("viz/pages/home.py", title="Attention Lab", default=True, visibility="hidden"),
    st.Page("viz/pages/explore.py", title="Explore", url_path="explore", icon=":material/grid_on:"),
    st.Page("viz/pages/inside.py", title="Inside a head", url_path="inside", icon=":material/functions:"),
    st.Page("viz/pages/positions.py", title="Positions", url_path="positions", icon=":material/waves:"),
    st.Page("viz/pages/decoder.py", title="Decoder stepper", url_path="decoder", icon=":material/skip_next:"),
    st.Page("viz/pages/compare.py", title="Compare", url_path="compare", icon=":material/compare_arrows:"),
    st.Page("viz/pages/playground.py", title="Playground", url_path="playground", icon=":material/science:"),
    st.Page("viz/pages/heads.py", title="Heads", url_path="heads", icon=":material/psychology:"),
    st.Page("viz/pages/patching.py", title="Patching", url_path="patching", icon=":material/healing:"),
    st.Page("viz/pages/lens.py", title="Lens", url_path="lens", icon=":material/stacks:"),
    st.Page("viz/pages/kvcache.py", title="KV cache", url_path="kvcache", icon=":material/memory:"),
    st.Page("viz/pages/corpus.py", title="Corpus", url_path="corpus", icon=":material/scatter_plot:"),
    st.Page("viz/pages/attribution.py", title="Attribution", url_path="attribution", icon=":material/insights:"),
    st.Page("viz/pages/notes.py", title="Lecture notes", url_path="notes", icon=":material/menu_book:"),
]

st.navigation(PAGES, position="sidebar").run()
