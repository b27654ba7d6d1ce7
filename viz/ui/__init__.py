"""The Streamlit side of viz: the parts the pages in viz/pages share (model loading, URL
state, widgets, chart and download helpers, the decoder's and Playground's panels). With
viz/pages, the only place in viz that imports Streamlit."""
