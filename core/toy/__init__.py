"""The toy model: the synthetic translation language (toy_task.py), the trained model's loader
(toy_model.py), its held-out evaluation (evaluate.py) and its saved training steps
(toy_steps.py). Training is `python -m core.cli.train_toy`."""
