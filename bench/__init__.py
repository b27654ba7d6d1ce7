"""Attention Lab's benchmarks: plain scripts that print figures (never timed unit tests).

    python -m bench.run_all [--quick]     # everything; writes docs/benchmarks.md
    python -m bench.core_bench            # minilm trace / forward against transformers
    python -m bench.memory_bench          # trace bytes, float16 attention error, cache sizes
    python -m bench.browser_bench         # the app in Chromium: sentence, model view, head, decoder step, 512 tokens

bench_smollm2.py is a stand-alone script for smollm2's load and trace times.
"""
