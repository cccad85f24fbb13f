"""The scheduler (sw/sched/milp.py): optimal against exhaustive search on random instances,
deadlines and power caps respected in the model, infeasible cases named."""

import math

import numpy as np
import pytest

from dnnfab.errors import ConfigError
from dnnfab.sw.metrics.costs import LayerCost, NetworkCost, Option, ResourceModel
from dnnfab.sw.sched.milp import baselines, evaluate, exhaustive, parse_objective, schedule, solve
from dnnfab.sw.sched.plan import Task


def random_network(rng, name, n_layers, p_split=0.5):
    layers = []
    for i in range(n_layers):
        k = int(rng.integers(0, min(i, 2) + 1))
        inputs = sorted({f"{name}{j}" for j in rng.choice(i, size=k, replace=False)}) if i else []
        cpu_s = float(rng.uniform(0.5, 5)) * 1e-3
        opts = {"cpu": Option("cpu", cpu_s=cpu_s, latency_s=cpu_s,
                              energy_j=cpu_s * float(rng.uniform(0.5, 2)))}
        if rng.random() < 0.75:
            fab = float(rng.uniform(0.2, 4)) * 1e-3
            opts["fabric"] = Option("fabric", fabric_s=fab, latency_s=fab,
                                    energy_j=fab * float(rng.uniform(0.05, 0.6)))
            if rng.random() < p_split:
                f = float(rng.uniform(0.2, 0.8))
                fs, cs = fab * f, cpu_s * (1 - f)
                opts["split:8"] = Option("split:8", fabric_s=fs, cpu_s=cs,
                                         latency_s=max(fs, cs) + 1e-5,
                                         energy_j=opts["fabric"].energy_j * f
                                         + opts["cpu"].energy_j * (1 - f), fabric_channels=8,
                                         detail={"out_channels": 16})
        layers.append(LayerCost(name=f"{name}{i}", op="conv", macs=1, inputs=inputs,
                                out_bytes=int(rng.integers(100, 20000)), options=opts,
                                graph_input_bytes=int(rng.integers(100, 5000)) if i == 0 else 0,
                                is_output=(i == n_layers - 1)))
    return NetworkCost(name=name, layers=layers)


def _rm(rng):
    return ResourceModel(board="test", clock_mhz=100, workers=1, host="board",
                         idle_w={"board": 0.2, "fabric": 0.05, "cpu": 0.01},
                         transfer_bytes_per_s=float(rng.uniform(2e6, 2e7)),
                         transfer_fixed_s=2e-5, transfer_j_per_byte=float(rng.uniform(0, 1e-7)))


def _value(tasks, costs, rm, a, objective, cap=None):
    from dnnfab.sw.sched.milp import _objective_value
    ev = evaluate(tasks, costs, rm, a, cap)
    return ev, _objective_value(tasks, ev, parse_objective(objective), {})


@pytest.mark.parametrize("seed", range(30))
def test_milp_equals_exhaustive_search(seed):
    rng = np.random.default_rng(seed)
    two = seed % 3 == 0
    nets = [random_network(rng, "a", int(rng.integers(3, 7 if not two else 5)))]
    if two:
        nets.append(random_network(rng, "b", int(rng.integers(2, 4))))
    rm = _rm(rng)
    # deadlines between the fastest and the slowest single-resource plans
    base = baselines([Task(n.name, 1.0, 1.0) for n in nets], nets, rm)
    tasks = []
    for n in nets:
        lo = min(b[1]["networks"][n.name]["latency_s"] for b in base.values())
        hi = max(b[1]["networks"][n.name]["latency_s"] for b in base.values())
        d = float(rng.uniform(0.7 * lo, 1.2 * hi))
        tasks.append(Task(n.name, period_s=d * float(rng.uniform(1, 3)) * (4 if two else 1),
                          deadline_s=d * (3 if two else 1)))
    objective = ["energy", "power", "latency", "energy:0.5,latency:0.5"][seed % 4]
    cap = None
    if seed % 5 == 4:
        cap = rm.idle_w_total + float(rng.uniform(0.1, 1.0))
    a_ex, v_ex = exhaustive(tasks, nets, rm, objective, cap)
    a, info = solve(tasks, nets, rm, objective, cap)
    if a_ex is None:
        assert a is None and info["status"] == "infeasible"
        return
    assert a is not None and info["optimal"], info
    ev, v = _value(tasks, nets, rm, a, objective, cap)
    assert ev["feasible"]
    assert math.isclose(v, v_ex, rel_tol=1e-5, abs_tol=1e-12), (v, v_ex)


@pytest.mark.parametrize("seed", range(12))
def test_plans_respect_deadlines_and_power_caps(seed):
    rng = np.random.default_rng(100 + seed)
    nets = [random_network(rng, "a", 12), random_network(rng, "b", 6)]
    rm = _rm(rng)
    base = baselines([Task(n.name, 1.0, 1.0) for n in nets], nets, rm)
    tasks = []
    for n in nets:
        fast = min(b[1]["networks"][n.name]["latency_s"] for b in base.values())
        tasks.append(Task(n.name, period_s=fast * float(rng.uniform(4, 8)),
                          deadline_s=fast * float(rng.uniform(2, 4))))
    cap = rm.idle_w_total + float(rng.uniform(0.2, 2.0)) if seed % 2 else None
    costs = {1: nets, 2: [random_network(np.random.default_rng(seed), "a", 12),
                          random_network(np.random.default_rng(seed + 1), "b", 6)]}
    plan, rep = schedule(tasks, costs, {1: rm, 2: rm}, "energy", cap)
    if not plan.feasible:
        assert plan.why and plan.solver["status"] == "infeasible"
        return
    ev = evaluate(tasks, costs[plan.workers], rm,
                  {n.name: {c.layer: _key(c) for c in n.layers} for n in plan.networks}, cap)
    assert ev["feasible"]
    for n in plan.networks:
        assert n.bound_s <= n.task.deadline_s * (1 + 1e-9)
        assert n.latency_s <= n.bound_s + 1e-12
    if cap is not None:
        assert plan.avg_power_w <= cap * (1 + 1e-9)
    for r, u in plan.utilization.items():
        assert u <= 1 + 1e-9
    # never worse than a feasible baseline
    for name, (a, bev) in rep["baselines"].items():
        if bev["feasible"] and plan.workers == 1:
            assert plan.avg_power_w <= bev["avg_power_w"] * (1 + 1e-7)


def _key(c):
    return "split:8" if c.resource == "split" else c.resource


def test_infeasible_deadline_names_the_bottleneck():
    rng = np.random.default_rng(7)
    net = random_network(rng, "a", 6)
    rm = _rm(rng)
    plan, _ = schedule([Task("a", 1e-4, 1e-4)], {1: [net]}, {1: rm}, "energy")
    assert not plan.feasible
    assert "a: its fastest plan takes" in plan.why and "deadline of 0.1 ms" in plan.why
    assert "longest layer a" in plan.why
    plan, _ = schedule([Task("a", 10.0, 10.0)], {1: [net]}, {1: rm}, "energy",
                       power_cap_w=rm.idle_w_total * 0.5)
    assert not plan.feasible and "over the" in plan.why and "cap" in plan.why


def test_bad_objectives_are_one_line_errors():
    with pytest.raises(ConfigError, match="unknown objective 'speed'"):
        parse_objective("speed")
    with pytest.raises(ConfigError, match="not a number"):
        parse_objective("energy:x")
    assert parse_objective("energy:0.7,latency:0.3") == {"energy": 0.7, "latency": 0.3}


@pytest.mark.parametrize("p_split", [0.0, 0.5])
def test_the_runtime_policy_keeps_the_modelled_latency(p_split):
    """The runtime's modelled replay (the same dispatch code as a real run: in order per
    resource within a frame, earliest release first) gives every plan's frame exactly the
    latency the MILP modelled; a split may only finish earlier (its halves start
    independently at run time, the model holds both resources from one start)."""
    from dnnfab.sw.runtime.realtime import replay_plan
    checked = 0
    for seed in range(25):
        rng = np.random.default_rng(seed)
        net = random_network(rng, "a", int(rng.integers(4, 14)), p_split=p_split)
        rm = _rm(rng)
        base = baselines([Task("a", 1, 1)], [net], rm)
        d = 1.3 * min(b[1]["networks"]["a"]["latency_s"] for b in base.values())
        plan, _ = schedule([Task("a", 10 * d, d)], {1: [net]}, {1: rm})
        if not plan.feasible:
            continue
        lat = replay_plan(plan, [net], rm, frames=1).frames[0].latency_s
        want = plan.networks[0].latency_s
        if p_split == 0.0:
            assert lat == pytest.approx(want, rel=1e-9, abs=1e-12)
        else:
            assert lat <= want * (1 + 1e-9)
        checked += 1
    assert checked >= 15


@pytest.mark.parametrize("seed", range(8))
def test_tiny_objective_coefficients_still_optimal(seed):
    """Energies of nanojoules and deadlines of 10^9 s (the infeasibility analysis' loose
    tasks) make the raw objective coefficients far below HiGHS's tolerances; the objective
    is scaled, so the optimum still equals exhaustive search (found on squeezenet: a
    "latency-optimal" plan 2.2x slower than all-fabric)."""
    rng = np.random.default_rng(500 + seed)
    net = random_network(rng, "a", int(rng.integers(3, 7)))
    for L in net.layers:
        for o in L.options.values():
            o.energy_j *= 1e-6
    rm = _rm(rng)
    for objective, task in (("energy", None), ("latency", Task("a", 1e9, 1e9))):
        if task is None:
            base = baselines([Task("a", 1.0, 1.0)], [net], rm)
            d = 1.2 * min(b[1]["networks"]["a"]["latency_s"] for b in base.values())
            task = Task("a", d, d)
        a_ex, v_ex = exhaustive([task], [net], rm, objective)
        a, info = solve([task], [net], rm, objective)
        if a_ex is None:
            assert a is None
            continue
        _, v = _value([task], [net], rm, a, objective)
        assert math.isclose(v, v_ex, rel_tol=1e-6, abs_tol=0), (objective, v, v_ex)
