#!/usr/bin/env python3
"""Run one conv layer from DRAM through the generated accelerator RTL (Verilator) and report.

    python scripts/bench_layer.py --rows 8 --cols 8 --h 18 --w 18 --cin 64 --cout 64 --k 3 \\
        --stride 1 --pad 0 --json

Prints one JSON object: ``cycles`` (CYCLES perf counter, START to DONE), ``macs`` (the
layer's MACs), ``utilization`` (macs / (cycles * rows * cols)), ``bit_exact`` (DRAM result
vs the integer reference), ``scalesim_ws_cycles`` (SCALE-Sim's stall-free weight-stationary
count ceil(K/R)*ceil(M/C)*(2R + C + Npx - 2) - 1), ``physical_limit_cycles``
(ceil(K/R)*ceil(M/C)*Npx), the fast model's estimate, every perf counter and the wall time.
Without ``--json`` a readable table is printed too.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--cols", type=int, default=8)
    ap.add_argument("--bus-bits", type=int, default=128)
    ap.add_argument("--h", type=int, default=18)
    ap.add_argument("--w", type=int, default=18)
    ap.add_argument("--cin", type=int, default=64)
    ap.add_argument("--cout", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--pad", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sim", default="verilator", choices=("verilator", "icarus"))
    ap.add_argument("--json", action="store_true", help="print only the JSON object")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)

    from dnnfab.hw.config import AcceleratorConfig
    from dnnfab.cosim.designs import generated
    from dnnfab.cosim import runner
    from dnnfab.sw.compiler.layer import random_layer
    from dnnfab.sw.compiler.program import compile_layer
    from dnnfab.sw.compiler.fastmodel import estimate_cycles
    from dnnfab.cosim.fuzz import scalesim_ws_cycles
    import numpy as np

    cfg = AcceleratorConfig(rows=args.rows, cols=args.cols, bus_bits=args.bus_bits)
    spec = dict(cin=args.cin, cout=args.cout, k=args.k, stride=args.stride, pad=args.pad,
                hw=[args.h, args.w], seed=args.seed)
    layer = random_layer(np.random.default_rng(args.seed), args.cin, args.cout, k=args.k,
                         stride=args.stride, pad=args.pad, in_hw=(args.h, args.w))
    prog = compile_layer(layer, cfg)
    est = estimate_cycles(prog)

    t0 = time.monotonic()
    vfile, module, _ = generated(cfg, "accelerator")
    with tempfile.TemporaryDirectory() as tmp:
        rep = Path(tmp) / "report.json"
        res = runner.run([vfile], module, "dnnfab.cosim.tb_accel", sim=args.sim, testcase="layers",
                         params={"config": cfg.to_dict(), "layers": [spec], "report": str(rep)})
        report = json.loads(rep.read_text())[0]
    wall = time.monotonic() - t0

    oh, ow = layer.out_hw
    scalesim, physical = scalesim_ws_cycles(layer, cfg)
    cycles = report["cycles"]
    out = {
        "config": cfg.to_dict(),
        "layer": spec,
        "cycles": cycles,
        "macs": layer.macs,
        "utilization": layer.macs / (cycles * cfg.rows * cfg.cols),
        "bit_exact": report["bit_exact"],
        "scalesim_ws_cycles": scalesim,
        "ratio_to_scalesim": cycles / scalesim,
        "physical_limit_cycles": physical,
        "model_cycles": est.cycles,
        "model_error": (est.cycles - cycles) / cycles,
        "counters": report["counters"],
        "instructions": len(prog.insns),
        "simulator": args.sim,
        "build_s": round(res.build_s, 2),
        "sim_wall_s": round(report["wall_s"], 2),
        "sim_cycles_per_s": round(cycles / report["wall_s"]),
        "wall_s": round(wall, 2),
    }
    text = json.dumps(out, indent=None if args.json else 2)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    if args.json:
        print(text)
    else:
        c = out["counters"]
        print(f"layer {args.h}x{args.w}x{args.cin} -> {oh}x{ow}x{args.cout}, k={args.k} s={args.stride} "
              f"p={args.pad} on {cfg.rows}x{cfg.cols} ({cfg.bus_bits}-bit bus)")
        rows = [("cycles (START..DONE)", cycles), ("SCALE-Sim WS cycles", scalesim),
                ("cycles / SCALE-Sim", f"{out['ratio_to_scalesim']:.4f}"),
                ("physical limit", out["physical_limit_cycles"]),
                ("utilization", f"{out['utilization']:.4f}"), ("fast-model cycles", est.cycles),
                ("array busy cycles", c["BUSY_CYCLES"]), ("stall cycles", c["STALL_CYCLES"]),
                ("DMA read bytes", c["DMA_RD_BYTES"]), ("DMA write bytes", c["DMA_WR_BYTES"]),
                ("bit exact", out["bit_exact"]), ("simulated cycles/s", out["sim_cycles_per_s"])]
        for k, v in rows:
            print(f"  {k:24s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
