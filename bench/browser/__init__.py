"""The browser benchmark's modules: shared helpers (page) and one module per scenario; the runner
and its command line are bench.browser_bench."""
