"""Loaders: where each model's weights come from and how they fill the network. The catalog
of named models (catalog.py) sits below every loader; core/registry.py sits above them.
Hugging Face folders (hf*.py, masked_lm.py; encoder-decoders in hf_seq2seq.py with
seq2seq_*.py), GGUF files (gguf_file.py, gguf_gemma.py, gguf_gpt_oss.py, gguf_reader.py, byte_bpe.py), later decoder families (families/), minilm, smollm2,
checkpoints (safetensors only) and the local folders the app lists."""
