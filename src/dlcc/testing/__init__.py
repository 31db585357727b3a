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
    convnext_block_stack,
    deeplabv3_head,
    depthwise_separable_block,
    efficientnet_b0,
    gelu_erf,
    gelu_tanh,
    layernorm_primitive,
    mlp,
    mobilenet_v2,
    mobilenet_v3_small,
    residual_block,
    resnet18,
    shufflenet_v2,
    squeezenet,
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
    "convnext_block_stack",
    "deeplabv3_head",
    "depthwise_separable_block",
    "efficientnet_b0",
    "export",
    "gelu_erf",
    "gelu_tanh",
    "has_torch",
    "layernorm_primitive",
    "light_input",
    "light_model",
    "light_model_path",
    "mlp",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "randomize",
    "residual_block",
    "resnet18",
    "shufflenet_v2",
    "squeezenet",
    "torch_modules",
    "transformer_encoder_block",
]
