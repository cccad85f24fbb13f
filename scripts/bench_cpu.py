#!/usr/bin/env python
"""Wall time of the CPU workers (dnnfab.sw.cpu.workers.CpuWorkers; its thread pool) at 1
and 2 threads vs onnxruntime running the project's exported QDQ int8 model with the same
thread count, batch 1, side by side in one run.

Models: digits-cnn, eeg-seizure and the nine ONNX "light" zoo models (weights randomized
as in tests/sw/models_helper.py; timing does not depend on the values). Each model is
quantized, exported (``QuantizedNetwork.export``) and run by onnxruntime's default
session (its fused int8 kernels; *not* bit-exact on CPUs without VNNI -- the speed a user
would otherwise get). The workers' time includes quantizing the float input and
dequantizing the outputs, like the QDQ model's. Every round times the four runs back to
back (each after an idle pause and an untimed warm-up call: onnxruntime's default pool
spins for a while after a run and would steal the CPU from the next one); reported are
median times and the median over rounds of the per-round ratios, so load swings on a
shared machine hit both sides of a ratio alike. ``workers_ms_2t_processes``: the same
2-thread workers with helper *processes* instead of a second thread
(``Options(pool="processes")``, sw/cpu/procpool.py), after its helpers have prepared and
it has calibrated (``processes_mode``: ``helpers`` -- slices to a helper process --,
``native`` -- the graph in one helper process whose GEMMs use onnxruntime's own 2-thread
pool -- or ``caller`` alone; ``processes_calibration_ms``: the fastest calibration run of
each). ``workers_ms_2t_profiled``: the pool at 2
threads guided by a CPU profile measured in the same run (``CpuWorkers(profile=...)``:
layers that were no faster on 2 threads than on 1 are not split). ``machine_scaling`` times one exact
uint8 GEMM on 1 thread and the same work twice on 2 threads, concurrently, in the same
run: the 2-thread ceiling the machine offered at that time. ``best_ms`` (and the ``*_best``
ratios) are the fastest of the rounds: other tenants of a shared machine only ever add
time, so the best round is the closest to a quiet machine.

    python scripts/bench_cpu.py [--json] [--out benchmarks/cpu.json] [--models a,b] [--repeat 9]
    python scripts/bench_cpu.py --profile [--models a,b]   # fill ~/.cache/dnnfab/cpu_profile.json

``--profile`` skips the comparison and measures the per-layer CPU latency profile
(:class:`dnnfab.sw.cpu.profile.CpuProfile`, 1 and 2 threads) of the models instead.

Targets: workers <= 1.0x onnxruntime int8 at 2 threads on every conv-heavy model (conv
MACs >= half of all MACs), 2-thread speed-up >= 1.7x.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLED = ["digits-cnn", "eeg-seizure"]


def _load(name, mh):
    import numpy as np
    import dnnfab
    from dnnfab.models import datasets
    if name == "digits-cnn":
        g = dnnfab.load(name)
        x = datasets.digits_split()[0]
        return g, dnnfab.quantize(g, calibration=x[:64]), {g.inputs[0].name: x[:1]}
    if name == "eeg-seizure":
        g = dnnfab.load(name)
        x = datasets.eeg_model_input(datasets.eeg_windows(32, seed=datasets.EEG_TRAIN_SEED)[0])
        return g, dnnfab.quantize(g, calibration=x), {g.inputs[0].name: x[:1]}
    g = dnnfab.load(mh.randomized(name), name=name)
    rng = np.random.default_rng(0)
    shape = g.inputs[0].shape
    q = dnnfab.quantize(g, calibration=rng.standard_normal((2,) + shape[1:]).astype(np.float32))
    return g, q, {g.inputs[0].name: rng.standard_normal(shape).astype(np.float32)}


def _macs(q):
    import numpy as np
    conv = other = 0
    for L in q.layers:
        if L.op == "conv":
            n, _, ho, wo = (tuple(q.shape(L.output)) + (1,))[:4] if len(q.shape(L.output)) == 3 \
                else q.shape(L.output)
            conv += int(n * ho * wo) * int(np.prod(L.qweight.shape))
        elif L.op == "gemm":
            other += int(np.prod(q.shape(L.input)[:-1])) * int(np.prod(L.qweight.shape))
    return conv, other


def _ort_session(model, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def machine_scaling(repeat=5):
    """(1-thread ms, 2-thread ms for twice the work, scaling) of an exact u8u8 GEMM."""
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor
    from dnnfab.sw.cpu.workers import _matmul_session
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (576, 64)).astype(np.int8)
    a = rng.integers(0, 256, (3136, 576)).astype(np.uint8)
    e1, e2 = _matmul_session(w, "ort-u8u8"), _matmul_session(w, "ort-u8u8")
    ex = ThreadPoolExecutor(1)

    def one():
        for _ in range(3):
            e1(a)

    def two():
        f = ex.submit(lambda: [e2(a) for _ in range(3)])
        one()
        f.result()
    one(), two()
    s, d = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        one()
        s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        two()
        d.append(time.perf_counter() - t0)
    ex.shutdown()
    s, d = statistics.median(s) * 1e3, statistics.median(d) * 1e3
    return dict(gemm="3136x576x64 u8u8 x3", one_thread_ms=round(s, 3),
                two_threads_twice_the_work_ms=round(d, 3), scaling=round(2 * s / d, 2))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="write the JSON file (--out)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "cpu.json"))
    ap.add_argument("--models", default="", help="comma-separated subset")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--profile", action="store_true",
                    help="measure the per-layer latency profile (cached on disk) instead")
    ap.add_argument("--profile-path", default=None, help="profile file (default ~/.cache/dnnfab)")
    ap.add_argument("--pause", type=float, default=0.05,
                    help="seconds of idle before each timed call (lets spinning pools sleep)")
    args = ap.parse_args(argv)

    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "tests", "sw"))
    import models_helper as mh
    from dnnfab.sw.cpu.engines import CpuFeatures
    from dnnfab.sw.cpu.options import Options
    import tempfile
    from dnnfab.sw.cpu.profile import CpuProfile
    from dnnfab.sw.cpu.workers import CpuWorkers
    from dnnfab.sw.ir.qgraph import dequantize_tensor
    tmpdir = tempfile.mkdtemp(prefix="dnnfab-bench-cpu-")

    names = [n for n in args.models.split(",") if n] or BUNDLED + mh.LIGHT_MODELS
    feats = CpuFeatures.detect()
    if args.profile:
        prof = CpuProfile(args.profile_path)
        for name in names:
            _, q, feed = _load(name, mh)
            res = prof.measure(q, threads=(1, 2), feed_q=q.quantize_inputs(feed))
            t1 = sum(v[1] for v in res.values())
            t2 = sum(v[2] for v in res.values())
            print(f"{name:14s} {len(res):4d} layers  sum of layer medians {t1:9.2f} ms (1 thread) "
                  f"{t2:9.2f} ms (2 threads)", flush=True)
        print(f"profile: {prof.path} ({len(prof.signatures())} signatures)")
        return 0
    results = []
    scaling_before = machine_scaling()
    for name in names:
        _, q, feed = _load(name, mh)
        conv_macs, fc_macs = _macs(q)
        model = q.export()
        sess = {t: _ort_session(model, t) for t in (1, 2)}
        # the thread pool (``Options()`` alone would be the process pool, the default of
        # run(), whose helpers would then start and calibrate inside the timed rounds)
        threads_pool = Options(pool="threads")
        workers = {t: CpuWorkers(q, threads=t, options=threads_pool) for t in (1, 2)}
        net_plan = workers[1].pool_report()["kind"] == "plan"
        if net_plan:    # a small network runs as one NetPlan: layer by layer beside it
            workers["layers"] = CpuWorkers(q, threads=1, options=threads_pool.replace(net_plan=False))
        # the profile-guided pool: this run's own per-layer profile (1 and 2 threads),
        # layers that were no faster on 2 threads stay whole
        prof = CpuProfile(os.path.join(tmpdir, "cpu_profile.json"))
        prof.measure(q, threads=(1, 2), repeats=3, feed_q=q.quantize_inputs(feed))
        workers["2p"] = CpuWorkers(q, threads=2, options=threads_pool, profile=prof)
        unsplit = sum("note" in r for r in workers["2p"].engine_report().values())
        # a helper process instead of a second thread (Options(pool="processes"))
        workers["proc"] = CpuWorkers(q, threads=2, options=Options(pool="processes"))
        procs_ready = workers["proc"].wait_ready()

        def run_workers(w):
            out = w.run(q.quantize_inputs(feed))
            return {k: dequantize_tensor(v, q.qtensors[k].scale, q.qtensors[k].zero_point)
                    for k, v in out.items()}

        want = q.run_int(feed)
        got = workers[2].run(q.quantize_inputs(feed))
        got_p = workers["proc"].run(q.quantize_inputs(feed))
        exact = all(np.array_equal(got[k], want[k]) and np.array_equal(got_p[k], want[k])
                    for k in want)
        proc_slices = workers["proc"].pool_report()["last_run"] or {}
        fns = {"workers_1t": lambda: run_workers(workers[1]),
               "workers_2t": lambda: run_workers(workers[2]),
               "workers_2t_profiled": lambda: run_workers(workers["2p"]),
               "workers_2t_processes": lambda: run_workers(workers["proc"]),
               "ort_int8_1t": lambda: sess[1].run(None, feed),
               "ort_int8_2t": lambda: sess[2].run(None, feed)}
        if net_plan:
            fns["workers_1t_layers"] = lambda: run_workers(workers["layers"])
        for fn in fns.values():
            fn()
        for _ in range(60):     # calibration: the helper modes and the caller alone
            if workers["proc"].pool_report()["mode"] is not None or not procs_ready:
                break
            fns["workers_2t_processes"]()
        proc_rep = workers["proc"].pool_report()
        pools = {k: workers[k].pool_report()["kind"] for k in (1, 2, "2p", "proc")}
        ts = {k: [] for k in fns}
        ratios, speedups, ratios_p, speedups_p = [], [], [], []
        for _ in range(args.repeat):
            for k, fn in fns.items():
                time.sleep(args.pause)
                fn()
                t0 = time.perf_counter()
                fn()
                ts[k].append(time.perf_counter() - t0)
            ratios.append(ts["workers_2t"][-1] / ts["ort_int8_2t"][-1])
            speedups.append(ts["workers_1t"][-1] / ts["workers_2t"][-1])
            ratios_p.append(ts["workers_2t_processes"][-1] / ts["ort_int8_2t"][-1])
            speedups_p.append(ts["workers_1t"][-1] / ts["workers_2t_processes"][-1])
        med = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
        best = {k: min(v) * 1e3 for k, v in ts.items()}
        rep = workers[2].engine_report()
        engines = collections.Counter(r["engine"] for r in rep.values())
        heavy = collections.Counter()
        for L in q.layers:
            if L.op in ("conv", "gemm"):
                heavy[rep[L.name]["engine"]] += 1
        for w in workers.values():
            w.close()
        row = dict(model=name, workers_ms_1t=round(med["workers_1t"], 3),
                   workers_ms_2t=round(med["workers_2t"], 3),
                   ort_int8_ms_1t=round(med["ort_int8_1t"], 3),
                   ort_int8_ms_2t=round(med["ort_int8_2t"], 3),
                   speedup_2t_vs_1t=round(statistics.median(speedups), 2),
                   ort_speedup_2t_vs_1t=round(med["ort_int8_1t"] / med["ort_int8_2t"], 2),
                   ratio_vs_ort_int8_2t=round(statistics.median(ratios), 2),
                   ratio_vs_ort_int8_1t=round(med["workers_1t"] / med["ort_int8_1t"], 2),
                   workers_ms_2t_profiled=round(med["workers_2t_profiled"], 3),
                   ratio_vs_ort_int8_2t_profiled=round(
                       med["workers_2t_profiled"] / med["ort_int8_2t"], 2),
                   layers_kept_whole_by_profile=unsplit,
                   workers_ms_2t_processes=round(med["workers_2t_processes"], 3),
                   speedup_2t_processes_vs_1t=round(statistics.median(speedups_p), 2),
                   ratio_vs_ort_int8_2t_processes=round(statistics.median(ratios_p), 2),
                   pool_2t=pools[2], pool_2t_profiled=pools["2p"], pool_2t_processes=pools["proc"],
                   processes_ready=procs_ready, processes_slices=proc_slices,
                   processes_mode=proc_rep["mode"],
                   processes_calibration_ms=proc_rep["calibration_ms"],
                   best_ms={k: round(v, 3) for k, v in best.items()},
                   speedup_2t_vs_1t_best=round(best["workers_1t"] / best["workers_2t"], 2),
                   ratio_vs_ort_int8_2t_best=round(best["workers_2t"] / best["ort_int8_2t"], 2),
                   engine=heavy.most_common(1)[0][0] if heavy else engines.most_common(1)[0][0],
                   engines=dict(sorted(engines.items())),
                   conv_heavy=conv_macs >= fc_macs, macs=conv_macs + fc_macs,
                   layers=len(q.layers), bit_exact=exact, net_plan=net_plan)
        if net_plan:
            row["workers_ms_1t_layers"] = round(med["workers_1t_layers"], 3)
        results.append(row)
        print(f"{name:14s} workers {row['workers_ms_1t']:8.2f} / {row['workers_ms_2t']:8.2f}"
              f" / {row['workers_ms_2t_profiled']:8.2f} ms"
              f"  ort int8 {row['ort_int8_ms_1t']:8.2f} / {row['ort_int8_ms_2t']:8.2f} ms"
              f"  speed-up {row['speedup_2t_vs_1t']:4.2f}  ratio(2t) {row['ratio_vs_ort_int8_2t']:4.2f}"
              f"  processes {row['workers_ms_2t_processes']:8.2f} ms ({row['speedup_2t_processes_vs_1t']:4.2f}x,"
              f" ratio {row['ratio_vs_ort_int8_2t_processes']:4.2f})"
              f"  {row['engine']}{'' if exact else '  NOT EXACT'}", flush=True)
    scaling_after = machine_scaling()
    heavy_rows = [r for r in results if r["conv_heavy"]]
    summary = dict(
        machine=dict(cpu=feats.describe(), cores=os.cpu_count(), python=platform.python_version(),
                     u8s8_exact=feats.int8_dot),
        machine_scaling=dict(before=scaling_before, after=scaling_after),
        batch=1, results=results,
        targets=dict(ratio_vs_ort_int8_2t=1.0, speedup_2t_vs_1t=1.7),
        conv_heavy_within_ratio=[r["model"] for r in heavy_rows if r["ratio_vs_ort_int8_2t"] <= 1.0],
        conv_heavy_over_ratio=[r["model"] for r in heavy_rows if r["ratio_vs_ort_int8_2t"] > 1.0],
        speedup_reached=[r["model"] for r in results if r["speedup_2t_vs_1t"] >= 1.7],
        conv_heavy_within_ratio_processes=[r["model"] for r in heavy_rows
                                           if r["ratio_vs_ort_int8_2t_processes"] <= 1.0],
        speedup_reached_processes=[r["model"] for r in results
                                   if r["speedup_2t_processes_vs_1t"] >= 1.7],
        all_bit_exact=all(r["bit_exact"] for r in results))
    print(f"machine 2-thread scaling of an exact GEMM: {scaling_before['scaling']} before, "
          f"{scaling_after['scaling']} after")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")
        print(f"wrote {args.out}")
    return 0 if summary["all_bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
