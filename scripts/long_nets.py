#!/usr/bin/env python3
"""List the longest routed connections of a place-and-route run.

nextpnr names one critical path per clock; when a few hundred endpoints miss the target,
that path says little about the rest. With ``--detailed-timing-report`` (run ``dnnfab
synth`` with ``DNNFAB_NEXTPNR_ARGS=--detailed-timing-report``) its JSON report holds the
routing delay of every driver -> sink connection; this script groups the longest ones by
the design signal they carry (the net's ``src`` attribute, else its name with bit indices
and yosys suffixes cut off) so that a bus of 64 long wires shows up as one line.

    python scripts/long_nets.py <work dir or report.json> [--min-ns 3] [--top 40] [--json]
"""

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path


def _signal(net):
    stem = re.split(r"_TRELLIS|_LUT4|_CCU2C|_PFUMX|_DP16KD|_MULT18|\$", re.sub(r"\[\d+\]", "", net["net"]))[0]
    for src in net.get("sources") or []:
        m = re.search(r"([^/|]+\.py):(\d+)", src)
        if m:
            return f"{stem or net['net']} ({m.group(1)}:{m.group(2)})"
    return stem or net["net"]


def long_connections(report, min_ns=3.0):
    """``[(delay_ns, net, driver, sink cell, sink port, signal)]``, longest first."""
    out = []
    for net in report.get("detailed_net_timings", []):
        for ep in net["endpoints"]:
            d = max(ep["delay"])
            if d >= min_ns:
                out.append((d, net["net"], net["driver"], ep["cell"], ep["port"], _signal(net)))
    out.sort(reverse=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--min-ns", type=float, default=3.0)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    path = a.report / "report.json" if a.report.is_dir() else a.report
    report = json.loads(path.read_text())
    if "detailed_net_timings" not in report:
        print(f"{path}: no detailed_net_timings; rerun nextpnr with --detailed-timing-report "
              "(DNNFAB_NEXTPNR_ARGS=--detailed-timing-report dnnfab synth ...)", file=sys.stderr)
        return 2
    conns = long_connections(report, a.min_ns)
    groups = defaultdict(list)
    for c in conns:
        groups[c[5]].append(c)
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0][0])[:a.top]
    if a.json:
        print(json.dumps([{"signal": k, "connections": len(v), "max_ns": v[0][0],
                           "example": {"net": v[0][1], "driver": v[0][2], "sink": v[0][3],
                                       "port": v[0][4]}} for k, v in rows], indent=1))
        return 0
    print(f"{len(conns)} connections >= {a.min_ns} ns routing, in {len(groups)} signals")
    print(f"{'max ns':>7} {'n':>5}  signal / example sink")
    for k, v in rows:
        print(f"{v[0][0]:7.2f} {len(v):5d}  {k}")
        print(f"{'':14}{v[0][2][:70]} -> {v[0][3][:70]}.{v[0][4]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
