"""Public Python API of the model front end (re-exported as ``dnnfab.load``/``quantize``).

>>> import dnnfab, numpy as np
>>> g = dnnfab.load("model.onnx")                  # or a ModelProto, bytes, a zoo name
>>> y = g.run({"input": x})                        # float reference, ONNX output names
>>> q = dnnfab.quantize(g, calibration=xs)         # int8 per the integer contract
>>> yq = q.run({"input": x})                       # integer reference, dequantized
>>> q.export("model_qdq.onnx")                     # QDQ model onnxruntime can run
"""

from __future__ import annotations

from ..frontend.onnx_import import import_onnx, read_model
from ..ir.graph import Graph
from ..ir.qgraph import QuantizedGraph, dequantize_tensor
from ..quant.ptq import quantize_graph
from .network import check_finite

__all__ = ["load", "quantize", "Graph", "QuantizedGraph", "QuantizedNetwork"]


class QuantizedNetwork(QuantizedGraph):
    """The int8 network :func:`quantize` returns: the data of
    :class:`~dnnfab.sw.ir.qgraph.QuantizedGraph` plus its executors.

    ``run(feed)`` quantizes the float inputs, executes the integer reference
    (:func:`dnnfab.sw.cpu.reference.run_reference`) and returns dequantized float outputs
    named as in the ONNX model. ``run_int`` returns the int8 output codes instead.
    ``options``: an :class:`~dnnfab.sw.cpu.options.Options` (default: the environment's).
    """

    def run_int(self, feed, observer=None, options=None):
        """Integer outputs (int8 codes) for float inputs ``feed``."""
        from ..cpu.reference import run_reference
        return run_reference(self, self.quantize_inputs(feed), observer=observer, options=options)

    def run(self, feed, observer=None, options=None):
        """Dequantized float outputs, named as in the ONNX model."""
        qout = self.run_int(feed, observer=observer, options=options)
        return {k: dequantize_tensor(v, self.qtensors[k].scale, self.qtensors[k].zero_point)
                for k, v in qout.items()}

    def export(self, path=None):
        """QDQ ONNX model of this network (see :mod:`dnnfab.sw.frontend.export`)."""
        from ..frontend.export import export_qdq
        return export_qdq(self, path)


def load(model, batch=1, input_shapes=None, name=None):
    """Import an ONNX model into a float :class:`~dnnfab.sw.ir.graph.Graph`.

    model: path to an ``.onnx`` file, its bytes, an ``onnx.ModelProto`` or the name of a
    bundled zoo model (``dnnfab models``). batch: value for a dynamic batch dimension.
    input_shapes: {input name: shape} for other dynamic dimensions.
    Raises :class:`~dnnfab.errors.ModelError` / ``UnsupportedOpError`` with a one-line fix
    (a path that does not exist: ``file not found: <path>``).
    """
    check_model_path(model)
    proto = read_model(model)
    if name is None and isinstance(model, str):
        import os
        name = os.path.splitext(os.path.basename(model))[0]
    return import_onnx(proto, batch=batch, input_shapes=input_shapes, name=name)


def check_model_path(model):
    """Raise ``ModelError("file not found: <path>")`` when ``model`` is a path (it names an
    ``.onnx`` file or a directory) that does not exist, rather than treating it as a zoo
    name; a directory is not a model either."""
    import os
    from ...errors import ModelError
    if not isinstance(model, (str, os.PathLike)):
        return
    path = os.fspath(model)
    if os.path.isdir(path):
        raise ModelError(f"{path} is a directory; pass the path of an .onnx file")
    looks_like_path = path.lower().endswith(".onnx") or os.sep in path or \
        (os.altsep is not None and os.altsep in path)
    if looks_like_path and not os.path.exists(path):
        raise ModelError(f"file not found: {path}; check the path (zoo models are named "
                         "without .onnx, see `dnnfab models`)")


def quantize(graph, calibration=None, method="minmax", percentile=99.99, reduce_range=False):
    """Post-training int8 quantization; see :func:`dnnfab.sw.quant.ptq.quantize_graph`.
    ``reduce_range=True``: 7-bit weights, so onnxruntime's optimized session runs the
    exported QDQ model exactly also on x86 CPUs without VNNI (docs/frontend.md)."""
    if not isinstance(graph, Graph):
        graph = load(graph)
    _check_finite_calibration(graph, calibration)
    return quantize_graph(graph, calibration=calibration, method=method, percentile=percentile,
                          reduce_range=reduce_range, graph_class=QuantizedNetwork)


def _check_finite_calibration(graph, calibration):
    """NaN/inf calibration data would give NaN scales: refuse it with the input's name.
    Checks arrays and dicts of arrays (iterables are passed through unread)."""
    import numpy as np
    if isinstance(calibration, np.ndarray) and len(graph.inputs) == 1:
        check_finite({graph.inputs[0].name: calibration}, what="calibration input")
    elif isinstance(calibration, dict):
        check_finite({k: v for k, v in calibration.items() if isinstance(v, np.ndarray)},
                     what="calibration input")
