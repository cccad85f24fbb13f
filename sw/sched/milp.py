"""The heterogeneous scheduler: each layer of each network on the fabric, the CPU or split
between them, so that deadlines hold at the lowest energy, power or latency. Exact: a
mixed-integer linear program solved by HiGHS (``scipy.optimize.milp``).

The execution model (what the runtime does, :mod:`dnnfab.sw.runtime.realtime`)
---------------------------------------------------------------------------------
Two resources, the fabric (one launch at a time) and the CPU worker pool (one layer at a
time). Within a frame every resource takes its layers in the network's topological order;
a layer starts when its inputs are there (plus the move of a tensor produced on the other
side) and its resources are free; a split layer holds both. That is a list schedule, and
with the order fixed it is *linear*: for layer i and resource r,

    s_i >= f_p + T(p) * [p's output is on the other side]      for every producer p
    s_i >= a_{i-1,r} - M (1 - u_{i,r})                          (r free)
    a_{i,r} >= a_{i-1,r},  a_{i,r} >= s_i + busy_{i,r} - M (1 - u_{i,r})
    f_i = s_i + sum_o x_{i,o} lat_{i,o}

where x_{i,o} picks option o of layer i and u_{i,r} says whether it uses r. The earliest
solution of these inequalities is the list schedule itself, so a plan is feasible in the
program exactly when its schedule meets the deadline: independent branches on different
resources overlap (inter-operator parallelism), the rest serialises.

Several networks share the resources. Each resource serves the ready layer of the
highest-priority network first -- deadline-monotonic: the shorter relative deadline
wins -- and one network's frames by release; layers are not preempted. Each frame's
latency L_n is computed on idle resources; its response bound adds what can get in its
way (:func:`_coeffs`): every frame of a higher-priority network released while it is
pending (ceil(D_n / P_m) + 1 of them, whole), one layer of a lower-priority network
each time one of its layers waits (at most its layer count times that network's
longest layer), and its own earlier frames when D_n > P_n. ``L_n + interference_n <=
D_n`` is the classic non-preemptive fixed-priority response test (sufficient), which
the runtime's timeline checks for real. Each resource's utilisation sum_n busy_{n,r} /
P_n stays <= 1, and an optional power cap bounds the average power
``idle + sum_n E_n / P_n``.

Objectives: ``energy`` (sum over networks of the energy per frame), ``power`` (average
power, frames weighted by their rate), ``latency`` (sum of L_n / D_n), or a weighted sum
``"energy:0.7,latency:0.3"`` of the three, each normalised by its all-fabric value.
The CPU worker count is decided by solving once per count and keeping the best.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from ...errors import ConfigError
from ..metrics.costs import NetworkCost, ResourceModel
from .plan import LayerChoice, NetworkPlan, Plan, Task

__all__ = ["OBJECTIVES", "solve", "schedule", "evaluate", "baselines", "exhaustive",
           "parse_objective", "priority"]

OBJECTIVES = ("energy", "power", "latency")


def parse_objective(spec):
    """``"energy"`` or ``"energy:0.7,latency:0.3"`` -> {name: weight}."""
    if isinstance(spec, dict):
        w = dict(spec)
    else:
        w = {}
        for part in str(spec).split(","):
            name, _, val = part.strip().partition(":")
            try:
                w[name.strip()] = float(val) if val else 1.0
            except ValueError:
                raise ConfigError(f"objective weight {val!r} is not a number; write e.g. "
                                  "energy:0.7,latency:0.3") from None
    for k in w:
        if k not in OBJECTIVES:
            raise ConfigError(f"unknown objective {k!r}; use {', '.join(OBJECTIVES)} or a "
                              "weighted sum like energy:0.7,latency:0.3")
    if not w or sum(w.values()) <= 0:
        raise ConfigError("the objective needs a positive weight")
    return w


# ---------------------------------------------------------------------- evaluation
def priority(tasks):
    """{network: rank}: deadline-monotonic (the shorter relative deadline first, then the
    order given); the runtime's queues use the same ranks."""
    order = sorted(range(len(tasks)), key=lambda i: (tasks[i].deadline_s, i))
    return {tasks[i].name: r for r, i in enumerate(order)}


def _coeffs(tasks, costs):
    """{(n, m): (frames, lower)}: the response bound of network n adds ``frames`` x the
    busy time of a frame of m, plus, when ``lower``, the blocking by m's layers.

    Each resource serves the ready layer of the highest-priority network first
    (deadline-monotonic, :func:`priority`), frames of one network by release; layers are
    not preempted. So for a frame of n: a higher-priority m gets in its way with every
    frame released while n's is pending, ceil(D_n / P_m) + 1 of them; n's own earlier
    frames, ceil(D_n / P_n) - 1 of them, count whole; a lower-priority m only blocks it
    with the one layer a resource is running when one of n's layers becomes ready there
    while the resource is not already n's -- an *entry*: a layer of n on r with no
    producer, or a producer whose output is on the other side. Per resource r that is at
    most min(K_n x lambda_{m,r}, Lambda_{m,r} x E_{n,r}) (:func:`_blocking`): K_n n's
    layer count, E_{n,r} its entries on r, lambda_{m,r} m's longest layer on r in the
    plan, Lambda_{m,r} m's longest possible one. This is the classic non-preemptive
    fixed-priority response test with D_n for the response time: sufficient."""
    rank = priority(tasks)
    out = {}
    for t in tasks:
        for m in tasks:
            if m.name == t.name:
                out[(t.name, m.name)] = (max(0, math.ceil(t.deadline_s / t.period_s - 1e-12) - 1), False)
            elif rank[m.name] < rank[t.name]:
                out[(t.name, m.name)] = (math.ceil(t.deadline_s / m.period_s - 1e-12) + 1, False)
            else:
                out[(t.name, m.name)] = (0, True)
    return out


def _busy(o, r):
    return o.fabric_s if r == "fabric" else o.cpu_s


def _max_busy(nc):
    """Lambda: {resource: the longest time any option of any layer holds it}."""
    return {r: max((_busy(o, r) for L in nc.layers for o in L.options.values()), default=0.0)
            for r in ("fabric", "cpu")}


def _blocking(k_n, entries, lam, cap):
    """sum over resources of min(K_n lambda_r, Lambda_r E_r)."""
    return sum(min(k_n * lam[r], cap[r] * entries[r]) for r in ("fabric", "cpu"))


def _interference(tasks, costs, coeffs, per):
    """{network: seconds other frames may hold the resources} for evaluated networks."""
    caps = {t.name: _max_busy(nc) for t, nc in zip(tasks, costs)}
    size = {t.name: len(nc.layers) for t, nc in zip(tasks, costs)}
    out = {}
    for t in tasks:
        tot = 0.0
        for m in tasks:
            k, lower = coeffs[(t.name, m.name)]
            tot += k * sum(per[m.name]["busy_s"].values())
            if lower:
                tot += _blocking(size[t.name], per[t.name]["entries"], per[m.name]["longest"],
                                 caps[m.name])
        out[t.name] = tot
    return out


def evaluate(tasks, costs, rm: ResourceModel, assign, power_cap_w=None):
    """The model's figures for an assignment {network: {layer: option key}}: per network
    latency, busy time per resource, dynamic energy per frame, the response bound; plus
    utilisation, average power and whether every constraint holds."""
    per = {}
    for t, nc in zip(tasks, costs):
        a = assign[t.name]
        avail = {"fabric": 0.0, "cpu": 0.0}
        fin, side, times = {}, {}, {}
        energy, busy, lat = 0.0, {"fabric": 0.0, "cpu": 0.0}, 0.0
        moved = set()
        longest = {"fabric": 0.0, "cpu": 0.0}
        entries = {"fabric": 0, "cpu": 0}
        for L in nc.layers:
            o = L.options[a[L.name]]
            start = 0.0
            if L.graph_input_bytes and "fabric" in o.uses:
                start = rm.transfer_s(L.graph_input_bytes)
                energy += rm.transfer_j(L.graph_input_bytes)
            for p in L.inputs:
                t_p = fin[p]
                other = [s for s in o.in_sides if s != side[p]]
                if other:
                    pb = nc.layer(p).out_bytes
                    t_p += rm.transfer_s(pb)
                    for s in other:
                        if (p, s) not in moved:
                            moved.add((p, s))
                            energy += rm.transfer_j(pb)
                start = max(start, t_p)
            for r in o.uses:
                start = max(start, avail[r])
            end = start + o.latency_s
            for r in o.uses:
                longest[r] = max(longest[r], _busy(o, r))
                if not L.inputs or any(side[p] != r for p in L.inputs):
                    entries[r] += 1
            for r in o.uses:
                b = o.fabric_s if r == "fabric" else o.cpu_s
                avail[r] = start + b
                busy[r] += b
            fin[L.name], side[L.name] = end, o.out_side
            times[L.name] = (start, end)
            energy += o.energy_j
            done = end
            if L.is_output and o.out_side == "fabric":
                done += rm.transfer_s(L.out_bytes)
                energy += rm.transfer_j(L.out_bytes)
            lat = max(lat, done)             # the frame is done when every layer is
        per[t.name] = {"latency_s": lat, "busy_s": busy, "energy_j": energy, "times": times,
                       "longest": longest, "entries": entries}
    inter = _interference(tasks, costs, _coeffs(tasks, costs), per)
    util = {r: sum(per[t.name]["busy_s"][r] / t.period_s for t in tasks) for r in ("fabric", "cpu")}
    power = rm.idle_w_total + sum(per[t.name]["energy_j"] / t.period_s for t in tasks)
    ok = all(util[r] <= 1 + 1e-9 for r in util)
    for t in tasks:
        per[t.name]["bound_s"] = per[t.name]["latency_s"] + inter[t.name]
        per[t.name]["meets"] = per[t.name]["bound_s"] <= t.budget_s * (1 + 1e-9)
        ok = ok and per[t.name]["meets"]
    if power_cap_w is not None and power > power_cap_w * (1 + 1e-9):
        ok = False
    return {"networks": per, "utilization": util, "avg_power_w": power, "feasible": ok}


def _objective_value(tasks, ev, weights, norm):
    val = 0.0
    for k, w in weights.items():
        val += w * _terms(tasks, ev)[k] / norm.get(k, 1.0)
    return val


def _terms(tasks, ev):
    per = ev["networks"]
    return {"energy": sum(per[t.name]["energy_j"] for t in tasks),
            "power": sum(per[t.name]["energy_j"] / t.period_s for t in tasks),
            "latency": sum(per[t.name]["latency_s"] / t.deadline_s for t in tasks)}


# ---------------------------------------------------------------------- the program
class _Vars:
    def __init__(self):
        self.lb, self.ub, self.integ, self.c = [], [], [], []

    def add(self, lb=0.0, ub=np.inf, integer=False):
        self.lb.append(lb)
        self.ub.append(ub)
        self.integ.append(1 if integer else 0)
        self.c.append(0.0)
        return len(self.lb) - 1


class _Rows:
    def __init__(self):
        self.r, self.cidx, self.v, self.lo, self.hi = [], [], [], [], []

    def add(self, terms, lo=-np.inf, hi=np.inf):
        k = len(self.lo)
        for j, a in terms:
            if a != 0:
                self.r.append(k)
                self.cidx.append(j)
                self.v.append(float(a))
        self.lo.append(lo)
        self.hi.append(hi)


def _horizon(nc, rm):
    h = 0.0
    for L in nc.layers:
        h += max(o.latency_s for o in L.options.values())
        h += rm.transfer_s(L.graph_input_bytes) + rm.transfer_s(L.out_bytes) * 2
    return h * 1.01 + 1e-6


def solve(tasks, costs, rm: ResourceModel, objective="energy", power_cap_w=None,
          time_limit_s=30.0, norm=None, mip_rel_gap=1e-7):
    """Solve one instance (one worker count). ``tasks`` [Task], ``costs`` [NetworkCost]
    (same order). Returns (assignment, info) with info {status, optimal, solve_s,
    objective, message}; the assignment is None when no plan exists."""
    weights = parse_objective(objective)
    norm = norm or {}
    V, R = _Vars(), _Rows()
    X = {}                        # (net, layer) -> {key: var}
    lat_var, busy_terms, energy_terms, lam_var, entry_var = {}, {}, {}, {}, {}
    coeffs = _coeffs(tasks, costs)
    for t, nc in zip(tasks, costs):
        H = _horizon(nc, rm)
        prev_a = {"fabric": None, "cpu": None}
        fvar, yfab = {}, {}
        e_terms = []                                  # (var, coeff) of frame energy
        b_terms = {"fabric": [], "cpu": []}
        Lv = V.add(0.0, np.inf)
        lat_var[t.name] = Lv
        lower_of = any(coeffs[(u.name, t.name)][1] for u in tasks)    # t blocks someone
        higher = any(coeffs[(t.name, u.name)][1] for u in tasks)      # someone blocks t
        lam = lam_var[t.name] = {r: V.add(0.0, np.inf) for r in ("fabric", "cpu")}
        ent = entry_var[t.name] = {r: [] for r in ("fabric", "cpu")}
        outs = {}                                     # layer -> {r: [(var, 1)] output on r}
        need_c, need_f = {}, {}                       # producer -> [(consumer side var terms)]
        for L in nc.layers:
            xs = {k: V.add(0, 1, True) for k in L.options}
            X[(t.name, L.name)] = xs
            R.add([(v, 1) for v in xs.values()], 1, 1)
            s, f = V.add(), V.add(0.0, H)
            # f = s + sum x lat
            R.add([(f, 1), (s, -1)] + [(xs[k], -o.latency_s) for k, o in L.options.items()], 0, 0)
            fab_side = [(xs[k], 1) for k, o in L.options.items() if "fabric" in o.in_sides]
            cpu_side = [(xs[k], 1) for k, o in L.options.items() if "cpu" in o.in_sides]
            outs[L.name] = {r: [(xs[k], 1) for k, o in L.options.items() if o.out_side == r]
                            for r in ("fabric", "cpu")}
            for r in ("fabric", "cpu"):
                use = [(xs[k], 1) for k, o in L.options.items() if r in o.uses]
                if lower_of and use:                  # lambda_r >= this layer's time on r
                    R.add([(lam[r], 1)] + [(xs[k], -_busy(o, r)) for k, o in L.options.items()
                                            if r in o.uses], 0)
                if higher and use:                    # entry_r >= u_r - out_{p,r}
                    e = V.add(0, 1)
                    ent[r].append(e)
                    if not L.inputs:
                        R.add([(e, 1)] + [(v, -1) for v, _ in use], 0)
                    for p in L.inputs:
                        R.add([(e, 1)] + [(v, -1) for v, _ in use] + outs[p][r], 0)
            for k, o in L.options.items():
                e_terms.append((xs[k], o.energy_j))
                b_terms["fabric"].append((xs[k], o.fabric_s))
                b_terms["cpu"].append((xs[k], o.cpu_s))
            if L.graph_input_bytes and fab_side:
                T = rm.transfer_s(L.graph_input_bytes)
                R.add([(s, 1)] + [(v, -T) for v, _ in fab_side], 0)
                e_terms += [(v, rm.transfer_j(L.graph_input_bytes)) for v, _ in fab_side]
            for p in L.inputs:
                T = rm.transfer_s(nc.layer(p).out_bytes)
                # s >= f_p always; + T if p on fabric and we need it on the CPU, or p on the
                # CPU and we need it on the fabric
                R.add([(s, 1), (fvar[p], -1)], 0)
                if cpu_side:
                    R.add([(s, 1), (fvar[p], -1), (yfab[p], -T)] + [(v, -T) for v, _ in cpu_side], -T)
                    need_c.setdefault(p, []).append(cpu_side)
                if fab_side:
                    R.add([(s, 1), (fvar[p], -1), (yfab[p], T)] + [(v, -T) for v, _ in fab_side], 0)
                    need_f.setdefault(p, []).append(fab_side)
            for r in ("fabric", "cpu"):
                use = [(xs[k], 1) for k, o in L.options.items() if r in o.uses]
                a = V.add(0.0, H)
                if prev_a[r] is not None:
                    R.add([(a, 1), (prev_a[r], -1)], 0)
                if use:
                    if prev_a[r] is not None:
                        # s >= a_prev - H (1 - u)
                        R.add([(s, 1), (prev_a[r], -1)] + [(v, -H) for v, _ in use], -H)
                    busy = [(xs[k], -(o.fabric_s if r == "fabric" else o.cpu_s))
                            for k, o in L.options.items() if r in o.uses]
                    R.add([(a, 1), (s, -1)] + busy + [(v, -H) for v, _ in use], -H)
                prev_a[r] = a
            fvar[L.name] = f
            yfab[L.name] = xs["fabric"] if "fabric" in xs else None
            if yfab[L.name] is None:
                yfab[L.name] = V.add(0, 0)            # a constant 0
            T = rm.transfer_s(L.out_bytes) if L.is_output else 0.0
            R.add([(Lv, 1), (f, -1), (yfab[L.name], -T)], 0)     # done when every layer is
            if L.is_output and T:
                e_terms.append((yfab[L.name], rm.transfer_j(L.out_bytes)))
        # tensor moves' energy: once per producer and direction
        for p, sides in need_c.items():
            pb = nc.layer(p).out_bytes
            m = V.add(0, 1)
            for cs in sides:                         # m >= yfab_p + cpu_side - 1
                R.add([(m, 1), (yfab[p], -1)] + [(v, -1) for v, _ in cs], -1)
            e_terms.append((m, rm.transfer_j(pb)))
        for p, sides in need_f.items():
            pb = nc.layer(p).out_bytes
            m = V.add(0, 1)
            for fs in sides:                         # m >= (1 - yfab_p) + fab_side - 1
                R.add([(m, 1), (yfab[p], 1)] + [(v, -1) for v, _ in fs], 0)
            e_terms.append((m, rm.transfer_j(pb)))
        energy_terms[t.name] = e_terms
        busy_terms[t.name] = b_terms
    # deadlines with interference, utilisation, power cap
    caps = {t.name: _max_busy(nc) for t, nc in zip(tasks, costs)}
    size = {t.name: len(nc.layers) for t, nc in zip(tasks, costs)}
    for t in tasks:
        terms = [(lat_var[t.name], 1)]
        for m in tasks:
            k, lower = coeffs[(t.name, m.name)]
            if k:
                for r in ("fabric", "cpu"):
                    terms += [(v, k * b) for v, b in busy_terms[m.name][r]]
            if lower:
                # w_r >= min(K lambda_r, Lambda_r E_r): one binary picks the smaller bound
                for r in ("fabric", "cpu"):
                    cap, K = caps[m.name][r], size[t.name]
                    if cap <= 0:
                        continue
                    w, z, M = V.add(0.0, np.inf), V.add(0, 1, True), K * cap
                    R.add([(w, 1), (lam_var[m.name][r], -K), (z, M)], 0)
                    R.add([(w, 1), (z, -M)] + [(e, -cap) for e in entry_var[t.name][r]], -M)
                    terms.append((w, 1))
        R.add(terms, -np.inf, t.budget_s)
    for r in ("fabric", "cpu"):
        R.add([(v, b / t.period_s) for t in tasks for v, b in busy_terms[t.name][r]], -np.inf, 1.0)
    if power_cap_w is not None:
        R.add([(v, e / t.period_s) for t in tasks for v, e in energy_terms[t.name]], -np.inf,
              power_cap_w - rm.idle_w_total)
    # objective
    c = np.zeros(len(V.lb))
    for k, w in weights.items():
        scale = w / norm.get(k, 1.0)
        for t in tasks:
            if k == "energy":
                for v, e in energy_terms[t.name]:
                    c[v] += scale * e
            elif k == "power":
                for v, e in energy_terms[t.name]:
                    c[v] += scale * e / t.period_s
            else:
                c[lat_var[t.name]] += scale / t.deadline_s
    A = coo_matrix((R.v, (R.r, R.cidx)), shape=(len(R.lo), len(V.lb))).tocsr()
    # the objective's raw coefficients are joules or seconds / deadline, as small as 1e-9:
    # below HiGHS's tolerances every plan would look equally good, so scale it to 1
    cmax = float(np.abs(c).max()) if len(c) else 0.0
    cscale = 1.0 / cmax if cmax > 0 else 1.0
    t0 = time.perf_counter()
    res = milp(c * cscale, constraints=LinearConstraint(A, R.lo, R.hi), integrality=np.array(V.integ),
               bounds=Bounds(V.lb, V.ub),
               options={"time_limit": float(time_limit_s), "mip_rel_gap": mip_rel_gap,
                        "presolve": True})
    solve_s = time.perf_counter() - t0
    info = {"status": _STATUS.get(res.status, str(res.status)), "optimal": res.status == 0,
            "solve_s": round(solve_s, 4), "message": res.message,
            "variables": len(V.lb), "constraints": len(R.lo),
            "binaries": int(sum(V.integ)), "mip_gap": getattr(res, "mip_gap", None)}
    if res.x is None:
        return None, info
    assign = {}
    for (n, l), xs in X.items():
        assign.setdefault(n, {})[l] = max(xs, key=lambda k: res.x[xs[k]])
    info["objective"] = float(res.fun) / cscale
    return assign, info


_STATUS = {0: "optimal", 1: "time or iteration limit", 2: "infeasible", 3: "unbounded",
           4: "other"}


# ---------------------------------------------------------------------- baselines
def _single(nc, pick):
    return {L.name: pick(L) for L in nc.layers}


def baselines(tasks, costs, rm, power_cap_w=None):
    """all-fabric (every layer the fabric can run there), all-CPU, and greedy
    fastest-resource (each layer where it alone is fastest, no splits):
    {name: (assignment, evaluation)}."""
    picks = {
        "all_fabric": lambda L: "fabric" if "fabric" in L.options else "cpu",
        "all_cpu": lambda L: "cpu",
        "greedy": lambda L: min((k for k in ("fabric", "cpu") if k in L.options),
                                key=lambda k: (L.options[k].latency_s, k)),
    }
    out = {}
    for name, pick in picks.items():
        a = {t.name: _single(nc, pick) for t, nc in zip(tasks, costs)}
        out[name] = (a, evaluate(tasks, costs, rm, a, power_cap_w))
    return out


def exhaustive(tasks, costs, rm, objective="energy", power_cap_w=None, norm=None):
    """Every assignment (small instances only, for the tests): (best assignment, value)."""
    weights = parse_objective(objective)
    norm = norm or {}
    slots = [(t.name, L.name, list(L.options)) for t, nc in zip(tasks, costs) for L in nc.layers]
    best, best_v = None, math.inf
    for combo in itertools.product(*[s[2] for s in slots]):
        a = {}
        for (n, l, _), k in zip(slots, combo):
            a.setdefault(n, {})[l] = k
        ev = evaluate(tasks, costs, rm, a, power_cap_w)
        if not ev["feasible"]:
            continue
        v = _objective_value(tasks, ev, weights, norm)
        if v < best_v - 1e-15:
            best, best_v = a, v
    return best, best_v


# ---------------------------------------------------------------------- the front door
def _norm(tasks, costs, rm, weights):
    if len(weights) == 1:
        return {}
    a, ev = baselines(tasks, costs, rm)["all_fabric"]
    terms = _terms(tasks, ev)
    return {k: (v if v > 0 else 1.0) for k, v in terms.items()}


def _why_infeasible(tasks, costs, rm, power_cap_w):
    """A sentence naming the bottleneck when no plan exists."""
    # each network's fastest plan on its own (latency objective, no deadline), then the
    # bound of all of them together
    a, msgs = {}, []
    for t, nc in zip(tasks, costs):
        one, _ = solve([Task(t.name, t.period_s * 1e9, t.deadline_s * 1e9)], [nc], rm,
                       objective="latency", time_limit_s=10)
        if one is None:
            a = None
            break
        a.update(one)
    if a is not None:
        ev = evaluate(tasks, costs, rm, a)
        for t, nc in zip(tasks, costs):
            per = ev["networks"][t.name]
            if per["bound_s"] > t.budget_s:
                big = max(nc.layers, key=lambda L: min(o.latency_s for o in L.options.values()))
                bo = min(big.options.values(), key=lambda o: o.latency_s)
                msgs.append(f"{t.name}: its fastest plan takes {per['latency_s'] * 1e3:.3g} ms"
                            + (f" (+{(per['bound_s'] - per['latency_s']) * 1e3:.3g} ms waiting "
                               "for the other networks)" if per['bound_s'] > per['latency_s'] else "")
                            + f" against a deadline of {t.deadline_s * 1e3:.3g} ms"
                            + (f" less a {t.margin_s * 1e3:.3g} ms margin" if t.margin_s else "")
                            + "; its longest "
                            f"layer {big.name} needs {bo.latency_s * 1e3:.3g} ms at best ({bo.key})")
        for r, u in ev["utilization"].items():
            if u > 1:
                msgs.append(f"the {r} would be busy {u:.0%} of the time")
    if power_cap_w is not None:
        low = [Task(t.name, t.period_s, t.deadline_s * 1e9) for t in tasks]
        a2, _ = solve(low, costs, rm, objective="power", time_limit_s=10)
        if a2 is not None:
            p = evaluate(low, costs, rm, a2)["avg_power_w"]
            if p > power_cap_w:
                msgs.append(f"the lowest average power of any plan is {p:.3g} W, over the "
                            f"{power_cap_w:.3g} W cap (idle alone {rm.idle_w_total:.3g} W)")
    return "; ".join(msgs) or "no plan meets every constraint at once"


def schedule(tasks, costs_by_workers, rms, objective="energy", power_cap_w=None,
             time_limit_s=30.0, board="", host="board"):
    """The best plan over the worker counts: ``costs_by_workers`` {w: [NetworkCost]},
    ``rms`` {w: ResourceModel}. Returns (Plan, report) where report holds the per-count
    solves and the baselines at the chosen count."""
    weights = parse_objective(objective)
    best = None
    tried = {}
    t_all = time.perf_counter()
    for w in sorted(costs_by_workers):
        costs, rm = costs_by_workers[w], rms[w]
        norm = _norm(tasks, costs, rm, weights)
        a, info = solve(tasks, costs, rm, objective, power_cap_w, time_limit_s, norm)
        tried[w] = info
        if a is None:
            continue
        ev = evaluate(tasks, costs, rm, a, power_cap_w)
        v = _objective_value(tasks, ev, weights, norm)
        if best is None or v < best[0] - 1e-12:
            best = (v, w, a, ev, info)
    w_report = max(costs_by_workers) if best is None else best[1]
    costs, rm = costs_by_workers[w_report], rms[w_report]
    base = baselines(tasks, costs, rm, power_cap_w)
    solver = {"status": "infeasible" if best is None else best[4]["status"],
              "optimal": best is not None and all(i["optimal"] for i in tried.values()),
              "solve_s": round(time.perf_counter() - t_all, 4),
              "per_workers": {str(k): v for k, v in tried.items()}}
    if best is None:
        a, _ = base["all_fabric"]
        ev = evaluate(tasks, costs, rm, a, power_cap_w)
        plan = _to_plan(tasks, costs, rm, a, ev, objective, w_report, board, host, power_cap_w)
        plan.feasible = False
        plan.why = _why_infeasible(tasks, costs, rm, power_cap_w)
        solver["optimal"] = all(i["status"] == "infeasible" for i in tried.values())
    else:
        _, w_report, a, ev, info = best
        plan = _to_plan(tasks, costs, rm, a, ev, objective, w_report, board, host, power_cap_w)
    plan.solver = solver
    return plan, {"baselines": base, "costs": costs, "rm": rm}


def _to_plan(tasks, costs, rm, a, ev, objective, workers, board, host, cap):
    nets = []
    for t, nc in zip(tasks, costs):
        per = ev["networks"][t.name]
        choices = []
        for L in nc.layers:
            k = a[t.name][L.name]
            o = L.options[k]
            res = "split" if k.startswith("split") else k
            cout = 0
            if res == "split":
                cout = int(o.detail.get("out_channels", 0))
            st, en = per["times"][L.name]
            choices.append(LayerChoice(network=t.name, layer=L.name, resource=res,
                                       fabric_channels=o.fabric_channels, out_channels=cout,
                                       start_s=st, end_s=en, energy_j=o.energy_j))
        nets.append(NetworkPlan(task=t, layers=choices, latency_s=per["latency_s"],
                                bound_s=per["bound_s"], energy_j=per["energy_j"],
                                busy_s=dict(per["busy_s"])))
    return Plan(networks=nets, objective=str(objective), workers=workers, board=board, host=host,
                clock_mhz=rm.clock_mhz, power_cap_w=cap, avg_power_w=ev["avg_power_w"],
                idle_w=rm.idle_w_total, feasible=ev["feasible"], utilization=ev["utilization"])
