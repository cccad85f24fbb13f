#!/usr/bin/env python3
"""Benchmark of issue 17: the session on the model backend vs the integer reference.

For every model (default: the nine onnx "light" zoo models plus digits-cnn and
eeg-seizure), side by side in one process: ``InferenceSession.run`` (backend "model",
compiled, warm) and ``run_reference`` (the integer reference on the CPU), in alternating blocks of
``--repeats`` runs (two blocks each), the minimum kept (this machine is shared and noisy). Also the
whole-network fabric efficiency (sum of MACs / (sum of cycles x R x C)) with and without
in-place chaining / cross-layer overlap, and for ``--compile-model`` the first-call
(compile, cold cache) and cached-call times.

    python scripts/bench_session.py --json benchmarks/session.json
    python scripts/bench_session.py --models digits-cnn squeezenet --repeats 2   # smaller
"""

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

import numpy as np

LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
         "shufflenet", "squeezenet", "vgg19", "zfnet512"]
DEFAULT_MODELS = ["digits-cnn", "eeg-seizure"] + LIGHT


def _feed(sess, seed=5):
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sess.get_inputs()}


def bench_model(name, repeats, cache_dir, progress=None):
    import dnnfab
    from dnnfab.sw.cpu.reference import run_reference
    from dnnfab.sw.compiler.network import compile_network
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        sess = dnnfab.InferenceSession(name, cache_dir=cache_dir)
        t_construct = time.perf_counter() - t0
    feed = _feed(sess)
    feed_q = sess.qg.quantize_inputs(feed)
    t0 = time.perf_counter()
    out = sess.run_int(feed)
    t_first = time.perf_counter() - t0
    ref = run_reference(sess.qg, feed_q, options=sess.options)
    exact = all(np.array_equal(out[k], ref[k]) for k in ref)
    # blocks of runs, alternating (not run by run: onnxruntime's thread pool spins for a
    # while after each of its runs and would slow whatever runs next on a 2-core machine)
    ts, tr = [], []
    for _ in range(2):
        for _ in range(repeats):
            t0 = time.perf_counter()
            sess.run_int(feed)
            ts.append(time.perf_counter() - t0)
        for _ in range(repeats):
            t0 = time.perf_counter()
            run_reference(sess.qg, feed_q, options=sess.options)
            tr.append(time.perf_counter() - t0)
    net = sess.net
    base = compile_network(sess.qg, sess.cfg, chain=False, cache_dir=cache_dir)
    prof = sess.profile()
    rec = {
        "model": name,
        "bit_exact": bool(exact),
        "session_ms": min(ts) * 1e3,
        "reference_ms": min(tr) * 1e3,
        "ratio": min(ts) / min(tr),
        "session_ms_all": [t * 1e3 for t in ts],
        "reference_ms_all": [t * 1e3 for t in tr],
        "construct_s": t_construct,
        "first_run_s": t_first,
        "fabric_layers": sum(r["target"] == "fabric" for r in prof),
        "layers": len(prof),
        "runs": len(net.runs),
        "runs_unchained": len(base.runs),
        "fabric_cycles": sum(r.cycles for r in net.runs),
        "fabric_cycles_unchained": sum(r.cycles for r in base.runs),
        "efficiency": net.efficiency(),
        "efficiency_unchained": base.efficiency(),
        "dram_bytes": net.dram_bytes,
        "arena_bytes": net.arena_bytes,
        "arena_bytes_unchained": base.arena_bytes,
        "plan_launches": sess.dev.backend.fm.plan_runs,
        "launches": sess.dev.backend.launches,
    }
    sess.close()
    return rec


def bench_compile(name, cache_root):
    """First call (cold cache: quantize + compile + load + run), a new session on the
    warm cache (construct + first run), and a steady run."""
    import dnnfab
    d = tempfile.mkdtemp(prefix="dnnfab_cc_", dir=cache_root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        s = dnnfab.InferenceSession(name, cache_dir=d)
        t1 = time.perf_counter()
        feed = _feed(s)
        s.run_int(feed)
        t2 = time.perf_counter()
        compile_s = s.compile_s
        s.close()
        s = dnnfab.InferenceSession(name, cache_dir=d)
        t3 = time.perf_counter()
        s.run_int(feed)
        t4 = time.perf_counter()
        s.run_int(feed)
        t5 = time.perf_counter()
        cached_compile_s = s.compile_s
        s.close()
    return {"model": name, "construct_s": t1 - t0, "first_run_cold_s": t2 - t1,
            "compile_cold_s": compile_s, "construct_again_s": t3 - t2,
            "first_run_cached_s": t4 - t3, "compile_cached_s": cached_compile_s,
            "steady_run_s": t5 - t4}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compile-model", default="resnet50", help="'' to skip")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    from tqdm import tqdm
    cache_root = tempfile.mkdtemp(prefix="dnnfab_bench_")
    recs = []
    for name in tqdm(args.models, desc="models", file=sys.stderr):
        recs.append(bench_model(name, args.repeats, os.path.join(cache_root, "cc")))
    comp = bench_compile(args.compile_model, cache_root) if args.compile_model else None
    out = {"models": recs, "compile": comp,
           "target_ratio": 3.0,
           "all_within_target": all(r["ratio"] <= 3.0 for r in recs),
           "all_bit_exact": all(r["bit_exact"] for r in recs),
           "machine": os.uname().machine, "cpus": os.cpu_count()}
    print(f"{'model':14} {'exact':5} {'session ms':>10} {'ref ms':>8} {'ratio':>6} "
          f"{'runs':>5} {'eff':>6} {'eff unch':>8}")
    for r in recs:
        print(f"{r['model']:14} {str(r['bit_exact']):5} {r['session_ms']:10.1f} "
              f"{r['reference_ms']:8.1f} {r['ratio']:6.2f} {r['runs']:5d} "
              f"{r['efficiency']:6.3f} {r['efficiency_unchained']:8.3f}")
    if comp:
        print("compile:", ", ".join(f"{k} {v:.2f}" for k, v in comp.items() if k != "model"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if out["all_bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
