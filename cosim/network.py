"""``dnnfab cosim MODEL``: a whole network on the generated Verilog, checked layer by layer.

The network runs through :class:`~dnnfab.sw.runtime.session.InferenceSession` on the
driver's ``rtl`` backend (:mod:`dnnfab.cosim.rtl_backend`): the fabric layers on the
simulated accelerator (one simulator process for the whole run), the rest on the CPU
workers -- the same host code as on the model backend or a board. The network is compiled
with ``chain=False``: every fabric layer is a launch of its own, so its CYCLES counter is
the layer's RTL cycles (a chained program's counters cover a whole run of layers; the
fast model's per-layer attribution inside a run is not measurable on the hardware).

Checks, per layer: right after each launch the layer's output buffer is read back from the
simulated DRAM (one bulk read) and compared with the integer reference network
(:func:`dnnfab.sw.cpu.reference.run_layer` over the whole graph, bit for bit); CPU layers
are compared from the session's tensors. A mismatch records the first differing element
(index, RTL value, reference value) and the accelerator's state; a fault or a hang (no
interrupt within 4x the modelled cycles + 100k) records the driver's typed error with
STATUS and the controller state (the session then completes the inference on the CPU and
marks the layer degraded). On a failure, or with ``waves``, the run is replayed on a
waveform build up to the failing (else the last) launch, recording only the last
``DNNFAB_WAVE_WINDOW_NS`` (default 200 us) before that launch ends, and the file is
reported (the simulation is deterministic: the same host operations at the same
simulated times).

Speed: ``sim_cycles_per_s`` is every simulated cycle of the inference (launches and the
host's bus transactions and DRAM syncs) per wall second the host spent waiting for the
simulator's answers (``sim_s``: the co-simulation's speed, round trips included);
``sim_wait_cycles_per_s`` counts only the wall time of the waits for the interrupt (the
simulator running free); ``inference_cycles_per_s`` divides by the whole inference's wall
time ``run_s`` (CPU layers, the per-layer reads and checks, the first call's CPU kernel
warm-up included).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from ..errors import DnnfabError

__all__ = ["cosim_network", "first_difference"]


class _StopReplay(Exception):
    pass


def first_difference(got, want):
    """``(index tuple, got, want)`` of the first element where two arrays differ, or None."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return ("shape", list(got.shape), list(want.shape))
    bad = np.argwhere(got != want)
    if not len(bad):
        return None
    i = tuple(int(v) for v in bad[0])
    return (list(i), int(got[i]), int(want[i]))


def _reference_env(qg, feed_q, options):
    """Every tensor of the integer reference network on ``feed_q`` (an Env)."""
    from ..sw.cpu.reference import Env, run_layer
    env = Env(qg)
    for t in qg.inputs:
        env.put(t.name, np.asarray(feed_q[t.name]), "lg")
    for L in qg.layers:
        run_layer(qg, env, L, options)
    return env


def _tensor_of(bname):
    return bname[:-5] if bname.endswith("@gemm") else bname


class _Checker:
    """The session's ``on_run`` hook: per launch, the RTL counters and the layer's output
    read back from the simulated DRAM, compared with the reference."""

    def __init__(self, sess, ref, progress=None, stop_after=None):
        self.sess, self.ref = sess, ref
        self.records = {}            # layer -> {"cycles", "bit_exact", "first_diff", "error", ...}
        self.launch_end = []         # simulated cycle at the end of each launch
        self.progress = progress
        self.stop_after = stop_after
        self.failed_launch = None

    def _compare(self, rec, layer, name, got, channel_last):
        want = self.ref.cl(name) if channel_last else self.ref.lg(name)
        diff = first_difference(got, want)
        rec["bit_exact"] = diff is None
        if diff is not None:
            rec["first_diff"] = diff
            rec["state"] = self.sess.dev.backend.state()
            self._failed(self.sess.net.layers[layer].run)

    def _failed(self, launch):
        """Keep the earliest failing launch (read-back checks run after the inference)."""
        self.failed_launch = launch if self.failed_launch is None else min(self.failed_launch, launch)

    def check_read_back(self, env):
        """Compare the fabric outputs the session read back itself (its tensors ``env``)."""
        net = self.sess.net
        for n, rec in self.records.items():
            name = rec.pop("later", None)
            if name is not None:
                conv = net.tensors[net.produces[n]].kind == "conv"
                self._compare(rec, n, name, env.cl(name) if conv else env.lg(name), conv)

    def __call__(self, run, counters, error):
        sess = self.sess
        net, be = sess.net, sess.dev.backend
        self.launch_end.append(be.wait_end_cycle)
        for n in run.layers:
            rec = {"cycles": None, "bit_exact": False, "first_diff": None, "error": "", "state": ""}
            if error is not None:
                rec["error"] = f"{type(error).__name__}: {error}"
                rec["state"] = be.state()
            else:
                rec["cycles"] = int(counters["cycles"]) if len(run.layers) == 1 else None
                b = net.produces[n]
                if b in run.outputs and self.stop_after is None:
                    # the session reads this buffer back itself (for a CPU layer or the
                    # caller): checked from its tensors after the inference (check_read_back)
                    rec["later"] = _tensor_of(b)
                else:
                    t = net.tensors[b]
                    got = t.unpack(sess.dev.read(t.addr, t.size))
                    self._compare(rec, n, _tensor_of(b), got, t.kind == "conv")
            self.records[n] = rec
            if rec["error"]:
                self._failed(run.index)
        if self.progress is not None:
            self.progress(run, counters)
        if self.stop_after is not None and run.index >= self.stop_after:
            raise _StopReplay()


def _session(qg, cfg, sim, backend_options=None, options=None):
    from ..sw.runtime.session import InferenceSession
    return InferenceSession(qg, config=cfg, backend="rtl", chain=False, options=options,
                            backend_options={"sim": sim, **(backend_options or {})})


def _replay_waves(qg, cfg, sim, feed, ref, launch, from_cycle, until_cycle):
    """Re-run up to launch index ``launch`` on a waveform build recording from the later of
    ``from_cycle`` and ``until_cycle`` minus the window; returns (path, MB) or (None, why)."""
    from .dram import CLOCK_NS
    from .runner import wave_window_ns
    window = wave_window_ns() // CLOCK_NS
    start = max(int(from_cycle), int(until_cycle) - window)
    sess = _session(qg, cfg, sim, {"waves": True, "waves_from_ns": start * CLOCK_NS,
                                   "keep_run_dir": True})
    try:
        sess.compile()
        sess.on_run = _Checker(sess, ref, stop_after=launch)
        try:
            sess.run_int(feed)
        except _StopReplay:
            pass
        be = sess.dev.backend
    finally:
        sess.close()
    for name in ("dump.vcd", "dump.fst"):
        path = be.run_dir / name
        if path.exists():
            return str(path), round(path.stat().st_size / 1e6, 2), start
    return None, f"no waveform file in {be.run_dir}", start


def cosim_network(model, cfg, sim="verilator", samples=1, waves=False, progress=True, options=None,
                  input_shapes=(), note=None, max_launches=None, backend_options=None):
    """Run ``model`` (zoo name or ONNX path) on the RTL; returns the summary dict (see the
    module docstring and ``dnnfab cosim --help``); ``note(text)`` is told before the
    simulator is built / started (every input check is done by then). ``max_launches``:
    stop after that many fabric launches (a large model's first layers; the record then
    lists only the fabric layers run, ``partial`` true). ``backend_options``: more keyword
    arguments of the rtl backend (e.g. ``{"axil": "lean"}``)."""
    import dnnfab
    from . import runner
    from ..sw.cpu.options import Options
    from ..sw.runtime.cli import load_for_cli
    from ..sw.runtime.network import check_run_config
    from ..sw.runtime.runcli import _data_for, _zoo_name
    t_all = time.monotonic()
    check_run_config(cfg, cli=True)
    runner.check_simulator(sim)
    if samples < 1:
        raise DnnfabError(f"--samples {samples}: run at least one sample (--samples 1 or more)")
    options = options or Options.from_env()
    g = load_for_cli(model, input_shape_specs=input_shapes)
    zoo = _zoo_name(model)
    calib, xs, _, desc = _data_for(zoo, model, g, samples, None, None)
    qg = dnnfab.quantize(g, calibration=calib)
    sess = _session(qg, cfg, sim, backend_options, options=options)
    if note is not None:
        note(f"{sim}: the {cfg.rows}x{cfg.cols} accelerator (a fresh build takes a few minutes, a "
             f"cached one seconds; cache {runner.cache_root() / 'cosim'})")
    t0 = time.monotonic()
    net = sess.compile()
    be = sess.dev.backend
    open_s = time.monotonic() - t0
    fab_layers = [n for n in net.layers if net.layers[n].target == "fabric"]
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(fab_layers) * len(xs), desc=f"{model} on {sim} RTL", unit="layer",
                   leave=False, disable=None, file=sys.stderr)
    state = {"c0": be.sim_cycles(), "t0": time.monotonic()}

    def tick(run, counters):
        if bar is not None:
            cyc = be.wait_end_cycle - state["c0"]
            dt = max(1e-9, time.monotonic() - state["t0"])
            bar.set_postfix_str(f"{cyc:,} cycles, {cyc / dt:,.0f} cycles/s")
            bar.update(len(run.layers))

    per_sample = []
    checker = None
    failure = None
    try:
        refs = [_reference_env(qg, qg.quantize_inputs(qg.check_feed(feed)), options) for feed in xs]
        c_start, w_start = be.sim_stats()
        req0 = {k: list(v) for k, v in be.stats.items()}
        t_run = time.monotonic()
        for i, (feed, ref) in enumerate(zip(xs, refs)):
            checker = _Checker(sess, ref, progress=tick,
                               stop_after=None if max_launches is None else max_launches - 1)
            sess.on_run = checker
            try:
                out = sess.run_int(feed)
            except _StopReplay:
                per_sample.append((checker, {}, True, None, list(sess.faults)))
                if checker.failed_launch is not None:
                    failure = (i, feed, ref, checker)
                break
            env = sess.last_env
            checker.check_read_back(env)
            if failure is None and checker.failed_launch is not None:
                failure = (i, feed, ref, checker)
            cpu_diff = {}
            for L in qg.layers:
                if L.name not in checker.records:
                    cpu_diff[L.name] = first_difference(env.lg(L.output), ref.lg(L.output))
            outputs_exact = all(np.array_equal(out[t.name], ref.lg(t.name)) for t in qg.outputs)
            per_sample.append((checker, cpu_diff, outputs_exact, sess.profile(), list(sess.faults)))
            sess.faults = []
            if failure is None and checker.failed_launch is not None:
                failure = (i, feed, ref, checker)
        run_s = time.monotonic() - t_run
        c_end, w_end = be.sim_stats()
        sim_cycles = c_end - c_start
        wait_s = w_end - w_start
        reqs = {k: (v[0] - req0.get(k, [0, 0])[0], v[1] - req0.get(k, [0, 0])[1])
                for k, v in be.stats.items() if k != "time"}
        sim_s = sum(v[1] for v in reqs.values())
    finally:
        if bar is not None:
            bar.close()
        sess.close()
    checker, cpu_diff, outputs_exact, prof, faults = per_sample[0]
    partial = prof is None
    if partial:                          # the first fabric layers only
        prof = [{"name": n, "op": net.layers[n].op} for n in checker.records]
    ops = {L.name: L.describe_op() for L in g.layers}
    layers = []
    for r in prof:
        n = r["name"]
        info = net.layers[n]
        on_fabric = info.target == "fabric"
        rec = checker.records.get(n) if on_fabric else None
        cycles = rec["cycles"] if rec else 0
        exact = (rec["bit_exact"] if rec else cpu_diff.get(n) is None)
        for c2, d2, _, _, _ in per_sample[1:]:
            exact &= (c2.records[n]["bit_exact"] if on_fabric else d2.get(n) is None)
        item = {"name": n, "op": ops.get(n, r["op"]), "target": "fabric" if on_fabric else "cpu",
                "macs": int(info.macs), "cycles": int(cycles or 0),
                "model_cycles": int(info.cycles) if on_fabric else 0,
                "utilization": round(info.macs / (cycles * cfg.rows * cfg.cols), 4) if cycles else 0.0,
                "bit_exact": bool(exact)}
        if on_fabric and cycles:
            item["model_error"] = round((info.cycles - cycles) / cycles, 5)
        if not on_fabric:
            item["reason"] = info.reason
        if rec and (rec["error"] or rec["first_diff"] is not None):
            item["error"] = rec["error"]
            item["first_diff"] = rec["first_diff"]
            item["state"] = rec["state"]
        if r.get("degraded"):
            item["degraded"] = True
        layers.append(item)
    bit_exact = all(x["bit_exact"] for x in layers) and all(s[2] for s in per_sample)
    summary = {
        "model": zoo or model, "simulator": sim, "config": cfg.to_dict(), "samples": len(xs),
        "inputs": desc["inputs"], "calibration": desc["calibration"],
        "bit_exact": bool(bit_exact),
        "total_cycles": int(sum(x["cycles"] for x in layers)),
        "model_total_cycles": int(sum(x["model_cycles"] for x in layers)),
        "sim_cycles": int(sim_cycles),
        "run_s": round(run_s, 3),
        "sim_s": round(sim_s, 3),
        "sim_cycles_per_s": round(sim_cycles / max(sim_s, 1e-9)),
        "sim_wait_cycles_per_s": round(sim_cycles / max(wait_s, 1e-9)) if wait_s else None,
        "inference_cycles_per_s": round(sim_cycles / max(run_s, 1e-9)),
        "launches": sum(len(c.launch_end) for c, *_ in per_sample),
        "partial": partial,
        "host_requests": {k: {"n": v[0], "s": round(v[1], 4)} for k, v in sorted(reqs.items())},
        "build": {"built": bool(be.built), "build_s": round(be.build_s, 2), "start_s": round(be.start_s, 2),
                  "build_dir": str(be.build_dir)},
        "faults": faults,
        "failure": None,
        "waves": None,
        "layers": layers,
    }
    if failure is not None or waves:
        if failure is not None:
            i, feed, ref, ck = failure
            k = ck.failed_launch
            bad = [x for x in layers if x["name"] in net.runs[k].layers][0]
            summary["failure"] = {"sample": i, "launch": k, "layer": bad["name"], "error": bad.get("error", ""),
                                  "first_diff": bad.get("first_diff"), "state": bad.get("state", "")}
        else:
            feed, ck, k = xs[0], per_sample[0][0], len(net.runs) - 1
            ref = _reference_env(qg, qg.quantize_inputs(qg.check_feed(feed)), options)
        start = ck.launch_end[k - 1] if k > 0 else 0
        path, size, from_cycle = _replay_waves(qg, cfg, sim, feed, ref, k, start, ck.launch_end[k])
        summary["waves"] = {"file": path, "mb": size, "from_cycle": from_cycle, "launch": k}
    summary["wall_s"] = round(time.monotonic() - t_all, 2)
    summary["open_s"] = round(open_s, 2)
    return summary


def table(summary):
    """Rows of the per-layer table (first row: the header)."""
    rows = [["layer", "op", "target", "MACs", "RTL cycles", "model cycles", "diff %", "util", "exact"]]
    for x in summary["layers"]:
        fab = x["target"] == "fabric"
        rows.append([x["name"], x["op"], x["target"], f"{x['macs']:,}",
                     f"{x['cycles']:,}" if fab else "", f"{x['model_cycles']:,}" if fab else "",
                     f"{100 * x['model_error']:+.2f}" if "model_error" in x else "",
                     f"{x['utilization']:.2f}" if fab else "", "yes" if x["bit_exact"] else "NO"])
    return rows
