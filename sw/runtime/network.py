"""Runtime: run a quantized network with conv/GEMM layers offloaded to the fabric.

:func:`run_network` walks the layers of a :class:`~dnnfab.sw.ir.qgraph.QuantizedGraph` in
order. Every layer the accelerator implements (dense conv2d/conv1d with ``groups == 1``,
GEMM) is compiled with :func:`dnnfab.sw.compiler.program.compile_layer` and executed on a fabric
backend; everything else runs on the CPU through the integer reference. The backends
compute the same integers (docs/contract.md), so the network output is bit-identical to
``QuantizedGraph.run_int`` — :func:`run_network` checks that when asked.

Where a layer runs, and why not on the fabric, is decided in one place:
:func:`place_layer` (one layer) / :func:`plan_network` (every layer). It takes a quantized
layer or a float IR layer (``dnnfab inspect`` shows the float graph before quantization)
and an accelerator configuration; a conv or GEMM goes to the fabric exactly when
:func:`~dnnfab.sw.compiler.program.compile_layer` can map it, otherwise the placement carries the
compiler's reason (e.g. ``2048 output channels exceed 255 C-blocks per pixel; use a
config with more columns``). ``dnnfab inspect`` and ``dnnfab run`` both print it.

Backends: ``"model"`` (:class:`~dnnfab.sw.driver.fastmodel.FastModel`: bit-exact execution of the
instruction stream plus the analytical cycle count). A fabric fault (:class:`FabricError`)
on a layer is reported in the result and, with ``fallback=True`` (default), that layer is
finished on the CPU so the inference completes.
"""

from dataclasses import dataclass, field
import time

import numpy as np

from ...errors import FabricError, DnnfabError, ConfigError
from ...hw.config import AcceleratorConfig
from ..compiler.fastmodel import estimate_cycles
from ..compiler.placement import (FABRIC_OPS, Placement, to_conv_layer, op_label, place_layer,  # noqa: F401
                                  plan_network, _strip_name)
from ..driver.fastmodel import FastModel
from ..cpu.options import Options
from ...errors import InputError as _InputError

__all__ = ["LayerRecord", "NetworkResult", "Placement", "FABRIC_OPS", "to_conv_layer",
           "op_label", "place_layer", "plan_network", "check_run_config", "check_finite",
           "run_network"]



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
    reason: str = ""             # why not on the fabric ("" when it ran there)


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
        """Header row plus one row per layer (strings); ``why not fabric`` names the reason
        of every CPU layer."""
        rows = [["layer", "op", "where", "MACs", "cycles", "util", "fabric ms", "cpu ms",
                 "why not fabric"]]
        for r in self.layers:
            rows.append([r.name, r.op, r.where, f"{r.macs:,}", f"{r.cycles:,}" if r.cycles else "",
                         f"{r.utilization:.2f}" if r.cycles else "", f"{r.fabric_ms:.3f}" if r.cycles else "",
                         f"{r.cpu_ms:.3f}" if r.cpu_ms else "", r.reason])
        return rows

    def to_dict(self):
        return {"bit_exact": self.bit_exact, "fabric_cycles": self.fabric_cycles,
                "fabric_ms": self.fabric_ms, "cpu_ms": self.cpu_ms, "faults": self.faults,
                "layers": [r.__dict__ for r in self.layers]}


def check_finite(feed, what="input"):
    """Raise :class:`~dnnfab.errors.InputError` if an array of ``feed`` ({name: array})
    holds NaN or inf."""
    for name, x in feed.items():
        x = np.asarray(x)
        if x.dtype.kind in "fc":
            bad = ~np.isfinite(x)
            if bad.any():
                first = tuple(int(i) for i in np.argwhere(bad)[0])
                raise _InputError(f"{what} {name!r} holds {int(bad.sum())} NaN/inf value(s) "
                                  f"(first at index {first}); int8 quantization needs finite "
                                  "numbers: clean the data (e.g. np.nan_to_num) first")


def check_run_config(cfg: AcceleratorConfig, cli=False):
    """Raise :class:`ConfigError` unless networks can run on ``cfg`` as the contract says.

    The quantizer, the integer reference and the fast model implement int8 x int8 products
    with int32 accumulation only (the quantizer bounds every sum by 2^31); a configuration
    with other widths would still compute int8, so it is refused rather than ignored.
    ``cli``: name the settings as command-line options (``--input-bits 4``).
    """
    bad = [k for k, want in (("input_bits", 8), ("weight_bits", 8)) if getattr(cfg, k) != want]
    if cfg.acc_bits < 32:
        bad.append("acc_bits")
    if not bad:
        return

    def name(k, v=None):
        v = getattr(cfg, k) if v is None else v
        return f"--{k.replace('_', '-')} {v}" if cli else f"{k}={v}"

    fix = ", ".join(name(k, ">=32" if k == "acc_bits" else 8) for k in bad)
    raise ConfigError(f"{', '.join(name(k) for k in bad)}: networks run as int8 x int8 with "
                      "int32 accumulators only (the quantizer, the integer reference and the "
                      f"fast model have no other widths); use {fix} (the default) -- "
                      "generate and synth build other widths, cosim --top array simulates them")


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
                check=False, progress=None, inject_fault=None, plan=None, options=None):
    """Run ``qg`` on float inputs ``feed``; conv/GEMM on the fabric, the rest on the CPU.

    ``check``: also run the pure CPU reference and set ``result.bit_exact``.
    ``inject_fault``: name of a layer whose fabric run raises a FabricError (testing the
    CPU fallback). ``plan``: ``plan_network(qg, cfg)`` computed once for many runs (the
    compiled programs are reused); by default it is computed here. ``options``: how the
    CPU layers run (:class:`~dnnfab.sw.cpu.options.Options`; default ``Options.from_env()``).
    Raises :class:`ConfigError` for a configuration the integer network cannot run on
    (:func:`check_run_config`) and :class:`InputError` for NaN/inf inputs.
    """
    cfg = cfg or AcceleratorConfig()
    if backend != "model":
        raise DnnfabError(f"backend {backend!r} is not available for whole networks yet; use backend='model'")
    check_run_config(cfg)
    from ..cpu.reference import Env, run_layer, run_reference   # numba: only when running
    if options is None:
        options = Options.from_env()
    feed = qg.check_feed(feed)
    check_finite(feed)
    if plan is None:
        plan = plan_network(qg, cfg)
    feed_q = qg.quantize_inputs(feed)
    env = Env(qg)
    for t in qg.inputs:
        env.put(t.name, np.asarray(feed_q[t.name]), "lg")
    model = FastModel(cfg)
    result = NetworkResult(outputs={})
    layers = qg.layers if progress is None else progress(qg.layers)
    for L in layers:
        in_shape = tuple(qg.shape(L.inputs[0])) if L.inputs else ()
        place = plan[L.name]
        conv, prog = place.conv, place.program
        rec = LayerRecord(name=L.name, op=op_label(L), where="cpu", reason=place.reason)
        if conv is not None:
            batch = int(in_shape[0]) if L.op == "conv" else 1
            rec.macs = conv.macs * batch
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
                rec.reason = f"fabric fault: {_strip_name(str(exc), L.name)}"
        t0 = time.perf_counter()
        run_layer(qg, env, L, options)
        rec.cpu_ms = (time.perf_counter() - t0) * 1e3
        if not rec.macs and L.op in ("conv", "gemm"):
            rec.macs = int(np.prod(qg.shape(L.output))) * int(np.prod(L.qweight.shape[1:]))
        result.layers.append(rec)
    result.outputs = {t.name: env.lg(t.name) for t in qg.outputs}
    if check:
        ref = run_reference(qg, feed_q, options=options)
        result.bit_exact = all(np.array_equal(ref[k], result.outputs[k]) for k in ref)
    return result
