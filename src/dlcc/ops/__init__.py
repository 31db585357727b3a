"""Per-op facts (TVM pattern kind, DNNFusion mapping type, flags) and per-node cost (FLOPs, bytes).

``table`` holds the facts, one row per op type; ``cost`` computes FLOPs and bytes from a node's shapes.
"""

from dlcc.ops.cost import model_flops, node_bytes, node_flops, static_shape
from dlcc.ops.table import (
    KNOWN_OPS,
    Kind,
    Mapping,
    OpInfo,
    combine_kinds,
    is_known,
    more_complex,
    op_info,
)

__all__ = [
    "KNOWN_OPS",
    "Kind",
    "Mapping",
    "OpInfo",
    "combine_kinds",
    "is_known",
    "model_flops",
    "more_complex",
    "node_bytes",
    "node_flops",
    "op_info",
    "static_shape",
]
