"""The root URL opens the explorer, keeping any URL parameters (so / and /explore both work)."""

import streamlit as st

st.switch_page("viz/pages/explore.py", query_params=st.query_params.to_dict())
