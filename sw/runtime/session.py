"""``dnnfab.InferenceSession``: onnxruntime's calling convention on the accelerator system.

>>> sess = dnnfab.InferenceSession("digits-cnn")            # or an .onnx path, a ModelProto
>>> (logits,) = sess.run(None, {"image": x})                # like onnxruntime
>>> sess.profile()                                          # per layer: target, cycles, ms

The model is quantized on construction (``calibration``: a list of input feeds, an array
of samples for a single-input model, or an already quantized graph; a zoo model without
it calibrates on its bundled data), compiled on the first ``run`` into one
:class:`~dnnfab.sw.compiler.network.CompiledNetwork` (cached on disk by model and config
hash) and loaded into the device's DRAM once; after that a ``run`` only writes the inputs
of each fabric run, launches it through the driver and reads back what the CPU layers
need.

Backends: ``"model"`` (fabric layers on the driver's model backend, the rest on the CPU),
``"rtl"`` (fabric layers on the generated Verilog under cocotb: the driver's rtl backend,
``dnnfab.cosim.rtl_backend``, one simulator for the session; ``backend_options`` e.g.
``{"sim": "icarus"}``), ``"cpu"`` (everything on the CPU; what a user without a board
runs), or a :class:`~dnnfab.sw.driver.backend.Backend` instance. A fabric fault on a run is reported
by the driver as a typed error; the session resets the device, reloads the image, runs
that run's layers on the CPU, completes the inference, and :meth:`profile` marks them
degraded with the error. Outputs are bit-identical to the integer reference either way.
"""

from __future__ import annotations

from dataclasses import dataclass
import time
import warnings

import numpy as np

from ...errors import ConfigError, DnnfabError, FabricError, InputError, ModelError
from ...hw.config import AcceleratorConfig
from ..compiler.network import compile_network, CompiledNetwork
from ..cpu.options import Options
from ..ir.graph import Graph
from ..ir.qgraph import QuantizedGraph, dequantize_tensor
from .. import driver
from ..driver.backend import Backend
from .network import check_finite, check_run_config

__all__ = ["InferenceSession", "NodeArg", "ModelMetadata", "SESSION_BACKENDS"]

SESSION_BACKENDS = ("model", "rtl", "cpu")
#: samples of a zoo model's bundled training data used when no calibration is given
DEFAULT_CALIB = 64


@dataclass(frozen=True)
class NodeArg:
    """An input or output, as onnxruntime describes it."""
    name: str
    shape: list
    type: str = "tensor(float)"


@dataclass(frozen=True)
class ModelMetadata:
    producer_name: str
    graph_name: str
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = 0
    custom_metadata_map: dict = None


def _zoo_calibration(name, graph):
    """Bundled calibration data of a zoo model: (feeds, description)."""
    from ...models import zoo, datasets
    canon = zoo.canonical_name(name)
    inp = graph.inputs[0].name
    if canon == "digits-cnn":
        xtr = datasets.digits_split()[0]
        return [{inp: xtr[i:i + 1]} for i in range(DEFAULT_CALIB)], "digits training split"
    if canon == "eeg-seizure":
        xtr = datasets.eeg_split(n_train=DEFAULT_CALIB, n_test=1)[0]
        return [{inp: xtr[i:i + 1]} for i in range(DEFAULT_CALIB)], "synthetic EEG training split"
    rng = np.random.default_rng(0)
    warnings.warn(f"{canon} ships no data: calibrating on 8 random standard-normal inputs, so "
                  "its int8 scales are not those of real data; pass calibration=[feeds]",
                  stacklevel=3)
    feeds = [{t.name: rng.standard_normal(t.shape).astype(np.float32) for t in graph.inputs}
             for _ in range(8)]
    return feeds, "random standard-normal inputs"


def _is_zoo_name(model):
    if not isinstance(model, str) or model.lower().endswith(".onnx") or "/" in model:
        return False
    from ...models import zoo
    try:
        zoo.canonical_name(model)
        return True
    except DnnfabError:
        return False


def _check_calibration(graph, calibration):
    """One-line errors for calibration data that does not fit the model's inputs."""
    if isinstance(calibration, np.ndarray):
        if len(graph.inputs) != 1:
            raise InputError(f"calibration is one array but the model has {len(graph.inputs)} "
                             "inputs; pass a list of {input name: array} feeds")
        t = graph.inputs[0]
        want = tuple(t.shape[1:])
        if calibration.ndim != len(t.shape) or tuple(calibration.shape[1:]) != want:
            raise InputError(f"calibration has shape {list(calibration.shape)}; input {t.name!r} "
                             f"needs [N, {', '.join(map(str, want))}] (N samples)")
        return
    if isinstance(calibration, dict):
        calibration = [calibration]
    try:
        feeds = list(calibration)
    except TypeError:
        raise InputError("calibration must be a list of input feeds ({name: array}), an array "
                         "of samples of the single input, or a quantized graph") from None
    if not feeds:
        raise InputError("calibration holds no samples; pass at least one input feed")
    for i, f in enumerate(feeds):
        if not isinstance(f, dict):
            raise InputError(f"calibration[{i}] is a {type(f).__name__}, not an input feed "
                             "({name: array}); pass a list of feeds")
        try:
            graph.check_feed(f)
        except InputError as exc:
            raise InputError(f"calibration[{i}]: {exc}") from None


class InferenceSession:
    """See the module docstring. ``config`` an :class:`~dnnfab.hw.config.AcceleratorConfig`
    (default: the board's, else the default 8x8), ``options`` an
    :class:`~dnnfab.sw.cpu.options.Options` for the CPU layers, ``cache_dir`` where
    compiled networks are kept (``False``: no disk cache), ``require_fabric``: raise
    :class:`~dnnfab.errors.ConfigError` naming the limit when a conv or GEMM cannot map onto
    the configuration (by default it runs on the CPU and :meth:`profile` says why);
    ``backend_options``: keyword arguments of the backend (``driver.open``), e.g. ``sim``
    of ``"rtl"``; ``chain=False`` compiles every fabric layer as a launch of its own (per
    layer hardware counters, e.g. for ``dnnfab cosim``)."""

    def __init__(self, model, calibration=None, backend="model", config=None, board=None,
                 options=None, cache_dir=None, timeout_s=None, require_fabric=False,
                 backend_options=None, chain=True):
        from .api import load, quantize
        self.options = options if options is not None else Options.from_env()
        if config is None:
            config = driver.device._board_config(board) if board is not None else None
            config = config or AcceleratorConfig()
        check_run_config(config)
        self.cfg = config
        self.board = board
        self._cache_dir = cache_dir
        self._timeout = timeout_s
        self.require_fabric = require_fabric
        self.backend_options = dict(backend_options or {})
        self.chain = bool(chain)
        self.on_run = None          # hook(run, counters, error) after each fabric launch
        self.last_env = None
        self.calibration_source = "given"
        if isinstance(model, QuantizedGraph):
            qg = model
            self.calibration_source = "already quantized"
        elif isinstance(calibration, QuantizedGraph):
            qg = calibration
            self.calibration_source = "already quantized"
        else:
            graph = model if isinstance(model, Graph) else load(model)
            if calibration is None:
                if not _is_zoo_name(model):
                    raise ModelError("no calibration data: pass calibration=[{input name: array}, "
                                     "...] (or an array of samples for a single-input model); "
                                     "only zoo models calibrate on their bundled data")
                calibration, self.calibration_source = _zoo_calibration(model, graph)
            else:
                _check_calibration(graph, calibration)
            qg = quantize(graph, calibration=calibration)
        self.qg = qg
        if isinstance(backend, Backend):
            self.backend_name = backend.name
            self._backend_obj = backend
        elif backend in SESSION_BACKENDS:
            self.backend_name = backend
            self._backend_obj = None
        else:
            raise DnnfabError(f"unknown backend {backend!r}; use one of "
                              f"{', '.join(SESSION_BACKENDS)} or a driver Backend")
        self.net: CompiledNetwork | None = None
        self.dev = None
        self._mem = None
        self._base = 0
        self._profile = []
        self._workers = None
        self._engines = {}
        self.compile_s = None
        self.faults = []

    # -- onnxruntime's introspection ---------------------------------------------------
    def get_inputs(self):
        return [NodeArg(t.name, list(t.shape)) for t in self.qg.inputs]

    def get_outputs(self):
        return [NodeArg(t.name, list(self.qg.shape(t.name))) for t in self.qg.outputs]

    def get_modelmeta(self):
        return ModelMetadata(producer_name="dnnfab", graph_name=self.qg.name or "",
                             description=f"int8 ({self.calibration_source}); backend "
                                         f"{self.backend_name}; {self.cfg.name}",
                             custom_metadata_map={"backend": self.backend_name,
                                                  "config": self.cfg.name,
                                                  "compiled": self.net.key if self.net else ""})

    def get_providers(self):
        return [f"dnnfab:{self.backend_name}"]

    # -- compile and load ------------------------------------------------------------
    def compile(self):
        """Compile (or load from the cache) and load the image into the device."""
        if self.net is not None:
            return self.net
        t0 = time.perf_counter()
        if self._workers is None:
            from ..cpu.workers import CpuWorkers
            self._workers = CpuWorkers(self.qg, options=self.options)
            self._engines = self._workers.engine_report()
        if self.backend_name == "cpu":
            self.net = None
            self.compile_s = time.perf_counter() - t0
            return None
        cache = self._cache_dir
        net = compile_network(self.qg, self.cfg, chain=self.chain, cache_dir=cache or None,
                              use_cache=cache is not False)
        if self.require_fabric:
            for info in net.layers.values():
                if info.target != "fabric" and info.op in ("conv", "gemm"):
                    raise ConfigError(f"layer {info.name} does not map onto {self.cfg.name}: "
                                      f"{info.reason}")
        self.net = net
        if self._backend_obj is not None:
            dev = driver.open(self._backend_obj, self.cfg)
        elif self.backend_name == "rtl":
            dev = driver.open("rtl", self.cfg, **{"dram_bytes": self.net.dram_bytes + 4096,
                                                  **self.backend_options})
        else:
            dev = driver.open("model", self.cfg, **{
                "dram_bytes": max(1 << 24, self.net.dram_bytes + (1 << 20)), "options": self.options,
                **self.backend_options})
        self.dev = dev
        self._mem = dev.allocate((self.net.dram_bytes,), np.uint8)
        self._base = self._mem.device_address
        if self._base != self.net.origin:
            # the device put the buffer elsewhere: compile the image for that address
            self.net = compile_network(self.qg, self.cfg, chain=self.chain, cache_dir=cache or None,
                                       use_cache=cache is not False, origin=self._base)
        self._load_image()
        self.compile_s = time.perf_counter() - t0
        return self.net

    def _load_image(self):
        img = self.net.image
        self._mem[:len(img)] = np.frombuffer(img, np.uint8)
        self._mem[:len(img)].sync_to_device()

    # -- running ----------------------------------------------------------------------
    def run(self, output_names, input_feed, run_options=None):
        """Outputs (float32, dequantized) named ``output_names`` (None: all), in order."""
        names = [t.name for t in self.qg.outputs] if output_names is None else list(output_names)
        known = {t.name for t in self.qg.outputs}
        for n in names:
            if n not in known:
                raise InputError(f"unknown output {n!r}; this model's outputs are {sorted(known)}")
        q = self.run_int(input_feed)
        return [dequantize_tensor(q[n], self.qg.qtensors[n].scale, self.qg.qtensors[n].zero_point)
                for n in names]

    def run_int(self, input_feed):
        """int8 output codes {output name: array} (the integer reference's form)."""
        from ..cpu.reference import Env
        qg = self.qg
        feed = qg.check_feed(input_feed)
        check_finite(feed)
        feed_q = qg.quantize_inputs(feed)
        self.compile()
        env = Env(qg)
        for t in qg.inputs:
            env.put(t.name, np.asarray(feed_q[t.name]), "lg")
        prof = []
        by_name = {L.name: L for L in qg.layers}
        if self.net is None:                       # backend "cpu": the workers, fused
            t0 = time.perf_counter()
            out = self._workers.run(feed_q)
            self.last_run_ms = (time.perf_counter() - t0) * 1e3
            self._profile = [self._cpu_record(L, None) for L in qg.layers]
            return out
        t0 = time.perf_counter()
        cpu = []                 # consecutive CPU layers: one call, independent ones at once

        def flush():
            times = {}
            self._workers.run_layers(env, cpu, times)
            for L in cpu:
                a, b = times.get(L.name, (None, None))
                prof.append(self._cpu_record(L, None if b is None else b - a))
            cpu.clear()

        with self.dev.backend.batch():
            for kind, what in self.net.steps:
                if kind == "cpu":
                    cpu.append(by_name[what])
                    continue
                if cpu:
                    flush()
                prof.extend(self._run_fabric(self.net.runs[what], env, by_name))
            if cpu:
                flush()
        self.last_run_ms = (time.perf_counter() - t0) * 1e3
        self._profile = prof
        self.last_env = env         # every tensor of the last run (checks, e.g. dnnfab cosim)
        return {t.name: env.lg(t.name) for t in qg.outputs}

    def _cpu_record(self, L, dt, reason=None):
        info = self.net.layers[L.name] if self.net is not None else None
        macs = info.macs if info is not None else 0
        eng = self._engines.get(L.name, {})
        return {"name": L.name, "op": info.op if info else L.op, "target": "cpu", "cycles": 0,
                "ms": dt * 1e3 if dt is not None else None, "utilization": 0.0, "macs": macs,
                "reason": reason if reason is not None else (info.reason if info else "backend cpu"),
                "degraded": False, "error": "", "engine": eng.get("engine", ""),
                "engine_reason": eng.get("reason", "")}

    @staticmethod
    def _tensor_of(bname):
        return bname[:-5] if bname.endswith("@gemm") else bname

    def _run_fabric(self, run, env, by_name):
        net, cfg = self.net, self.cfg
        mem, base = self._mem, self._base
        try:
            for b in run.inputs:
                t = net.tensors[b]
                name = self._tensor_of(b)
                arr = env.cl(name) if t.kind == "conv" else env.lg(name)
                lo = t.addr - base
                view = mem[lo:lo + t.size]
                t.pack_into(arr, view)
                view.sync_to_device()
            timeout = self._timeout if self._timeout is not None else \
                self.dev.backend.launch_timeout(run.cycles)
            try:
                counters = self.dev.run(driver.Program(run.prog_addr, run.n_insns,
                                                       run.out_window[0], run.out_window[1]),
                                        timeout_s=timeout)
            except FabricError as exc:
                if self.on_run is not None:
                    self.on_run(run, None, exc)
                raise
            if self.on_run is not None:
                self.on_run(run, counters, None)
            for b in run.outputs:
                t = net.tensors[b]
                lo = t.addr - base
                view = mem[lo:lo + t.size]
                view.sync_from_device()
                env.put(self._tensor_of(b), t.unpack_view(view),
                        "cl" if t.kind == "conv" else "lg")
        except FabricError as exc:
            return self._fallback(run, env, by_name, exc)
        recs = []
        total = max(1, sum(net.layers[n].cycles for n in run.layers))
        for n in run.layers:
            info = net.layers[n]
            cyc = round(counters["cycles"] * info.cycles / total)
            recs.append({"name": n, "op": info.op, "target": "fabric", "cycles": cyc,
                         "ms": cyc / (cfg.clock_mhz * 1e3),
                         "utilization": info.macs / (max(1, cyc) * cfg.rows * cfg.cols),
                         "macs": info.macs, "reason": "", "degraded": False, "error": "",
                         "run": run.index, "dram_bytes": info.dram_rd_bytes + info.dram_wr_bytes,
                         "occupancy": dict(info.occupancy)})
        return recs

    def _fallback(self, run, env, by_name, exc):
        layer = self._locate(run, exc)
        self.faults.append({"run": run.index, "layer": layer, "error": str(exc),
                            "type": type(exc).__name__})
        try:
            self.dev.reset()
            self._load_image()
        except FabricError as again:
            self.faults.append({"run": run.index, "layer": layer, "error": f"reset failed: {again}",
                                "type": type(again).__name__})
        recs = []
        for n in run.layers:
            L = by_name[n]
            t0 = time.perf_counter()
            self._workers.run_layer(env, L)
            r = self._cpu_record(L, time.perf_counter() - t0,
                                 reason=f"fabric fault in run {run.index}"
                                        + (f" at layer {layer}" if layer else ""))
            r.update(target="cpu (fallback)", degraded=True, error=f"{type(exc).__name__}: {exc}")
            recs.append(r)
        return recs

    def _locate(self, run, exc):
        """The layer of ``run`` the fault belongs to, when the error says (instruction index
        or a data address), else None."""
        net = self.net
        idx = getattr(exc, "index", None)
        if idx is not None:
            for n in run.layers:
                info = net.layers[n]
                if info.first_insn <= idx < info.end_insn:
                    return n
        addr = getattr(exc, "address", None)
        if addr is not None:
            for n in run.layers:
                for b in (net.consumes[n], net.produces[n]):
                    t = net.tensors[b]
                    if t.addr <= addr < t.addr + t.size:
                        return n
        return run.layers[0] if len(run.layers) == 1 else None

    def profile(self):
        """Per-layer records of the last run: name, op, target ("fabric" | "cpu" |
        "cpu (fallback)"), cycles, ms, utilization, macs, reason, degraded, error; CPU
        layers also engine and engine_reason (the workers' exact engine and why; ms is
        None on backend "cpu", which runs the graph fused, see ``last_run_ms``); fabric
        layers also run (launch index), dram_bytes (moved by the DMA) and occupancy
        (fraction of each scratchpad the tiling uses)."""
        return [dict(r) for r in self._profile]

    def close(self):
        if self.dev is not None:
            self.dev.close()
            self.dev = None
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
