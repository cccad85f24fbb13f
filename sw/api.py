"""Public Python API of the model front end (re-exported as ``dnnfab.load``/``quantize``).

>>> import dnnfab, numpy as np
>>> g = dnnfab.load("model.onnx")                  # or a ModelProto, bytes, a zoo name
>>> y = g.run({"input": x})                        # float reference, ONNX output names
>>> q = dnnfab.quantize(g, calibration=xs)         # int8 per the integer contract
>>> yq = q.run({"input": x})                       # integer reference, dequantized
>>> q.export("model_qdq.onnx")                     # QDQ model onnxruntime can run
"""

from __future__ import annotations

from .frontend import import_onnx, read_model
from .ir import Graph
from .quantize import QuantizedGraph, quantize_graph

__all__ = ["load", "quantize", "Graph", "QuantizedGraph"]


def load(model, batch=1, input_shapes=None, name=None):
    """Import an ONNX model into a float :class:`~dnnfab.sw.ir.Graph`.

    model: path to an ``.onnx`` file, its bytes, an ``onnx.ModelProto`` or the name of a
    bundled zoo model (``dnnfab models``). batch: value for a dynamic batch dimension.
    input_shapes: {input name: shape} for other dynamic dimensions.
    Raises :class:`~dnnfab.errors.ModelError` / ``UnsupportedOpError`` with a one-line fix.
    """
    proto = read_model(model)
    if name is None and isinstance(model, str):
        import os
        name = os.path.splitext(os.path.basename(model))[0]
    return import_onnx(proto, batch=batch, input_shapes=input_shapes, name=name)


def quantize(graph, calibration=None, method="minmax", percentile=99.99, reduce_range=False):
    """Post-training int8 quantization; see :func:`dnnfab.sw.quantize.quantize_graph`.
    ``reduce_range=True``: 7-bit weights, so onnxruntime's optimized session runs the
    exported QDQ model exactly also on x86 CPUs without VNNI (docs/frontend.md)."""
    if not isinstance(graph, Graph):
        graph = load(graph)
    return quantize_graph(graph, calibration=calibration, method=method, percentile=percentile,
                          reduce_range=reduce_range)
