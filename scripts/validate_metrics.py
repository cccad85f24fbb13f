"""Validate the metric model (sw/metrics/model.py) against measurements on this machine.

* CPU: the model's latency of every layer with host="local" (the CpuProfile, measured and
  cached on first use: the median of a layer's runs) against a fresh measurement of
  CpuWorkers.run_layer wall time taken the same way (the median of PASSES x ``--repeats``
  rounds over the network's layers in order, more for a network too quick to span
  profile.MIN_MEASURE_S, each layer once per round, after a warm-up:
  what a run of the network meets), per layer; target within 20 %. The fastest runs are
  compared too (``min``).
* Fabric: the model's cycles of every fabric layer's standalone launch against the
  CYCLES counter of the same launch through the driver (sw/driver, ``model`` backend).
  ``--backend rtl`` is the hook for the RTL backend (another issue): when the driver
  lists it, the same launches run there and the same table compares RTL cycles (target
  within 2 %).

    PYTHONPATH=... python scripts/validate_metrics.py [MODEL ...] [--board B] [--workers N]
        [--repeats R] [--backend model|rtl] [--out benchmarks/metrics_validation.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

DEFAULT_MODELS = ("digits-cnn", "eeg-seizure", "squeezenet", "shufflenet")
BIG_MS = 0.1          # layers at least this long (measured) get their own statistics


def _load(model):
    import dnnfab
    return dnnfab.InferenceSession(model).qg


def _measure_cpu(qg, workers, repeats):
    """({layer: (median ms, fastest ms)}, {layer: engine}) of CpuWorkers.run_layer, fresh
    (not the profile), timed as CpuProfile.measure times (profile.time_in_rounds)."""
    from dnnfab.sw.cpu.profile import time_in_rounds
    from dnnfab.sw.cpu import reference as R
    from dnnfab.sw.cpu.workers import CpuWorkers
    rng = np.random.default_rng(1)
    feed = {t.name: rng.integers(-128, 128, t.shape).astype(np.int8) for t in qg.inputs}
    with CpuWorkers(qg, threads=workers) as w:
        engines = {n: r["engine"] for n, r in w.engine_report().items()}
        env = R.Env(qg)
        for t in qg.inputs:
            env.put(t.name, feed[t.name], "lg")
        w.run_layers(env, qg.layers)
        ts = time_in_rounds(w, env, qg.layers, repeats)
    return {n: (statistics.median(v) * 1e3, min(v) * 1e3) for n, v in ts.items()}, engines


def _driver_cycles(net, cfg, backend="model"):
    """{layer: CYCLES of its launch} running every run of ``net`` through the driver."""
    from dnnfab.sw import driver
    if backend not in driver.BACKENDS:
        raise SystemExit(f"the driver has no {backend!r} backend yet (known: "
                         f"{', '.join(driver.BACKENDS)}); the RTL backend comes from its own issue")
    dev = driver.open(backend, cfg, dram_bytes=max(1 << 24, net.dram_bytes + (1 << 20)))
    mem = dev.allocate((net.dram_bytes,), np.uint8)
    base = mem.device_address
    mem[:len(net.image)] = np.frombuffer(net.image, np.uint8)
    mem[:len(net.image)].sync_to_device()
    rng = np.random.default_rng(2)
    for t in net.tensors.values():                         # any activation data will do
        lo = t.addr - base
        mem[lo:lo + t.size] = rng.integers(0, 256, t.size, dtype=np.uint8)
    mem.sync_to_device()
    out = {}
    for run in net.runs:
        c = dev.run(driver.Program(base + run.prog_addr, run.n_insns, base + run.out_window[0],
                                   base + run.out_window[1]), timeout_s=60)
        assert len(run.layers) == 1, "chain=False: one layer per launch"
        out[run.layers[0]] = int(c["cycles"])
    dev.close() if hasattr(dev, "close") else None
    return out


#: Published whole-network CPU times to check a board's CPU model against (the model's
#: constants were fixed before these were looked at; nothing is fitted to them).
PUBLISHED_CPU = {
    "ulx3s-85f": {
        "network": "TFLite Micro person_detection (MobileNet v1 alpha 0.25, 96x96x1, int8), one core",
        "measured_ms": 380.0,
        "source": "espressif/esp-tflite-micro README, 'Performance Comparison': ESP32, Person "
                  "Detection, with ESP-NN, 380 ms invoke() at 240 MHz (internal memory)",
    },
}


def mobilenet_v1_layers(alpha=0.25, size=96, channels_in=1, classes=2):
    """[(kind, macs, bytes)] of MobileNet v1 as TFLite Micro's person_detection builds it:
    conv 3x3/2, 13 depthwise-separable blocks, average pool, FC, softmax."""
    def ch(c):
        return max(8, int(c * alpha))
    h = -(-size // 2)
    c = ch(32)
    out = [("conv", h * h * c * channels_in * 9, 0)]
    for co, s in [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + \
            [(1024, 2), (1024, 1)]:
        h = -(-h // s)
        out.append(("dw", h * h * c * 9, 0))
        out.append(("pw", h * h * c * ch(co), 0))
        c = ch(co)
    out.append(("avgpool", 0, h * h * c + c))
    out.append(("fc", c * classes, 0))
    out.append(("softmax", 0, 2 * classes))
    return out


def board_cpu_check(board):
    """The board CPU model's time for a published network vs the published figure."""
    from dnnfab.sw.metrics import MetricModel
    pub = PUBLISHED_CPU.get(board)
    if pub is None:
        return {"board": board, "note": "no published whole-network CPU time found for this "
                                        "board's CPU (see docs/metrics.md)"}
    mm = MetricModel(board)
    t = sum(mm.cpu_board_s(m, b, k == "dw", workers=1)[0] for k, m, b in mobilenet_v1_layers())
    macs = sum(m for _, m, _ in mobilenet_v1_layers())
    return {"board": board, **pub, "macs": macs, "model_ms": round(t * 1e3, 1),
            "rel_err": round((t * 1e3 - pub["measured_ms"]) / pub["measured_ms"], 4)}


def _stats(errs, limit):
    a = [abs(e) for e in errs]
    if not a:
        return {}
    return {"median_abs_err": statistics.median(a), "worst_abs_err": max(a),
            "within": sum(x <= limit for x in a) / len(a), "limit": limit, "n": len(a)}


def validate(models=DEFAULT_MODELS, board="ulx3s-85f", workers=1, repeats=5, backend="model",
             profile_path=None):
    from dnnfab.sw.cpu.profile import CpuProfile, layer_signature
    from dnnfab.sw.metrics import MetricModel
    import os
    report = {"board": board, "workers": workers, "repeats": repeats, "backend": backend,
              "machine": platform.processor() or platform.machine(),
              "load_avg_at_start": list(os.getloadavg()), "models": {}}
    for name in models:
        t0 = time.perf_counter()
        qg = _load(name)
        prof = CpuProfile(profile_path) if profile_path else CpuProfile()
        mm = MetricModel(board, host="local", profile=prof, repeats=repeats)
        nc = mm.network(qg, workers=workers, splits=())
        report["machine"] = prof.machine
        by_name = {x.name: x for x in qg.layers}
        meas, engines = _measure_cpu(qg, workers, repeats)
        again, _ = _measure_cpu(qg, workers, repeats)       # the noise floor of a measurement
        rows = []
        for L in nc.layers:
            # the CPU's own time (the runtime's per-layer cost, runtime_layer_s, is
            # validated by scripts/bench_runtime.py against real runs)
            m = L.options["cpu"].latency_s * 1e3 - mm.runtime_layer_s() * 1e3
            mmin = prof.latency_ms(layer_signature(qg, by_name[L.name], engines[L.name]),
                                   workers, "min")
            (x, xmin), (y, ymin) = meas[L.name], again[L.name]
            rows.append({"layer": L.name, "op": L.op, "model_ms": round(m, 4),
                         "measured_ms": round(x, 4), "rel_err": round((m - x) / x, 4),
                         "remeasured_ms": round(y, 4), "repeat_rel_err": round((y - x) / x, 4),
                         "model_min_ms": round(mmin, 4), "measured_min_ms": round(xmin, 4),
                         "min_rel_err": round((mmin - xmin) / xmin, 4),
                         "min_repeat_rel_err": round((ymin - xmin) / xmin, 4)})
        total_m = sum(r["model_ms"] for r in rows)
        total_x = sum(r["measured_ms"] for r in rows)
        big = [r for r in rows if r["measured_ms"] >= BIG_MS]
        cpu = {"layers": rows, **_stats([r["rel_err"] for r in rows], 0.20),
               "time_weighted_abs_err": round(sum(abs(r["rel_err"]) * r["measured_ms"] for r in rows)
                                              / total_x, 4),
               "layers_over_0.1ms": _stats([r["rel_err"] for r in big], 0.20),
               "repeatability": _stats([r["repeat_rel_err"] for r in rows], 0.20),
               "min": _stats([r["min_rel_err"] for r in rows], 0.20),
               "min_repeatability": _stats([r["min_repeat_rel_err"] for r in rows], 0.20),
               # the per-layer shape with the network-wide drift (load) divided out
               "drift_removed": _stats([(r["model_ms"] * total_x / total_m - r["measured_ms"])
                                        / r["measured_ms"] for r in rows], 0.20),
               "total_model_ms": round(total_m, 3), "total_measured_ms": round(total_x, 3),
               "total_rel_err": round((total_m - total_x) / total_x, 4)}
        # fabric: modelled cycles per launch vs the driver's CYCLES counter
        net = mm.compiled(qg)
        got = _driver_cycles(net, mm.cfg, backend)
        frows = []
        for L in nc.layers:
            o = L.options.get("fabric")
            if o is None:
                continue
            mc, dc = o.detail["cycles"], got[L.name]
            frows.append({"layer": L.name, "model_cycles": mc, "driver_cycles": dc,
                          "rel_err": round((mc - dc) / dc, 6) if dc else 0.0,
                          "model_latency_ms": round(o.latency_s * 1e3, 4),
                          "bound": o.detail["bound"]})
        fab = {"layers": frows, **_stats([r["rel_err"] for r in frows],
                                         0.02 if backend == "rtl" else 0.0)}
        report["models"][name] = {"cpu": cpu, "fabric": fab,
                                  "wall_s": round(time.perf_counter() - t0, 1)}
    allc = [r["rel_err"] for m in report["models"].values() for r in m["cpu"]["layers"]]
    report["cpu_summary"] = _stats(allc, 0.20)
    big = [r["rel_err"] for m in report["models"].values() for r in m["cpu"]["layers"]
           if r["measured_ms"] >= BIG_MS]
    report["cpu_summary_over_0.1ms"] = _stats(big, 0.20)
    rep = [r["repeat_rel_err"] for m in report["models"].values() for r in m["cpu"]["layers"]]
    report["cpu_repeatability"] = _stats(rep, 0.20)
    mins = [r["min_rel_err"] for m in report["models"].values() for r in m["cpu"]["layers"]]
    report["cpu_summary_min"] = _stats(mins, 0.20)
    minrep = [r["min_repeat_rel_err"] for m in report["models"].values()
              for r in m["cpu"]["layers"]]
    report["cpu_repeatability_min"] = _stats(minrep, 0.20)
    report["load_avg_at_end"] = list(os.getloadavg())
    report["board_cpu_check"] = [board_cpu_check(b) for b in ("ulx3s-85f", "pynq-z2")]
    allf = [r["rel_err"] for m in report["models"].values() for r in m["fabric"]["layers"]]
    report["fabric_summary"] = _stats(allf, 0.02 if backend == "rtl" else 0.0)
    return report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    ap.add_argument("--board", default="ulx3s-85f")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backend", default="model")
    ap.add_argument("--shared-profile", action="store_true",
                    help="read the shared ~/.cache/dnnfab/cpu_profile.json (measured whenever, "
                         "under whatever load) instead of a profile measured afresh in this run")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "benchmarks" /
                                         "metrics_validation.json"))
    a = ap.parse_args(argv)
    import tempfile
    with tempfile.TemporaryDirectory() as td:
        prof = None if a.shared_profile else Path(td) / "cpu_profile.json"
        rep = validate(a.models, a.board, a.workers, a.repeats, a.backend, profile_path=prof)
    rep["profile"] = "shared ~/.cache/dnnfab/cpu_profile.json" if a.shared_profile else \
        "measured afresh at the start of each model (CpuProfile.measure, temporary file)"
    Path(a.out).write_text(json.dumps(rep, indent=1) + "\n")
    for n, m in rep["models"].items():
        c, f = m["cpu"], m["fabric"]
        print(f"{n}: cpu median |err| {c['median_abs_err']:.1%}, worst {c['worst_abs_err']:.1%}, "
              f"{c['within']:.0%} within 20% ({c['n']} layers), time-weighted "
              f"{c['time_weighted_abs_err']:.1%}, total {c['total_rel_err']:+.1%}; repeat median "
              f"{c['repeatability']['median_abs_err']:.1%}; "
              f"fabric worst |err| {f.get('worst_abs_err', 0):.2%} ({f.get('n', 0)} launches)")
    for b in rep["board_cpu_check"]:
        if "model_ms" in b:
            print(f"{b['board']} CPU model: {b['network']}: {b['model_ms']} ms vs published "
                  f"{b['measured_ms']} ms ({b['rel_err']:+.1%})")
    s = rep["cpu_summary"]
    print(f"all: cpu median {s['median_abs_err']:.1%}, worst {s['worst_abs_err']:.1%}, "
          f"{s['within']:.0%} of {s['n']} layers within 20%; layers >= {BIG_MS} ms: "
          f"{rep['cpu_summary_over_0.1ms'].get('within', 0):.0%} of "
          f"{rep['cpu_summary_over_0.1ms'].get('n', 0)} within 20%; a second measurement vs the "
          f"first: median {rep['cpu_repeatability']['median_abs_err']:.1%}, "
          f"{rep['cpu_repeatability']['within']:.0%} within 20%")
    s, r = rep["cpu_summary_min"], rep["cpu_repeatability_min"]
    print(f"by the fastest of the same runs: {s['within']:.0%} within 20% (median "
          f"{s['median_abs_err']:.1%}); a second measurement vs the first {r['within']:.0%} "
          f"-> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
