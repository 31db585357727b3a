"""The light reference models the onnx wheel ships, with real (random) weights.

What goes in: a model name from ``LIGHT_MODELS`` and a seed.
What comes out: the path of ``onnx/backend/test/data/light/light_<name>.onnx`` inside the installed onnx
package; a randomized copy of that model (``dlcc.testing.randomize``: every weight, which the file
generates as ``ConstantOfShape`` of 0.02, becomes a seeded random initializer of full size); seeded
random inputs for it.

Invariants: nothing is downloaded; an unknown name or a missing file is a ``LightModelError`` (a
``DlccError``) that says what to do; the file on disk is never modified. The models are opset 9, IR 3
ImageNet classifiers with one input of shape [1, 3, 224, 224]; randomized copies hold 1.2M (squeezenet)
to 144M (vgg19) parameters.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx

from dlcc.errors import DlccError
from dlcc.testing.randomize import randomize

__all__ = ["LIGHT_MODELS", "LightModelError", "light_input", "light_model", "light_model_path"]

LIGHT_MODELS: tuple[str, ...] = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                                 "shufflenet", "squeezenet", "vgg19", "zfnet512")


class LightModelError(DlccError):
    """A light reference model is unknown or is not where the onnx package should have it."""


def light_model_path(name: str) -> Path:
    """Where the installed onnx package keeps ``light_<name>.onnx``."""
    if name not in LIGHT_MODELS:
        raise LightModelError(f"'{name}' is not a light reference model",
                              hint=f"use one of {', '.join(LIGHT_MODELS)}")
    path = Path(onnx.__file__).resolve().parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    if not path.is_file():
        raise LightModelError(
            f"the onnx package at '{Path(onnx.__file__).parent}' does not ship '{path.name}'",
            hint="reinstall the onnx wheel (pip install --force-reinstall onnx); source builds may omit "
                 "the backend test data")
    return path


@functools.cache
def _load_bytes(name: str) -> bytes:
    return light_model_path(name).read_bytes()


def light_model(name: str, seed: int = 0) -> onnx.ModelProto:
    """A randomized copy of the light model ``name`` (a new ModelProto on every call)."""
    model = onnx.ModelProto()
    model.ParseFromString(_load_bytes(name))
    return randomize(model, seed)


def light_input(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded standard-normal float32 data for every real (non-initializer) input of model ``name``."""
    model = onnx.ModelProto()
    model.ParseFromString(_load_bytes(name))
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in graph.input:
        if vi.name in initializers:
            continue
        tt = vi.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tt.shape.dim)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds
