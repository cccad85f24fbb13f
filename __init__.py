"""dnnfab: turn a trained neural network into a running FPGA accelerator system.

The package maps the repository's top-level folders: ``dnnfab.hw`` (Amaranth hardware),
``dnnfab.sw`` (host software in layers: ir, frontend, quant, ref, cpu, compiler, driver,
runtime; docs/architecture.md),
``dnnfab.cosim`` (cocotb co-simulation), ``dnnfab.boards`` (board descriptions) and
``dnnfab.models`` (bundled models).
"""

from .errors import DnnfabError

__version__ = "0.1.0"

__all__ = ["DnnfabError", "load", "quantize", "InferenceSession", "__version__"]


def load(model, **kwargs):
    """Load an ONNX model (path, bytes, ``onnx.ModelProto`` or zoo name) into a graph."""
    from .sw.runtime.api import load as _load
    return _load(model, **kwargs)


def quantize(graph, calibration=None, **kwargs):
    """Post-training int8 quantization of a loaded graph (see :mod:`dnnfab.sw.quant.ptq`)."""
    from .sw.runtime.api import quantize as _quantize
    return _quantize(graph, calibration=calibration, **kwargs)


def __getattr__(name):
    # lazy: ``dnnfab.InferenceSession`` without importing the host side on ``import dnnfab``
    if name == "InferenceSession":
        from .sw.runtime.session import InferenceSession
        return InferenceSession
    raise AttributeError(f"module 'dnnfab' has no attribute {name!r}")
