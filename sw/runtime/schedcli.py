"""``dnnfab schedule``: plan where every layer of one or several networks runs (fabric, CPU
or split) so deadlines hold at the lowest energy, power or latency; see docs/scheduler.md.
``dnnfab run MODEL --fps F --frames N`` (sw/runtime/runcli.py) runs such a plan."""

from __future__ import annotations

import json
import sys
import warnings

from ...errors import ConfigError

__all__ = ["add_schedule_args", "plan_from_args", "register", "print_plan", "wants_plan",
           "cmd_run_plan"]

DEFAULT_BOARD = "ulx3s-85f"


def add_schedule_args(p, host="board"):
    g = p.add_argument_group("real-time schedule")
    g.add_argument("--deadline-ms", type=float, default=None,
                   help="each frame's deadline (default: the period; without --fps too: "
                        "1.5x the all-fabric latency)")
    g.add_argument("--fps", type=float, default=None, help="frame rate of MODEL")
    g.add_argument("--objective", default="energy",
                   help="energy | power | latency | a weighted sum like energy:0.7,latency:0.3")
    g.add_argument("--power-cap-w", type=float, default=None, help="average power cap (W)")
    g.add_argument("--also", action="append", default=[], metavar="MODEL2",
                   help="another network sharing the system (repeatable)")
    g.add_argument("--also-fps", action="append", type=float, default=[], metavar="F2",
                   help="frame rate of each --also network, in order")
    g.add_argument("--also-deadline-ms", action="append", type=float, default=[], metavar="D2",
                   help="deadline of each --also network (default its period)")
    g.add_argument("--host", choices=("board", "local"), default=host,
                   help="CPU side: the board's own CPU, modelled from its documented figures, "
                        "or this machine's workers, measured (a real timeline here); default "
                        + host)
    g.add_argument("--workers", type=int, default=None,
                   help="CPU worker threads (default: the scheduler tries 1..the cores)")
    g.add_argument("--margin", type=float, default=None,
                   help="fraction of each deadline the plan keeps free (default 0.3 with "
                        "--host local, whose plan runs for real on this machine; else 0)")
    g.add_argument("--no-split", action="store_true",
                   help="do not split layers between the fabric and the CPU")
    if not any(a.dest == "calibration" for a in p._actions):
        g.add_argument("--calibration", metavar="DATA", default=None,
                       help="calibration samples of MODEL (.npy / .npz / a directory); an ONNX "
                            "file without them is quantized on random inputs")


def _quantized(model, cfg, calibration=None):
    """The int8 graph of ``model``: a zoo model on its bundled data, a file on
    ``calibration`` (samples.load_samples) or else on 8 random inputs -- the plan depends on
    shapes only, not on the scales (a note says so)."""
    import dnnfab
    from .api import load
    from .samples import load_samples, _feeds, _random
    from .session import _is_zoo_name
    notes = []
    cal = None
    if calibration is not None or not _is_zoo_name(model):
        graph = load(model)
        if calibration is not None:
            cal = _feeds(graph, load_samples(calibration, graph))
        else:
            cal = _feeds(graph, _random(graph, 8, 0))
            notes.append(f"{model}: quantized on 8 random inputs (pass --calibration DATA for "
                         "real scales); the plan depends only on the layers' shapes")
        model = graph
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = dnnfab.InferenceSession(model, calibration=cal, config=cfg, backend="cpu")
    notes += [str(w.message) for w in caught]
    qg = sess.qg
    sess.close()
    return qg, notes


def _name(model):
    import os
    base = os.path.basename(str(model))
    return base[:-5] if base.endswith(".onnx") else base


def plan_from_args(args, cfg, progress=None):
    """(ScheduleResult, {network name: QuantizedGraph}) for the parsed options."""
    from ..sched.api import plan_networks
    if args.also_fps and len(args.also_fps) != len(args.also):
        raise ConfigError(f"{len(args.also)} --also models but {len(args.also_fps)} --also-fps "
                          "values; give one rate per --also model")
    if args.also and not args.also_fps:
        raise ConfigError("--also needs --also-fps F2 (the second network's frame rate)")
    if args.also_deadline_ms and len(args.also_deadline_ms) != len(args.also):
        raise ConfigError("give one --also-deadline-ms per --also model (or none)")
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be at least 1 (got {args.workers})")
    if args.power_cap_w is not None and args.power_cap_w <= 0:
        raise ConfigError(f"--power-cap-w must be positive (got {args.power_cap_w:g})")
    if args.margin is not None and not 0.0 <= args.margin < 1.0:
        raise ConfigError(f"--margin={args.margin:g}: a fraction of the deadline in [0, 1)")
    from ..metrics.model import MetricModel
    from ..sched.api import check_specs
    from ..sched.milp import parse_objective
    parse_objective(args.objective)
    specs = [(args.model, args.fps, args.deadline_ms)]
    for i, m in enumerate(args.also):
        specs.append((m, args.also_fps[i],
                      args.also_deadline_ms[i] if args.also_deadline_ms else None))
    check_specs([(_name(m), fps, d) for m, fps, d in specs])
    emu = None
    if args.host == "local":          # a real run here: launches last what the model takes
        from ..driver.emulation import LaunchProfile
        emu = LaunchProfile()
    mm = MetricModel(board=args.board or DEFAULT_BOARD, cfg=cfg, host=args.host, emulation=emu)
    nets, graphs, notes = [], {}, []
    for model, fps, d in specs:
        if progress:
            progress(f"quantizing {model}")
        qg, n = _quantized(model, cfg, getattr(args, "calibration", None))
        name = _name(model)
        nets.append((name, qg, fps, d))
        graphs[name] = qg
        notes += n
    if progress:
        progress("metric model and MILP")
    res = plan_networks(nets, board=args.board or DEFAULT_BOARD, cfg=cfg, host=args.host,
                        metric_model=mm, objective=args.objective, power_cap_w=args.power_cap_w,
                        workers=args.workers, splits=() if args.no_split else (0.25, 0.5, 0.75),
                        margin=args.margin)
    res.notes = notes + list(res.notes or [])
    return res, graphs


def print_plan(summary, title):
    from rich.table import Table
    from ...console import print_table
    t = Table(title=title)
    for h in ("network", "layer", "resource", "split", "start ms", "end ms"):
        t.add_column(h, justify="left" if h in ("network", "layer", "resource") else "right")
    for r in summary["plan"]:
        t.add_row(r["network"], r["layer"], r["resource"],
                  f"{r['split']:.2f}" if r["resource"] == "split" else "",
                  f"{r['start_ms']:.3f}", f"{r['end_ms']:.3f}")
    print_table(t)
    b = Table(title="plan vs single-resource baselines (modelled)")
    for h in ("plan", "latency ms", "energy mJ/frame", "avg power W", "meets deadline"):
        b.add_column(h, justify="left" if h == "plan" else "right")
    s = summary
    b.add_row("scheduled", f"{s['latency_ms']['model']:.3f}", f"{s['energy_mj_per_frame']:.4g}",
              f"{s['avg_power_w']:.4g}", str(s["feasible"]))
    for k, v in s["baselines"].items():
        b.add_row(k, f"{v['latency_ms']:.3f}", f"{v['energy_mj_per_frame']:.4g}",
                  f"{v['avg_power_w']:.4g}", str(v["meets_deadline"]))
    print_table(b)
    sv = s["energy_saving_vs_best_single"]
    margin = (f" ({s['margin_ms']:.4g} ms of it kept free)" if s.get("margin_ms") else "")
    print(f"deadline {s['deadline_ms']:.4g} ms{margin}, period {s['period_ms']:.4g} ms; workers "
          f"{s['workers']}; solver {s['solver']['status']} in {s['solver']['solve_s']:.3f} s; "
          f"saving vs the best single resource: "
          + ("n/a (no single-resource plan meets the deadline)" if sv is None else f"{100 * sv:.1f}%"))
    if not s["feasible"]:
        print(f"no plan meets every deadline: {s['why']}")
    for n in s["notes"]:
        print(f"note: {n}", file=sys.stderr)


def cmd_schedule(args):
    from ...gencli import config_from_args
    if args.board is None:
        args.board = DEFAULT_BOARD
    cfg = config_from_args(args)
    res, _ = plan_from_args(args, cfg, progress=None if args.json else
                            (lambda m: print(f"... {m}", file=sys.stderr)))
    s = res.summary()
    s.update(frames=0, deadline_misses=None, bit_exact=None,
             timeline="modelled (dnnfab run --fps F --frames N runs the plan)")
    if args.gantt:
        from .realtime import gantt_plan
        gantt_plan(res, args.gantt)
        s["gantt"] = args.gantt
    if args.json:
        print(json.dumps(s, indent=2, default=float))
    else:
        print_plan(s, f"schedule on {s['board']} ({s['host']} CPU), objective {s['objective']}")
    return 0 if s["feasible"] else 1


def register(sub):
    from ...gencli import add_config_args
    p = sub.add_parser("schedule", help="plan fabric/CPU placement to meet deadlines at the "
                                        "lowest energy",
                       description="Split one or several networks' layers between the fabric and "
                                   "the CPU workers (MILP, HiGHS) so every deadline holds at the "
                                   "lowest energy, power or latency; prints the plan, the "
                                   "single-resource baselines and the saving.")
    p.add_argument("model", nargs="?", default="digits-cnn", help="zoo name or .onnx path")
    add_config_args(p)
    add_schedule_args(p)
    p.add_argument("--gantt", metavar="PNG", default=None, help="draw a few frames of the plan")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_schedule)


def wants_plan(args):
    """``dnnfab run`` with any real-time option runs a schedule instead of the main job."""
    return any(getattr(args, k, None) not in (None, [], False) for k in
               ("frames", "fps", "deadline_ms", "also", "power_cap_w", "gantt")) or \
        getattr(args, "objective", "energy") != "energy"


def cmd_run_plan(args):
    """``dnnfab run MODEL --fps F --frames N ...``: plan, then run the plan for real (this
    machine's CPU: ``--host local``, the default here) or on the modelled timeline
    (``--host board``), check every frame against the integer reference."""
    from ...gencli import config_from_args
    from .realtime import Runtime, gantt
    if args.board is None:
        args.board = DEFAULT_BOARD
    frames = 20 if args.frames is None else args.frames
    if frames < 1:
        raise ConfigError(f"--frames must be at least 1 (got {frames})")
    cfg = config_from_args(args)
    say = None if args.json else (lambda m: print(f"... {m}", file=sys.stderr))
    res, graphs = plan_from_args(args, cfg, progress=say)
    s = res.summary()
    if not s["feasible"]:
        if args.json:
            s.update(frames=0, deadline_misses=None, bit_exact=None)
            print(json.dumps(s, indent=2, default=float))
        else:
            print_plan(s, f"schedule on {s['board']} ({s['host']} CPU)")
        return 1
    if say:
        say(f"running {frames} frames of each network ({'real' if res.plan.host == 'local' else 'modelled'} "
            "timeline)")
    counts = {}
    rate = sum(1 / t.period_s for t in res.tasks)
    for t in res.tasks:       # frames of each network in proportion to its rate
        counts[t.name] = max(1, round(frames * (1 / t.period_s) / rate * len(res.tasks)))
    with Runtime.from_schedule(res, graphs, cfg) as rt:
        rep = rt.run(frames=counts, progress=not args.json)
    d = rep.to_dict(layers=False)
    d.pop("frame_records", None)
    first = res.tasks[0].name
    s.update(frames=d["frames"], deadline_misses=d["deadline_misses"], bit_exact=d["bit_exact"],
             latency_ms=dict(d["latency_ms"][first], model=s["latency_ms"]["model"],
                         bound=s["latency_ms"]["bound"]),
             timeline=d["label"], run=d)
    if args.gantt:
        gantt(rep, args.gantt, frames=3)
        s["gantt"] = args.gantt
    if args.json:
        print(json.dumps(s, indent=2, default=float))
        return 0
    print_plan(s, f"schedule on {s['board']} ({s['host']} CPU), objective {s['objective']}")
    for name, v in d["latency_ms"].items():
        net = d["networks"][name]
        print(f"{name}: {net.get('frames', '?')} frames, latency p50 {v['p50']:.3f} / p99 "
              f"{v['p99']:.3f} / max {v['max']:.3f} ms, deadline "
              f"{net.get('deadline_s', 0) * 1e3:.4g} ms, misses {net.get('deadline_misses', '?')}")
    print(f"{d['label']}: {d['frames']} frames, {d['deadline_misses']} deadline misses, "
          f"{d['degraded_frames']} degraded; bit-exact vs the integer reference: {d['bit_exact']}")
    for n in d["notes"]:
        print(f"note: {n}", file=sys.stderr)
    return 0
