"""One browser-history entry per user action (app.py installs it once per page load).

Streamlit's frontend (1.67) pushes a history entry when the page changes (the sidebar's
links) and another whenever the script writes `st.query_params` outside a Back/Forward
navigation. A page switch is therefore two entries: `/positions`, then
`/positions?model=…` once the new page has written its state (PageState.publish), and Back
needs two presses, the first landing on a bare URL that the page at once fills in again.

The script below wraps `history.pushState` in the app's window: the first push after a user
action (a pointer press or a key) stays a push; every later push before the next action, and
every push after a page load or a Back/Forward, replaces the current entry instead. A page
switch, a changed layer, a pressed Play (however many steps it then plays) each make one
entry, and Back undoes one action. It runs in the app's document (st.html with
JavaScript allowed), once: later runs find it installed.
"""

from __future__ import annotations

import streamlit as st

SCRIPT = """<script>
(() => {
  if (window.__attentionLabHistory) return;
  window.__attentionLabHistory = true;
  const history = window.history, push = history.pushState.bind(history);
  let pushed = true;  // the page load has made this action's entry
  const action = () => { pushed = false; };
  window.addEventListener("pointerdown", action, true);
  window.addEventListener("keydown", action, true);
  window.addEventListener("popstate", () => { pushed = true; });
  history.pushState = function (state, unused, url) {
    if (pushed) return history.replaceState(state, unused, url);
    pushed = true;
    return push(state, unused, url);
  };
})();
</script>"""

# the container and the layout wrapper around it, which would otherwise take a gap above the page
HIDE = ("<style>.st-key-history-one-entry-per-action, [data-testid='stLayoutWrapper']:has("
        "> .st-key-history-one-entry-per-action) { display: none; }</style>")


def one_entry_per_action() -> None:
    """Install the wrapper (see the module docstring); it takes no room on the page."""
    st.html(HIDE)  # style only: Streamlit puts it where it takes no room
    with st.container(key="history-one-entry-per-action"):
        st.html(SCRIPT, unsafe_allow_javascript=True)
