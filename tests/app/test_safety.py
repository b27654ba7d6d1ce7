"""Safe defaults, checked statically and against what Streamlit actually reads.

The server binds 127.0.0.1 with XSRF protection on, usage statistics off, headless, and a small
upload limit (the app has no uploaders); no user text reaches unsafe_allow_html / st.html;
weights load through safetensors (or GGUF), never through pickle."""

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from viz.ui import registry

from conftest import assert_no_exception

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".streamlit" / "config.toml"
APP_SOURCES = [ROOT / "app.py", *sorted((ROOT / "viz").rglob("*.py"))]
CORE_SOURCES = sorted((ROOT / "core").rglob("*.py"))
MAX_UPLOAD_MB = 10


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def call_name(call: ast.Call) -> str:
    f = call.func
    parts = []
    while isinstance(f, ast.Attribute):
        parts.append(f.attr)
        f = f.value
    if isinstance(f, ast.Name):
        parts.append(f.id)
    return ".".join(reversed(parts))


def keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def is_false(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def is_literal_string(node, constants=frozenset()) -> bool:
    """A string fixed in the source: a constant, a module-level name assigned only such a string
    (`constants`), or these joined with +."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return True
    if isinstance(node, ast.Name) and node.id in constants:
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return is_literal_string(node.left, constants) and is_literal_string(node.right, constants)
    return False


def string_constants(tree) -> set:
    """Module-level names assigned exactly once, to a literal string, and never rebound in the module."""
    assigned = {}
    for node in ast.walk(tree):
        for target in getattr(node, "targets", []) + ([node.target] if isinstance(node, (ast.AugAssign,
                                                                                            ast.AnnAssign)) else []):
            if isinstance(target, ast.Name):
                assigned[target.id] = assigned.get(target.id, 0) + 1
    return {t.id for node in tree.body if isinstance(node, ast.Assign) and len(node.targets) == 1
            for t in node.targets if isinstance(t, ast.Name) and assigned.get(t.id) == 1
            and is_literal_string(node.value)}


# ------------------------------------------------------------------ .streamlit/config.toml
def test_config_file_binds_localhost_with_safe_defaults():
    cfg = tomllib.loads(CONFIG.read_text())
    server, browser = cfg.get("server", {}), cfg.get("browser", {})
    assert server.get("address") == "127.0.0.1"
    assert server.get("enableXsrfProtection") is True
    assert server.get("enableCORS", True) is True  # not switched off
    assert server.get("headless") is True
    assert browser.get("gatherUsageStats") is False
    assert 0 < server.get("maxUploadSize", 200) <= MAX_UPLOAD_MB
    assert server.get("runOnSave", False) is False
    assert server.get("fileWatcherType") == "none"  # a served app does not watch (or re-read) its sources
    assert cfg.get("client", {}).get("showErrorDetails", "full") in ("none", False)  # no tracebacks to visitors


def test_streamlit_reads_those_settings():
    """What Streamlit itself resolves from the project folder (no command-line flags)."""
    names = ["server.address", "server.enableXsrfProtection", "server.enableCORS", "server.headless",
             "browser.gatherUsageStats", "server.maxUploadSize", "client.showErrorDetails", "server.fileWatcherType"]
    code = ("import json; from streamlit import config; config.get_config_options(force_reparse=True); "
            f"print(json.dumps({{n: config.get_option(n) for n in {names!r}}}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT / ".streamlit")})
    assert out.returncode == 0, out.stderr[-2000:]
    opts = json.loads(out.stdout.strip().splitlines()[-1])
    assert opts["server.address"] == "127.0.0.1"
    assert opts["server.enableXsrfProtection"] is True and opts["server.enableCORS"] is True
    assert opts["server.headless"] is True and opts["browser.gatherUsageStats"] is False
    assert 0 < opts["server.maxUploadSize"] <= MAX_UPLOAD_MB
    assert opts["client.showErrorDetails"] in ("none", False)
    assert opts["server.fileWatcherType"] == "none"


def test_launch_scripts_do_not_rebind_the_server():
    """No launcher overrides those settings on the command line."""
    for path in [*(ROOT / "scripts").glob("*.sh"), *(ROOT / "scripts").glob("*.py"), ROOT / "Makefile",
                 ROOT / "tests" / "browser_utils.py"]:
        text = path.read_text()
        assert "0.0.0.0" not in text, path
        for unsafe in (r"server\.address\W+(?!127\.0\.0\.1)[\w:.]", r"enableXsrfProtection\W+false",
                       r"enableCORS\W+false", r"gatherUsageStats\W+true", r"headless\W+false"):
            assert not re.search(unsafe, text, re.I), (path.name, unsafe)


# ------------------------------------------------------------------ HTML from user text
def test_no_unsafe_html_with_computed_strings():
    """unsafe_allow_html=True, st.html and components.html only ever get fixed strings."""
    found = []
    for path in APP_SOURCES:
        tree = parsed(path)
        constants = string_constants(tree)
        for call in calls(tree):
            name = call_name(call)
            unsafe = keyword(call, "unsafe_allow_html")
            html_call = name.endswith(".html") or name in ("html",)
            if (unsafe is not None and not is_false(unsafe)) or html_call:
                body = call.args[0] if call.args else keyword(call, "body")
                found.append((path.name, call.lineno, name))
                assert isinstance(unsafe, ast.Constant) or unsafe is None, \
                    f"{path.name}:{call.lineno}: unsafe_allow_html must be a literal"
                assert body is not None and is_literal_string(body, constants), \
                    f"{path.name}:{call.lineno}: {name} renders HTML built at run time (user text could reach it)"
    print(f"HTML-rendering calls (all with fixed strings): {found or 'none'}")


def test_figures_are_built_without_streamlit():
    """Only a page (page.py), a page's Streamlit parts (*_panel.py) and viz/ui import Streamlit
    (docs/design.md): figures and analyses stay pure, testable without a running app."""
    def streamlit_side(p):
        return p.name == "page.py" or p.name.endswith("_panel.py") or (ROOT / "viz" / "ui") in p.parents
    checked = [p for p in (ROOT / "viz").rglob("*.py") if not streamlit_side(p)]
    assert len(checked) > 20 and any(p.parent.name == "figures" for p in checked)
    for path in checked:
        for node in ast.walk(parsed(path)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(m.split(".")[0] == "streamlit" for m in mods), f"{path} imports streamlit"


SENTINEL = "zq7sentinel <b>bold</b> <img src=x onerror=alert(1)>"


@pytest.mark.parametrize("page", [p.key for p in registry.with_text()])  # every page that takes text
def test_user_text_never_reaches_html_elements(app_test, page):
    """At run time: no element rendered with HTML allowed carries the typed text."""
    params = {**registry.page(page).params, "text": SENTINEL}
    if page == "compare":
        params["text2"] = SENTINEL
    at = app_test(page, **params)
    at.run()
    assert_no_exception(at)
    for el in at.get("markdown"):
        if getattr(el.proto, "allow_html", False):
            assert "zq7sentinel" not in el.proto.body, el.proto.body[:200]
    from viz.ui import history

    for el in at.get("html"):  # only the app's own fixed history script and its style
        assert "zq7sentinel" not in el.proto.body
        assert el.proto.body in (history.SCRIPT, history.HIDE), el.proto.body[:200]


# ------------------------------------------------------------------ weights: no pickle
def test_core_never_unpickles():
    bad = []
    for path in CORE_SOURCES:
        tree = parsed(path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                bad += [(path.name, node.lineno, m) for m in mods if m.split(".")[0] in ("pickle", "cPickle", "dill",
                                                                                           "joblib", "cloudpickle")]
        for call in calls(tree):
            name = call_name(call)
            if name.endswith("torch.load"):
                wo = keyword(call, "weights_only")
                if not (isinstance(wo, ast.Constant) and wo.value is True):
                    bad.append((path.name, call.lineno, "torch.load without weights_only=True"))
            if name.endswith(("np.load", "numpy.load")):
                ap = keyword(call, "allow_pickle")
                if not is_false(ap):
                    bad.append((path.name, call.lineno, "np.load without allow_pickle=False"))
            if name.endswith(("pickle.load", "pickle.loads", "torch.serialization.load")):
                bad.append((path.name, call.lineno, name))
    assert not bad, bad


def test_weights_load_through_safetensors():
    sources = {p.name: p.read_text() for p in CORE_SOURCES}
    assert "safetensors.torch import load_file" in sources["toy_model.py"]  # toy-translate
    assert "safetensors.torch import load_file" in sources["minilm.py"]  # all-MiniLM-L6-v2
    assert "GGUFReader" in sources["smollm2.py"]  # SmolLM2: GGUF, read as arrays
    assert not list((ROOT / "assets").rglob("*.bin")) and not list((ROOT / "assets").rglob("*.pt")) \
        and not list((ROOT / "assets").rglob("*.pkl")) and not list((ROOT / "assets").rglob("*.pth"))
    assert list((ROOT / "assets").rglob("*.safetensors"))


# ------------------------------------------------------------------ uploads
def test_no_file_uploads_or_each_is_limited():
    uploaders = []
    for path in APP_SOURCES:
        for call in calls(parsed(path)):
            if call_name(call).endswith(("file_uploader", "camera_input", "audio_input")):
                uploaders.append((path.name, call.lineno))
    cfg = tomllib.loads(CONFIG.read_text())
    # none today; should one be added, the server-wide limit below still caps every upload
    assert not uploaders or 0 < cfg["server"]["maxUploadSize"] <= MAX_UPLOAD_MB, uploaders
    assert 0 < cfg["server"]["maxUploadSize"] <= MAX_UPLOAD_MB
