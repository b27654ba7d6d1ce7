"""Attention Lab's transformer core: models that show their work.

    import core
    model = core.load_model("toy-translate")
    trace = model.trace("the small dog sees the cat")
    trace["encoder.0.self_attn.weights"]        # H x n x n, on CPU

No Streamlit and no plotting here: pages and figures build on this package.
"""

from .api import AttentionModel
from .net.attention import causal_mask, combine_masks, padding_mask, scaled_dot_product_attention
from .net.config import ModelConfig
from .device import device_name, pick_device
from .errors import InputError
from .net.model import Transformer
from .net.positional import apply_rope, rope_angles, sinusoidal_encoding
from .net.recorder import Recorder
from .registry import MODELS, ModelUnavailable, list_models, load_model
from .trace import Trace

__all__ = [
    "AttentionModel",
    "InputError",
    "ModelConfig",
    "ModelUnavailable",
    "MODELS",
    "Recorder",
    "Trace",
    "Transformer",
    "apply_rope",
    "causal_mask",
    "combine_masks",
    "device_name",
    "list_models",
    "load_model",
    "padding_mask",
    "pick_device",
    "rope_angles",
    "scaled_dot_product_attention",
    "sinusoidal_encoding",
]
