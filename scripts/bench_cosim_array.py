#!/usr/bin/env python3
"""Co-simulation speed of the 8x8 systolic array on Verilator and Icarus.

For each simulator: a fresh (uncached) build of the generated 8x8 array, then the cocotb
GEMM testbench on (1) one 8x8 weight tile column with K=256 (32 K tiles of N=64 rows: the
cycle count must equal the analytical formula) and (2) a longer GEMM for throughput.
Writes JSON (``--out``) and prints a table: build seconds, simulated cycles, wall seconds,
simulated cycles per wall second.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/cosim_array_speed.json")
    ap.add_argument("--sims", default="verilator,icarus")
    args = ap.parse_args(argv)
    results = []
    for sim in args.sims.split(","):
        with tempfile.TemporaryDirectory() as cache:
            os.environ["DNNFAB_CACHE"] = cache          # fresh build for an honest build time
            from dnnfab.hw.config import AcceleratorConfig
            from dnnfab.hw.systolic import stream_cycles
            from dnnfab.cosim.designs import generated
            from dnnfab.cosim import runner
            cfg = AcceleratorConfig(rows=8, cols=8)
            vfile, module, manifest = generated(cfg, "array")
            rep = Path(cache) / "r.json"
            cases = [{"n": 64, "k": 256, "m": 8, "seed": 1}, {"n": 256, "k": 256, "m": 32, "seed": 2}]
            params = dict(rows=8, cols=8, input_bits=8, weight_bits=8, acc_bits=32,
                          tag_bits=manifest["array"]["tag_bits"], cases=cases, report=str(rep))
            t0 = time.monotonic()
            res = runner.run([vfile], module, "dnnfab.cosim.tb_systolic", sim=sim, params=params)
            report = json.loads(rep.read_text())
            tile, big = report
            results.append({
                "simulator": sim, "build_s": round(res.build_s, 2),
                "k256_tile_cycles": tile["cycles"], "k256_model_cycles": tile["model_cycles"],
                "k256_formula_equal": tile["cycles"] == tile["model_cycles"],
                "throughput_case": big["case"], "sim_cycles": big["sim_cycles"],
                "sim_wall_s": round(big["wall_s"], 3),
                "cycles_per_s": round(big["sim_cycles"] / big["wall_s"]),
                "total_wall_s": round(time.monotonic() - t0, 2),
            })
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'sim':10s} {'build s':>8s} {'K=256 cycles':>13s} {'formula':>8s} {'cycles/s':>10s}")
    for r in results:
        print(f"{r['simulator']:10s} {r['build_s']:8.1f} {r['k256_tile_cycles']:13d} "
              f"{r['k256_model_cycles']:8d} {r['cycles_per_s']:10d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
