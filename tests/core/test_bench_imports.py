"""Every benchmark module imports: `bench.run_all` runs each in its own process and turns a
failure into a "not measured" row, so a broken import (a helper renamed in bench.common, say)
would otherwise only show as a missing row in docs/benchmarks.md."""

import importlib
import pkgutil

import pytest

import bench
import bench.browser

MODULES = sorted({f"bench.{m.name}" for m in pkgutil.iter_modules(bench.__path__)}
                 | {f"bench.browser.{m.name}" for m in pkgutil.iter_modules(bench.browser.__path__)})


def test_the_benchmarks_are_found():
    assert {"bench.bench_lens", "bench.bench_attribution", "bench.run_all", "bench.browser.long8k"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_a_benchmark_module_imports(name):
    importlib.import_module(name)


def test_the_mixer_benchmark_measures_what_it_says():
    """bench.mixers at 48 tokens: each kind's map rebuilds its heads, and the recurrent form it
    times (one position at a time, with the cache) gives the chunked form's output."""
    from bench.mixers import KINDS, run_kind

    for kind in KINDS:
        r = run_kind(kind, tokens=48, rounds=1)
        assert r["A_rebuild_rel"] < 1e-5, (kind, r)
        assert r["chunked_vs_recurrent_max_abs"] < 1e-5 * max(1.0, r["output_max_abs"]), (kind, r)
        assert r["A_one_head_over_traced"] > 0 and r["A_every_head_over_traced"] > 0
