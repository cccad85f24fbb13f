#!/usr/bin/env python
"""Exactness and speed of the integer GEMM engines of the reference, side by side.

For each shape (M, K, N), int8 activations [M, K] and int8 weights [K, N] with the
extremes present (activation rows of -128 and 127, i.e. uint8 0 and 255 after the +128
shift; weight columns of -128 and 127), every engine computes the int32 accumulators
from the int8 activations (its input conversion included) and is compared with int64
numpy; ``wrong`` counts the outputs that differ. Rounds interleave the engines; the
table gives the median time per call and GOPS = 2*M*K*N / time.

Engines:
  ort u8u8      the reference's 'ort' engine: MatMulInteger(x + 128, w + 128, 0, 128)
                (exact by construction; reference.PreparedGemm / _OrtMatMulInteger)
  ort u8u8 fold MatMulInteger(x + 128, w + 128) without zero points, -128 * rowsum(x + 128)
                subtracted in numpy (the same arithmetic, fix-up outside the session)
  ort u8s8      MatMulInteger(x + 128, w) -- what the reference used before; saturates
                int16 pair sums on x86 CPUs without VNNI
  f32 BLAS      the reference's 'numpy' engine: float32 BLAS, K chunked at 1024
  f64 BLAS      float64 BLAS (exact: every sum < 2^53)
  int64 numpy   np.matmul on int64 (no BLAS)

    python scripts/bench_gemm.py [--json] [--repeat 15] [--shapes 3136x576x64,...]

The threads are the reference's (``DNNFAB_THREADS``, default min(2, cores)) for the
onnxruntime sessions and numpy's BLAS default for the BLAS engines.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

DEFAULT_SHAPES = "3136x576x64,784x1152x128,196x2304x256,1x9216x4096"


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def engines(w, threads):
    from onnx import TensorProto, helper, numpy_helper

    from dnnfab.sw.cpu import reference as R

    k, n = w.shape
    prep = R.PreparedGemm(w)

    def plain_session(w_init, a_dtype=TensorProto.UINT8):
        return R._ort_session(
            [helper.make_node("MatMulInteger", ["a", "w"], ["y"])],
            [helper.make_tensor_value_info("a", a_dtype, ["M", k])],
            [helper.make_tensor_value_info("y", TensorProto.INT32, ["M", n])],
            [numpy_helper.from_array(w_init, "w")], threads)

    u8u8 = R._OrtMatMulInteger(w, threads)
    u8u8_plain = plain_session(R._u8_weights(w))
    u8s8 = plain_session(np.ascontiguousarray(w))
    colsum = prep.colsum
    wf64 = w.astype(np.float64)
    w64 = w.astype(np.int64)

    def shifted(x):
        return x.view(np.uint8) ^ np.uint8(0x80)

    def e_u8u8(x):
        return u8u8(shifted(x)) - 128 * colsum

    def e_fold(x):
        a = shifted(x)
        acc = u8u8_plain.run(None, {"a": a})[0]
        acc -= (128 * a.sum(axis=1, dtype=np.int32))[:, None]
        return acc - 128 * colsum

    def e_u8s8(x):
        return u8s8.run(None, {"a": shifted(x)})[0] - 128 * colsum

    def e_f32(x):
        return prep.matmul_f32(x.astype(np.float32))

    def e_f64(x):
        return x.astype(np.float64) @ wf64

    def e_i64(x):
        return x.astype(np.int64) @ w64

    return [("ort u8u8", e_u8u8), ("ort u8u8 fold", e_fold), ("ort u8s8", e_u8s8),
            ("f32 BLAS", e_f32), ("f64 BLAS", e_f64), ("int64 numpy", e_i64)]


def bench_shape(m, k, n, repeat, threads, rng):
    x = rng.integers(-128, 128, (m, k)).astype(np.int8)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    x[0] = 127
    if m > 1:
        x[-1] = -128
    w[:, 0], w[:, -1] = 127, -128
    exact = x.astype(np.int64) @ w.astype(np.int64)
    engs = engines(w, threads)
    rows = {}
    for name, f in engs:
        got = np.asarray(f(x)).astype(np.int64)    # warm-up call, also the exactness check
        rows[name] = {"wrong": int((got != exact).sum()), "times": []}
    slow = m * k * n > (1 << 26)  # int64 numpy: a few rounds are enough
    for r in range(repeat):
        for name, f in engs:
            if name == "int64 numpy" and slow and r >= 2:
                continue
            t0 = time.perf_counter()
            f(x)
            rows[name]["times"].append(time.perf_counter() - t0)
    out = []
    for name, _ in engs:
        t = statistics.median(rows[name]["times"])
        out.append({"engine": name, "ms": t * 1e3, "gops": 2 * m * k * n / t / 1e9,
                    "wrong": rows[name]["wrong"], "outputs": m * n})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="MxKxN,... (comma-separated)")
    args = ap.parse_args(argv)
    import onnxruntime as ort

    from dnnfab.sw.cpu import reference as R
    from dnnfab.sw.cpu.options import Options
    threads = Options.from_env().threads
    flags = _cpu_flags()
    info = {"machine": platform.machine(), "cores": os.cpu_count(), "threads": threads,
            "load": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
            "onnxruntime": ort.__version__, "numpy": np.__version__,
            "avx2": "avx2" in flags,
            "vnni": bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})}
    rng = np.random.default_rng(0)
    results = []
    for spec in args.shapes.split(","):
        m, k, n = (int(v) for v in spec.lower().split("x"))
        results.append({"shape": [m, k, n],
                        "engines": bench_shape(m, k, n, args.repeat, threads, rng)})
    if args.json:
        print(json.dumps({"info": info, "results": results}, indent=1))
        return 0
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    for r in results:
        m, k, n = r["shape"]
        print(f"\nM,K,N = {m},{k},{n}")
        print(f"  {'engine':<14} {'ms':>9} {'GOPS':>7} {'wrong':>12}")
        for e in r["engines"]:
            print(f"  {e['engine']:<14} {e['ms']:9.3f} {e['gops']:7.1f} "
                  f"{e['wrong']:>6}/{e['outputs']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
