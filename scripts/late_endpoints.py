#!/usr/bin/env python3
"""List every timing endpoint that misses the clock, grouped by signal and by block.

nextpnr names one critical path per clock; when a few hundred endpoints miss the target,
that path says little about the rest. With ``--detailed-timing-report`` (run ``dnnfab
synth`` with ``DNNFAB_NEXTPNR_ARGS=--detailed-timing-report``) its JSON report lists, for
every net, the worst arrival time at each of its timing endpoints (flip-flop and block
inputs). This script keeps those later than the clock period (default: the target of the
run), groups them by the register they load (the sink cell name with bit indices and
yosys suffixes cut off, so a 32-bit register is one line) and by top-level block.

    python scripts/late_endpoints.py <work dir or report.json> [--period-ns P] [--top 40] [--json]
"""

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path


def _register(cell):
    cell = re.sub(r"\[\d+\]", "", cell)
    return re.split(r"_TRELLIS|_LUT4|_CCU2C|_PFUMX|_L6MUX|_DP16KD|_MULT18|\$", cell)[0] or cell


def late_endpoints(report, period_ns):
    """``[(arrival_ns, sink cell, sink port, driver, register)]``, latest first."""
    out = []
    for net in report.get("detailed_net_timings", []):
        for ep in net["endpoints"]:
            d = ep["delay"]
            d = max(d) if isinstance(d, list) else d
            if d > period_ns:
                out.append((d, ep["cell"], ep["port"], net["driver"], _register(ep["cell"])))
    out.sort(reverse=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--period-ns", type=float, default=None,
                    help="default: the run's target (report.json 'fmax' constraint)")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    path = a.report / "report.json" if a.report.is_dir() else a.report
    report = json.loads(path.read_text())
    if "detailed_net_timings" not in report:
        print(f"{path}: no detailed_net_timings; rerun nextpnr with --detailed-timing-report "
              "(DNNFAB_NEXTPNR_ARGS=--detailed-timing-report dnnfab synth ...)", file=sys.stderr)
        return 2
    period = a.period_ns
    if period is None:
        clk = next(iter(report.get("fmax", {}).values()), {})
        period = 1000.0 / clk["constraint"] if clk.get("constraint") else 1000.0 / 150
    late = late_endpoints(report, period)
    regs = defaultdict(list)
    blocks = defaultdict(int)
    for e in late:
        regs[e[4]].append(e)
        blocks[e[4].split(".")[0] if "." in e[4] else "(top)"] += 1
    rows = sorted(regs.items(), key=lambda kv: -kv[1][0][0])[:a.top]
    if a.json:
        print(json.dumps({"period_ns": period, "late_endpoints": len(late), "blocks": blocks,
                          "registers": [{"register": k, "endpoints": len(v), "worst_ns": v[0][0],
                                         "example": {"sink": v[0][1], "port": v[0][2], "driver": v[0][3]}}
                                        for k, v in rows]}, indent=1))
        return 0
    print(f"{len(late)} endpoints arrive later than {period:.3f} ns, {len(regs)} registers")
    print("by block: " + ", ".join(f"{b} {n}" for b, n in sorted(blocks.items(), key=lambda kv: -kv[1])))
    print(f"{'worst':>6} {'n':>5}  register  (example: driver -> sink.port)")
    for k, v in rows:
        print(f"{v[0][0]:6.2f} {len(v):5d}  {k}   ({v[0][3][:60]} -> .{v[0][2]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
