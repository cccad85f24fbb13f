"""``dnnfab cosim``: run one co-simulation of generated Verilog from the command line.

Everything that can be checked without a simulator is checked first (exit code 2, one
line): the GEMM or layer shape, that the layer maps onto the configuration (the
compiler's own check), and that the simulator is installed. The Verilator build (about
two minutes for a fresh 8x8 accelerator, a second once cached) runs as its own step with
a message on stderr, and a ticking spinner on a terminal.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

from ..errors import ConfigError

__all__ = ["register", "check_gemm", "check_layer"]


def _ints(text, n, what):
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(f"--{what} {text!r}: expected {n} comma-separated integers") from None
    if len(vals) != n:
        raise ConfigError(f"--{what} {text!r}: expected {n} comma-separated integers")
    return vals


def check_gemm(text):
    """``n, k, m`` of ``--gemm`` (each >= 1), or ConfigError."""
    n, k, m = _ints(text, 3, "gemm")
    bad = [f"{nm}={v}" for nm, v in zip("nkm", (n, k, m)) if v < 1]
    if bad:
        raise ConfigError(f"--gemm {text}: {', '.join(bad)}; a GEMM needs n, k, m >= 1 "
                          "(n rows of K inputs times a K x M weight matrix), e.g. --gemm 64,256,8")
    return n, k, m


_LAYER_FIELDS = ("cin", "cout", "k", "stride", "pad", "h", "w")


def check_layer(text, cfg):
    """The ``--layer`` spec dict for the accelerator testbench, or ConfigError.

    Besides the ranges, the layer must map onto ``cfg``: the compiler
    (:func:`dnnfab.sw.compiler.program.compile_layer`) runs here, so a layer it cannot map fails
    before any build with the compiler's reason.
    """
    vals = dict(zip(_LAYER_FIELDS, _ints(text, 7, "layer")))
    bad = [f"{k}={v}" for k, v in vals.items() if v < (0 if k == "pad" else 1)]
    if bad:
        raise ConfigError(f"--layer {text}: {', '.join(bad)}; cin, cout, k, stride, h, w must "
                          "be >= 1 and pad >= 0, e.g. --layer 16,16,3,1,1,8,8")
    spec = dict(cin=vals["cin"], cout=vals["cout"], k=vals["k"], stride=vals["stride"],
                pad=vals["pad"], hw=[vals["h"], vals["w"]])
    import numpy as np
    from ..sw.compiler.layer import random_layer
    from ..sw.compiler.program import compile_layer
    layer = random_layer(np.random.default_rng(0), spec["cin"], spec["cout"], k=spec["k"],
                         stride=spec["stride"], pad=spec["pad"], in_hw=tuple(spec["hw"]))
    from ..errors import DnnfabError
    try:
        compile_layer(layer, cfg)
    except DnnfabError as exc:
        raise ConfigError(f"--layer {text}: {str(exc).removeprefix('layer conv: ')}") from None
    return spec


def _build(sim, sources, module, waves, build_kw=None):
    """Build (or find cached) the simulation model, telling the user what is going on."""
    from . import runner
    print(f"dnnfab: {sim}: building {module} (a fresh build of the accelerator takes about "
          f"two minutes, a cached one a second; cache {runner.cache_root() / 'cosim'})",
          file=sys.stderr, flush=True)
    t0 = time.monotonic()
    if sys.stderr.isatty():
        from rich.console import Console
        con = Console(stderr=True)
        with con.status(f"{sim}: building {module}") as status:
            import threading
            done = threading.Event()

            def tick():
                while not done.wait(1.0):
                    status.update(f"{sim}: building {module}, {time.monotonic() - t0:.0f} s")
            th = threading.Thread(target=tick, daemon=True)
            th.start()
            try:
                _, _, built, secs = runner.build(sources, module, sim, waves, **(build_kw or {}))
            finally:
                done.set()
                th.join()
    else:
        _, _, built, secs = runner.build(sources, module, sim, waves, **(build_kw or {}))
    print(f"dnnfab: {sim}: {'built' if built else 'cached build of'} {module} "
          f"({secs:.0f} s); simulating", file=sys.stderr, flush=True)
    return built, secs


def _print_table(rows):
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())


def cmd_cosim_network(args, cfg):
    """``dnnfab cosim MODEL``: see :mod:`dnnfab.cosim.network`."""
    from .network import cosim_network, table
    from . import runner
    runner.check_simulator(args.sim)
    if args.first_layers is not None and args.first_layers < 1:
        raise ConfigError(f"--first-layers {args.first_layers}: run at least one layer (--first-layers 1 or more)")
    s = cosim_network(args.model, cfg, sim=args.sim, samples=args.samples, waves=args.waves,
                      max_launches=args.first_layers,
                      progress=not args.json or sys.stderr.isatty(),
                      note=lambda text: print(f"dnnfab: {text}", file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        print(f"cosim {s['model']}{' (first layers)' if s['partial'] else ''} on {cfg.rows}x{cfg.cols} {args.sim}: "
              f"{'BIT-EXACT' if s['bit_exact'] else 'MISMATCH'} vs the integer reference "
              f"({s['samples']} sample{'s' * (s['samples'] != 1)}: {s['inputs']})")
        _print_table(table(s))
        print(f"  fabric cycles {s['total_cycles']:,} (model {s['model_total_cycles']:,}); simulated "
              f"{s['sim_cycles']:,} cycles, {s['sim_cycles_per_s']:,} cycles/s of simulator time "
              f"({s['sim_s']:.2f} s; inference {s['run_s']:.2f} s); "
              f"wall {s['wall_s']:.1f} s ({'fresh' if s['build']['built'] else 'cached'} build "
              f"{s['build']['build_s']:.1f} s)")
    if s["failure"] and not args.json:
        f = s["failure"]
        print(f"FAILED at layer {f['layer']} (launch {f['launch']}, sample {f['sample']}): "
              + (f["error"] or f"first difference at {f['first_diff'][0]}: RTL {f['first_diff'][1]}, "
                                f"reference {f['first_diff'][2]}"))
        if f["state"]:
            print(f"  accelerator state: {f['state']}")
    if s["waves"] and not args.json:
        w = s["waves"]
        print(f"  waveform: {w['file']} ({w['mb']} MB, launch {w['launch']}, from cycle {w['from_cycle']})")
    return 0 if s["bit_exact"] else 1


def cmd_cosim(args):
    from ..gencli import config_from_args
    from .designs import generated
    from . import runner
    cfg = config_from_args(args)
    if args.model:
        return cmd_cosim_network(args, cfg)
    # every input check before the simulator and the (long) build
    if args.top == "array":
        n, k, m = check_gemm(args.gemm)
    else:
        from ..sw.runtime import check_run_config
        check_run_config(cfg, cli=True)
        spec = check_layer(args.layer, cfg)
    runner.check_simulator(args.sim)
    with tempfile.TemporaryDirectory() as tmp:
        rep = Path(tmp) / "report.json"
        if args.top == "array":
            vfile, module, manifest = generated(cfg, "array")
            built, build_s = _build(args.sim, [vfile], module, args.waves)
            params = dict(rows=cfg.rows, cols=cfg.cols, input_bits=cfg.input_bits, weight_bits=cfg.weight_bits,
                          acc_bits=cfg.acc_bits, tag_bits=manifest["array"]["tag_bits"],
                          cases=[{"n": n, "k": k, "m": m, "seed": args.seed}], report=str(rep))
            res = runner.run([vfile], module, "dnnfab.cosim.tb_systolic", sim=args.sim, params=params,
                             waves=args.waves)
            report = json.loads(rep.read_text())
        else:
            from .dram import accel_target, run_accel
            sources, module, build_kw = accel_target(cfg, args.sim)
            built, build_s = _build(args.sim, sources, module, args.waves, build_kw)
            spec["seed"] = args.seed
            res = run_accel(cfg, "layers", {"layers": [spec], "report": str(rep)}, sim=args.sim,
                            waves=args.waves)
            report = json.loads(rep.read_text())
    out = {"simulator": args.sim, "top": args.top, "config": cfg.to_dict(), "passed": True,
           "build_dir": str(res.build_dir), "built": built, "build_s": round(build_s, 2),
           "run_s": round(res.run_s, 2), "waves": str(res.waves) if res.waves else None, "report": report}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"cosim {args.top} {cfg.rows}x{cfg.cols} on {args.sim}: PASSED (bit-exact vs numpy)")
        for r in report:
            print(f"  cycles {r['cycles']}" + (f"  (model {r['model_cycles']})" if "model_cycles" in r else ""))
        print(f"  build {'fresh' if built else 'cached'} {build_s:.1f}s, run {res.run_s:.1f}s, dir {res.build_dir}")
        if res.waves:
            print(f"  waveform: {res.waves}")
    return 0


def register(sub):
    from ..gencli import add_config_args
    p = sub.add_parser("cosim", help="co-simulate the generated Verilog against the numpy reference",
                       description="Generate the Verilog of a configuration, build it with "
                                   "Verilator or Icarus (cached per design) and run it. With "
                                   "MODEL (an ONNX path or a zoo name): the whole network, fabric "
                                   "layers on the simulated accelerator through the host driver's "
                                   "rtl backend, the rest on the CPU, every layer checked against "
                                   "the integer reference, a per-layer table (RTL cycles vs the "
                                   "fast model). Without: one cocotb test, a conv layer through the "
                                   "whole accelerator, checked against the fast model bit for bit, "
                                   "or a GEMM through the bare systolic array, checked against numpy.")
    p.add_argument("model", nargs="?", help="ONNX file or zoo name: co-simulate the whole network")
    add_config_args(p)
    p.add_argument("--sim", default="verilator", help="verilator (default) or icarus")
    p.add_argument("--samples", type=int, default=1, help="MODEL: inputs to run (default 1)")
    p.add_argument("--first-layers", type=int, default=None, metavar="N",
                   help="MODEL: only the first N fabric layers (a large model's start)")
    p.add_argument("--top", default="accelerator", choices=("accelerator", "array"))
    p.add_argument("--layer", default="16,16,3,1,1,8,8",
                   help="accelerator: conv layer cin,cout,k,stride,pad,h,w (default 16,16,3,1,1,8,8)")
    p.add_argument("--gemm", default="64,256,8", help="array: GEMM n,k,m (default 64,256,8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--waves", action="store_true",
                   help="dump a waveform (FST/VCD) and print its path; MODEL: a window of the last "
                        "$DNNFAB_WAVE_WINDOW_NS (200 us) of the failing, else the last, launch")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cosim)
