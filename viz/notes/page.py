"""The lecture notes the pages follow: each concept of the notes, linked to the page that
shows it on an example (viz.figures.citations.CONCEPTS), and the notes by the short names the pages
cite them by."""

import pandas as pd
import streamlit as st

from viz.figures.citations import CONCEPTS, NOTES
from viz.ui import registry, url_state, widgets

widgets.header("notes")
st.caption("The pages follow five sets of lecture notes on attention and transformers and cite them by the short "
           "names below (“Bishop ch. 12, eq. 3”). Each concept opens the page that shows it, on an example; change "
           "the sentence there to see it on your own. Elsewhere in the app, “seed” means only a random seed.")
# the page keeps nothing in its URL: a value given there is named as ignored, and the URL left empty
state = url_state.PageState("notes", reads_url=False)
state.show_messages()
state.publish()

for number, notes in NOTES.items():
    st.markdown(f"**{notes.short}** · {notes.title}")
    for i, c in enumerate(x for x in CONCEPTS if x.notes == number):
        spec = registry.page(c.page)
        st.page_link(spec.file, label=f"{c.idea} → {spec.title} ({c.model})", icon=spec.icon,
                     query_params={"model": c.model, "text": c.text, **dict(c.params)})

st.subheader("The notes")
st.table(pd.DataFrame([{"Cited as": n.short, "Title": n.title, "Author": n.author, "What the app takes from them":
                        n.covers} for n in NOTES.values()]).set_index("Cited as"))
