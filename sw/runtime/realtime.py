"""The real-time runtime: executes a scheduler's :class:`~dnnfab.sw.sched.plan.Plan` for one
or several networks, frame after frame, on one fabric and one CPU worker pool.

>>> with Runtime(plan, {"digits-cnn": qg1, "eeg-seizure": qg2}, cfg, clock_mhz=100) as rt:
...     rep = rt.run(frames={"digits-cnn": 1000, "eeg-seizure": 500}, feeds=feeds)
>>> rep.latency_ms["digits-cnn"], rep.deadline_misses, rep.bit_exact
>>> gantt(rep, "gantt.png", frames=3)

**What runs where.** Per network the graph is rewritten with the plan's splits
(:func:`~dnnfab.sw.compiler.split.apply_splits`) and compiled with ``chain=False`` (one
fabric launch per layer) and the plan's CPU layers
(:func:`~dnnfab.sw.compiler.network.compile_network`). All networks share one device, as
on a board: each image is compiled for the address the device allocates it at
(``compile_network(..., origin=)``). There are two resources, as the scheduler models
them:

* **the fabric**: one thread serves the launches of every network, one at a time;
* **the CPU**: one dispatcher thread runs one layer at a time on a worker pool shared by
  all networks (:class:`~dnnfab.sw.cpu.workers.CpuWorkers` with ``share_pool``); the
  pool's ``workers`` threads (the dispatcher is one of them) parallelize within the layer.

A split layer's halves ``L@fab`` and ``L@cpu`` go to the two resources and can run at the
same time; the join (a pass-through concat named ``L``) runs on the CPU.

**Policy.** A network releases a frame every ``period_s`` (frame k at ``k * period_s``
after the start; every network starts at 0); a frame's layers form a DAG (each layer waits
for the producers of its inputs). Whenever a resource is free it takes, among the ready
layers assigned to it, the one of the **highest-priority network** (deadline-monotonic:
the shorter relative deadline first), then of the **earliest-released frame**, ties
broken by the layer's topological index (then the network's index in the plan, then the
frame index); within a frame a resource takes its layers in topological order; nothing is
preempted. This is the policy the scheduler's model and response-time bound assume
(:mod:`dnnfab.sw.sched.milp`). Frames of a network overlap (the fabric on frame k+1 while the CPU finishes frame
k) and networks run side by side at their own rates. A frame's latency is from its
release to the end of its last layer; it misses its deadline when that exceeds
``task.deadline_s``.

**Each fabric launch is self-contained**: the host writes the layer's input buffer, the
fabric runs, the host reads the output buffer back. The compiled network keeps tensors in
DRAM between fabric layers, but with frames in flight the arena (one per network, buffers
shared by lifetime) would be overwritten by the next frame, so the runtime does not rely
on it; the extra copies are host time on the fabric thread.

**Modes.** ``"real"`` (this machine): launches really run on the model backend and the
fabric thread holds each launch until ``start + cycles / clock_mhz`` (the device's CYCLES
counter at the board clock) has elapsed; when the model computes more slowly than that,
the launch takes what it takes and :attr:`RunReport.hold_exceeded` counts it. CPU layers
run for real on this machine's CPU. ``"modelled"``: a deterministic discrete-event replay
of the same policy with the given ``durations`` ({network: {layer: (fabric_s, cpu_s)}})
for a board whose CPU is not this machine's; every layer is still computed (in the
replay's order, on the model backend and the workers) so outputs are checked, but all
times are the replay's, and the report says ``modelled``.

**Faults.** A typed :class:`~dnnfab.errors.FabricError` on a launch: that network's
device is reset and its image reloaded, the layer (the whole launch: one layer with
``chain=False``) is queued on the CPU with the same priority, the frame completes and is
marked degraded with the error. Nothing is lost.

**Bit-exactness** is checked after the timeline, off it: every frame's int8 outputs
against :func:`~dnnfab.sw.cpu.reference.run_reference` of the *unsplit* graph on the same
quantized input (identical inputs are run once).
"""

from __future__ import annotations

from dataclasses import dataclass, field, asdict
import hashlib
import gc
import heapq
import itertools
import math
import sys
import threading
import time

import numpy as np

from ...errors import ConfigError, DnnfabError, FabricError
from ...hw.config import AcceleratorConfig
from ..compiler.network import compile_network
from ..compiler.split import apply_splits, split_target, FAB_SUFFIX, CPU_SUFFIX
from ..cpu.options import Options
from ..cpu.reference import Env, run_reference
from ..cpu.workers import CpuWorkers
from .. import driver
from ..driver.backend import Backend
from ..sched.milp import priority
from .network import check_finite

__all__ = ["Runtime", "RunReport", "FrameRecord", "LayerRecord", "gantt", "gantt_plan",
           "replay_plan", "durations_from_costs", "MODES"]

MODES = ("real", "modelled")
#: ``durations`` key of a split layer's join (``L@join``; default 0)
JOIN_SUFFIX = "@join"
#: the interpreter's thread switch interval during a real run (see :meth:`Runtime.run`)
SWITCH_INTERVAL_S = 1e-3
RESOURCES = ("fabric", "cpu")
MODELLED_LABEL = ("modelled: discrete-event replay of the plan with the board profile's "
                  "latencies (not measured on this machine)")
REAL_LABEL = ("real: wall clock on this machine; fabric launches on the model backend held "
              "to their modelled duration at the board clock, CPU layers measured")


# ====================================================================== records
@dataclass
class LayerRecord:
    """One layer of one frame on one resource (a fault gives two: the failed fabric
    attempt and the CPU re-run). Times in seconds from the run's start."""
    network: str
    frame: int
    layer: str
    resource: str                 # "fabric" | "cpu"
    start: float
    end: float
    planned: str = ""             # the plan's resource for this layer ("" : not in the plan)
    cycles: int = 0               # fabric: the device's CYCLES counter
    modelled_s: float = 0.0       # fabric: cycles / clock (what the launch is held to)
    exceeded: bool = False        # fabric, real mode: the model took longer than modelled_s
    degraded: bool = False        # a CPU re-run of a faulted launch
    error: str = ""               # the fabric error (on the failed attempt and the re-run)


@dataclass
class FrameRecord:
    network: str
    index: int
    release: float
    start: float
    end: float
    latency_s: float
    deadline_s: float
    deadline_miss: bool
    degraded: bool = False
    errors: list = field(default_factory=list)
    bit_exact: bool | None = None     # None: not checked


def _pct(lat):
    if not lat:
        return {"p50": None, "p99": None, "max": None}
    a = np.asarray(lat) * 1e3
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}


@dataclass
class RunReport:
    """What :meth:`Runtime.run` returns; :meth:`to_dict` is JSON-able."""
    mode: str
    label: str
    clock_mhz: float
    workers: int
    wall_s: float                 # real seconds the run took (modelled mode too)
    span_s: float                 # the timeline: first release to last frame end
    frames: list                  # [FrameRecord]
    layers: list                  # [LayerRecord]
    networks: dict                # name -> {period_s, deadline_s, frames, deadline_misses, ...}
    bit_exact: bool | None = None
    mismatches: list = field(default_factory=list)   # [(network, frame index)]
    hold_exceeded: int = 0        # real mode: fabric launches the model computed too slowly
    fabric_launches: int = 0
    faults: list = field(default_factory=list)       # [{network, frame, layer, error, type}]
    utilization: dict = field(default_factory=dict)  # resource -> busy fraction of span_s
    notes: list = field(default_factory=list)

    @property
    def latency_ms(self):
        """{network: {p50, p99, max}} in milliseconds."""
        return {n: dict(v["latency_ms"]) for n, v in self.networks.items()}

    @property
    def deadline_misses(self):
        return sum(1 for f in self.frames if f.deadline_miss)

    @property
    def degraded(self):
        return sum(1 for f in self.frames if f.degraded)

    def to_dict(self, layers=True):
        d = {"mode": self.mode, "label": self.label, "clock_mhz": self.clock_mhz,
             "workers": self.workers, "wall_s": self.wall_s, "span_s": self.span_s,
             "frames": len(self.frames), "deadline_misses": self.deadline_misses,
             "degraded_frames": self.degraded, "latency_ms": self.latency_ms,
             "networks": self.networks, "bit_exact": self.bit_exact,
             "mismatches": [list(m) for m in self.mismatches],
             "hold_exceeded": self.hold_exceeded, "fabric_launches": self.fabric_launches,
             "faults": self.faults, "utilization": self.utilization, "notes": self.notes,
             "frame_records": [asdict(f) for f in self.frames]}
        if layers:
            d["layer_records"] = [asdict(r) for r in self.layers]
        return d


# ====================================================================== internal state
class _Net:
    """One network as the runtime runs it."""

    def __init__(self, index, nplan, qg):
        self.index, self.plan, self.qg = index, nplan, qg
        self.name, self.task = nplan.name, nplan.task
        self.graph = apply_splits(qg, nplan.splits())
        self.layers = list(self.graph.layers)
        self.by_name = {L.name: L for L in self.layers}
        self.topo = {L.name: i for i, L in enumerate(self.layers)}
        producer = {L.output: L.name for L in self.layers}
        self.deps, self.consumers = {}, {L.name: [] for L in self.layers}
        for L in self.layers:
            d = sorted({producer[t] for t in L.inputs if t in producer and producer[t] != L.name},
                       key=self.topo.get)
            self.deps[L.name] = d
            for p in d:
                self.consumers[p].append(L.name)
        self.sources = [L.name for L in self.layers if not self.deps[L.name]]
        self.planned = {}
        for c in nplan.layers:
            if c.resource == "split":
                self.planned[c.layer + FAB_SUFFIX] = "fabric"
                self.planned[c.layer + CPU_SUFFIX] = "cpu"
                self.planned[c.layer] = "cpu"
            else:
                self.planned[c.layer] = c.resource
        self.net = self.dev = self.mem = self.workers = None
        self.target, self.runs, self.dur = {}, {}, {}
        # what a modelled replay charges for tensor moves (see Runtime._xfer)
        ins = {t.name for t in self.graph.inputs}
        outs = {t.name for t in self.graph.outputs}
        size = lambda t: int(np.prod(self.graph.shape(t)))
        self.bytes_out = {L.name: size(L.output) for L in self.layers}
        self.gin = {L.name: sum(size(t) for t in L.inputs if t in ins) for L in self.layers}
        self.outs = {L.name for L in self.layers if L.output in outs}
        self.nocharge = {(x + FAB_SUFFIX, x) for x in nplan.splits()}
        self.xfer = None
        self._order = {}

    def order(self, res):
        """The layers on ``res`` in topological order."""
        o = self._order.get(res)
        if o is None:
            o = self._order[res] = [L.name for L in self.layers if self.target.get(L.name) == res]
        return o


class _Frame:
    def __init__(self, net, index, release, feed_q):
        self.net, self.index, self.release = net, index, release
        self.feed_q = feed_q
        self.env = None
        if feed_q is not None:
            self.env = Env(net.graph)
            for t in net.graph.inputs:
                self.env.put(t.name, np.asarray(feed_q[t.name]), "lg")
        self.pending = {n: len(d) for n, d in net.deps.items()}
        self.head = {"fabric": 0, "cpu": 0}
        self.held = set()
        self.ready_at = {}
        self.out_end = 0.0
        self.left = len(net.layers)
        self.start = self.end = None
        self.degraded = False
        self.errors = []
        self.outputs = None


def _feed_key(feed_q):
    h = hashlib.sha1()
    for k in sorted(feed_q):
        a = np.ascontiguousarray(feed_q[k])
        h.update(k.encode() + repr(a.shape).encode() + a.tobytes())
    return h.hexdigest()


def _tensor_of(bname):
    return bname[:-5] if bname.endswith("@gemm") else bname


class _Bar:
    """A tqdm bar without tqdm's monitor thread (the runtime leaves no thread behind)."""

    def __init__(self, total, desc, enabled):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                class _T(tqdm):
                    monitor_interval = 0
                self.bar = _T(total=total, desc=desc, unit="frame", leave=True)
            except ImportError:       # pragma: no cover - tqdm is a dependency
                self.bar = None
        self.n = 0

    def to(self, n, misses=0, degraded=0):
        if self.bar is not None and n != self.n:
            self.bar.update(n - self.n)
            self.bar.set_postfix(misses=misses, degraded=degraded, refresh=False)
        self.n = n

    def close(self):
        if self.bar is not None:
            self.bar.close()


class _one_blas_thread:
    """BLAS limited to one thread for the run (restored after). The fast model already
    limits it around each program, but a limit that flips back to the machine's thread
    count between launches costs each launch a wake-up of BLAS's threads, and those
    threads fight the fabric and CPU threads for the cores: measured here, eeg-seizure's
    conv1 launch took 17 ms (wall, median) in a two-network run against 2 ms with this.
    The CPU workers parallelize over their own threads, one BLAS / onnxruntime thread each."""

    def __enter__(self):
        try:
            from threadpoolctl import threadpool_limits
            self._lim = threadpool_limits(limits=1, user_api="blas")
        except ImportError:          # pragma: no cover - threadpoolctl is a dependency
            self._lim = None
        return self

    def __exit__(self, *exc):
        if self._lim is not None:
            self._lim.restore_original_limits()


# ====================================================================== the runtime
class Runtime:
    """Executes ``plan`` (a :class:`~dnnfab.sw.sched.plan.Plan`) on ``graphs`` ({network
    name: QuantizedGraph}, one per plan network); see the module docstring.

    ``cfg`` the accelerator configuration (default: the default 8x8); ``clock_mhz`` the
    board clock launches are held to (default ``plan.clock_mhz``, else ``cfg.clock_mhz``);
    ``mode`` ``"real"`` | ``"modelled"``; ``workers`` the CPU pool's threads (default
    ``plan.workers``); ``backend`` ``"model"``, a :class:`~dnnfab.sw.driver.backend.Backend`
    (one network only) or {network: Backend | "model"}; ``durations`` (modelled mode)
    {network: {layer: (fabric_s, cpu_s)}} keyed by the layers of the split graph -- a split
    half missing falls back to the entry of its original layer (``L@fab`` its fabric_s,
    ``L@cpu`` its cpu_s); the join (named ``L`` in the graph) is keyed ``L@join``, default
    0; a missing fabric time falls back to the compiled cycles at ``clock_mhz``; a missing
    CPU time is an error. ``options`` the CPU workers'
    :class:`~dnnfab.sw.cpu.options.Options`; ``cache_dir`` for compiled networks
    (``False``: none); ``timeout_s`` per launch (default 1 s + 20x its modelled time);
    ``warmup``: run one frame of each network outside the timeline when built (see
    :meth:`_warm`; it launches each fabric layer once). ``resources`` (modelled mode): the
    metric model's :class:`~dnnfab.sw.metrics.costs.ResourceModel`; the replay then delays
    a layer by ``transfer_s`` of each input produced on the other resource, a fabric layer
    by that of the graph inputs it reads, and a frame's end by that of outputs left on the
    fabric, as the scheduler does (a split's join reading its fabric half is not charged:
    the split option counts it)."""

    def __init__(self, plan, graphs, cfg=None, clock_mhz=None, mode="real", workers=None,
                 backend="model", durations=None, options=None, cache_dir=None,
                 timeout_s=None, warmup=True, resources=None):
        if mode not in MODES:
            raise ConfigError(f"unknown runtime mode {mode!r}; use one of {', '.join(MODES)}")
        self.plan, self.mode = plan, mode
        self.cfg = cfg or AcceleratorConfig()
        self.clock_mhz = float(clock_mhz or plan.clock_mhz or self.cfg.clock_mhz)
        if self.clock_mhz <= 0:
            raise ConfigError(f"clock_mhz must be positive, got {self.clock_mhz}")
        self.workers = int(workers if workers is not None else (plan.workers or 1))
        self.options = options if options is not None else Options.from_env()
        self._timeout = timeout_s
        self._closed = False
        self._owner = None
        missing = [n.name for n in plan.networks if n.name not in graphs]
        if missing:
            raise ConfigError(f"no graph for network(s) {', '.join(missing)}; pass graphs="
                              "{name: QuantizedGraph} for every network of the plan")
        self.notes = []
        if mode == "real" and getattr(plan, "host", "") == "board":
            self.notes.append("the plan's CPU figures are the board's CPU (host 'board'); a real "
                              "run measures this machine's CPU instead -- the modelled mode "
                              "replays the board's figures")
        self.nets = []
        self._shared = None
        try:
            nets = []
            for i, nplan in enumerate(plan.networks):
                n = _Net(i, nplan, graphs[nplan.name])
                self._compile(n, cache_dir)
                nets.append(n)
            if not isinstance(backend, (dict, Backend)) and backend == "model":
                # one accelerator and one DRAM for every network, as on a board
                from ..driver.model import ModelBackend
                need = sum(-(-n.net.dram_bytes // 4096) * 4096 + 4096 for n in nets)
                self._shared = ModelBackend(self.cfg, dram_bytes=max(1 << 24, need + (1 << 20)),
                                            options=self.options)
            for n in nets:
                be = backend.get(n.name, "model") if isinstance(backend, dict) else backend
                if be == "model" and self._shared is not None:
                    be = self._shared
                self._open(n, be, cache_dir)
                if mode == "modelled" or durations:
                    # real mode with durations: each launch is held to its modelled time
                    # (the metric model's: cycles at the clock, the DRAM bound, the launch
                    # overhead), not only to cycles / clock
                    self._durations(n, (durations or {}).get(n.name))
                if resources is not None:
                    n.xfer = resources.transfer_s
                self.nets.append(n)
            if warmup:
                for n in self.nets:
                    self._warm(n)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_schedule(cls, result, graphs, cfg=None, mode=None, **kw):
        """A runtime for a :class:`~dnnfab.sw.sched.api.ScheduleResult` (``plan``, ``costs``,
        ``rm``). ``mode`` default: ``"real"`` when the plan was made for this machine's CPU
        (``plan.host == "local"``), else ``"modelled"`` with :func:`durations_from_costs`
        and the result's resource model (the board's CPU is not this machine's)."""
        plan = result.plan
        if mode is None:
            mode = "real" if plan.host == "local" else "modelled"
        costs = result.costs if isinstance(result.costs, dict) else \
            {c.name: c for c in result.costs}
        kw.setdefault("durations", durations_from_costs(plan, costs))
        # tensor moves between host and fabric take their modelled time in both modes
        kw.setdefault("resources", getattr(result, "rm", None))
        return cls(plan, graphs, cfg, mode=mode, **kw)

    # -- setting up ---------------------------------------------------------------------
    def _compile(self, n, cache_dir, origin=0):
        n.net = compile_network(n.graph, self.cfg, chain=False, cpu_layers=n.plan.cpu_layers(),
                                cache_dir=cache_dir or None, use_cache=cache_dir is not False,
                                origin=origin)
        n.runs = {}
        for run in n.net.runs:
            assert len(run.layers) == 1, "chain=False compiles one layer per launch"
            n.runs[run.layers[0]] = run
        if n.workers is not None:                 # a relocated compile: same placement
            return
        for L in n.layers:
            info = n.net.layers[L.name]
            n.target[L.name] = info.target
            want = n.planned.get(L.name, "")
            if want == "fabric" and info.target != "fabric":
                self.notes.append(f"{n.name}: the plan puts {L.name} on the fabric but it runs "
                                  f"on the CPU: {info.reason}")
        kw = {"threads": self.workers, "options": self.options}
        if self._owner is None:
            n.workers = self._owner = CpuWorkers(n.graph, **kw)
        else:
            n.workers = CpuWorkers(n.graph, share_pool=self._owner, **kw)

    def _open(self, n, be, cache_dir=None):
        dram = max(1 << 24, n.net.dram_bytes + (1 << 20))
        if isinstance(be, Backend):
            n.dev = driver.open(be, self.cfg)
        elif be == "model":
            n.dev = driver.open("model", self.cfg, dram_bytes=dram, options=self.options)
        else:
            raise ConfigError(f"unknown backend {be!r}; use \"model\" or a Backend instance")
        n.mem = n.dev.allocate((n.net.dram_bytes,), np.uint8)
        n.base = n.mem.device_address
        if n.base != n.net.origin:               # compile the image for where it lives
            self._compile(n, cache_dir, origin=n.base)
        self._load_image(n)

    def _warm(self, n):
        """One frame outside the timeline: every layer on the CPU workers (kernels compile,
        engine sessions open -- a fabric layer's CPU form is its fault fallback) and every
        fabric layer launched once (the model prepares each program). Launches
        ``len(n.runs)`` programs on the device before the first frame."""
        rng = np.random.default_rng(12345)
        feed = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in n.qg.inputs}
        frame = _Frame(n, -1, 0.0, n.qg.quantize_inputs(n.qg.check_feed(feed)))
        for L in n.layers:
            if L.name in n.runs:
                _, exc = self._fabric(n, frame, L.name)
                if exc is not None:
                    self.notes.append(f"{n.name}: warm-up launch of {L.name} failed "
                                      f"({type(exc).__name__}: {exc}); device reset")
            self._cpu(n, frame, L.name)

    @staticmethod
    def _load_image(n):
        img = n.net.image
        n.mem[:len(img)] = np.frombuffer(img, np.uint8)
        n.mem[:len(img)].sync_to_device()
        # a reset of the shared accelerator does not touch DRAM: the other images stay

    def _durations(self, n, given):
        given = given or {}
        clk = self.clock_mhz * 1e6
        splits = n.plan.splits()
        for L in n.layers:
            name = L.name
            base = None
            if name in splits:                   # the join: never the split layer's own entry
                ent = given.get(name + JOIN_SUFFIX, (0.0, 0.0))
            else:
                ent = given.get(name)
            if ent is None:
                st = split_target(name)
                if st is not None:
                    base = given.get(name[:-len(FAB_SUFFIX if st == "fabric" else CPU_SUFFIX)])
            f = c = None
            if ent is not None:
                f, c = ent
            elif base is not None:
                f, c = base
            if f is None:
                f = n.net.layers[name].cycles / clk
            if c is None:
                raise ConfigError(f"modelled mode: no CPU duration for layer {name!r} of "
                                  f"{n.name}; pass durations={{{n.name!r}: {{{name!r}: "
                                  "(fabric_s, cpu_s), ...}}")
            n.dur[name] = (float(f), float(c))

    # -- executing one layer -----------------------------------------------------------
    def _fabric(self, n, frame, lname):
        """One launch; returns (cycles, None) or (0, the FabricError) after reset + reload."""
        run, net, mem = n.runs[lname], n.net, n.mem
        try:
            b = net.consumes[lname]
            t = net.tensors[b]
            name = _tensor_of(b)
            arr = frame.env.cl(name) if t.kind == "conv" else frame.env.lg(name)
            lo = t.addr - n.base
            view = mem[lo:lo + t.size]
            t.pack_into(arr, view)
            view.sync_to_device()
            timeout = self._timeout if self._timeout is not None else \
                1.0 + 20 * run.cycles / (self.cfg.clock_mhz * 1e6)
            counters = n.dev.run(driver.Program(run.prog_addr, run.n_insns, run.out_window[0],
                                                run.out_window[1]), timeout_s=timeout)
            b = net.produces[lname]
            t = net.tensors[b]
            lo = t.addr - n.base
            view = mem[lo:lo + t.size]
            view.sync_from_device()
            frame.env.put(_tensor_of(b), t.unpack_view(view),
                          "cl" if t.kind == "conv" else "lg")
            return int(counters["cycles"]), None
        except FabricError as exc:
            try:
                n.dev.reset()
                self._load_image(n)
            except FabricError as again:        # pragma: no cover - the model resets fine
                exc = FabricError(f"{exc}; reset failed: {again}")
            return 0, exc

    def _cpu(self, n, frame, lname):
        n.workers.run_layer(frame.env, n.by_name[lname])

    # -- frames -------------------------------------------------------------------------
    def _counts(self, frames, total_s):
        if frames is None and total_s is None:
            raise ConfigError("run needs frames={network: N} (or an int for every network) "
                              "or total_s")
        out = {}
        for n in self.nets:
            if frames is not None:
                k = frames if isinstance(frames, int) else int(frames.get(n.name, 0))
            else:
                k = int(math.ceil(total_s / n.task.period_s - 1e-9))
            out[n.name] = max(0, k)
        return out

    def _releases(self, counts):
        rel = [(k * n.task.period_s, n.index, k) for n in self.nets for k in range(counts[n.name])]
        rel.sort()
        return rel

    def _make_frame(self, n, k, release, feeds):
        qg = n.qg
        if feeds is None:
            rng = np.random.default_rng([n.index, k])
            feed = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in qg.inputs}
        else:
            feed = feeds(n.name, k)
        feed = qg.check_feed(feed)
        check_finite(feed)
        return _Frame(n, k, release, qg.quantize_inputs(feed))

    def _entry(self, frame, lname, err=None):
        """A queue entry: the network's deadline-monotonic rank first (the scheduler's
        :func:`~dnnfab.sw.sched.milp.priority`), then release, topological index."""
        n = frame.net
        rank = self.__dict__.get("_rank")
        if rank is None:
            rank = self._rank = priority([m.task for m in self.nets])
        return (rank[n.name], frame.release, n.topo[lname], n.index, frame.index,
                next(self._seq), frame, lname, err)

    def _resource_of(self, frame, lname):
        return frame.net.target[lname]

    def _push_ready(self, frame, names, heaps):
        """Queue the layers whose inputs are there -- each only once every earlier layer
        (topological order) of its frame on the same resource has been dispatched: within
        a frame a resource takes its layers in order, as the scheduler models it
        (:mod:`dnnfab.sw.sched.milp`); a ready layer behind the head waits in
        ``frame.held``."""
        for lname in names:
            res = self._resource_of(frame, lname)
            order = frame.net.order(res)
            if order[frame.head[res]] == lname:
                heapq.heappush(heaps[res], self._entry(frame, lname))
            else:
                frame.held.add(lname)

    def _dispatched(self, frame, lname, res, heaps):
        """``lname`` left ``res``'s queue: the frame's next layer there may go."""
        order = frame.net.order(res)
        h = frame.head[res]
        if h < len(order) and order[h] == lname:
            frame.head[res] = h = h + 1
            if h < len(order) and order[h] in frame.held:
                frame.held.discard(order[h])
                heapq.heappush(heaps[res], self._entry(frame, order[h]))

    def _xfer(self, n, p, c):
        """Modelled seconds to move ``p``'s output to consumer ``c`` (0: same side, no
        resource model, or the join of a split reading its fabric half, which the metric
        model's split option already counts); ``p`` None: ``c``'s graph inputs to the
        fabric; ``c`` None: a graph output from the fabric to the host."""
        if n.xfer is None:
            return 0.0
        if p is None:
            return n.xfer(n.gin[c]) if n.target[c] == "fabric" and n.gin[c] else 0.0
        if c is None:
            return n.xfer(n.bytes_out[p]) if n.target[p] == "fabric" else 0.0
        if n.target[p] == n.target[c] or (p, c) in n.nocharge:
            return 0.0
        return n.xfer(n.bytes_out[p])

    def _start_frame(self, frame, heaps, delayed=None):
        n = frame.net
        for c in n.sources:
            frame.ready_at[c] = frame.release + self._xfer(n, None, c)
        self._ready(frame, n.sources, frame.release, heaps, delayed)

    def _ready(self, frame, names, now, heaps, delayed):
        now_ = []
        for c in names:
            at = frame.ready_at.get(c, now)
            if delayed is not None and at > now + 1e-15:
                heapq.heappush(delayed, (at, next(self._seq), frame, c))
            else:
                now_.append(c)
        self._push_ready(frame, now_, heaps)

    def _done(self, frame, lname, t_end, heaps, delayed=None):
        """Bookkeeping after a layer finished; pushes what became ready (into ``delayed``
        while a modelled tensor move is under way); True when the frame is complete."""
        n = frame.net
        frame.left -= 1
        ready = []
        for c in n.consumers[lname]:
            frame.pending[c] -= 1
            frame.ready_at[c] = max(frame.ready_at.get(c, t_end), t_end + self._xfer(n, lname, c))
            if frame.pending[c] == 0:
                ready.append(c)
        self._ready(frame, ready, t_end, heaps, delayed)
        if lname in n.outs:
            frame.out_end = max(frame.out_end, t_end + self._xfer(n, lname, None))
        if frame.left == 0:
            frame.end = max(t_end, frame.out_end)
            if frame.env is not None:
                frame.outputs = {t.name: frame.env.lg(t.name) for t in n.graph.outputs}
            frame.env = None
            return True
        return False

    def _record(self, frame, lname, res, t0, t1, **kw):
        if frame.start is None or t0 < frame.start:
            frame.start = t0
        n = frame.net
        self._layers.append(LayerRecord(n.name, frame.index, lname, res, t0, t1,
                                        planned=n.planned.get(lname, ""), **kw))

    def _fault(self, frame, lname, exc, heaps):
        frame.degraded = True
        msg = f"{type(exc).__name__}: {exc}"
        frame.errors.append(f"{lname}: {msg}")
        self._faults.append({"network": frame.net.name, "frame": frame.index, "layer": lname,
                             "error": str(exc), "type": type(exc).__name__})
        heapq.heappush(heaps["cpu"], self._entry(frame, lname, msg))
        return msg

    # -- running ------------------------------------------------------------------------
    def run(self, frames=None, total_s=None, feeds=None, progress=True, check=True) -> RunReport:
        """Run ``frames`` ({network: N}, or one int for all) or every frame released within
        ``total_s`` seconds; ``feeds(name, frame_index) -> {input name: float array}``
        (default: seeded standard-normal inputs); ``check``: compare every frame with the
        integer reference after the run. Returns a :class:`RunReport`."""
        if self._closed:
            raise DnnfabError("the runtime is closed; create a new Runtime to run again")
        counts = self._counts(frames, total_s)
        releases = self._releases(counts)
        self._seq = itertools.count()
        self._layers, self._faults, self._frames = [], [], []
        self._hold_exceeded = 0
        self._launches = 0
        bar = _Bar(len(releases), f"{self.mode} run", progress)
        w0 = time.perf_counter()
        try:
            if self.mode == "real":
                # a thread that wants the GIL waits up to the switch interval (5 ms by
                # default) for the one holding it: on the timeline that is a stall of the
                # other resource, so it is shortened while the run lasts
                old = sys.getswitchinterval()
                sys.setswitchinterval(min(old, SWITCH_INTERVAL_S))
                # no cyclic garbage collection on the timeline (a full collection of a
                # heap this size stops every thread for milliseconds); frames make no
                # reference cycles of size, and one collection runs after the run
                gc_was = gc.isenabled()
                gc.collect()
                gc.disable()
                try:
                    with _one_blas_thread():
                        self._run_real(releases, feeds, bar)
                finally:
                    sys.setswitchinterval(old)
                    if gc_was:
                        gc.enable()
            else:
                self._run_modelled(releases, feeds, bar)
        finally:
            bar.close()
        wall = time.perf_counter() - w0
        rep = self._report(wall)
        if check:
            self._check(rep)
        return rep

    def _run_real(self, releases, feeds, bar):
        cv = threading.Condition()
        heaps = {r: [] for r in RESOURCES}
        # layers waiting for a modelled tensor move (ready time, seq, frame, layer); the
        # releasing thread moves them to their queue when the time has come
        delayed = []
        state = {"stop": False, "error": None, "done": 0, "misses": 0, "degraded": 0}
        now = time.monotonic
        t0 = None
        clk = self.clock_mhz * 1e6

        def finish(frame):
            state["done"] += 1
            lat = frame.end - frame.release
            if lat > frame.net.task.deadline_s + 1e-9:
                state["misses"] += 1
            state["degraded"] += frame.degraded

        def loop(res):
            try:
                while True:
                    with cv:
                        while not heaps[res] and not state["stop"]:
                            cv.wait()
                        if state["stop"]:
                            return
                        ent = heapq.heappop(heaps[res])
                        frame, lname, err = ent[6], ent[7], ent[8]
                        if err is None:
                            self._dispatched(frame, lname, res, heaps)
                            cv.notify_all()
                    n = frame.net
                    a = now() - t0
                    if res == "fabric":
                        cycles, exc = self._fabric(n, frame, lname)
                        modelled = cycles / clk
                        if n.dur:
                            modelled = max(modelled, n.dur[lname][0])
                        exceeded = False
                        if exc is None:
                            left = t0 + a + modelled - now()
                            if left > 0:
                                time.sleep(left)
                            else:
                                exceeded = True
                        b = now() - t0
                        with cv:
                            self._launches += 1
                            if exc is None:
                                self._hold_exceeded += exceeded
                                self._record(frame, lname, res, a, b, cycles=cycles,
                                             modelled_s=modelled, exceeded=exceeded)
                                if self._done(frame, lname, b, heaps, delayed):
                                    finish(frame)
                            else:
                                msg = self._fault(frame, lname, exc, heaps)
                                self._record(frame, lname, res, a, b, error=msg)
                            cv.notify_all()
                    else:
                        self._cpu(n, frame, lname)
                        b = now() - t0
                        with cv:
                            self._record(frame, lname, res, a, b, degraded=err is not None,
                                         error=err or "")
                            if self._done(frame, lname, b, heaps, delayed):
                                finish(frame)
                            cv.notify_all()
            except BaseException as exc:  # noqa: BLE001 - handed to run()'s caller
                with cv:
                    if state["error"] is None:
                        state["error"] = exc
                    state["stop"] = True
                    cv.notify_all()

        threads = [threading.Thread(target=loop, args=(r,), name=f"dnnfab-rt-{r}", daemon=True)
                   for r in RESOURCES]
        for t in threads:
            t.start()
        try:
            pending = list(releases)
            nxt = self._make_frame(self.nets[pending[0][1]], pending[0][2], pending[0][0], feeds) \
                if pending else None
            t0 = now() + 0.02              # the threads are up before the first release

            def moves():                   # under cv: queue the layers whose move is done
                t = now() - t0
                woke = False
                while delayed and delayed[0][0] <= t:
                    _, _, f, c = heapq.heappop(delayed)
                    self._push_ready(f, [c], heaps)
                    woke = True
                if woke:
                    cv.notify_all()
                return (delayed[0][0] - t) if delayed else 0.1

            for i, (rel, _, _) in enumerate(pending):
                frame = nxt
                with cv:
                    while not state["stop"]:
                        nxt_move = moves()
                        left = t0 + rel - now()
                        if left <= 0:
                            break
                        cv.wait(max(1e-4, min(left, nxt_move, 0.1)))
                        bar.to(state["done"], state["misses"], state["degraded"])
                    if state["stop"]:
                        break
                    self._frames.append(frame)
                    self._start_frame(frame, heaps, delayed)
                    moves()
                    cv.notify_all()
                bar.to(state["done"], state["misses"], state["degraded"])
                if i + 1 < len(pending):           # prepare the next frame before its release
                    r2, ni, k = pending[i + 1]
                    nxt = self._make_frame(self.nets[ni], k, r2, feeds)
            with cv:
                while not state["stop"] and state["done"] < len(pending):
                    cv.wait(max(1e-4, min(moves(), 0.1)))
                    bar.to(state["done"], state["misses"], state["degraded"])
        except BaseException as exc:
            with cv:
                if state["error"] is None:
                    state["error"] = exc
        finally:
            with cv:
                state["stop"] = True
                cv.notify_all()
            for t in threads:
                t.join()
        bar.to(state["done"], state["misses"], state["degraded"])
        if state["error"] is not None:
            raise state["error"]

    def _run_modelled(self, releases, feeds, bar):
        """A discrete-event replay: the same policy, the durations given, time simulated.
        Each layer is computed for real when the replay starts it."""
        heaps = {r: [] for r in RESOURCES}
        busy = {r: None for r in RESOURCES}        # (end, entry, start)
        delayed = []                               # (ready time, seq, frame, layer)
        t, i, done = 0.0, 0, 0
        misses = degr = 0
        total = len(releases)
        while done < total:
            while i < total and releases[i][0] <= t + 1e-15:
                rel, ni, k = releases[i]
                frame = self._make_frame(self.nets[ni], k, rel, feeds)
                self._frames.append(frame)
                self._start_frame(frame, heaps, delayed)
                i += 1
            while delayed and delayed[0][0] <= t + 1e-15:
                _, _, frame, c = heapq.heappop(delayed)
                self._push_ready(frame, [c], heaps)
            for res in RESOURCES:
                if busy[res] is None and heaps[res]:
                    ent = heapq.heappop(heaps[res])
                    frame, lname, err = ent[6], ent[7], ent[8]
                    if err is None:
                        self._dispatched(frame, lname, res, heaps)
                    n = frame.net
                    f_s, c_s = n.dur[lname]
                    if res == "fabric":
                        cycles, exc = self._fabric(n, frame, lname)
                        self._launches += 1
                        ent = ent + (cycles, exc)
                        busy[res] = (t + f_s, ent, t)
                    else:
                        self._cpu(n, frame, lname)
                        busy[res] = (t + c_s, ent, t)
            ends = [busy[r][0] for r in RESOURCES if busy[r] is not None]
            ends += [releases[i][0]] if i < total else []
            ends += [delayed[0][0]] if delayed else []
            nxt = min(ends, default=None)
            if nxt is None:                                        # pragma: no cover
                raise DnnfabError("modelled replay stalled: a layer is never ready")
            t = max(t, nxt)
            for res in RESOURCES:
                if busy[res] is None or busy[res][0] > t + 1e-15:
                    continue
                end, ent, a = busy[res]
                busy[res] = None
                frame, lname, err = ent[6], ent[7], ent[8]
                if res == "fabric":
                    cycles, exc = ent[9], ent[10]
                    if exc is not None:
                        msg = self._fault(frame, lname, exc, heaps)
                        self._record(frame, lname, res, a, end, error=msg)
                        continue
                    self._record(frame, lname, res, a, end, cycles=cycles,
                                 modelled_s=end - a)
                else:
                    self._record(frame, lname, res, a, end, degraded=err is not None,
                                 error=err or "")
                if self._done(frame, lname, end, heaps, delayed):
                    done += 1
                    misses += frame.end - frame.release > frame.net.task.deadline_s + 1e-12
                    degr += frame.degraded
                    bar.to(done, misses, degr)

    # -- the report ---------------------------------------------------------------------
    def _report(self, wall):
        recs = []
        for f in self._frames:
            if f.end is None:
                continue
            lat = f.end - f.release
            dl = f.net.task.deadline_s
            recs.append(FrameRecord(f.net.name, f.index, f.release, f.start, f.end, lat, dl,
                                    lat > dl + 1e-9, f.degraded, list(f.errors)))
        layers = sorted(self._layers, key=lambda r: (r.start, r.resource))
        span = max((f.end for f in recs), default=0.0)
        nets = {}
        for n in self.nets:
            mine = [f for f in recs if f.network == n.name]
            nets[n.name] = {"period_s": n.task.period_s, "deadline_s": n.task.deadline_s,
                            "frames": len(mine),
                            "deadline_misses": sum(f.deadline_miss for f in mine),
                            "degraded": sum(f.degraded for f in mine),
                            "latency_ms": _pct([f.latency_s for f in mine]),
                            "placement": {L.name: n.target[L.name] for L in n.layers}}
        util = {r: (sum(x.end - x.start for x in layers if x.resource == r) / span if span else 0.0)
                for r in RESOURCES}
        label = REAL_LABEL if self.mode == "real" else MODELLED_LABEL
        return RunReport(mode=self.mode, label=label,
                         clock_mhz=self.clock_mhz, workers=self.workers, wall_s=wall, span_s=span,
                         frames=recs, layers=layers, networks=nets,
                         hold_exceeded=self._hold_exceeded if self.mode == "real" else 0,
                         fabric_launches=self._launches, faults=list(self._faults),
                         utilization=util, notes=list(self.notes))

    def _check(self, rep):
        """Every frame against the integer reference of the unsplit graph (after the run)."""
        refs = {}
        by = {(f.net.name, f.index): f for f in self._frames}
        ok = True
        for r in rep.frames:
            f = by[(r.network, r.index)]
            key = (r.network, _feed_key(f.feed_q))
            ref = refs.get(key)
            if ref is None:
                ref = refs[key] = run_reference(f.net.qg, f.feed_q, options=self.options)
            same = all(np.array_equal(f.outputs[k], v) for k, v in ref.items())
            r.bit_exact = same
            if not same:
                ok = False
                rep.mismatches.append((r.network, r.index))
        rep.bit_exact = ok if rep.frames else None

    def outputs(self, network, index):
        """The int8 outputs of frame ``index`` of ``network`` in the last run."""
        for f in self._frames:
            if f.net.name == network and f.index == index:
                return f.outputs
        raise KeyError((network, index))

    # -- lifetime -----------------------------------------------------------------------
    def close(self):
        """Close the devices and stop the worker pool (idempotent)."""
        self._closed = True
        for n in getattr(self, "nets", []):
            if n.dev is not None:
                n.dev.close()
                n.dev = None
            if n.workers is not None and n.workers is not self._owner:
                n.workers.close()
        if self._owner is not None:
            self._owner.close()
            self._owner = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ====================================================================== durations for a replay
def durations_from_costs(plan, costs):
    """``durations`` for modelled mode from the metric model's figures: ``costs`` is
    {network: :class:`~dnnfab.sw.metrics.costs.NetworkCost`} (the one the plan was solved
    on). Per layer of the split graph (fabric_s, cpu_s):

    * a fabric layer: its ``"fabric"`` option's fabric_s, and its ``"cpu"`` option's cpu_s
      (what a fault's CPU re-run costs);
    * a CPU layer: its ``"cpu"`` option's cpu_s (fabric_s the same: it never runs there);
    * a split ``L`` at C channels: ``L@fab`` the ``"split:C"`` option's fabric_s (its CPU
      re-run: the ``"cpu"`` option's cpu_s scaled by C / Cout), ``L@cpu`` that option's
      cpu_s, the join ``L@join`` what the option's latency adds to the longer half.

    Tensor moves between the resources (``ResourceModel.transfer_s``) are not in these
    figures; the replay does not charge them."""
    out = {}
    for n in plan.networks:
        cost = costs[n.name]
        d = out[n.name] = {}
        for c in n.layers:
            lc = cost.layer(c.layer)
            cpu = lc.options["cpu"].cpu_s
            if c.resource == "split":
                opt = lc.options.get(f"split:{c.fabric_channels}")
                if opt is None:
                    raise ConfigError(f"{n.name}: the costs have no option split:"
                                      f"{c.fabric_channels} for layer {c.layer}")
                frac = c.fabric_channels / max(1, c.out_channels or c.fabric_channels)
                d[c.layer + FAB_SUFFIX] = (opt.fabric_s, cpu * frac)
                d[c.layer + CPU_SUFFIX] = (opt.cpu_s, opt.cpu_s)
                # the join: what the option's duration adds to its longer half
                join = max(0.0, opt.latency_s - max(opt.fabric_s, opt.cpu_s))
                d[c.layer + JOIN_SUFFIX] = (join, join)
            elif c.resource == "fabric" and "fabric" in lc.options:
                d[c.layer] = (lc.options["fabric"].fabric_s, cpu)
            else:
                d[c.layer] = (cpu, cpu)
    return out


# ====================================================================== a plan without graphs
class _CostNet:
    """A network of a plan as the replay needs it, from the metric model's
    :class:`~dnnfab.sw.metrics.costs.NetworkCost` alone (no graph, nothing computed)."""

    def __init__(self, index, nplan, cost, dur, xfer):
        from types import SimpleNamespace
        self.index, self.plan, self.name, self.task = index, nplan, nplan.name, nplan.task
        self.graph = self.qg = self.net = self.dev = self.mem = self.workers = None
        self.runs = {}
        choice = {c.layer: c for c in nplan.layers}
        names, self.deps, self.target, self.planned = [], {}, {}, {}
        self.bytes_out, self.gin, self.outs, self.nocharge = {}, {}, set(), set()
        for L in cost.layers:
            c = choice.get(L.name)
            res = c.resource if c is not None else "cpu"
            if res == "split":
                fab, cpu = L.name + FAB_SUFFIX, L.name + CPU_SUFFIX
                frac = c.fabric_channels / max(1, c.out_channels or c.fabric_channels)
                for h, side, b in ((fab, "fabric", frac), (cpu, "cpu", 1 - frac)):
                    names.append(h)
                    self.deps[h] = list(L.inputs)
                    self.target[h] = self.planned[h] = side
                    self.bytes_out[h] = int(round(L.out_bytes * b))
                    self.gin[h] = L.graph_input_bytes if side == "fabric" else 0
                self.deps[L.name] = [fab, cpu]
                self.nocharge.add((fab, L.name))
                res_j = "cpu"
                self.gin[L.name] = 0
            else:
                res_j = res if (res != "fabric" or "fabric" in L.options) else "cpu"
                self.deps[L.name] = list(L.inputs)
                self.gin[L.name] = L.graph_input_bytes
            names.append(L.name)
            self.target[L.name], self.planned[L.name] = res_j, res if res != "split" else "cpu"
            self.bytes_out[L.name] = L.out_bytes
            if L.is_output:
                self.outs.add(L.name)
        self.layers = [SimpleNamespace(name=x) for x in names]
        self.topo = {x: i for i, x in enumerate(names)}
        self.consumers = {x: [] for x in names}
        for x in names:
            for p in self.deps[x]:
                self.consumers[p].append(x)
        self.sources = [x for x in names if not self.deps[x]]
        joins = {c.layer for c in nplan.layers if c.resource == "split"}
        self.dur = {x: dur.get(x + JOIN_SUFFIX if x in joins else x, (0.0, 0.0)) for x in names}
        self.xfer = xfer
        self._order = {}

    order = _Net.order


class _Replay(Runtime):
    """The modelled replay of a plan from its costs: the same policy, nothing computed."""

    def __init__(self, plan, nets):
        self.plan, self.mode, self.nets = plan, "modelled", nets
        self.clock_mhz, self.workers = float(plan.clock_mhz or 0.0), int(plan.workers or 1)
        self.notes, self._closed, self._owner, self.options = [], False, None, None

    def _make_frame(self, n, k, release, feeds):
        return _Frame(n, k, release, None)

    def _fabric(self, n, frame, lname):
        return 0, None

    def _cpu(self, n, frame, lname):
        pass


def replay_plan(plan, costs, resources=None, frames=None, total_s=None) -> RunReport:
    """The modelled timeline of ``plan`` from the metric model's figures alone: ``costs``
    {network: NetworkCost} (or a list, matched by name), ``resources`` the
    :class:`~dnnfab.sw.metrics.costs.ResourceModel` for tensor moves (None: free). Same
    policy and durations as ``Runtime(mode="modelled")`` with :func:`durations_from_costs`,
    but no graph is needed and nothing is computed (``bit_exact`` is None). ``frames``
    default: 3 of each network."""
    if not isinstance(costs, dict):
        costs = {c.name: c for c in costs}
    dur = durations_from_costs(plan, costs)
    xfer = resources.transfer_s if resources is not None else None
    nets = [_CostNet(i, n, costs[n.name], dur[n.name], xfer) for i, n in enumerate(plan.networks)]
    if frames is None and total_s is None:
        frames = 3
    with _Replay(plan, nets) as r:
        return r.run(frames=frames, total_s=total_s, progress=False, check=False)


def gantt_plan(result, path, frames=3):
    """The Gantt chart of a schedule before it runs: ``result`` a
    :class:`~dnnfab.sw.sched.api.ScheduleResult` (``plan``, ``costs``, ``rm``) or a
    (plan, costs[, resources]) tuple; the first ``frames`` frames of each network, replayed
    by :func:`replay_plan` (labelled modelled). Returns the path."""
    if isinstance(result, tuple):
        plan, costs, rm = (tuple(result) + (None,))[:3]
    else:
        plan, costs, rm = result.plan, result.costs, getattr(result, "rm", None)
    return gantt(replay_plan(plan, costs, rm, frames=frames), path, frames=frames)


# ====================================================================== the Gantt chart
def gantt(report, path, frames=3, networks=None):
    """A Gantt chart of ``report`` (both resources) over the first ``frames`` frames of each
    network (``networks``: which, default all) saved to ``path``; returns the path."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("the Gantt chart needs matplotlib: pip install -e '.[plot]' (or drop "
                          "--gantt)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = list(networks) if networks is not None else list(report.networks)
    colors = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
    keep = {(f.network, f.index) for f in report.frames if f.network in names and f.index < frames}
    fr = [f for f in report.frames if (f.network, f.index) in keep]
    recs = [r for r in report.layers if (r.network, r.frame) in keep]
    fig, ax = plt.subplots(figsize=(12, 3.2))
    rows = {"fabric": 1, "cpu": 0}
    for r in recs:
        y = rows[r.resource]
        ms0, ms1 = r.start * 1e3, r.end * 1e3
        alpha = 0.95 if r.frame % 2 == 0 else 0.6
        ax.barh(y, max(ms1 - ms0, 1e-4), left=ms0, height=0.6, color=colors[r.network],
                alpha=alpha, edgecolor="red" if (r.degraded or r.error) else "black",
                linewidth=1.5 if (r.degraded or r.error) else 0.3,
                hatch="//" if r.error and r.resource == "fabric" else None)
    span = (max((f.end for f in fr), default=0.0)) * 1e3
    for r in recs:
        w = (r.end - r.start) * 1e3
        if span and w > span / 60:
            ax.text((r.start + r.end) / 2 * 1e3, rows[r.resource], f"{r.frame}", ha="center",
                    va="center", fontsize=6)
    for f in fr:
        ax.plot([f.release * 1e3], [1.45], marker="v", color=colors[f.network], ms=5)
        ax.axvline((f.release + f.deadline_s) * 1e3, color=colors[f.network], ls=":", lw=0.7)
    ax.set_yticks([0, 1])
    ax.set_yticklabels(["CPU workers", "fabric"])
    ax.set_ylim(-0.5, 1.7)
    ax.set_xlabel("time since start (ms)")
    kind = "MODELLED" if report.mode == "modelled" else "real"
    ax.set_title(f"{kind} timeline, first {frames} frame(s) per network "
                 f"(triangles: releases, dotted: deadlines, red edge: fault / CPU re-run)",
                 fontsize=9)
    ax.legend(handles=[Patch(color=colors[n], label=n) for n in names], loc="upper right",
              fontsize=7)
    if span:
        ax.set_xlim(0, span * 1.02)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
