""""Why here?": a click on a cell of a head's map opens the cell's score taken apart into
query-side x key-side terms (core.analysis.score_attribution): the terms as a heatmap (grouped
by layer, opened to heads or summed to kinds), the two marginals, the top terms in words, the
score among its row's other scores and the softmax that turns them into weights, the same terms
for the score's lead over another key ("versus", default the next-heaviest key), and the check
that the terms add up to the model's own score. Figures: viz/figures/why.py.

URL fields (the pages list them among theirs): why=i,j (query, key), versus=j2 | none (left out:
the next-heaviest key), why_group=layers | heads | kinds (left out: layers).
"""

from __future__ import annotations

from typing import Dict, Optional

import streamlit as st

from core import analysis
from core import trace_names as tn
from core.head_maps import long_layer
from viz.ui import gate
from viz.figures import why as wf
from viz.ui import admission, charts, explore_links, models
from viz.ui.url_state import PageState

FIELDS = ("why", "versus", "why_group")
GROUPS = {"layers": "layer", "heads": "component", "kinds": "kind"}  # URL name -> core's group
GROUP_LABELS = {"layers": "by layer", "heads": "by head (every head's write)", "kinds": "by kind"}
TOL = 1e-4  # the contract's: |sum - score| <= TOL x max(1, |score|)
AUTO = "auto"


def parse_cell(raw) -> Optional[tuple]:
    """'5,2' -> (5, 2); '' or None -> None; ValueError otherwise."""
    if raw is None or str(raw).strip() in ("", "none"):
        return None
    parts = [p.strip() for p in str(raw).split(",")]
    if len(parts) != 2:
        raise ValueError(raw)
    return int(parts[0]), int(parts[1])


def cell_url(cell) -> Optional[str]:
    return None if cell is None else f"{cell[0]},{cell[1]}"


def seed(state: PageState, n_q: int, n_k: int, causal: bool) -> Dict[str, str]:
    """Seed the cell, the versus key and the grouping from the URL (or this session: a model or
    text switch keeps them where they still fit, with a note where they do not). Returns the
    session keys by field."""
    def fits(cell):
        return cell is None or (0 <= cell[0] < n_q and 0 <= cell[1] < n_k)

    keys = {}
    keys["why"] = state.seeded_key("why", None, parse=parse_cell, valid=fits,
                                   why=f"a cell is query,key within this map's {n_q} × {n_k} positions")
    cell = st.session_state[keys["why"]]
    if isinstance(cell, str):
        try:
            cell = parse_cell(cell)
        except ValueError:
            cell = None
    if not fits(cell):
        state.overridden("why", cell_url(cell), None, f"this map has {n_q} × {n_k} positions", used_text="no cell")
        cell = None
    st.session_state[keys["why"]] = cell
    state.keep(keys["why"])

    def versus_ok(v):
        return v in (AUTO, "none") or (str(v).lstrip("-").isdigit() and 0 <= int(v) < n_k)

    keys["versus"] = state.seeded_key("versus", AUTO, valid=versus_ok,
                                      why=f"versus is a key position 0–{n_k - 1} or none")
    if not versus_ok(st.session_state[keys["versus"]]):
        st.session_state[keys["versus"]] = AUTO
    keys["why_group"] = state.seeded_key("why_group", "layers", valid=lambda v: v in GROUPS,
                                         why=f"groupings: {', '.join(GROUPS)}")
    if st.session_state[keys["why_group"]] not in GROUPS:
        st.session_state[keys["why_group"]] = "layers"
    state.keep(keys["versus"])
    state.keep(keys["why_group"])
    return keys


def url(keys: Dict[str, str]) -> Dict[str, Optional[str]]:
    """The fields for PageState.publish (left out at their defaults)."""
    cell = st.session_state.get(keys["why"])
    versus = str(st.session_state.get(keys["versus"], AUTO))
    group = st.session_state.get(keys["why_group"], "layers")
    return {"why": cell_url(cell), "versus": None if cell is None or versus == AUTO else versus,
            "why_group": None if cell is None or group == "layers" else group}


def pick(chart_key: str, why_key: str, transposed: bool = False) -> None:
    """on_select of a map's chart: the clicked cell (x the key, y the query; transposed maps
    the other way round) becomes the one explained."""
    sel = st.session_state.get(chart_key)
    pts = (sel or {}).get("selection", {}).get("points", []) if sel else []
    if not pts:
        return
    p = pts[0]
    cd = p.get("customdata")
    if isinstance(cd, (list, tuple)) and len(cd) >= 2:  # a cell's click target (why_figures.add_cell_targets)
        try:
            st.session_state[why_key] = (int(cd[0]), int(cd[1]))
            return
        except (TypeError, ValueError):
            pass
    try:
        x, y = int(p.get("x")), int(p.get("y"))
    except (TypeError, ValueError):
        return
    st.session_state[why_key] = (x, y) if transposed else (y, x)


def _row(trace, stack: str, layer: int, kind: str, head: int, i: int, what: str):
    name = tn.attn(stack, layer, kind, what)
    if kind == tn.SELF and long_layer(trace, stack, kind):
        return trace.head(name, head)[i].double().numpy()
    return trace[name][head][i].double().numpy()


def _attribution(trace, stack: str, layer: int, head: int, kind: str, i: int, j: int, versus: Optional[int],
                 group: str):
    # not cached: one cell costs a fraction of a second, and a result kept past its trace could
    # hide what the check is there to show
    return analysis.score_attribution(trace, stack, layer, head, i, j, attn=kind, versus=versus, group=group)


def sum_check(df, where=st, what: str = "score") -> bool:
    """The check the panel shows: the terms' sum against the model's own score (the trace's
    scaled map), within TOL x max(1, |score|). Green when it holds, an error when not."""
    score, total = df.attrs["score"], df.attrs["sum"]
    diff, tol = abs(total - score), TOL * max(1.0, abs(score))
    source = "from the trace's scaled map" if what == "score" else "Σ a_ij s_ij from the trace's weights and scaled map"
    detail = (f"sum of the terms {total:+.6f}, the model's own {what} {score:+.6f} ({source}), "
              f"|difference| {diff:.1e}, tolerance 10⁻⁴ × max(1, |score|) = {tol:.1e}")
    if diff <= tol:
        where.caption(f":green[✓ The terms add up to the model's own {what}]: {detail}.")
        return True
    where.error(f"The terms do not add up to the model's own {what}: {detail}. The decomposition or the map is wrong "
                "for this head.")
    return False


def panel(state: PageState, keys: Dict[str, str], trace, model_name: str, text: str, stack: str, kind: str,
          layer: int, head: Optional[int], q_tokens, k_tokens, key: str) -> None:
    """The "Why here?" panel for the selected cell, if one is selected."""
    cell = st.session_state.get(keys["why"])
    if cell is None:
        return
    i, j = cell
    with st.container(border=True, key=f"{key}-why"):
        top = st.columns([6, 1])
        qt = q_tokens[i] if i < len(q_tokens) else str(i)
        kt = k_tokens[j] if j < len(k_tokens) else str(j)
        top[0].subheader(f"Why here? query {i} ‘{qt.strip() or qt}’ → key {j} ‘{kt.strip() or kt}’")
        if top[1].button("Close", key=f"{key}-why-close"):
            st.session_state[keys["why"]] = None
            st.rerun()
        if head is None:
            st.info("Pick one head (not the average over heads): a score belongs to one head.")
            return
        if kind == tn.SELF:
            explore_links.circuit_link(st, model_name, text, stack, layer, head,
                                       label=f"Which earlier heads make layer {layer} head {head} attend: its circuit")
        causal = stack == "decoder" and kind == tn.SELF
        scaled = _row(trace, stack, layer, kind, head, i, "scaled")
        weights = _row(trace, stack, layer, kind, head, i, "weights")
        allowed = [k for k in range(len(weights)) if not (causal and k > i)]
        others = sorted((k for k in allowed if k != j), key=lambda k: -weights[k])
        c = st.columns([2, 2])
        group_name = c[0].radio("Group the terms", list(GROUPS), key=keys["why_group"], horizontal=True,
                                format_func=lambda g: GROUP_LABELS[g])
        options = [AUTO, "none"] + [str(k) for k in allowed if k != j]
        if str(st.session_state[keys["versus"]]) not in options:
            st.session_state[keys["versus"]] = AUTO
        next_heavy = others[0] if others else None

        def vs_label(v):
            if v == AUTO:
                return ("the next-heaviest key" + (f" ({next_heavy}: ‘{k_tokens[next_heavy].strip()}’)"
                                                   if next_heavy is not None else " (none)"))
            if v == "none":
                return "no other key"
            return f"{v}: ‘{k_tokens[int(v)].strip()}’"

        vs = c[1].selectbox("Versus another key", options, key=keys["versus"], format_func=vs_label)
        versus = next_heavy if vs == AUTO else None if vs == "none" else int(vs)
        group = GROUPS[group_name]
        try:
            df = _attribution(trace, stack, layer, head, kind, i, j, None, group)
            dv = None if versus is None else _attribution(trace, stack, layer, head, kind, i, j, versus, group)
        except ValueError as exc:
            st.error(f"This score cannot be taken apart: {exc}")
            return
        ok = sum_check(df)
        w = weights[j]
        capped = "" if df.attrs["capped"] is None else (f"; soft-capped to {df.attrs['capped']:+.4f} "
                                                        f"(c tanh(s / c), c = {df.attrs['softcap']:g}) before the mask")
        masked = " The key is masked for this query (its weight is 0): the score is still computed." if (
            causal and j > i) else ""
        st.markdown(f"Score s = {df.attrs['score']:+.4f} (scaled by {df.attrs['scale']:.4g}){capped}; weight "
                    f"a = {w:.4f} after the softmax over the row.{masked}")
        st.markdown("**Largest terms**")
        st.markdown("\n".join(f"{n}. {s}" for n, s in enumerate(wf.term_sentences(df, qt, kt, 5), start=1)))
        label = f"L{layer}H{head}: s({i}, {j}) = {df.attrs['score']:+.3f} taken apart, {GROUP_LABELS[group_name]}"
        charts.chart(wf.terms_heatmap(df, title=label), key=f"{key}-why-terms", width="stretch",
                     name=f"{model_name}-why-L{layer}H{head}-{i}-{j}")
        charts.chart(wf.marginal_bars(df, title="What each component adds, through the query side and the key side"),
                     key=f"{key}-why-marginals", width="stretch")
        charts.chart(wf.row_figure(scaled, weights, k_tokens[:len(weights)], j, versus,
                                   title=f"Query {i}'s row: every key's score, and the softmax that makes them weights"),
                     key=f"{key}-why-row", width="stretch")
        if dv is not None:
            vt = k_tokens[versus]
            st.markdown(f"**Versus key {versus} ‘{vt.strip() or vt}’**: s({i}, {j}) − s({i}, {versus}) = "
                        f"{dv.attrs['score']:+.4f} (weights {w:.3f} vs {weights[versus]:.3f}). Why key {j} beats (or "
                        f"loses to) key {versus}, largest terms first:")
            st.markdown("\n".join(f"{n}. {s}" for n, s in enumerate(wf.term_sentences(dv, qt, kt, 5, vt), start=1)))
            sum_check(dv)
            charts.chart(wf.terms_heatmap(dv, title=f"s({i}, {j}) − s({i}, {versus}), {GROUP_LABELS[group_name]}"),
                         key=f"{key}-why-versus", width="stretch")
        table = df.assign(model=model_name, stack=stack, attn=kind, layer=layer, head=head, query=i, key=j,
                          score=df.attrs["score"])
        st.download_button("Terms (CSV)", table.to_csv(index=False).encode(),
                           file_name=f"{model_name}-{stack}-{kind.replace('_', '-')}-L{layer}H{head}-why-{i}-{j}.csv",
                           mime="text/csv", key=f"{key}-why-csv", on_click="ignore")
        st.caption("Each term is scale × q_a · k_b: component a of the stream at the query, through the layer's norm "
                   "(its scale frozen at its traced value), W_q, QK-norm and RoPE, against component b at the key "
                   "through W_k. The score is exactly their sum" + ("" if ok else " (not here: see the error above)")
                   + ". Components: the token embeddings, added positions, each earlier head's write through its "
                   "slice of Wᴼ, each MLP's output, and biases.")


def pattern_section(state: PageState, trace, model_name: str, stack: str, default_head, key: str = "heads",
                    text: Optional[str] = None, on: str = "text") -> Dict:
    """The Heads page's "What drives a head's pattern": pattern_attribution of one head (URL
    pa=layer,head; pa_group), its terms grouped, its marginals and its sum check, and a link to the
    head's circuit (on `text`, or the repeated sequence: on="repeat"). Returns the URL fields."""
    n_layers, n_heads = trace.layers(stack), trace.n_heads(stack)

    def valid(c):
        return c is not None and 0 <= c[0] < n_layers and 0 <= c[1] < n_heads

    pa_key = state.seeded_key("pa", default_head, parse=parse_cell, valid=valid,
                              why=f"pa is layer,head within {n_layers} layers × {n_heads} heads")
    cell = st.session_state[pa_key]
    if isinstance(cell, str):
        try:
            cell = parse_cell(cell)
        except ValueError:
            cell = None
    if not valid(cell):
        cell = default_head
    st.session_state[pa_key] = cell
    state.keep(pa_key)
    group_key = state.seeded_key("pa_group", "layers", valid=lambda v: v in GROUPS,
                                 why=f"groupings: {', '.join(GROUPS)}")
    if st.session_state[group_key] not in GROUPS:
        st.session_state[group_key] = "layers"
    state.keep(group_key)
    c = st.columns([1, 1, 2])
    layer = c[0].selectbox("Layer", list(range(n_layers)), index=cell[0], key=f"{key}-pa-layer")
    head = c[1].selectbox("Head", list(range(n_heads)), index=cell[1], key=f"{key}-pa-head")
    group_name = c[2].radio("Group the terms", list(GROUPS), key=group_key, horizontal=True,
                            format_func=lambda g: GROUP_LABELS[g])
    st.session_state[pa_key] = (layer, head)
    try:
        n = len(trace[tn.embed(stack)])
        cfg = models.get_model(model_name).config
        with admission.admitted(gate.pattern_bytes(cfg, n, layer), 0.0, f"{model_name} pattern attribution, {n} tokens",
                                kind="pattern"), \
                st.spinner(f"Taking apart every score of layer {layer} head {head}…"):
            df = analysis.pattern_attribution(trace, stack, layer, head, group=GROUPS[group_name])
    except ValueError as exc:
        if trace.mixer_layers(stack):  # score attribution reads softmax heads all the way down: not this model
            st.info(f"**This head's pattern cannot be taken apart here**: {exc}")
        else:
            st.error(f"This head's pattern cannot be taken apart: {exc}")
        return {"pa": cell_url((layer, head)), "pa_group": None}
    sum_check(df, what="attention-weighted score")
    if text is not None:
        explore_links.circuit_link(st, model_name, text, stack, layer, head, on=on,
                                   label=f"Layer {layer} head {head}'s circuit: these sources as a graph, expanded and "
                                         "checked by patching")
    st.markdown("**Largest terms of the whole pattern** (each cell's terms weighted by the attention it gets): "
                + "; ".join(wf.term_sentences(df, None, None, 3)))
    charts.chart(wf.terms_heatmap(df, title=f"L{layer}H{head}: Σ_ij a_ij × term_ij, {GROUP_LABELS[group_name]}"),
                 key=f"{key}-pa-terms", width="stretch", name=f"{model_name}-pattern-L{layer}H{head}")
    charts.chart(wf.marginal_bars(df, title="Through the query side and through the key side"),
                 key=f"{key}-pa-marginals", width="stretch")
    st.download_button("Terms (CSV)", df.assign(model=model_name, stack=stack, layer=layer, head=head)
                       .to_csv(index=False).encode(), file_name=f"{model_name}-{stack}-L{layer}H{head}-pattern-terms.csv",
                       mime="text/csv", key=f"{key}-pa-csv", on_click="ignore")
    return {"pa": None if (layer, head) == tuple(default_head) else cell_url((layer, head)),
            "pa_group": None if group_name == "layers" else group_name}
