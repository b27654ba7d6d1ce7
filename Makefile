# The README's two commands are `make run` and `make test`; both set everything up first.
.PHONY: run test setup bench train eval

# make run MODELS=/path/to/models[:/other/folder]: every checkpoint folder or .gguf file one level
# inside those folders joins the model picker ($ATTENTION_LAB_MODELS).
run:
	$(if $(MODELS),ATTENTION_LAB_MODELS="$(MODELS)" )bash scripts/run.sh

test:
	bash scripts/test.sh

setup:
	bash scripts/setup.sh --test

bench: setup
	.venv/bin/python -m bench.run_all

train: setup
	.venv/bin/python -m core.train_toy

eval: setup
	.venv/bin/python -m core eval --model toy-translate
