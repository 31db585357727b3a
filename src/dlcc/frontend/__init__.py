"""Frontend: ONNX file -> validated onnx_ir model with known shapes (``load``, ``shapes``)."""
