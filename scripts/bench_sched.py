#!/usr/bin/env python3
"""Benchmark of issue 20: the scheduler's solve time and the energy saving of its plans.

* Solve time: DenseNet-121 (246 layers) alone and the two-network case (a zoo image model
  with eeg-seizure windows at their own rate), per board profile: the MILP's status,
  optimality and time (``solver.solve_s``: every worker count's solve plus the
  baselines), next to the time to build the metric model.
* Savings: for every model (default: the nine onnx "light" zoo models, digits-cnn,
  eeg-seizure) and the two-network scenario, at a deadline of 1.5x the all-fabric
  latency (period = deadline), on each board profile (default ULX3S-85F and PYNQ-Z2, the
  board's own CPU modelled): ``energy_saving_vs_best_single`` and the plan's resources,
  plus the deadline misses of ``--frames`` frames replayed on the runtime's modelled
  timeline (0 means that was not run).

    python scripts/bench_sched.py --json benchmarks/sched.json --plot benchmarks/sched_savings.png
    python scripts/bench_sched.py --models digits-cnn eeg-seizure --boards ulx3s-85f   # small
"""

import argparse
import json
import os
import sys
import time
import warnings

LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
         "shufflenet", "squeezenet", "vgg19", "zfnet512"]
DEFAULT_MODELS = ["digits-cnn", "eeg-seizure"] + LIGHT
BOARDS = ["ulx3s-85f", "pynq-z2"]


def _qg(name, cache):
    if name not in cache:
        import dnnfab
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = dnnfab.InferenceSession(name, backend="cpu")
        cache[name] = s.qg
        s.close()
    return cache[name]


def _row(res, frames, graphs):
    s = res.summary()
    plan = res.plan
    row = {"feasible": s["feasible"], "why": s["why"], "deadline_ms": s["deadline_ms"],
           "latency_ms": s["latency_ms"]["model"], "bound_ms": s["latency_ms"]["bound"],
           "energy_mj_per_frame": s["energy_mj_per_frame"], "avg_power_w": s["avg_power_w"],
           "energy_saving_vs_best_single": s["energy_saving_vs_best_single"],
           "workers": s["workers"], "solver": {k: s["solver"][k] for k in ("status", "optimal", "solve_s")},
           "metric_model_s": s["metric_model_s"],
           "baselines": {k: {kk: v[kk] for kk in ("latency_ms", "energy_mj_per_frame",
                                                   "avg_power_w", "meets_deadline")}
                         for k, v in s["baselines"].items()},
           "resources": {}}
    for n in plan.networks:
        cnt = {}
        for c in n.layers:
            cnt[c.resource] = cnt.get(c.resource, 0) + 1
        row["resources"][n.name] = cnt
    row["frames"], row["deadline_misses"] = 0, None
    if frames and s["feasible"]:
        from dnnfab.sw.runtime.realtime import replay_plan
        rep = replay_plan(res.plan, res.costs, res.rm, frames=frames)
        row["frames"] = len(rep.frames)
        row["deadline_misses"] = rep.deadline_misses
        row["replay_latency_ms"] = rep.latency_ms
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--boards", nargs="+", default=BOARDS)
    ap.add_argument("--pair", default="squeezenet",
                    help="image model of the two-network scenario (with eeg-seizure)")
    ap.add_argument("--pair-fps", type=float, default=None,
                    help="its frame rate (default: the rate its 1.5x all-fabric deadline allows)")
    ap.add_argument("--eeg-fps", type=float, default=2.0,
                    help="eeg-seizure windows per second (default 2: its 1 s windows of 256 Hz "
                         "EEG with 50%% overlap), each due within its period")
    ap.add_argument("--solve-model", default="densenet121")
    ap.add_argument("--tight", type=float, default=0.8,
                    help="also plan each model at this fraction of its all-fabric latency "
                         "(0: not), where no single resource meets the deadline")
    ap.add_argument("--frames", type=int, default=0, help="frames replayed per plan (modelled)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    from dnnfab.sw.sched.api import plan_networks, DEADLINE_FACTOR
    cache, out = {}, {"deadline_factor": DEADLINE_FACTOR, "boards": args.boards, "solve": [],
                      "savings": []}
    t_all = time.perf_counter()
    for board in args.boards:
        # ---- solve time
        if args.solve_model:
            qg = _qg(args.solve_model, cache)
            res = plan_networks([(args.solve_model, qg, None, None)], board=board)
            s = res.summary()
            out["solve"].append({"case": args.solve_model, "board": board, "layers": len(qg.layers),
                                 "solver": s["solver"], "metric_model_s": s["metric_model_s"],
                                 "feasible": s["feasible"]})
            print(f"[{board}] solve {args.solve_model}: {s['solver']['status']} in "
                  f"{s['solver']['solve_s']:.3f} s (metric model {s['metric_model_s']:.2f} s)",
                  file=sys.stderr)
        # ---- savings per model
        for name in args.models:
            qg = _qg(name, cache)
            res = plan_networks([(name, qg, None, None)], board=board)
            row = {"case": name, "board": board, "deadline_factor": DEADLINE_FACTOR,
                   **_row(res, args.frames, {name: qg})}
            out["savings"].append(row)
            if args.tight:
                d = args.tight * res.summary()["baselines"]["all_fabric"]["latency_ms"]
                tight = plan_networks([(name, qg, None, d)], board=board)
                trow = {"case": name, "board": board, "deadline_factor": args.tight,
                        **_row(tight, args.frames, {name: qg})}
                out.setdefault("tight", []).append(trow)
                print(f"[{board}] {name} at {args.tight:g}x all-fabric: feasible "
                      f"{trow['feasible']}, resources {trow['resources'][name]}", file=sys.stderr)
            sv = row["energy_saving_vs_best_single"]
            print(f"[{board}] {name}: saving {('n/a' if sv is None else f'{100 * sv:.1f}%')}, "
                  f"resources {row['resources'][name]}, misses {row['deadline_misses']}",
                  file=sys.stderr)
        # ---- two networks
        if args.pair:
            qa, qe = _qg(args.pair, cache), _qg("eeg-seizure", cache)
            solo = plan_networks([(args.pair, qa, None, None)], board=board, workers=None)
            d_ms = solo.summary()["deadline_ms"]
            fps = args.pair_fps or 1e3 / d_ms
            eeg_fps = args.eeg_fps
            res = plan_networks([(args.pair, qa, fps, None), ("eeg-seizure", qe, eeg_fps, None)],
                                board=board)
            s = res.summary()
            case = f"{args.pair}@{fps:.3g}fps+eeg-seizure@{eeg_fps:.3g}fps"
            out["solve"].append({"case": case, "board": board,
                                 "layers": len(qa.layers) + len(qe.layers),
                                 "solver": s["solver"], "metric_model_s": s["metric_model_s"],
                                 "feasible": s["feasible"]})
            row = {"case": case, "board": board,
                   **_row(res, args.frames, {args.pair: qa, "eeg-seizure": qe})}
            out["savings"].append(row)
            sv = row["energy_saving_vs_best_single"]
            print(f"[{board}] {case}: {s['solver']['status']} in {s['solver']['solve_s']:.3f} s, "
                  f"saving {('n/a' if sv is None else f'{100 * sv:.1f}%')}", file=sys.stderr)
    out["wall_s"] = round(time.perf_counter() - t_all, 1)
    _table(out)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=float)
    if args.plot:
        _plot(out, args.plot)
    return 0


def _table(out):
    if out.get("tight"):
        print(f"at {out['tight'][0]['deadline_factor']:g}x the all-fabric latency:")
        for r in out["tight"]:
            b = r["baselines"]
            print(f"  {r['case']:20s} {r['board']:10s} feasible {str(r['feasible']):5s} "
                  f"all-fabric meets {str(b['all_fabric']['meets_deadline']):5s} all-cpu meets "
                  f"{str(b['all_cpu']['meets_deadline']):5s} plan {r['resources'][r['case']]}")
    print(f"{'case':52s} {'board':10s} {'saving':>8s} {'plan':>28s} {'misses':>7s} {'solve s':>8s}")
    for r in out["savings"]:
        sv = r["energy_saving_vs_best_single"]
        res = ",".join(f"{k}:{v}" for n in r["resources"].values() for k, v in sorted(n.items()))
        print(f"{r['case'][:52]:52s} {r['board']:10s} {('n/a' if sv is None else f'{100 * sv:.1f}%'):>8s} "
              f"{res[:28]:>28s} {str(r['deadline_misses']):>7s} {r['solver']['solve_s']:8.3f}")


def _plot(out, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    boards = out["boards"]
    cases = list(dict.fromkeys(r["case"] for r in out["savings"]))
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(cases) * len(boards)), 4))
    w = 0.8 / max(1, len(boards))
    for bi, b in enumerate(boards):
        vals = []
        for c in cases:
            r = next((r for r in out["savings"] if r["case"] == c and r["board"] == b), None)
            sv = r and r["energy_saving_vs_best_single"]
            vals.append(100 * sv if sv is not None else 0.0)
        ax.bar([i + bi * w for i in range(len(cases))], vals, w, label=b)
    ax.set_xticks([i + w * (len(boards) - 1) / 2 for i in range(len(cases))])
    ax.set_xticklabels([c.split("@")[0] + ("+eeg" if "+" in c else "") for c in cases],
                       rotation=45, ha="right")
    ax.set_ylabel("energy saving vs best single resource (%)")
    ax.set_title(f"deadline = {out['deadline_factor']:g}x all-fabric latency (modelled)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
