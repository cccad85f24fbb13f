"""The metric model: per layer and resource, latency, busy time and dynamic energy.

>>> mm = MetricModel("ulx3s-85f")                      # the board's own CPU (ESP32), modelled
>>> res = mm.resources(workers=2)                      # idle powers, transfer figures
>>> cost = mm.network(qg, workers=2)                   # NetworkCost: options per layer
>>> cost.layer("conv1").options["fabric"].latency_s

``host="local"`` uses this machine's CPU workers instead (their measured profile,
:class:`~dnnfab.sw.cpu.profile.CpuProfile`; missing entries are measured and cached).

Every constant comes from the board file (``boards/*.toml``: ``[power]``, ``[cpu_model]``,
``[launch]``, ``[transfer]``, ``[local_host]``), each with a ``<key>_source`` string next
to it; :meth:`MetricModel.sources` lists the ones a model used. The formulas are in
docs/metrics.md. Nothing here imports the driver, the scheduler or the runtime.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...boards import get_board
from ...boards import fit as _fit
from ...errors import ConfigError
from ...hw.config import AcceleratorConfig
from ..compiler.network import compile_network
from ..compiler.split import apply_splits, splittable, out_channels, FAB_SUFFIX
from .costs import Option, LayerCost, NetworkCost, ResourceModel

__all__ = ["MetricModel", "layer_macs", "DEFAULT_SPLITS", "split_channels"]

DEFAULT_SPLITS = (0.25, 0.5, 0.75)
HOSTS = ("board", "local")
_SYNTH_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "synth"


def _nbytes(shape):
    return int(np.prod([int(d) for d in shape])) if len(shape) else 1


def layer_macs(qg, L) -> int:
    """Multiply-accumulates of a conv or GEMM layer (whole batch); 0 for other ops."""
    w = getattr(L, "qweight", None)
    if w is None or L.op not in ("conv", "gemm"):
        return 0
    out = tuple(qg.shape(L.output))
    if L.op == "conv":
        per_out = int(np.prod(w.shape[1:]))          # Cin/groups x kh x kw
        return _nbytes(out) * per_out
    k = int(w.shape[1]) if w.ndim == 2 else int(np.prod(w.shape[1:]))
    return _nbytes(out) * k


def _is_depthwise(qg, L):
    if L.op != "conv" or getattr(L, "groups", 1) == 1:
        return False
    return int(L.qweight.shape[1]) == 1


def split_channels(cout, frac, cols):
    """Fabric channels for a split at ``frac`` of ``cout``: a multiple of the array's
    columns when one lies strictly inside (0, cout), else the nearest integer; None when
    no split exists."""
    if cout < 2:
        return None
    c = int(round(frac * cout / cols)) * cols
    if not 0 < c < cout:
        c = min(cout - 1, max(1, int(round(frac * cout))))
    return c


class MetricModel:
    """See the module docstring. ``board``: a board id or :class:`~dnnfab.boards.Board`;
    ``cfg``: the accelerator configuration (default: the default config at the board's
    clock); ``host``: ``"board"`` (the board's CPU, modelled from ``[cpu_model]``) or
    ``"local"`` (this machine's CPU workers, measured); ``clock_mhz``: the fabric clock
    (default the board file's); ``profile``: a CpuProfile or a path to its JSON (host
    local; default ``~/.cache/dnnfab/cpu_profile.json``); ``repeats``: runs per profile
    measurement; ``cache_dir``: compiled-network cache (None: the default, False: none)."""

    def __init__(self, board="ulx3s-85f", cfg=None, host="board", clock_mhz=None, profile=None,
                 repeats=5, cache_dir=None, emulation=None):
        if host not in HOSTS:
            raise ConfigError(f"host {host!r}: use one of {', '.join(HOSTS)}")
        self.board = get_board(board)
        if self.board.power.get("model") != "dnnfab-metrics-1":
            raise ConfigError(f"board {self.board.id} has no metric-model figures in its board "
                              "file yet (boards/*.toml [power] model = \"dnnfab-metrics-1\"); "
                              "boards with them: ulx3s-85f, pynq-z2")
        self.clock_mhz = float(clock_mhz or self.board.clock_mhz)
        self.cfg = cfg or AcceleratorConfig(clock_mhz=self.clock_mhz)
        self.host = host
        self.repeats = repeats
        self.cache_dir = cache_dir
        self._profile = profile
        # host "local": what this machine's model backend takes per launch (an object
        # with launch_s(compiled network) -> {layer: s}, dnnfab.sw.driver.emulation); a
        # fabric layer then lasts max(board time, emulation time) -- a real run here
        # cannot be faster than the model computes
        self.emulation = emulation if host == "local" else None
        self._used = {}
        self._ff = None
        self._nets = {}

    # ------------------------------------------------------------------ constants
    def const(self, section, key):
        """A number from the board file's ``[section]``; records it and its source."""
        sec = self.board.sections.get(section, {})
        if key not in sec:
            raise ConfigError(f"board file {self.board.path.name if self.board.path else self.board.id} "
                              f"lacks [{section}] {key}; the metric model needs it")
        self._used[f"{section}.{key}"] = {"value": sec[key], "source": sec.get(f"{key}_source", "")}
        return float(sec[key])

    def sources(self):
        """{"section.key": {"value", "source"}} of every board constant used so far."""
        return {k: dict(v) for k, v in sorted(self._used.items())}

    def _record(self, name, value, source):
        self._used[name] = {"value": value, "source": source}
        return value

    # ------------------------------------------------------------------ resources
    def fabric_ff(self):
        """Flip-flops of the accelerator on this board: the synthesis report in
        benchmarks/synth/ when one matches the configuration, else boards.fit's estimate."""
        if self._ff is not None:
            return self._ff
        want = {k: v for k, v in self.cfg.to_dict().items() if k != "clock_mhz"}
        ff, src = None, ""
        for p in sorted(_SYNTH_DIR.glob(f"{self.board.id}_accelerator_*.json")):
            try:
                d = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            cfg = {k: v for k, v in d.get("config", {}).items() if k != "clock_mhz"}
            if cfg == want and d.get("top") == "accelerator":
                ff = int(d["resources"]["ff"]["used"])
                src = (f"synthesis report benchmarks/synth/{p.name} (nextpnr, "
                       f"{d.get('tool_versions', {})}): {ff} TRELLIS_FF used")
                break
        if ff is None:
            ff = int(_fit.estimate(self.cfg, self.board)["ff"])
            src = f"estimate: boards/fit.py estimate() for {self.cfg.rows}x{self.cfg.cols} on {self.board.id}"
        self._ff = self._record("design.ff", ff, src)
        return ff

    def launch_s(self):
        """Host time of one fabric launch (register sequence + interrupt)."""
        if self.host == "local":
            return self.const("local_host", "launch_s")
        return self.const("launch", "reg_accesses") * self.const("launch", "reg_access_s") + \
            self.const("launch", "irq_s")

    def _transfer(self):
        """(bytes/s, fixed s, J/byte) of a host <-> fabric tensor move."""
        dram_j = self.const("power", "dram_pj_per_byte") * 1e-12
        if self.host == "local":
            bps = self.const("local_host", "bytes_per_s")
            return bps, self.const("local_host", "fixed_s"), dram_j
        t = self.board.sections.get("transfer", {})
        if "spi_clock_mhz" in t:
            bps = self.const("transfer", "spi_clock_mhz") * 1e6 * self.const("transfer", "lanes") / 8
        else:
            bps = self.const("transfer", "bytes_per_s")
        # the host core is busy for the move; the fabric side's DRAM is written or read,
        # and on a shared-DRAM board the host side's copy touches the DRAM too
        jb = self.const("power", "host_active_w_per_core") / bps + dram_j
        if self.board.host.get("shares_dram"):
            jb += dram_j
        return bps, self.const("transfer", "fixed_s"), jb

    def _touch_all(self):
        """Read every constant the options use, so :meth:`sources` (and
        ``ResourceModel.sources``) list them before any layer is costed."""
        self.fabric_ff()
        self.launch_s()
        for k in ("ff_toggle_pj", "toggle_rate", "dram_pj_per_byte", "dram_efficiency",
                  "host_active_w_per_core"):
            self.const("power", k)
        self._record("dram.peak_mb_s", self.board.dram["peak_mb_s"], self.board.dram.get("source", ""))
        self._record("clock.mhz", self.clock_mhz, "clock_mhz argument" if self.clock_mhz !=
                     float(self.board.clock_mhz) else self.board.clock_basis)
        if self.host == "local":
            for k in ("cpu_active_w_per_core", "layer_overhead_s", "eltwise_bytes_per_s",
                      "runtime_layer_s"):
                self.const("local_host", k)
        else:
            for k in ("clock_mhz", "cores", "cycles_per_mac", "depthwise_cycles_per_mac",
                      "layer_overhead_cycles", "eltwise_bytes_per_cycle"):
                self.const("cpu_model", k)

    def max_workers(self):
        if self.host == "local":
            import os
            return max(1, len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") \
                else (os.cpu_count() or 1)
        return int(self.const("cpu_model", "cores"))

    def resources(self, workers=1) -> ResourceModel:
        """Board-level figures for ``workers`` CPU worker threads."""
        if self.host == "local":
            cpu_idle = self.const("local_host", "cpu_idle_w")
        else:
            cpu_idle = self.const("power", "host_idle_w")
        bps, fixed, jb = self._transfer()
        idle = {"board": self.const("power", "board_idle_w"),
                "fabric": self.const("power", "fpga_static_w"), "cpu": cpu_idle}
        self._touch_all()
        return ResourceModel(board=self.board.id, clock_mhz=self.clock_mhz, workers=int(workers),
                             host=self.host, idle_w=idle, transfer_bytes_per_s=bps,
                             transfer_fixed_s=fixed, transfer_j_per_byte=jb,
                             max_cpu_workers=self.max_workers(),
                             sources={k: v["source"] for k, v in self.sources().items()})

    # ------------------------------------------------------------------ fabric
    def fabric_option(self, info, key="fabric", channels=0, emulation_s=None):
        """An Option for a fabric layer from its compiled LayerInfo (standalone run);
        ``emulation_s``: this machine's measured launch time (host local), a floor."""
        clk = self.clock_mhz * 1e6
        cyc = int(info.cycles)
        nbytes = int(info.dram_rd_bytes + info.dram_wr_bytes)
        t_compute = cyc / clk
        bw = self.board.dram["peak_mb_s"] * 1e6 * self.const("power", "dram_efficiency")
        self._record("dram.peak_mb_s", self.board.dram["peak_mb_s"], self.board.dram.get("source", ""))
        t_dram = nbytes / bw
        t_launch = self.launch_s()
        busy = max(t_compute, t_dram) + t_launch
        board_s = busy
        if emulation_s is not None and emulation_s > busy:
            busy = float(emulation_s)
        emulated = busy > board_s
        rt = self.runtime_layer_s()
        busy += rt
        ff = self.fabric_ff()
        e_ff = self.const("power", "ff_toggle_pj") * 1e-12 * ff * self.const("power", "toggle_rate") * cyc
        e_dram = self.const("power", "dram_pj_per_byte") * 1e-12 * nbytes
        e_launch = 0.0 if self.host == "local" else \
            self.const("power", "host_active_w_per_core") * t_launch
        det = {"cycles": cyc, "dram_bytes": nbytes, "compute_s": t_compute, "dram_s": t_dram,
               "launch_s": t_launch, "host_cpu_s": t_launch, "bound": "dram" if t_dram > t_compute else "compute",
               "clock_mhz": self.clock_mhz, "ff": ff, "energy_ff_j": e_ff, "energy_dram_j": e_dram,
               "energy_launch_j": e_launch, "macs": int(info.macs), "hw_macs": int(info.hw_macs),
               "board_s": board_s, "emulation_s": emulation_s, "runtime_s": rt,
               "bound_by_emulation": emulated}
        return Option(key, fabric_s=busy, latency_s=busy, energy_j=e_ff + e_dram + e_launch,
                      fabric_channels=channels, detail=det)

    # ------------------------------------------------------------------ cpu
    def cpu_board_s(self, macs=0, nbytes=0, depthwise=False, workers=1):
        """(seconds, cores, detail) of one layer on the board's CPU model: ``macs`` > 0 a
        conv / GEMM (``depthwise`` for a depthwise conv), else ``nbytes`` of elementwise
        work (inputs + output); see docs/metrics.md."""
        clk = self.const("cpu_model", "clock_mhz") * 1e6
        cores = min(int(workers), int(self.const("cpu_model", "cores")))
        ovh = self.const("cpu_model", "layer_overhead_cycles") / clk
        if macs:
            cpm = self.const("cpu_model", "depthwise_cycles_per_mac" if depthwise
                             else "cycles_per_mac")
            t = ovh + macs * cpm / (clk * cores)
            det = {"model": "macs", "macs": int(macs), "cycles_per_mac": cpm, "cores": cores,
                   "overhead_s": ovh}
        else:
            bpc = self.const("cpu_model", "eltwise_bytes_per_cycle")
            t = ovh + nbytes / (bpc * clk * cores)
            det = {"model": "bytes", "bytes": int(nbytes), "bytes_per_cycle": bpc,
                   "cores": cores, "overhead_s": ovh}
        return t, cores, det

    def _cpu_board(self, qg, L, workers, macs=None):
        """(seconds, cores, detail) of layer L on the board's CPU model."""
        macs = layer_macs(qg, L) if macs is None else macs
        nb = 0 if macs else \
            sum(_nbytes(qg.shape(t)) for t in L.inputs) + _nbytes(qg.shape(L.output))
        return self.cpu_board_s(macs, nb, _is_depthwise(qg, L), workers)

    def profile(self):
        """The CpuProfile the local host reads (created on first use)."""
        from ..cpu.profile import CpuProfile
        if not isinstance(self._profile, CpuProfile):
            self._profile = CpuProfile(self._profile)
        return self._profile

    def _local_ms(self, qg, workers):
        """{layer name: ms} at ``workers`` threads, measuring what the profile lacks."""
        from ..cpu.profile import PASSES, MIN_MEASURE_S
        res = self.profile().measure(qg, threads=(int(workers),), repeats=self.repeats)
        self._record("local.profile", str(self.profile().path),
                     f"measured: CpuProfile ({self.profile().machine}), the median of at "
                     f"least {PASSES} x {self.repeats} rounds over the network spanning "
                     f"{MIN_MEASURE_S:g} s, each layer's CpuWorkers.run_layer once per round")
        return {n: v[int(workers)] for n, v in res.items()}

    def runtime_layer_s(self):
        """Host local: what the real-time runtime adds to each layer on this machine (its
        dispatch, thread hand-offs and the hold's overshoot, measured); board: 0 (the
        board's per-layer costs are in its launch and CPU models)."""
        return self.const("local_host", "runtime_layer_s") if self.host == "local" else 0.0

    def cpu_option(self, qg, L, workers, local_ms=None):
        if self.host == "local":
            t = local_ms[L.name] / 1e3 + self.runtime_layer_s()
            n = int(workers)
            p = self.const("local_host", "cpu_active_w_per_core")
            det = {"model": "profile", "ms": local_ms[L.name], "threads": n}
        else:
            t, n, det = self._cpu_board(qg, L, workers)
            p = self.const("power", "host_active_w_per_core")
        det["power_w"] = p * n
        return Option("cpu", cpu_s=t, latency_s=t, energy_j=p * n * t, detail=det)

    def _split_option(self, qg, L, c, fab_info, fab_opt, cpu_opt, workers, res):
        cout = out_channels(L)
        frac_cpu = (cout - c) / cout
        out_b = _nbytes(qg.shape(L.output))
        fab_out = int(round(out_b * c / cout))
        if self.host == "local":
            ovh = self.const("local_host", "layer_overhead_s") + self.runtime_layer_s()
            cpu_t = (cpu_opt.cpu_s - self.runtime_layer_s()) * frac_cpu + ovh
            p1 = self.const("local_host", "cpu_active_w_per_core")
            cpu_e = p1 * int(workers) * cpu_t
            join = out_b / self.const("local_host", "eltwise_bytes_per_s")
            how = "profile x (Cout-C)/Cout + layer_overhead_s"
        else:
            macs = layer_macs(qg, L)
            cpu_t, n, _ = self._cpu_board(qg, L, workers, macs=int(round(macs * frac_cpu)))
            p1 = self.const("power", "host_active_w_per_core")
            cpu_e = p1 * n * cpu_t
            join = out_b / (self.const("cpu_model", "eltwise_bytes_per_cycle") *
                            self.const("cpu_model", "clock_mhz") * 1e6)
            how = "cpu model on (Cout-C)/Cout of the MACs (+ its per-layer overhead)"
        back = res.transfer_s(fab_out)
        fab_t = fab_opt.fabric_s + back
        lat = max(fab_t, cpu_t) + join
        e = fab_opt.energy_j + res.transfer_j(fab_out) + cpu_e + p1 * join
        det = {"cout": cout, "fabric_channels": c, "fabric": dict(fab_opt.detail),
               "fabric_part_s": fab_t, "fabric_out_transfer_s": back, "cpu_part_s": cpu_t,
               "cpu_how": how, "join_s": join, "fabric_out_bytes": fab_out}
        return Option(f"split:{c}", fabric_s=fab_t, cpu_s=cpu_t + join, latency_s=lat,
                      energy_j=e, fabric_channels=c, detail=det)

    # ------------------------------------------------------------------ network
    def _emulated(self, net):
        """{layer: this machine's launch seconds} (host local with an emulation), else {}."""
        if self.emulation is None:
            return {}
        self._record("local.emulation", "max(board, measured)",
                     "measured: LaunchProfile (dnnfab.sw.driver.emulation), median of the "
                     "model backend's standalone launches on this machine")
        return self.emulation.launch_s(net)

    def compiled(self, qg, splits=None):
        """The network compiled with every fabric layer standalone (chain=False); kept in
        memory per graph object and split plan (and on disk by compile_network)."""
        key = (id(qg), tuple(sorted((splits or {}).items())))
        hit = self._nets.get(key)
        if hit is not None and hit[0] is qg:
            return hit[1]
        g = apply_splits(qg, splits) if splits else qg
        net = compile_network(g, self.cfg, chain=False, cache_dir=self.cache_dir or None,
                              use_cache=self.cache_dir is not False)
        self._nets[key] = (qg, net)             # holds qg, so its id is not reused
        return net

    def network(self, qg, workers=1, name=None, splits=DEFAULT_SPLITS) -> NetworkCost:
        """Per-layer options of ``qg`` (its layers in order) at ``workers`` CPU threads;
        ``splits``: fractions of a splittable fabric layer's output channels to offer on
        the fabric (``()``: no split options)."""
        workers = int(workers)
        if workers < 1:
            raise ConfigError(f"workers={workers}: at least 1")
        res = self.resources(workers)
        net = self.compiled(qg)
        emu0 = self._emulated(net)
        local_ms = self._local_ms(qg, workers) if self.host == "local" else None
        producer = {L.output: L.name for L in qg.layers}
        graph_in = {t.name for t in qg.inputs}
        graph_out = {t.name for t in qg.outputs}
        by_name = {L.name: L for L in qg.layers}
        # split candidates: fabric-mapped, splittable; one compile per fraction
        split_infos = {}                       # layer -> {c: LayerInfo of L@fab}
        for frac in (splits or ()):
            plan = {}
            for n, info in net.layers.items():
                L = by_name[n]
                if info.target != "fabric" or not splittable(L):
                    continue
                c = split_channels(out_channels(L), frac, self.cfg.cols)
                if c is not None and c not in split_infos.get(n, {}):
                    plan[n] = c
            if not plan:
                continue
            snet = self.compiled(qg, plan)
            emu = self._emulated(snet)
            for n, c in plan.items():
                hi = snet.layers.get(n + FAB_SUFFIX)
                if hi is not None and hi.target == "fabric":
                    split_infos.setdefault(n, {})[c] = (hi, emu.get(n + FAB_SUFFIX))
        layers = []
        for L in qg.layers:
            info = net.layers[L.name]
            ins = []
            for t in L.inputs:
                p = producer.get(t)
                if p is not None and p not in ins:
                    ins.append(p)
            gib = sum(_nbytes(qg.shape(t)) for t in dict.fromkeys(L.inputs) if t in graph_in)
            opts = {"cpu": self.cpu_option(qg, L, workers, local_ms)}
            reason = ""
            if info.target == "fabric":
                opts["fabric"] = self.fabric_option(info, emulation_s=emu0.get(L.name))
                for c, (hi, e) in sorted(split_infos.get(L.name, {}).items()):
                    fo = self.fabric_option(hi, key=f"fabric@{c}", channels=c, emulation_s=e)
                    so = self._split_option(qg, L, c, hi, fo, opts["cpu"], workers, res)
                    opts[so.key] = so
            else:
                reason = info.reason
            layers.append(LayerCost(name=L.name, op=info.op, macs=layer_macs(qg, L), inputs=ins,
                                    out_bytes=_nbytes(qg.shape(L.output)), options=opts,
                                    reason=reason, graph_input_bytes=gib,
                                    is_output=L.output in graph_out))
        return NetworkCost(name=name or qg.name or "network", layers=layers, workers=workers)

    # ------------------------------------------------------------------ validation hooks
    def fabric_cycles(self, qg):
        """{layer: modelled cycles of its standalone launch} (the RTL backend's cycles are
        compared against these; see scripts/validate_metrics.py)."""
        net = self.compiled(qg)
        return {n: int(i.cycles) for n, i in net.layers.items() if i.target == "fabric"}
