#!/usr/bin/env python3
"""Benchmark of issue 20's real mode: a scheduled plan for this machine (``host="local"``)
run for real, frames against their deadlines.

``plan_networks`` plans ``--model`` (digits-cnn) at ``--fps`` with eeg-seizure windows at ``--eeg-rate``
per second (``--board`` profile, this machine's CPU workers, launches floored at what the
model backend takes here, :data:`~dnnfab.sw.sched.api.LOCAL_MARGIN` of each deadline kept
free); :class:`~dnnfab.sw.runtime.realtime.Runtime` then runs ``--frames`` frames in real
mode (the model backend holds each launch for its modelled time). Reported per network: the
plan's latency and response bound, the measured p50 / p99 / max latency, deadline misses;
the launches the model computed more slowly than planned; and the runtime's measured cost
per layer beyond the plan (``runtime_layer_s``: (p50 latency - planned latency without it)
/ layers, the figure the board files' ``[local_host] runtime_layer_s`` is taken from).

    python scripts/bench_runtime.py --json benchmarks/runtime_real.json
    python scripts/bench_runtime.py --frames 100          # smaller (CI)
    python scripts/bench_runtime.py --model squeezenet --fps 5 --frames 200 --json benchmarks/runtime_real_squeezenet.json
"""

import argparse
import json
import sys
import time
import warnings


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="digits-cnn", help="the image model (bundled or zoo)")
    ap.add_argument("--fps", type=float, default=50.0, help="its frames per second")
    ap.add_argument("--eeg-rate", type=float, default=2.0, help="eeg-seizure windows per second")
    ap.add_argument("--frames", type=int, default=1000, help="frames in all (split by rate)")
    ap.add_argument("--board", default="pynq-z2")
    ap.add_argument("--objective", default="energy", help="the scheduler's objective")
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args(argv)

    warnings.simplefilter("ignore")
    from dnnfab.sw.runtime.session import InferenceSession
    from dnnfab.sw.sched.api import plan_networks, LOCAL_MARGIN
    from dnnfab.sw.runtime.realtime import Runtime

    model = args.model
    qgs = {m: InferenceSession(m).qg for m in (model, "eeg-seizure")}
    t0 = time.perf_counter()
    res = plan_networks([(model, qgs[model], args.fps, None),
                         ("eeg-seizure", qgs["eeg-seizure"], args.eeg_rate, None)],
                        board=args.board, host="local", objective=args.objective)
    plan_s = time.perf_counter() - t0
    out = {"board": args.board, "model": model, "objective": args.objective, "fps": args.fps, "eeg_rate": args.eeg_rate,
           "margin": LOCAL_MARGIN, "feasible": res.plan.feasible, "plan_s": plan_s,
           "why": res.plan.why if not res.plan.feasible else ""}
    if not res.plan.feasible:
        print(json.dumps(out, indent=1))
        return 1
    total = args.fps + args.eeg_rate
    n_d = max(1, round(args.frames * args.fps / total))
    frames = {model: n_d, "eeg-seizure": max(1, args.frames - n_d)}
    with Runtime.from_schedule(res, qgs) as rt:
        rep = rt.run(frames=frames, progress=True)
    from dnnfab.sw.metrics.model import MetricModel
    included = MetricModel(args.board, host="local").runtime_layer_s()
    nets = {}
    for n in res.plan.networks:
        lat = rep.latency_ms[n.name]
        layers = len(n.layers)
        planned_bare = n.latency_s - layers * included
        nets[n.name] = {"plan_latency_ms": n.latency_s * 1e3, "plan_bound_ms": n.bound_s * 1e3,
                        "deadline_ms": rep.networks[n.name]["deadline_s"] * 1e3,
                        "latency_ms": lat, "frames": rep.networks[n.name]["frames"],
                        "deadline_misses": rep.networks[n.name]["deadline_misses"],
                        "layers": layers,
                        "runtime_layer_s": (lat["p50"] / 1e3 - planned_bare) / layers}
    out.update(networks=nets, frames=len(rep.frames), deadline_misses=rep.deadline_misses,
               bit_exact=rep.bit_exact, hold_exceeded=rep.hold_exceeded,
               fabric_launches=rep.fabric_launches, runtime_layer_s_included=included,
               runtime_layer_s=min(v["runtime_layer_s"] for v in nets.values()),
               wall_s=rep.wall_s)
    print(f"{'network':12s} {'plan ms':>8s} {'bound':>7s} {'deadline':>8s} {'p50':>6s} {'p99':>6s} "
          f"{'max':>6s} misses")
    for name, v in nets.items():
        lat = v["latency_ms"]
        print(f"{name:12s} {v['plan_latency_ms']:8.2f} {v['plan_bound_ms']:7.2f} "
              f"{v['deadline_ms']:8.1f} {lat['p50']:6.2f} {lat['p99']:6.2f} {lat['max']:6.2f} "
              f"{v['deadline_misses']}/{v['frames']}")
    print(f"launches over their hold: {rep.hold_exceeded} of {rep.fabric_launches}; "
          f"runtime cost per layer beyond the plan: {out['runtime_layer_s'] * 1e3:.3f} ms "
          f"(the plan included {included * 1e3:.3f} ms); bit-exact: {rep.bit_exact}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if rep.deadline_misses == 0 and rep.bit_exact else 1


if __name__ == "__main__":
    sys.exit(main())
