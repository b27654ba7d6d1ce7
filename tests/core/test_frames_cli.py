"""core.frames (attention maps as long tables), the CLI's csv/parquet export, and the
installed `attention-lab` command."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import core
from core import trace_names as tn
from core.cli import attention_lab
from core.__main__ import main as core_main
from core.frames import attention_names, frame, frames, select_names

DEVICE = "cpu"  # the model fixtures (conftest.py) load on the CPU here

ROOT = Path(__file__).resolve().parents[2]
TEXT = "the small dog sees the cat"


@pytest.fixture(scope="module")
def trace(toy):
    return toy.trace(TEXT)


def _check_cells(df, tensor, q_tokens, k_tokens, value, heads):
    """Every row against the tensor, read cell by cell (not by reshaping the column)."""
    t = tensor.numpy()
    assert len(df) == t.size
    for row in df.itertuples(index=False):
        r = row._asdict()
        cell = t[r["query_index"], r["key_index"]] if heads is None else t[r["head"], r["query_index"], r["key_index"]]
        assert r[value] == cell or (np.isinf(cell) and r[value] == cell)
        assert r["query_token"] == q_tokens[r["query_index"]]
        assert r["key_token"] == k_tokens[r["key_index"]]
    seen = set(zip(df["head"], df["query_index"], df["key_index"]))
    assert len(seen) == len(df)  # every cell once


@pytest.mark.parametrize("name, q_side, k_side", [
    ("encoder.1.self_attn.weights", "source", "source"),
    ("decoder.2.self_attn.weights", "target", "target"),
    ("decoder.0.cross_attn.weights", "target", "source"),
    ("decoder.1.self_attn.scores", "target", "target"),
])
def test_frame_rows_are_the_map(trace, name, q_side, k_side):
    df = frame(trace, name)
    stack, layer, attn, what = name.split(".")
    value = {"weights": "weight", "scores": "score"}[what]
    assert list(df.columns) == ["stack", "layer", "attn", "head", "query_index", "query_token",
                                "key_index", "key_token", value]
    assert set(df["stack"]) == {stack} and set(df["layer"]) == {int(layer)} and set(df["attn"]) == {attn}
    _check_cells(df, trace[name], trace.tokens(q_side), trace.tokens(k_side), value, heads=True)


def test_mask_frame_has_head_minus_one(trace):
    name = "decoder.1.self_attn.mask"
    df = frame(trace, name)
    assert set(df["head"]) == {-1}
    tgt = trace.tokens("target")
    _check_cells(df, trace[name], tgt, tgt, "mask", heads=None)
    # the look-ahead mask: -inf exactly above the diagonal
    assert ((df["mask"] == -np.inf) == (df["key_index"] > df["query_index"])).all()


def test_frame_rejects_other_names(trace):
    with pytest.raises(ValueError, match="not an attention map name"):
        frame(trace, "encoder.0.out")
    with pytest.raises(KeyError):
        frame(trace, "encoder.9.self_attn.weights")
    with pytest.raises(ValueError, match="matches no attention name"):
        select_names(trace, ["decoder.*.nothing.weights"])


def test_select_names_wildcards(trace):
    assert select_names(trace, ["decoder.*.cross_attn.weights"]) == [tn.cross_attn("decoder", i, "weights") for i in range(3)]
    assert attention_names(trace) == [n for n in trace.names() if n.endswith(".weights")]


def _cli_table(tmp_path, fmt, extra=()):
    out = tmp_path / f"t.{fmt}"
    rc = core_main(["trace", "--model", "toy-translate", "--device", "cpu", "--text", TEXT,
                    "--format", fmt, "--out", str(out), *extra])
    assert rc == 0 and out.is_file()
    if fmt == "csv":
        return pd.read_csv(out, keep_default_na=False)
    return pd.read_parquet(out)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_cli_table_equals_frame(tmp_path, trace, fmt):
    got = _cli_table(tmp_path, fmt)
    want = frames(trace, attention_names(trace, "weights"))
    assert len(want) == sum(trace[n].numel() for n in attention_names(trace))
    for col in want.columns:
        if col == "weight":
            # csv prints floats in decimal; parquet keeps float32 bit for bit
            tol = 1e-7 if fmt == "csv" else 0
            np.testing.assert_allclose(got[col].to_numpy(float), want[col].to_numpy(float), rtol=tol, atol=0)
        else:
            assert got[col].astype(str).tolist() == want[col].astype(str).tolist(), col


def test_cli_names_choose_maps(tmp_path, trace):
    names = ["decoder.0.self_attn.mask", "encoder.2.self_attn.scores"]
    got = _cli_table(tmp_path, "parquet", ["--names", *names])
    want = frames(trace, select_names(trace, names))  # in the trace's order
    assert select_names(trace, names) == names[::-1]
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want, check_dtype=False)
    assert np.isinf(got["mask"]).any()  # -inf survives parquet


def test_cli_bad_name_is_an_error_line(tmp_path, capsys):
    rc = core_main(["trace", "--device", "cpu", "--text", TEXT, "--format", "csv",
                    "--out", str(tmp_path / "x.csv"), "--names", "encoder.0.out"])
    assert rc == 2 and "not an attention map name" in capsys.readouterr().err


def test_console_script_is_declared():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["attention-lab"] == "core.cli:main"
    assert "app" in meta["tool"]["setuptools"]["py-modules"]


def test_streamlit_settings_match_config_toml():
    conf = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    flat = {f"{sec}.{k}": v for sec, opts in conf.items() for k, v in opts.items()}
    assert attention_lab.STREAMLIT_SETTINGS == flat


def test_run_command_points_at_the_app():
    cmd = attention_lab.streamlit_command(port=8765, extra=["--server.address=0.0.0.0"])
    assert cmd[1:4] == ["-m", "streamlit", "run"] and Path(cmd[4]) == ROOT / "app.py"
    assert "--server.port=8765" in cmd and cmd[-1] == "--server.address=0.0.0.0"
    assert "--server.headless=true" in cmd


def _entry(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "core.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)


@pytest.mark.slow
def test_entry_help_names_every_command():
    res = _entry("--help")
    assert res.returncode == 0, res.stderr
    for word in ("run", "trace", "models", "eval", "attention-lab"):
        assert word in res.stdout
    for sub, phrase in [("run", "start the app"), ("trace", "csv"), ("models", "list the models")]:
        r = _entry(sub, "--help")
        assert r.returncode == 0 and phrase in r.stdout, (sub, r.stdout)


@pytest.mark.slow
def test_entry_models_lists_every_model():
    res = _entry("models")
    assert res.returncode == 0, res.stderr
    names = [line.split("\t")[0] for line in res.stdout.splitlines()]
    assert names == list(core.registry.MODELS)


def test_names_found_when_a_trace_lists_only_what_it_stores(trace):
    """A trace whose names() lists only stored tensors still yields its attention names."""

    class StoredOnly:
        def __init__(self, t):
            self.t = t

        def names(self):
            return [n for n in self.t.names() if n.endswith(".out") or n.startswith("embed.")]

        def __getattr__(self, attr):
            return getattr(self.t, attr)

        def __contains__(self, name):
            return name in self.t

        def __getitem__(self, name):
            return self.t[name]

    lean = StoredOnly(trace)
    assert attention_names(lean) == attention_names(trace)
    masks = select_names(lean, ["decoder.1.*.mask"])
    assert "decoder.1.self_attn.mask" in masks
    assert sorted(masks) == sorted(select_names(trace, ["decoder.1.*.mask"]))
    pd.testing.assert_frame_equal(frame(lean, "encoder.0.self_attn.weights"), frame(trace, "encoder.0.self_attn.weights"))


@pytest.mark.slow
def test_wheel_ships_the_app_and_the_command(tmp_path):
    """What `pip install .` installs: app.py beside core/ and viz/ (pages included), the
    bundled checkpoint, and the attention-lab entry point. Built from a copy of the tracked
    files, so the checkout stays clean."""
    import shutil
    import zipfile

    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    src = tmp_path / "src"
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("attention_lab-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry = next(z.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "app.py" in names and "core/cli/attention_lab.py" in names and "core/frames.py" in names
    pages = {f.replace("\\", "/") for f in files if f.startswith("viz/") and f.endswith("/page.py")}
    assert len(pages) >= 12 and pages <= names
    assert {f for f in files if f.startswith("assets/toy-translate/")} <= names
    assert "attention-lab = core.cli:main" in entry


def test_trace_frame_is_core_frames_frame():
    import core
    from core.frames import frame

    tr = core.load_model("toy-translate", device="cpu").trace("the small dog sees the cat")
    a, b = tr.frame("decoder.1.cross_attn.weights"), frame(tr, "decoder.1.cross_attn.weights")
    assert a.equals(b) and len(a) == 4 * len(tr.tokens("target")) * len(tr.tokens("source"))
