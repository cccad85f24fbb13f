"""The metric model's per-network totals for every zoo model on the boards with metric-model
figures (host = the board's own CPU): a sanity table, not a schedule.

For each network: layers, fabric-mappable layers, and the sums over layers of the pure
options -- all on the CPU (``workers`` threads), every mappable layer on the fabric (the
rest on the CPU), and per layer the faster of the two -- with their dynamic energies and
the board's idle power. Transfers between resources are left out (the scheduler adds them).

    PYTHONPATH=... python scripts/metrics_table.py [--workers 2] [--out benchmarks/metrics_zoo.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path


def table(models=None, boards=("ulx3s-85f", "pynq-z2"), workers=2):
    import dnnfab
    from dnnfab.models import zoo
    from dnnfab.sw.metrics import MetricModel
    models = models or zoo.model_names()
    rows = []
    for name in models:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qg = dnnfab.InferenceSession(name).qg
        for b in boards:
            t0 = time.perf_counter()
            mm = MetricModel(b)
            nc = mm.network(qg, workers=workers, splits=())
            res = mm.resources(workers)
            cpu_t = sum(L.options["cpu"].latency_s for L in nc.layers)
            cpu_e = sum(L.options["cpu"].energy_j for L in nc.layers)
            fab = [L.options.get("fabric", L.options["cpu"]) for L in nc.layers]
            fab_t, fab_e = sum(o.latency_s for o in fab), sum(o.energy_j for o in fab)
            best = [min(L.options["cpu"], L.options.get("fabric", L.options["cpu"]),
                        key=lambda o: o.latency_s) for L in nc.layers]
            rows.append({
                "model": name, "board": b, "layers": len(nc.layers),
                "fabric_layers": sum("fabric" in L.options for L in nc.layers),
                "macs": sum(L.macs for L in nc.layers),
                "all_cpu_ms": round(cpu_t * 1e3, 3), "all_cpu_dyn_mj": round(cpu_e * 1e3, 4),
                "fabric_where_mapped_ms": round(fab_t * 1e3, 3),
                "fabric_where_mapped_dyn_mj": round(fab_e * 1e3, 4),
                "faster_per_layer_ms": round(sum(o.latency_s for o in best) * 1e3, 3),
                "dram_bound_fabric_layers": sum(1 for L in nc.layers if "fabric" in L.options
                                                and L.options["fabric"].detail["bound"] == "dram"),
                "idle_w": round(res.idle_w_total, 4), "wall_s": round(time.perf_counter() - t0, 1)})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "benchmarks" /
                                         "metrics_zoo.json"))
    a = ap.parse_args(argv)
    rows = table(a.models or None, workers=a.workers)
    Path(a.out).write_text(json.dumps({"workers": a.workers, "host": "board", "rows": rows},
                                      indent=1) + "\n")
    print(f"{'model':14} {'board':10} {'layers':>6} {'fab':>4} {'GMAC':>6} {'all cpu ms':>11} "
          f"{'fabric ms':>10} {'faster ms':>10} {'dram-bound':>10}")
    for r in rows:
        print(f"{r['model']:14} {r['board']:10} {r['layers']:6} {r['fabric_layers']:4} "
              f"{r['macs'] / 1e9:6.2f} {r['all_cpu_ms']:11.1f} {r['fabric_where_mapped_ms']:10.1f} "
              f"{r['faster_per_layer_ms']:10.1f} {r['dram_bound_fabric_layers']:10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
