"""Circuits: which earlier heads make a head attend where it does (query and key sides) and what it
reads (value side), as a graph drawn layer by layer; a click on a head expands it; "Check by
patching" tests an edge by path patching (core.analysis.head_circuit, path_patch; figures in
viz/circuits/figures.py, runs in viz/circuits/run_panel.py).

URL fields: model, text, on (text | repeat), stack, layer, head, top, open (expanded heads,
"L16H0,L17H8"), edge (the edge to check, "L16H0>L18H6:key"), checked (edges checked by patching,
the same ids separated by ";"), score (induction | previous_token)."""

import numpy as np
import pandas as pd
import streamlit as st

from core import analysis
from core.analysis.circuits import parse_head
from viz.circuits import figures as cf
from viz.circuits import run_panel as circuits_run
from viz.ui import charts, explore_links, models, url_state, url_switches, widgets

TOP_CHOICES = (3, 5, 8)
ON = {"text": "your text", "repeat": "a repeated random sequence (where induction is scored)"}
SCORES = {"induction": "induction (weight on the token after an earlier copy)",
          "previous_token": "previous token (weight on the token before)"}
REPEAT_R = analysis.REPEAT_LENGTH  # the Heads page's induction sequence: R random tokens repeated twice

widgets.header("circuits")
st.caption("Each edge is exact on this text: a query- or key-side weight is the head's pattern attribution summed over "
           "the other side (Σ_ij a_ij × term_ij), a value-side weight is the source's share of the head's output. "
           "Click a head to expand it; check an edge by path patching (Wang et al. 2022).")
state = url_state.PageState("circuits", fields=("model", "text", "on", "stack", "layer", "head", "top", "open", "edge",
                                                "checked", "score"))
model_name, model, text_col = widgets.model_header(state)
if model is None:
    st.stop()
text_key = state.seeded_key("text", model.examples[0] if model.examples else analysis.DEFAULT_SENTENCE)
with text_col:
    text = widgets.text_box("Sentence", text_key, help="The circuit is read on this text, or on a repeated random "
                                                      "sequence (below).")
url = dict(model=model_name, text=text)
on_key = url_switches.option(state, "on", "text", list(ON))
on = st.radio("Read the circuit on", list(ON), key=on_key, horizontal=True, format_func=ON.get)
url["on"] = url_switches.changed(on, "text")


@st.cache_resource(max_entries=8, show_spinner=False)
def _repeat(model_name: str, stack: str, _model):
    out = analysis.repeated_text(_model, stack, r=REPEAT_R)
    out["corrupt_ids"] = analysis.repeated_sequence(_model, r=REPEAT_R, seed=1)[out["stack"]][0]
    return out


stacks = ["decoder"] if model.kind == "decoder" else ["encoder"] + (["decoder"] if model.kind == "encoder-decoder"
                                                                      else [])
stack_key = url_switches.option(state, "stack", stacks[0], stacks)
stack = stacks[0]
if len(stacks) > 1:
    stack = st.radio("Stack", stacks, key=stack_key, horizontal=True, format_func=lambda s: f"{s} self-attention")
url["stack"] = url_switches.changed(stack, stacks[0])
read_text, rep = text, None
if on == "repeat":
    rep = _repeat(model_name, stack, model)
    if rep["text"] is None or not rep["same_ids"]:
        st.info(f"The repeated sequence cannot be read here: {rep['why']}. Reading your text instead.")
        rep = None
    else:
        read_text = rep["text"]
        st.caption(f"On {2 * rep['r']} random tokens ({rep['r']} repeated twice, seeded): an induction head attends "
                   "from each token of the second copy to the token after its first copy.")
trace = models.get_trace(model_name, read_text)
state.show_messages()
if trace is None:
    state.end_here(**url)
n_layers, n_heads = trace.layers(stack), trace.n_heads(stack)
c = st.columns([1, 1, 1])
layer_key = url_state.int_from_url(state, "layer", n_layers - 1, 0, n_layers - 1, of=f"{model_name}'s {stack}")
layer = c[0].selectbox("Layer", list(range(n_layers)), key=layer_key)
head_key = url_state.int_from_url(state, "head", 0, 0, n_heads - 1, of=f"{model_name}'s heads")
head = c[1].selectbox("Head", list(range(n_heads)), key=head_key)
top_key = url_switches.option(state, "top", 5, TOP_CHOICES)
top = c[2].select_slider("Sources per side", TOP_CHOICES, key=top_key,
                         help="The heaviest sources of each side listed (and, among heads, expanded by a click).")
url.update(layer=layer, head=head, top=url_switches.changed(top, 5))
root = f"L{layer}H{head}"

# the expanded heads: from the URL, then every click; only heads below the chosen one's layer stay
open_key = state.seeded_key("open", "")
raw_open = str(st.session_state.get(open_key) or "")
opened = [h for h in dict.fromkeys(p.strip() for p in raw_open.split(",") if p.strip())
          if parse_head(h) is not None and parse_head(h)[0] < layer and parse_head(h)[1] < n_heads]
state.keep(open_key, ",".join(opened))
if raw_open and [p.strip() for p in raw_open.split(",") if p.strip()] != opened:
    state.overridden("open", raw_open, ",".join(opened) or "none", f"open lists heads (L{{layer}}H{{head}}) below the "
                     f"chosen head's layer {layer}, with heads 0-{n_heads - 1}", used_text=",".join(opened) or "none")


def _expand() -> None:
    sel = st.session_state.get("circuits-graph") or {}
    pts = (sel.get("selection") or {}).get("points") or []
    for p in pts:
        name = p.get("customdata")
        if isinstance(name, str) and parse_head(name) is not None:
            now = [h for h in str(st.session_state.get(open_key) or "").split(",") if h]
            if name != root and name not in now:
                st.session_state[open_key] = ",".join(now + [name])
            return
        edge = cf.parse_edge(name) if isinstance(name, str) else None
        if edge is not None and parse_head(edge[0]) is not None:
            st.session_state[state.key("edge")] = name
            return


read_key = ("repeat", REPEAT_R) if rep is not None else ("text", text)
frames, depth_of = [], {root: 1}
for name in [root] + opened:
    lh = parse_head(name)
    e = circuits_run.head_edges(trace, model.config, model_name, str(read_key), stack, lh[0], lh[1], top)
    if e is None:
        state.end_here(**url)
    e = e.copy()
    e["depth"] = depth_of.get(name, 2)
    for src in e["source"]:
        depth_of.setdefault(src, int(e["depth"].iloc[0]) + 1)
    frames.append(e)
edges = pd.concat(frames, ignore_index=True)
checks = [ch for f in frames for ch in f.attrs.get("checks", [])]
bad = [ch for ch in checks if abs(ch.get("pattern_sum", 0) - ch.get("pattern_score", 0))
       > 1e-4 * max(1.0, abs(ch.get("pattern_score", 0))) or ch.get("value_error", 0) > 1e-3]
if bad:
    st.error("The edges do not add up to the model's own numbers for " + ", ".join(ch["target"] for ch in bad)
             + ": the decomposition does not hold here, so the weights are not exact.")
else:
    st.success(f"Exact on this text: every expanded head's query/key terms sum to its own attention-weighted score "
               f"(within 1e-4), and its value sources add up to its own output (within 1e-3), for {len(checks)} "
               f"head{'s' if len(checks) != 1 else ''}.", icon=":material/check:")

# the edge to check and the checks already made
options = cf.head_options(edges)
edge_key = state.seeded_key("edge", options[0] if options else "")
if st.session_state.get(edge_key) not in options:
    if "edge" in state.from_url:
        state.overridden("edge", st.session_state.get(edge_key), options[0] if options else None,
                         "edge names an edge of this graph from a head (source>target:side)",
                         used_text=options[0] if options else "none (no edge of this graph starts at a head)")
    st.session_state[edge_key] = options[0] if options else None
state.keep(edge_key)
score_key = url_switches.option(state, "score", "induction", list(SCORES))
checked_key = state.seeded_key("checked", "")
raw_checked = [e for e in str(st.session_state.get(checked_key) or "").split(";") if e]
checked = [e for e in raw_checked if e in options]
if raw_checked != checked:
    state.overridden("checked", ";".join(raw_checked), ";".join(checked) or "none",
                     "checked lists edges of this graph from a head (source>target:side)",
                     used_text=";".join(checked) or "none")
patchable = bool(options) and not (model.kind == "encoder-decoder" and stack == "decoder")
clean_ids = list(rep["ids"]) if rep is not None else list(model.encode(read_text).ids)
if rep is not None:  # another random sequence, also repeated; scored on the induction cells
    corrupt_ids = list(rep["corrupt_ids"])
else:  # the same tokens shuffled (seeded), the first kept where it is a decoder's
    lead = 1 if len(clean_ids) > 1 and model.kind != "encoder" else 0
    corrupt_ids = clean_ids[:lead] + [int(t) for t in np.random.default_rng(0).permutation(clean_ids[lead:])]


def _targets(score: str):
    if rep is None or score != "induction":
        return None
    return [(i, i - rep["r"] + 1) for i in range(rep["start"], rep["start"] + rep["r"])]


def _patch(eid: str, score: str):
    src, dst, side = cf.parse_edge(eid)
    return circuits_run.patch(model, model_name, str(read_key), eid, clean_ids, corrupt_ids, parse_head(src),
                           parse_head(dst), side, score, stack, _targets(score))


patches = {}
for eid in checked if patchable else []:  # a shared link's checks are run again where this server lacks them
    got = _patch(eid, st.session_state[score_key])
    if got is not None:
        patches[eid] = got.attrs
fig = cf.circuit_figure(edges, (layer, head), n_heads, opened, patches,
                        title=f"{model_name}: what makes {root} attend, and what it reads")
charts.chart(fig, key="circuits-graph", on_select=_expand, selection_mode="points", width="stretch",
             name=f"{model_name}-{stack}-{root}-circuit")
st.caption("Blue: query side, orange: key side, green: value side; a dotted edge pushes the score down. Hover the "
           "diamond in an edge's middle for its weight and share. Click a light-blue head to expand it.")
if opened and st.button("Collapse every expanded head", key="circuits-collapse"):
    st.session_state[open_key] = ""
    st.rerun()

st.subheader("Check by patching")
if not options:
    st.info("No edge here comes from a head: nothing to patch.")
elif not patchable:
    st.info("Path patching runs one stack on its own input: on an encoder-decoder, the encoder's heads.")
else:
    cc = st.columns([2, 2, 1])
    eid = cc[0].selectbox("Edge", options, key=edge_key)
    score = cc[1].selectbox("Score of the receiving head", list(SCORES), key=score_key, format_func=SCORES.get)
    src, dst, side = cf.parse_edge(eid)
    if rep is not None:
        st.caption("Corrupted run: another random sequence, also repeated. Score: the mean weight of each second-copy "
                   "token on the token after its first copy (the Heads page's induction score).")
    else:
        st.caption("Corrupted run: the same tokens shuffled (seeded). The sender's write into the receiver's "
                   f"{side} is taken from it; every other path keeps its clean value.")
    if cc[2].button("Check by patching", key="circuits-patch", type="primary"):
        if _patch(eid, score) is not None:
            st.session_state[checked_key] = ";".join(list(dict.fromkeys(checked + [eid])))
            st.rerun()
    got = circuits_run.cached_patch(model_name, str(read_key), eid, score)
    if got is not None:
        a = got.attrs
        if np.isnan(a["clean"]):
            st.warning(f"This text gives the {score.replace('_', ' ')} score no positions to read (no token repeats "
                       "an earlier one): choose the previous-token score or the repeated sequence.")
        else:
            st.markdown(f"**{eid}**: {dst}'s {score.replace('_', ' ')} score {a['clean']:.3f} clean → "
                        f"**{a['patched']:.3f}** patched (drop {a['drop']:+.3f}); its write changes by "
                        f"{a['output_change']:.1%}.")
url.update(open=",".join(opened) or None, edge=st.session_state.get(edge_key) if options and
           st.session_state.get(edge_key) != options[0] else None,
           checked=";".join(checked) or None, score=url_switches.changed(st.session_state[score_key], "induction"))
st.download_button("Edges (CSV)", edges.assign(model=model_name, stack=stack).to_csv(index=False).encode(),
                   file_name=f"{model_name}-{stack}-{root}-circuit.csv", mime="text/csv", key="circuits-csv",
                   on_click="ignore")
explore_links.link(st, f"Open {root} in Explore", explore_links.explore_params(model_name, read_text, stack, layer,
                                                                               head))
state.publish(**url)
state.show_messages()
