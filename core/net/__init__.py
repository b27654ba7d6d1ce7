"""The network: ModelConfig, the Transformer and its parts (layers, multi-head attention,
scaled-dot-product attention and masks, positions), the Recorder that names every
intermediate, head ablation, and parameter counts and timings (cost)."""
