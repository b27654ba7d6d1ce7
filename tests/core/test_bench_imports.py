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
