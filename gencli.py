"""``dnnfab generate``: config -> Verilog + manifest (+ regs.h); and the accelerator-config
options every command shares (:func:`add_config_args`, :func:`config_from_args`).

Command-line glue above hw/ and boards/ (a ``--board`` sizes and checks the config against
a board, and ``generate --board`` writes its constraints), so that hw/ never imports
boards/ (tests/test_architecture.py)."""

import json
from pathlib import Path

from .hw.config import AcceleratorConfig, PRESETS
from .errors import ConfigError

__all__ = ["register", "add_config_args", "config_from_args"]


def _int_or_auto(text):
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"expected an integer or 'auto', got {text!r}") from None


def add_config_args(p):
    """Accelerator config options shared by generate / synth / cosim / run."""
    g = p.add_argument_group("accelerator configuration")
    g.add_argument("--preset", choices=sorted(PRESETS), help="start from a named config")
    g.add_argument("--config", metavar="JSON", help="config file (JSON, keys as in the manifest)")
    g.add_argument("--rows", type=str, help="array rows R (reduction dim), or 'auto' with --board")
    g.add_argument("--cols", type=str, help="array columns C (output channels), or 'auto' with --board")
    for name, help_ in (("input_bits", "activation bits"), ("weight_bits", "weight bits"),
                        ("acc_bits", "accumulator bits"), ("bus_bits", "AXI data width"),
                        ("act_kib", "activation scratchpad KiB"), ("wgt_kib", "weight scratchpad KiB"),
                        ("acc_kib", "accumulator scratchpad KiB"), ("out_kib", "output scratchpad KiB"),
                        ("max_burst", "longest AXI burst (beats)")):
        g.add_argument("--" + name.replace("_", "-"), dest=name, type=str, help=help_)
    g.add_argument("--dataflow", help="ws (weight-stationary)")
    g.add_argument("--clock-mhz", dest="clock_mhz", type=float, help="target clock")
    g.add_argument("--board", help="size and constrain for this board (see `dnnfab boards`)")


def config_from_args(args):
    """Build an :class:`AcceleratorConfig` from parsed options (raises ConfigError)."""
    base = {}
    if args.preset:
        base = PRESETS[args.preset].to_dict()
    if getattr(args, "config", None):
        try:
            base.update(json.loads(Path(args.config).read_text()))
        except FileNotFoundError:
            raise ConfigError(f"config file {args.config} not found; pass an existing JSON file") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config file {args.config} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        base.pop("config_hash", None)
    auto = []
    for name in ("rows", "cols", "input_bits", "weight_bits", "acc_bits", "bus_bits", "act_kib",
                 "wgt_kib", "acc_kib", "out_kib", "max_burst"):
        v = getattr(args, name, None)
        if v is None:
            continue
        v = _int_or_auto(v) if name in ("rows", "cols") else _int_arg(name, v)
        if v == "auto":
            auto.append(name)
        else:
            base[name] = v
    for name in ("dataflow", "clock_mhz"):
        v = getattr(args, name, None)
        if v is not None:
            base[name] = v
    board = getattr(args, "board", None)
    top = getattr(args, "top", None)
    if board:
        from .boards import get_board
        b = get_board(board)
        base.setdefault("clock_mhz", b.clock_mhz)
        if auto:
            from .boards.fit import autosize
            return autosize(b, base, auto, top=top)
        cfg = AcceleratorConfig.from_dict(base)
        from .boards.fit import check_fit
        check_fit(cfg, b, top=top)
        return cfg
    if auto:
        raise ConfigError(f"--{auto[0]} auto needs --board to size against; name a board (see `dnnfab boards`)")
    return AcceleratorConfig.from_dict(base)


def _int_arg(name, text):
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--{name.replace('_', '-')}={text!r} is not an integer") from None


def cmd_generate(args):
    from .hw.generate import generate
    cfg = config_from_args(args)
    extra = None
    if args.board:
        from .boards import get_board
        b = get_board(args.board)
        extra = {"board": {"id": b.id, "part": b.fpga.full_part, "clock_mhz": cfg.clock_mhz}}
    paths = generate(cfg, args.output, top=args.top, extra=extra)
    removed = paths.pop("removed", [])
    if args.board:
        from .boards.synth import write_constraints
        from .hw.generate import TOPS, record_files
        cons = write_constraints(cfg, args.board, args.output,
                                 module=TOPS[args.top][1], verilog=paths["verilog"].name)
        record_files(paths["manifest"], cons.values())
        paths.update(cons)
    print(f"generated {args.top} {cfg.rows}x{cfg.cols} ({cfg.dataflow}, config {cfg.config_hash()}):")
    for kind, path in paths.items():
        print(f"  {kind:9s} {path}")
    written = {p.name for p in paths.values()}
    for path in removed:
        if path.name not in written:
            print(f"  removed   {path} (left by the previous generation in {args.output})")
    return 0


def register(sub):
    p = sub.add_parser("generate", help="generate Verilog + manifest for a configuration")
    add_config_args(p)
    p.add_argument("--top", choices=("accelerator", "array"), default="accelerator",
                   help="whole accelerator (default) or the bare systolic array")
    p.add_argument("-o", "--output", default="out", help="output directory (default: out)")
    p.set_defaults(func=cmd_generate)
