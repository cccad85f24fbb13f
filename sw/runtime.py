"""Runtime: run a quantized network with conv/GEMM layers offloaded to the fabric.

:func:`run_network` walks the layers of a :class:`~dnnfab.sw.quantize.QuantizedGraph` in
order. Every layer the accelerator implements (dense conv2d/conv1d with ``groups == 1``,
GEMM) is compiled with :func:`dnnfab.sw.program.compile_layer` and executed on a fabric
backend; everything else runs on the CPU through the integer reference. The backends
compute the same integers (docs/contract.md), so the network output is bit-identical to
``QuantizedGraph.run_int`` — :func:`run_network` checks that when asked.

Backends: ``"model"`` (:class:`~dnnfab.sw.fastmodel.FastModel`: bit-exact execution of the
instruction stream plus the analytical cycle count). A fabric fault (:class:`FabricError`)
on a layer is reported in the result and, with ``fallback=True`` (default), that layer is
finished on the CPU so the inference completes.
"""

from dataclasses import dataclass, field
import time

import numpy as np

from ..errors import FabricError, DnnfabError
from ..hw.config import AcceleratorConfig
from .layer import ConvLayer
from .program import compile_layer, UnsupportedLayerError
from .fastmodel import FastModel, estimate_cycles

__all__ = ["LayerRecord", "NetworkResult", "to_conv_layer", "run_network"]


@dataclass
class LayerRecord:
    name: str
    op: str
    where: str                   # "fabric" | "cpu" | "cpu (fallback)"
    macs: int = 0
    cycles: int = 0              # fabric cycles (analytical model), per batch element x batch
    fabric_ms: float = 0.0       # cycles at the configured clock
    cpu_ms: float = 0.0          # measured wall time on the host (CPU layers)
    utilization: float = 0.0
    note: str = ""


@dataclass
class NetworkResult:
    outputs: dict                # name -> int8 array (logical layout)
    layers: list = field(default_factory=list)
    bit_exact: bool | None = None
    faults: list = field(default_factory=list)

    @property
    def fabric_cycles(self):
        return sum(r.cycles for r in self.layers)

    @property
    def fabric_ms(self):
        return sum(r.fabric_ms for r in self.layers)

    @property
    def cpu_ms(self):
        return sum(r.cpu_ms for r in self.layers)

    def table(self):
        rows = [["layer", "op", "where", "MACs", "cycles", "util", "fabric ms", "cpu ms"]]
        for r in self.layers:
            rows.append([r.name, r.op, r.where, f"{r.macs:,}", f"{r.cycles:,}" if r.cycles else "",
                         f"{r.utilization:.2f}" if r.cycles else "", f"{r.fabric_ms:.3f}" if r.cycles else "",
                         f"{r.cpu_ms:.3f}" if r.cpu_ms else ""])
        return rows

    def to_dict(self):
        return {"bit_exact": self.bit_exact, "fabric_cycles": self.fabric_cycles,
                "fabric_ms": self.fabric_ms, "cpu_ms": self.cpu_ms, "faults": self.faults,
                "layers": [r.__dict__ for r in self.layers]}


def to_conv_layer(L, in_shape):
    """The accelerator's view of a QConv/QGemm, or None if it cannot run on the fabric.

    ``in_shape`` is the logical (ONNX) input shape.
    """
    if L.op == "conv":
        if L.groups != 1:
            return None
        w = L.qweight
        if w.ndim == 3:                         # conv1d: [Cout, Cin, k] -> kh = 1
            w = w[:, :, None, :]
        if len(in_shape) == 4:
            hw = (in_shape[2], in_shape[3])
        elif len(in_shape) == 3:
            hw = (1, in_shape[2])
        else:
            return None
        stride, pad, dil = tuple(L.stride), tuple(L.pad), tuple(L.dilation)
        if len(stride) == 1:
            stride, dil = (1,) + stride, (1,) + dil
            pad = (0, pad[0], 0, pad[1])
        return ConvLayer(weight=w, bias=L.bias, m=L.m, n=L.n, zx=L.zx, zy=L.zy, lo=L.lo, hi=L.hi,
                         stride=stride, pad=pad, dilation=dil, in_hw=hw, name=L.name)
    if L.op == "gemm":
        rows = int(np.prod(in_shape[:-1]))
        return ConvLayer.gemm(L.qweight.T, bias=L.bias, m=L.m, n=L.n, rows=rows, zx=L.zx, zy=L.zy,
                              lo=L.lo, hi=L.hi, name=L.name)
    return None


def _fabric_conv(model, layer, prog, x_cl, L):
    """Run one conv on the fabric model for every batch element. x_cl: NHWC or NWC."""
    outs = []
    for xb in x_cl:
        xb = xb.reshape(layer.in_hw + (layer.cin,))
        outs.append(model.run_layer(prog, xb))
    y = np.stack(outs)
    if x_cl.ndim == 3:                          # conv1d: back to NWC
        y = y[:, 0]
    return y


def run_network(qg, feed, cfg: AcceleratorConfig = None, backend="model", fallback=True,
                check=False, progress=None, inject_fault=None):
    """Run ``qg`` on float inputs ``feed``; conv/GEMM on the fabric, the rest on the CPU.

    ``check``: also run the pure CPU reference and set ``result.bit_exact``.
    ``inject_fault``: name of a layer whose fabric run raises a FabricError (testing the
    CPU fallback).
    """
    from .reference import Env, run_layer
    cfg = cfg or AcceleratorConfig()
    if backend != "model":
        raise DnnfabError(f"backend {backend!r} is not available for whole networks yet; use backend='model'")
    feed_q = qg.quantize_inputs(feed)
    env = Env(qg)
    for t in qg.inputs:
        env.put(t.name, np.asarray(feed_q[t.name]), "lg")
    model = FastModel(cfg)
    result = NetworkResult(outputs={})
    layers = qg.layers if progress is None else progress(qg.layers)
    for L in layers:
        in_shape = tuple(qg.shape(L.inputs[0])) if L.inputs else ()
        conv = to_conv_layer(L, in_shape) if L.op in ("conv", "gemm") else None
        rec = LayerRecord(name=L.name, op=L.op, where="cpu")
        if conv is not None:
            batch = int(in_shape[0]) if L.op == "conv" else 1
            rec.macs = conv.macs * batch
            try:
                prog = compile_layer(conv, cfg)
            except UnsupportedLayerError as exc:
                prog = None
                rec.note = str(exc)
            if prog is not None:
                try:
                    if inject_fault == L.name:
                        raise FabricError(f"layer {L.name}: injected fabric fault (DMA error 1)")
                    if L.op == "conv":
                        y = _fabric_conv(model, conv, prog, env.cl(L.input), L)
                        env.put(L.output, y, "cl")
                    else:
                        x = env.lg(L.input)
                        shp = x.shape
                        xb = x.reshape(1, -1, shp[-1])
                        y = model.run_layer(prog, xb).reshape(shp[:-1] + (conv.cout,))
                        env.put(L.output, y, "lg")
                    rep = estimate_cycles(prog)
                    rec.where = "fabric"
                    rec.cycles = rep.cycles * batch
                    rec.fabric_ms = rec.cycles / (cfg.clock_mhz * 1e3)
                    rec.utilization = conv.macs * batch / (rec.cycles * cfg.rows * cfg.cols)
                    result.layers.append(rec)
                    continue
                except FabricError as exc:
                    result.faults.append({"layer": L.name, "error": str(exc)})
                    if not fallback:
                        raise
                    rec.where = "cpu (fallback)"
                    rec.note = str(exc)
        t0 = time.perf_counter()
        run_layer(qg, env, L)
        rec.cpu_ms = (time.perf_counter() - t0) * 1e3
        if not rec.macs and L.op in ("conv", "gemm"):
            rec.macs = int(np.prod(qg.shape(L.output))) * int(np.prod(L.qweight.shape[1:]))
        result.layers.append(rec)
    result.outputs = {t.name: env.lg(t.name) for t in qg.outputs}
    if check:
        ref = qg.run_int(feed)
        result.bit_exact = all(np.array_equal(ref[k], result.outputs[k]) for k in ref)
    return result
