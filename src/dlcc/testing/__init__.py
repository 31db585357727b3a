"""Test-model kit: ONNX models built in code, the onnx wheel's light reference models with random
weights, seeded weight randomization, and (optionally) models exported from PyTorch.

What goes in: builder keyword arguments, model names, seeds.
What comes out: ``onnx.ModelProto`` objects (checker-clean, runnable in onnxruntime) and input feeds.

Invariants: nothing is downloaded; everything is deterministic given its seed; torch is imported only
when ``export`` (or ``torch_export.torch_modules``) is called, so this package imports without it.
"""

from dlcc.testing.light import LIGHT_MODELS, LightModelError, light_input, light_model, light_model_path
from dlcc.testing.models import (
    KIT_MODELS,
    attention_block,
    conv_bn_relu_stack,
    depthwise_separable_block,
    gelu_erf,
    gelu_tanh,
    layernorm_primitive,
    mlp,
    residual_block,
    transformer_encoder_block,
)
from dlcc.testing.randomize import randomize
from dlcc.testing.torch_export import TorchMissingError, export, has_torch, torch_modules

__all__ = [
    "KIT_MODELS",
    "LIGHT_MODELS",
    "LightModelError",
    "TorchMissingError",
    "attention_block",
    "conv_bn_relu_stack",
    "depthwise_separable_block",
    "export",
    "gelu_erf",
    "gelu_tanh",
    "has_torch",
    "layernorm_primitive",
    "light_input",
    "light_model",
    "light_model_path",
    "mlp",
    "randomize",
    "residual_block",
    "torch_modules",
    "transformer_encoder_block",
]
