"""Attention Lab's benchmarks: plain scripts that print figures (never timed unit tests).

    python -m bench.run_all [--quick]     # everything; writes docs/benchmarks.md
    python -m bench.core_bench            # minilm trace / forward against transformers
    python -m bench.trace_bench           # long inputs: trace bytes and costs at the models' own context
    python -m bench.load_bench            # a 0.5 B Llama-shaped bfloat16 checkpoint from disk
    python -m bench.flow_bench            # attention flow for 30 tokens x 6 layers
    python -m bench.corpus_bench          # the corpus job and the joint projection
    python -m bench.browser_bench         # the app in Chromium: sentence, model view, head, decoder step, 512 tokens,
                                          # corpus, each page's first load (scenarios in bench/browser/)

bench_smollm2.py is a stand-alone script for smollm2's load and trace times.
"""
