"""The lecture notes the pages cite, by the short names the pages use."""

import pandas as pd
import streamlit as st

from viz.ui import widgets

from viz.citations import NOTES

widgets.header("notes")
st.caption("The pages follow five sets of lecture notes on attention and transformers and cite them by the short "
           "names below (“Bishop ch. 12, eq. 3”). Elsewhere in the app, “seed” means only a random seed.")
st.table(pd.DataFrame([{"Cited as": n.short, "Title": n.title, "Author": n.author, "What the app takes from them":
                        n.covers} for n in NOTES.values()]).set_index("Cited as"))
