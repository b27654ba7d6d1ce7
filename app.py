"""Attention Lab: process setup, page configuration and navigation, each page run inside the
admission gate's page-run scope (what it holds counts against the memory budget until it ends).
Nothing else lives here."""

import streamlit as st

from viz.ui.admission import page_run
from viz.ui.models import setup_process
from viz.ui.history import one_entry_per_action
from viz.ui.registry import by_section

setup_process()

# An emoji favicon is drawn in the browser; a ":material/...:" one is fetched from fonts.gstatic.com.
st.set_page_config(page_title="Attention Lab", page_icon="👀", layout="wide")
one_entry_per_action()  # Back undoes one action (a page switch included), not half of one

NAV = {section: [st.Page(p.file, title=p.title, url_path=None if p.default else p.key, icon=p.icon, default=p.default)
                  for p in pages] for section, pages in by_section().items()}

with page_run():
    st.navigation(NAV, position="sidebar", expanded=True).run()
