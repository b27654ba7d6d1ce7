"""Playground: attention by hand, parameter-free and symmetric attention, why scores are
scaled, what the hyper-parameters cost in parameters, what sequence length costs in time, and
what a fixed state forgets on associative recall.

Computation lives in viz.figures.by_hand (pure functions over core). This page reads the model,
the sentence and the controls (playground_controls.py), draws the open tab only (tabs
1–4 in playground_attention.py, 5 and 6 in playground_cost.py, 7 in recall_panel.py) and writes
the URL."""

import streamlit as st

from viz.ui import models, url_state, url_switches, widgets
from viz.playground import attention_panel as playground_attention, controls_panel as playground_controls, cost_panel as playground_cost
from viz.playground import recall_panel
from viz.playground.controls_panel import PLAY_TABS

widgets.header("playground")
state = url_state.PageState("playground", fields=playground_controls.FIELDS)

model_name, model, text_col = widgets.model_header(state)
default_text = model.examples[0] if model is not None and model.examples else widgets.NOTES_EXAMPLES["bank (river)"]
text_key = state.seeded_key("text", default_text)
with text_col:
    text = widgets.text_box("Sentence, used by tabs 2, 3 and 5", text_key)
trace = models.get_trace(model_name, text) if model is not None else None

keys = playground_controls.seeded_keys(state, trace, model_name)
hand_base = playground_controls.hand_tables(state)
tab_key = url_switches.tab(state, "tab", PLAY_TABS)
state.show_messages()
tabs = st.tabs(list(PLAY_TABS.values()), key=tab_key, on_change="rerun")

# Only the open tab runs (st.tabs with on_change="rerun"): the first view mounts one tab's
# charts, not eight. A closed tab's URL values come from its seeded controls (seeded_keys),
# tab 1's tables and tab 5's "built" flag from what the tab last showed.
ss = st.session_state
if tabs[0].open:
    edited = ss["playground.hand_edited"] = playground_attention.hand_tab(keys, hand_base)
else:
    edited = ss.get("playground.hand_edited", hand_base)
if tabs[1].open:
    playground_attention.parameter_free(trace, keys)
if tabs[2].open:
    playground_attention.symmetric(state, trace, model, model_name, keys)
if tabs[3].open:
    playground_attention.scaling(keys)
if tabs[4].open:
    built = ss["playground.hp_shown"] = playground_cost.hyper_parameters(state, keys, text)
else:
    built = ss.get("playground.hp_shown", bool(ss[keys["hp_built"]]))
if tabs[5].open:
    playground_cost.cost(keys)
if tabs[6].open:
    recall_panel.recall(keys)

state.publish(model=model_name, text=text, layer=ss.get(state.key("layer")), head=ss.get(state.key("head")),
              tab=url_switches.tab_url(state, "tab", PLAY_TABS),
              **playground_controls.url_values(keys, trace, edited, built))
