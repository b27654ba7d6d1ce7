"""Lens: in which layer the prediction forms (the logit lens, nostalgebraist 2020) and which
heads write it into the output (direct logit attribution). The numbers come from
core.analysis.lens and core.analysis.logit_attribution, the figures from viz.lens.figures.
"""

import streamlit as st

import core.analysis as ca
from core.analysis.token_ids import output_token_id
from viz.lens import figures as lf
from core.head_maps import derived as per_trace
from viz.figures.text import _md_code
from viz.ui import charts, downloads, explore_links, longdoc, models, url_state, url_switches, widgets
from core import trace_names as tn

IOI = "When Mary and John went to the store, John gave a drink to"
COLOUR_DEFAULT = "target"

explore_links.follow("lens")  # a head clicked on the last run opens in Explore

widgets.header("lens")
st.caption("The **logit lens** reads the residual stream after every layer through the model's own output head (final "
           "norm and unembedding): which token it would predict if it stopped there. **Direct logit attribution** "
           "splits the output logit into what each head, each MLP and the embeddings add to it.")
state = url_state.PageState("lens", fields=("model", "text", "target", "baseline", "color"))

model_name, model, text_col = widgets.model_header(state)
if model is None:
    st.stop()
text_key = state.seeded_key("text", IOI if model.kind == "decoder" else (model.examples[0] if model.examples else IOI))
with text_col:
    text = widgets.text_box("Sentence", text_key, help="The lens and the attribution read the model's pass on this text.")

trace = models.get_trace(model_name, text, progress=longdoc.announce(model, model_name, text))  # a long input: time and bar
url = dict(model=model_name, text=text)
if trace is None:
    state.end_here(**url)


def _one_token(raw: str) -> str:
    """A typed token as given, once the model's vocabulary holds it (a ValueError says why not)."""
    raw = str(raw)
    if raw:
        output_token_id(model, raw)
    return raw


def _why(raw, exc) -> str:
    return str(exc) or "not one token of this model"


INSTEAD = {"target": "the model's own top-1 at each position", "baseline": "no baseline (the target's logit alone)"}
keys = {f: state.seeded_key(f, "", parse=_one_token, why=_why, instead=INSTEAD[f]) for f in ("target", "baseline")}
for f, k in keys.items():  # a value kept from another model or page that this model cannot read
    try:
        _one_token(st.session_state[k])
    except ValueError as exc:
        state.say(f"The {f} {url_state.said(st.session_state[k])} is cleared: {exc}.")
        st.session_state[k] = ""
colour_key = url_switches.option(state, "color", COLOUR_DEFAULT, list(lf.COLOURS))
top10 = trace.tokens("next") if model.config.has_decoder else []


def _pick(field: str) -> None:
    picked = st.session_state.get(f"lens.pick-{field}")
    if picked is not None:
        st.session_state[keys[field]] = picked
        st.session_state[f"lens.pick-{field}"] = None


c = st.columns([2, 2, 2])
for col, field, label in ((c[0], "target", "Target token"), (c[1], "baseline", "Baseline token (optional)")):
    col.text_input(label, key=keys[field],
                   help="One token as the model spells it, leading space included (' Mary'). "
                        + ("Empty: the model's own top-1 at each position." if field == "target"
                           else "Given, the attribution explains logit(target) − logit(baseline): why A and not B."))
    if top10:
        col.selectbox("or pick from the model's top 10 next tokens", top10, index=None, key=f"lens.pick-{field}",
                      on_change=_pick, args=(field,), placeholder="top 10 at the last position",
                      format_func=lambda t: repr(t))
colour = c[2].radio("Colour the lens by", list(lf.COLOURS), key=colour_key, format_func=lambda k: lf.COLOUR_LABELS[k])
target, baseline = st.session_state[keys["target"]], st.session_state[keys["baseline"]]
url.update(target=target or None, baseline=baseline or None, color=url_switches.changed(colour, COLOUR_DEFAULT))
state.publish(**url)
state.show_messages()


def _memo(name, fn):
    """A result kept with the trace (core.head_maps.derived): it goes when the trace does."""
    memo = per_trace(trace)
    if name not in memo:
        memo[name] = fn()
    return memo[name]


# ------------------------------------------------------------------ the logit lens
st.subheader("Logit lens")
st.markdown(lf.CONVENTION)
try:
    with st.spinner("Reading every layer through the output head…"):
        lens_df = _memo(("lens", target), lambda: ca.lens(trace, target=target or None))
except ValueError as exc:
    lens_df = None
    st.warning(f"The logit lens does not apply to {model_name}: {exc}")
if lens_df is not None:
    n_pos = len(trace[tn.embed(lens_df.attrs["stack"])])
    shown = lens_df.attrs["positions"]
    st.caption(f"Rows: the residual stream entering block 0 (embed), after each block (after L0, after L1, …), the "
               f"last of them the model's output (where the lens is the output itself: KL = "
               f"{lens_df[lens_df.layer == lens_df.layer.max()].kl.max():.1e}). "
               f"Each cell shows the lens's top-1 token; hover for its top 5. "
               + (f"The last {len(shown)} of {n_pos} positions are shown (the end of the text, where the prediction "
                  f"is; positions 0–{n_pos - len(shown) - 1} are left out to keep the grid readable)."
                  if len(shown) < n_pos else "")
               + ("" if target else " Target: the model's own top-1 at each position."))
    charts.chart(lf.lens_grid(lens_df, colour), key="lens-grid", name=f"logit-lens-{model_name}", width="stretch")
    st.download_button("The lens (CSV)", downloads.csv_later(lens_df, lf.lens_table),
                       help="One row per stream and position: after_block (-1 = the embeddings, k = after block k) "
                            "and stream ('embed', 'after L23') name the row.",
                       file_name=f"logit-lens-{model_name}.csv", mime="text/csv", key="lens-csv", on_click="ignore")

# ------------------------------------------------------------------ direct logit attribution
st.subheader("Direct logit attribution")
attr_target = target or (int(trace["next.ids"][0]) if "next.ids" in trace else "")


def _open() -> None:
    sel = st.session_state.get("lens-attribution")
    pts = (sel or {}).get("selection", {}).get("points", []) if sel else []
    picked = lf.head_pick(pts[0]) if pts else None
    if picked is not None:
        explore_links.open_next_run("lens", explore_links.explore_params(model_name, text, "decoder", picked[0], picked[1],
                                                                            picked[2]))


try:
    with st.spinner("Splitting the logit into heads, MLPs and embeddings…"):
        attr = _memo(("attribution", attr_target, baseline),
                     lambda: ca.logit_attribution(trace, attr_target, baseline=baseline or None))
except ValueError as exc:
    attr = None
    # a note on the architecture, not a fault: the lens above still applies (a warning where nothing does)
    (st.info if lens_df is not None else st.warning)(f"Direct logit attribution does not apply to {model_name}: {exc}")
if attr is not None and attr.attrs.get("baseline_id") is not None and attr.attrs["baseline_id"] == attr.attrs["target_id"]:
    st.warning(f"The target and the baseline are the same token ({_md_code(attr.attrs['target'])}, id "
               f"{attr.attrs['target_id']}): logit(target) − logit(baseline) is 0 for every head, MLP and the "
               "embeddings, so there is nothing to attribute. Choose a different baseline, or clear it to attribute "
               "the target's logit alone.")
    attr = None
if attr is not None:
    what = lf.what_is_attributed(attr.attrs["target"], attr.attrs["baseline"])
    own = lf.own_logit(trace, attr)
    ok, total, tol = lf.sum_check(attr, own, str(next(model.net.parameters()).dtype))
    line = (f"sum of the contributions {total:.6f}, the model's own {what} {own:.6f} (from the pass's final hidden "
            f"state through the output projection): |Δ| = {abs(total - own):.1e}, tolerance {tol:.0e} "
            f"(relative to max(1, |logit|))")
    if ok:
        st.success(f"Contributions add up to the model's own logit: {line}.")
    else:
        st.error(f"Contributions do not add up to the model's own logit: {line}. The decomposition or the model is "
                 "wrong somewhere; the numbers below are not to be trusted.")
    pos = attr.attrs["position"]
    st.caption(f"At the last position ({pos}: {_md_code(trace.tokens('target')[pos])}), with the final norm's scale "
               f"frozen at its traced value. Rows are blocks (L23: block 23, whose output the lens reads at after L23), "
               f"columns heads; each layer's MLP is a column of its own "
               f"and the embeddings a row of their own. Red adds to {what}, blue takes from it. Click a head to open "
               "it in Explore.")
    charts.chart(lf.attribution_heatmap(attr), key="lens-attribution", name=f"logit-attribution-{model_name}",
                 on_select=_open, selection_mode="points", width="stretch")
    against = lf.bottom_heads(attr)
    cols = st.columns(2)
    for col, title, rows in ((cols[0], "**Top 5 heads** for " + what, lf.top_heads(attr)),
                             (cols[1], "**Top 5 heads against** it (most negative)", against)):
        with col:
            st.markdown(title)
            if not len(rows):
                st.caption("No head works against it here.")
            for row in rows.itertuples():
                explore_links.link(st, f"{lf.head_label(row.layer, row.head)} (layer {row.layer} · "
                                                           f"head {row.head}): {row.contribution:+.3f}",
                             explore_links.explore_params(model_name, text, "decoder", row.layer, row.head, row.attn))
    st.download_button("The attribution (CSV)", downloads.csv_later(attr, lf.attribution_table),
                       help="One row per part: block (-1 for the embeddings and the final biases), head (-1 where not "
                            "a head) and label ('L23H3', 'L23 MLP', 'embed').",
                       file_name=f"logit-attribution-{model_name}.csv", mime="text/csv", key="attribution-csv",
                       on_click="ignore")
