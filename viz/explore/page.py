"""Explore: type a sentence, see every head of every layer.

Heatmap of one (stack, attention, layer, head); model view (layer x head grid, click a map
to enlarge it); head view (lines from queries to keys, one colour per head). Word-piece
models can be read in words (core.tokens.words); long inputs are drawn in blocks and deep models
show a range of layers in the model view (viz.figures.model_view). Only the open tab is computed.

Each layer's kind (its mask and positions, model.layer_kinds) is in the map's title and beside
the model view's rows; a learned sink (gpt-oss) is drawn as a column of its own
(viz.figures.heatmaps.add_sink_column) on the map, the model view and its enlarged map; the
map can shade what its mask forbids (`shade`) and draw another layer's map of the head under it
(`beside`: a NoPE layer beside a RoPE one).
"""

import streamlit as st

from viz.figures import model_view
from viz.figures.heatmaps import add_mask_overlay, add_sink_column, attention_heatmap, fix_margins, head_view
from viz.explore import knockout
from viz.figures import why as why_figures
from viz.ui import (charts, downloads, explore_links, longdoc, models, sparse_panel, training_panel, url_state, url_switches,
                   vocab, why_panel, widgets)
from viz.explore import knockout_panel, mixer_panel
from core import trace_names as tn
from viz.figures.select import View, attention_matrix, axis_tokens, mask_of, sink_of
from viz.figures.sparse import add_selection_outline, selection_of
from viz.figures.text import _md_code

TAB_MAP, TAB_MODEL, TAB_HEADS, TAB_LONG = "Heatmap", "Model view (all layers × heads)", "Head view", "Long document"

widgets.header("explore")
state = url_state.PageState("explore", fields=("model", "text", "attn", "layer", "head", "tab", "mean", "permap", "log", "hide",
                                             "words", "full", "heads", "ablate", "ablation", "step_train", "norms",
                                             "section", "shade", "beside") + why_panel.FIELDS)

model_name, model, text_col = widgets.model_header(state)
if model is None:
    st.stop()

default_text = model.examples[0] if model.examples else widgets.NOTES_EXAMPLES["bank (river)"]
text_key = state.seeded_key("text", default_text)
# A new model gets its own default sentence, unless the user typed one of their own.
previous = st.session_state.get("explore._model")
if previous is not None and previous != model_name and not (state.external and "text" in state.qp):
    if st.session_state.get(text_key, "") in ("", st.session_state.get("explore._default_text")):
        st.session_state[text_key] = default_text
st.session_state["explore._model"] = model_name
st.session_state["explore._default_text"] = default_text

examples = vocab.dedupe_examples(list(widgets.NOTES_EXAMPLES.items()) + [(s, s) for s in model.examples[:6]])
# each example opens on a model that reads it: the notes' English sentences leave toy-translate for minilm
opens_on = {label: vocab.model_for_example(model, model_name, s) for label, s in examples.items()}
examples = {(label if opens_on[label] == model_name else f"{label} → {opens_on[label]}"): (s, opens_on[label])
            for label, s in examples.items()}


def _use_example(choice) -> None:
    sentence, on = choice
    st.session_state[text_key] = sentence
    if on != model_name:
        st.session_state[state.key("model")] = on


with text_col:
    text = widgets.text_box("Sentence", text_key)
st.caption("Examples from the lecture notes and for this model:")
widgets.example_buttons(examples, "explore-ex", _use_example, shown=len(widgets.NOTES_EXAMPLES))
run_model = training_panel.training_step(state, model_name, model, text, "explore")  # toy-translate: a training step

ablate_key, ablation_key = knockout_panel.seeded_keys(state, model)
off, ablation = knockout_panel.heads_off(ablate_key), st.session_state[ablation_key]
url_ablation = dict(ablate=knockout.format_ablate(off) or None, ablation=ablation if off and ablation != "zero" else None)
trace = models.get_trace(run_model, text, ablate=off, ablation=ablation, progress=longdoc.announce(model, model_name, text))
if trace is None:
    state.end_here(model=model_name, text=text, **url_ablation)

vocab.offer_reader(state, model_name, trace, key="explore-reader")
n_source = len(trace.tokens("source"))
if n_source <= 64:
    widgets.token_chips(trace.tokens("source"), title=f"{n_source} source tokens")
else:
    with st.expander(f"{n_source} source tokens"):
        widgets.token_chips(trace.tokens("source"))
if trace.tokens("target") and model.kind == "encoder-decoder":
    widgets.token_chips(trace.tokens("target"), title=f"decoder input ({trace.meta.get('mode', '')}), "
                       f"then predicts: {' '.join(trace.tokens('next')[:1])}")
elif model.kind == "decoder" and trace.tokens("next"):
    st.caption(f"Next-token prediction after the prompt: `{_md_code(trace.tokens('next')[0])}`")

c = st.columns([2, 1, 1, 1.3])
attn, stack, kind, layer, head, layer_key, head_key = widgets.attention_picker(state, trace, c, mixers=True)
if kind == tn.MIXER:  # a layer whose token mixer is not softmax attention: its own view
    state.show_messages()
    state.publish(model=model_name, text=text, attn=attn, layer=layer, head=head)
    mixer_panel.show(model, trace, stack, layer, head, widgets.mixer_kind(trace), model_name)
    st.stop()
n_layers, n_heads = trace.layers(stack), trace.n_heads(stack)
flags = {f: url_switches.flag(state, f) for f in ("mean", "permap", "log", "hide", "words", "full", "shade")}
notes = model_view.layer_notes(model, stack, kind, n_layers)  # each layer's mask and positions ("sliding 4 · RoPE")
beside_key = state.seeded_key("beside", -1, parse=lambda raw: -1 if str(raw) == "none" else int(str(raw)),
                              valid=lambda v: isinstance(v, int) and -1 <= v < n_layers,
                              why=f"beside is a layer from 0 to {n_layers - 1}, or none")
with c[3]:
    mean_heads = st.toggle("Average over heads", key=flags["mean"],
                           help="One map: the mean of this layer's heads, instead of the head chosen.")
    per_map = st.toggle("Scale colours per map", key=flags["permap"],
                        help="Off: every map uses one colour scale, 0 to 1, so maps compare. On: each map's own "
                             "largest weight is the darkest colour, so faint patterns show.")
    log_scale = st.toggle("Log colour scale", key=flags["log"],
                          help="Colour by log10(weight): shows the small weights beside an attention sink (a first "
                               "token that takes most of the weight in long prompts of decoder models).")
    hide_special = st.toggle("Hide special tokens", key=flags["hide"],
                             help="Leave out the markers the model adds around the text ([CLS], [SEP], <s>, "
                                  "</s>): they often take much of the weight and hide the words' pattern.")
    norms = explore_links.norms_toggle(state)
    what = "value_norms" if norms else "weights"
    words = False
    long_input = longdoc.is_long(trace, stack, kind)  # maps read pooled, in blocks and per head (viz.ui.longdoc)
    if not model_view.reads_pieces(model) and st.session_state[flags["words"]] and "words" in state.from_url:
        state.ignored("words", f"{model_name}'s tokens are whole words: there are no pieces to merge")
    if model_view.reads_pieces(model) and not long_input:
        words = st.toggle("Read in words", key=flags["words"],
                          help="Merge word pieces into the words you typed: a word's column is the sum over its "
                               "pieces (total attention to the word), its row the mean over its pieces.")
heads_key = url_switches.heads(state, "heads", n_heads, f"{model_name} has heads 0–{n_heads - 1}")
TABS = {"map": TAB_MAP, "model": TAB_MODEL, "heads": TAB_HEADS, "long": TAB_LONG}
tab_key = url_switches.tab(state, "tab", TABS)
section_key = url_switches.tab(state, "section", longdoc.SECTIONS)  # the Long document tab's own tabs
q_side, k_side = axis_tokens(trace, stack, kind)
why_keys = why_panel.seed(state, len(q_side), len(k_side), causal=stack == "decoder" and kind == "self_attn")
state.show_messages()
url_view = {f: url_switches.flag_url(st.session_state[k]) for f, k in flags.items()}
url_view["words"] = url_switches.flag_url(words)
url_view["norms"] = url_switches.flag_url(norms)
url_view["section"] = url_switches.tab_url(state, "section", longdoc.SECTIONS)
url_view["beside"] = st.session_state[beside_key] if st.session_state[beside_key] >= 0 else None
if st.session_state[heads_key] != list(range(min(n_heads, 4))):
    url_view["heads"] = ",".join(str(h) for h in st.session_state[heads_key]) or "none"
state.publish(model=model_name, text=text, attn=attn, layer=layer, head=head, tab=url_switches.tab_url(state, "tab", TABS),
              **url_view, **url_ablation, **why_panel.url(why_keys))
# what the research pages do with this head, and switching heads off, behind one "more" (open while heads are
# off): the first view keeps the map and its plain controls; the widgets stay mounted, as the script sets them
with st.expander("More: switch heads off, patch this head, the logit lens", expanded=bool(off),
                 icon=":material/tune:"):
    explore_links.head_links(st, model, model_name, text, stack, kind, layer, head)
    knockout_panel.controls(model, ablate_key, ablation_key)
if off:
    knockout_panel.what_changed(model if run_model == model_name else models.get_model(run_model), run_model, text,
                          trace, off, ablation)

view = View(stack, kind, layer, None if mean_heads else head, what)
per_map = explore_links.norms_scale(norms, per_map)
if long_input:  # never the whole map: the heatmap tab draws its overview and a block (viz.ui.longdoc)
    (matrix, (q_toks, k_toks)) = None, axis_tokens(trace, stack, kind)
elif words:
    matrix, q_toks, k_toks = model_view.word_matrix(trace, view, text, hide_special=hide_special)
    st.caption("Read in words: each word's column is the **sum** over its pieces' columns (how much a query attends "
               "to the whole word) and each word's row is the **mean** over its pieces' rows, so every row still "
               f"sums to 1 ({len(trace.tokens(model_view.view_sides(stack, kind)[0]))} tokens → {matrix.shape[-2]} words).")
else:
    matrix, q_toks, k_toks = attention_matrix(trace, view, hide_special=hide_special)
unit = "words" if words else "tokens"
map_name = downloads.map_name(model=model_name, stack=stack, kind=kind, layer=layer, head=view.head, suffix="-words" if words else "")



def layer_extras(fig, v: View, exact: bool, log: bool, shade: bool) -> None:
    """A learned sink's column and the mask's shading on a map drawn cell for cell."""
    sink = sink_of(trace, v) if exact else None
    if shade and exact and mask_of(trace, v) is not None:
        add_mask_overlay(fig, mask_of(trace, v))
    sel = selection(v) if exact and v.what == "weights" else None
    if sel is not None:  # a sparse layer (DeepSeek V3.2): the keys its indexer kept, outlined
        add_selection_outline(fig, sel["selected"])
    if sink is not None:
        add_sink_column(fig, sink, log_scale=log)


def selection(v: View):
    """A sparse layer's selection for one head (viz.figures.sparse.selection_of), or None."""
    return None if v.head is None or v.kind != "self_attn" else selection_of(trace, v.stack, v.layer, v.head)


def mask_controls(v: View, exact: bool, shade_key: str) -> None:
    """What the layer's mask and sink are, and the switch that shades the forbidden cells."""
    if sink_of(trace, v) is not None:
        st.caption("This layer has a **learned sink**: each head's softmax runs over the keys and one extra logit that "
                   "no key owns (gpt-oss). " + (
                       "Its share is the column **sink**, right of the red line; each row, sink included, sums to 1."
                       if exact else "Its column is drawn where the map shows every token as it is (not read in "
                                     "words, special tokens shown, not in blocks); here rows sum to less than 1."))
    if exact and mask_of(trace, v) is not None:
        st.toggle("Shade what the mask forbids", key=shade_key,
                  help=f"Grey over the cells this layer's mask sets to -inf ({notes[v.layer] or 'its mask'}): a "
                       "query never sees those keys, whatever the scores say.")


def beside_map(v: View, exact: bool, reduced: bool, qt, kt, per: bool, log: bool) -> None:
    """Another layer's map of the same head beside this one (a layer without positions beside one
    that rotates, a windowed layer beside a full one)."""
    options = [-1] + list(range(n_layers))
    other = st.selectbox("Beside it, the same head of layer", options, key=beside_key,
                         format_func=lambda i: "none" if i < 0 else f"layer {i}" + (f" ({notes[i]})" if notes[i] else ""),
                         help="Draw another layer's map of this head beside the map on the same text: a NoPE "
                              "layer's pattern beside a RoPE layer's, a sliding or chunked layer beside a full one.")
    if other < 0:
        return
    if reduced:
        st.caption("The map beside is drawn for short inputs read in tokens with every token shown.")
        return
    w = View(v.stack, v.kind, other, v.head, v.what)
    m2, q2, k2 = attention_matrix(trace, w)
    title = w.label() + (f" · {notes[other]}" if notes[other] else "")
    fig2 = fix_margins(attention_heatmap(m2, q2, k2, title=title, fixed_scale=not per, log_scale=log), q2, k2, min_top=90)
    layer_extras(fig2, w, True, log, st.session_state[flags["shade"]])
    charts.chart(fig2, key="explore-beside-map", width="stretch")


tab_map, tab_model, tab_heads, tab_long = st.tabs([TAB_MAP, TAB_MODEL, TAB_HEADS, TAB_LONG], key=tab_key,
                                                  on_change="rerun")
with tab_map:
    if tab_map.open is not False and long_input:
        longdoc.heatmap_tab(trace, view, q_toks, k_toks, n_heads, model_name=model_name, per_map=per_map,
                            log_scale=log_scale)
    elif tab_map.open is not False:
        full = False
        if max(matrix.shape) > model_view.MAX_HEATMAP_SIDE:
            full = st.toggle(f"Draw every one of the {max(matrix.shape)} {unit} (slow)", key=flags["full"])
        z, zq, zk, fq, fk = (matrix, q_toks, k_toks, 1, 1) if full else model_view.reduce_map(matrix, q_toks, k_toks)
        title = view.label() + (" · in words" if words else "") + (" · what is added (value norms)" if norms else "")
        title += f" · {notes[layer]}" if notes[layer] else ""
        exact = fq == 1 and fk == 1 and not (words or hide_special)  # the map's cells are the trace's own
        if fq > 1 or fk > 1:
            title += f" · blocks of {max(fq, fk)}"
            st.info(f"Long input ({matrix.shape[-2]} × {matrix.shape[-1]} {unit}): drawn as blocks of up to "
                    f"{max(fq, fk)} neighbouring {unit} so the page stays responsive — within a block the keys' "
                    "weights are summed and the queries' rows averaged, so each drawn row still sums to 1. Hover a "
                    "cell for its block; the CSV download has every token.")
        fig = fix_margins(attention_heatmap(z, zq, zk, title=title, fixed_scale=not per_map, log_scale=log_scale,
                                            value_name="norm" if norms else "weight"),
                          zq, zk, min_top=90)
        layer_extras(fig, view, exact, log_scale, st.session_state[flags["shade"]])
        if fq > 1 or fk > 1:
            model_view.fit_block_ticks(fig)
        clickable = not (words or hide_special or mean_heads or fq > 1 or fk > 1) and why_figures.add_cell_targets(fig)
        if clickable:  # a click on a cell opens "Why here?" below the map
            charts.chart(fig, key="explore-heatmap", width="stretch", name=map_name, selection_mode="points",
                         on_select=lambda: why_panel.pick("explore-heatmap", why_keys["why"]))
            st.caption("Click a cell to see **why** the head puts its score there: the score taken apart into what "
                       "earlier heads, MLPs and the embeddings wrote at the query and at the key.")
        else:
            charts.chart(fig, key="explore-heatmap", width="stretch", name=map_name)
        explore_links.map_caption(norms)
        mask_controls(view, exact, flags["shade"])
        if exact and (sel := selection(view)) is not None:
            sparse_panel.panel(sel, q_toks, k_toks, layer, view.head, key="explore")
        beside_map(view, exact, words or hide_special or long_input, q_toks, k_toks, per_map, log_scale)
        why_panel.panel(state, why_keys, trace, model_name, text, stack, kind, layer, view.head, q_side, k_side,
                        key="explore")
        downloads.offer(trace, matrix, q_toks, k_toks, model=model_name, stack=stack, kind=kind, layer=layer,
                 head=view.head, key="explore-dl", suffix="-words" if words else "")


def _pick_from_grid() -> None:
    sel = st.session_state.get("explore-grid")
    pts = (sel or {}).get("selection", {}).get("points", []) if sel else []
    picked = model_view.grid_pick(pts[0]) if pts else None
    if picked is not None and st.session_state.get("explore.knockout"):
        knockout_panel.toggle_head(ablate_key, stack, *picked)
    elif picked is not None:
        st.session_state[layer_key], st.session_state[head_key] = picked
        st.session_state["explore.mean"] = False


with tab_model:
    if tab_model.open is not False and trace.mixer_layers(stack):  # layers of more than one kind
        mixer_panel.model_view(model, trace, stack, layer, head)
    elif tab_model.open is not False:
        lo, hi = 0, n_layers - 1
        if n_layers > model_view.MAX_GRID_LAYERS:
            range_key = "explore.grid_layers"
            current = st.session_state.get(range_key)
            if current is None or st.session_state.get("explore.grid_for") != (stack, layer):
                # opened, or another layer picked: centre the grid on the selected layer
                if current is None or not current[0] <= layer <= current[1]:
                    current = model_view.layer_range_around(layer, n_layers)
            st.session_state["explore.grid_for"] = (stack, layer)
            st.session_state[range_key] = model_view.clamp_range(current, n_layers)
            lo, hi = st.slider("Layers in the grid", 0, n_layers - 1, key=range_key,
                               help=f"{n_layers} layers × {n_heads} heads is {n_layers * n_heads} maps: choose the "
                                    "layers to draw (fewer layers draw faster).")
        layers = list(range(lo, hi + 1))
        varied = len(set(notes)) > 1  # layers of more than one kind: each row says its own, else the title says it once
        pooled = longdoc.pooled_layers(trace, stack, kind, layers, text, words, long_input, what)
        sinks = None if (words or what != "weights") else model_view.layer_sinks(trace, stack, kind, layers)
        st.caption("Every head of the chosen layers. Click a map to make it the selected one (outlined in red), or, "
                   "with “Clicks switch heads off” on, to switch that head off or back on (crossed out); "
                   f"the enlarged map is on the Heatmap tab and below. Maps wider than {model_view.MAX_GRID_SIDE} cells are "
                   "drawn in blocks (keys summed, queries averaged)." + (
                       " Beside each layer: its mask and positions." if varied else "") + (
                       " Right of each map's red line: its learned sink (the share no key owns)." if sinks else ""))
        grid = model_view.grid_figure(None, lo, pooled=pooled, selected=(layer, head),
                                      notes=notes[lo:hi + 1] if varied else None, sinks=sinks,
                              title=f"{widgets.KIND_LABEL.get((stack, kind), attn)}: layers {lo}–{hi} of {n_layers} × "
                                    f"{n_heads} heads" + (" · in words" if words else "")
                                    + (f" · every layer {notes[0]}" if notes[0] and not varied else ""))
        knockout.mark_grid(grid, off, stack)
        charts.chart(grid, key="explore-grid", on_select=_pick_from_grid,
                     selection_mode="points", width="stretch")
        if not lo <= layer <= hi:
            st.caption(f"The selected layer {layer} is outside the layers drawn.")
        small = (longdoc.overview(trace, view, n_heads, log_scale)[0].update_layout(height=420) if long_input else
                 model_view.selected_figure(matrix, q_toks, k_toks, view.label() + (" · in words" if words else ""),
                                    fixed_scale=not per_map, log_scale=log_scale,
                                    sink=None if words or hide_special else sink_of(trace, view)))
        charts.chart(small, key="explore-enlarged", width="stretch", name=map_name)

with tab_heads:
    if tab_heads.open is not False:
        chosen = st.multiselect("Heads shown", list(range(n_heads)), key=heads_key, format_func=lambda h: f"head {h}")
        if hide_special:
            st.info("The head view shows all tokens; turn off “Hide special tokens” to see it.")
        else:
            w_all = None if long_input else model_view.word_stack(trace, stack, kind, [layer], text, what)[0] if words else trace[view.name]
            if norms and w_all is not None:
                w_all = w_all / w_all.max().clamp_min(1e-30)
            n_q, n_k = (len(q_toks), len(k_toks)) if w_all is None else (w_all.shape[-2], w_all.shape[-1])
            qs, ks, where = explore_links.head_view_window(n_q, n_k, unit)
            w = longdoc.head_view_weights(trace, view, n_heads, qs, ks) if w_all is None else w_all[:, qs, ks]
            charts.chart(head_view(w, q_toks[qs], k_toks[ks], heads=chosen,
                                   title=f"layer {layer}{where}: queries (left) → keys (right)"),
                         key="explore-headview", width="stretch")
with tab_long:  # spans, head profiles, surprisal (viz.ui.longdoc)
    _ = tab_long.open is not False and longdoc.long_tab(trace, text, view, n_heads, n_layers, model_name=model_name,
                                                        log_scale=log_scale, section_key=section_key)
