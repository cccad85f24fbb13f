"""``dnnfab cosim``: run one co-simulation of generated Verilog from the command line."""

import json
import tempfile
from pathlib import Path

from ..errors import ConfigError

__all__ = ["register"]


def _ints(text, n, what):
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(f"--{what} {text!r}: expected {n} comma-separated integers") from None
    if len(vals) != n:
        raise ConfigError(f"--{what} {text!r}: expected {n} comma-separated integers")
    return vals


def cmd_cosim(args):
    from ..hw.cli import config_from_args
    from .designs import generated
    from . import runner
    cfg = config_from_args(args)
    runner.check_simulator(args.sim)
    with tempfile.TemporaryDirectory() as tmp:
        rep = Path(tmp) / "report.json"
        if args.top == "array":
            n, k, m = _ints(args.gemm, 3, "gemm")
            vfile, module, manifest = generated(cfg, "array")
            params = dict(rows=cfg.rows, cols=cfg.cols, input_bits=cfg.input_bits, weight_bits=cfg.weight_bits,
                          acc_bits=cfg.acc_bits, tag_bits=manifest["array"]["tag_bits"],
                          cases=[{"n": n, "k": k, "m": m, "seed": args.seed}], report=str(rep))
            res = runner.run([vfile], module, "dnnfab.cosim.tb_systolic", sim=args.sim, params=params,
                             waves=args.waves)
            report = json.loads(rep.read_text())
        else:
            cin, cout, k, stride, pad, h, w = _ints(args.layer, 7, "layer")
            vfile, module, _ = generated(cfg, "accelerator")
            spec = dict(cin=cin, cout=cout, k=k, stride=stride, pad=pad, hw=[h, w], seed=args.seed)
            res = runner.run([vfile], module, "dnnfab.cosim.tb_accel", sim=args.sim, testcase="layers",
                             params={"config": cfg.to_dict(), "layers": [spec], "report": str(rep)},
                             waves=args.waves)
            report = json.loads(rep.read_text())
    out = {"simulator": args.sim, "top": args.top, "config": cfg.to_dict(), "passed": True,
           "build_dir": str(res.build_dir), "built": res.built, "build_s": round(res.build_s, 2),
           "run_s": round(res.run_s, 2), "waves": str(res.waves) if res.waves else None, "report": report}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"cosim {args.top} {cfg.rows}x{cfg.cols} on {args.sim}: PASSED (bit-exact vs numpy)")
        for r in report:
            print(f"  cycles {r['cycles']}" + (f"  (model {r['model_cycles']})" if "model_cycles" in r else ""))
        print(f"  build {'fresh' if res.built else 'cached'} {res.build_s:.1f}s, run {res.run_s:.1f}s, dir {res.build_dir}")
        if res.waves:
            print(f"  waveform: {res.waves}")
    return 0


def register(sub):
    from ..hw.cli import add_config_args
    p = sub.add_parser("cosim", help="co-simulate the generated Verilog against the numpy reference")
    add_config_args(p)
    p.add_argument("--sim", default="verilator", choices=("verilator", "icarus"))
    p.add_argument("--top", default="accelerator", choices=("accelerator", "array"))
    p.add_argument("--layer", default="16,16,3,1,1,8,8",
                   help="accelerator: conv layer cin,cout,k,stride,pad,h,w (default 16,16,3,1,1,8,8)")
    p.add_argument("--gemm", default="64,256,8", help="array: GEMM n,k,m (default 64,256,8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--waves", action="store_true", help="dump a waveform (FST/VCD) and print its path")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cosim)
