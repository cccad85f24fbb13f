#!/usr/bin/env python3
"""Fuzz the accelerator RTL with random layers against the reference and the fast model.

    python scripts/fuzz_rtl.py --count 300 --seed 1 [--config 8x8|small|cfg.json] [--json]

Draws ``--count`` random layers (:func:`dnnfab.cosim.fuzz.draw_spec`: row bands, K chunks,
M tiles, strides 1-3, padding, dilation, 1x1 / 7x7 kernels, GEMMs, channel counts that are
not multiples of the array, one-pixel and one-row outputs, extreme values and zero
points), compiles each, checks the fast model (token machine: no deadlock; bit-exact) and
runs them on the RTL (Verilator, many layers per simulator launch) with a cycle watchdog
of ``2 x model estimate + 10000``. A case passes when the RTL finished, its output is
bit-exact with the reference, every perf counter is right (checked by the testbench) and
its cycles are within ``--tolerance`` (2 %, at least ``--min-slack`` cycles) of the
model's. A failing case is printed as one JSON line (its repro: ``--repro LINE`` runs it
again) and the run goes on.

``--json`` prints one object: ``cases``, ``passed``, ``failures`` (list of repros with the
reason), ``config``, ``wall_s``, ``sim_cycles``, ``model_error`` (max / mean relative).
"""

import argparse
import json
import sys
import time
from pathlib import Path

CONFIGS = {
    # the default accelerator (64 KiB scratchpads, 128-bit bus)
    "8x8": dict(rows=8, cols=8),
    # small scratchpads: every corner (bands, K chunks, slot rings) at small sizes
    "small": dict(rows=4, cols=4, bus_bits=64, act_kib=8, wgt_kib=8, acc_kib=8, out_kib=4, aux_kib=1),
}


def load_config(name):
    from dnnfab.hw.config import AcceleratorConfig
    if name in CONFIGS:
        return AcceleratorConfig(**CONFIGS[name])
    path = Path(name)
    if not path.exists():
        raise SystemExit(f"fuzz_rtl: error: unknown config {name!r}; use {', '.join(CONFIGS)} or a JSON file")
    return AcceleratorConfig.from_dict(json.loads(path.read_text()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--config", default="8x8", help="8x8 (default accelerator), small, or a config JSON file")
    ap.add_argument("--sim", default="verilator", choices=("verilator", "icarus"))
    ap.add_argument("--max-cycles", type=int, default=60000, help="redraw cases the model estimates longer")
    ap.add_argument("--tolerance", type=float, default=0.02, help="allowed |RTL - model| / RTL cycles")
    ap.add_argument("--min-slack", type=int, default=16, help="allowed |RTL - model| cycles at least")
    ap.add_argument("--batch", type=int, default=100, help="layers per simulator launch")
    ap.add_argument("--repro", help="run one case given as its JSON line (a failure printed by a run)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--out", help="also write the JSON object here")
    ap.add_argument("--records", help="write every RTL case (spec, RTL and model cycles) here, one JSON line each")
    args = ap.parse_args(argv)
    if args.count < 1:
        raise SystemExit("fuzz_rtl: error: --count must be at least 1")

    from tqdm import tqdm
    from dnnfab.hw.config import AcceleratorConfig
    from dnnfab.cosim.fuzz import draw_cases, estimate, with_limit, fuzz

    t0 = time.monotonic()
    if args.repro:
        rep = json.loads(args.repro)
        cfg = AcceleratorConfig.from_dict(rep["config"])
        spec = {k: v for k, v in rep["layer"].items() if k != "limit"}
        est = estimate(cfg, spec)
        cases, rejected = [(with_limit(spec, est), est)], 0
    else:
        cfg = load_config(args.config)
        cases, rejected = draw_cases(cfg, args.count, args.seed, args.max_cycles)
    records = open(args.records, "w") if args.records else None
    out = fuzz(cfg, cases, sim=args.sim, tolerance=args.tolerance, min_slack=args.min_slack,
               batch=args.batch, progress=not args.json or sys.stderr.isatty(),
               on_failure=lambda rep: tqdm.write(json.dumps(rep), file=sys.stderr), records=records)
    out.pop("results")
    out.update(seed=args.seed, redrawn=rejected, wall_s=round(time.monotonic() - t0, 1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['cases']} cases on {cfg.rows}x{cfg.cols} ({cfg.bus_bits}-bit bus): {out['passed']} passed, "
              f"{len(out['failures'])} failed; {out['sim_cycles']} simulated cycles in {out['wall_s']} s; model error "
              f"max {100 * out['model_error']['max_abs']:.2f} %, mean {100 * out['model_error']['mean']:+.2f} %")
    return 0 if not out["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
