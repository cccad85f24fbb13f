"""One call from quantized networks to a plan: the metric model per worker count, the MILP,
the baselines and the figures ``dnnfab schedule --json`` prints.

>>> res = plan_networks([("digits-cnn", qg, None, None)], board="ulx3s-85f")
>>> res.plan.networks[0].layers[0].resource, res.summary()["energy_saving_vs_best_single"]
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ...errors import ConfigError
from .milp import baselines, schedule
from .plan import Plan, Task

__all__ = ["DEADLINE_FACTOR", "ScheduleResult", "plan_networks", "check_specs"]

#: without --deadline-ms or --fps the deadline is this multiple of the all-fabric latency
DEADLINE_FACTOR = 1.5


@dataclass
class ScheduleResult:
    plan: Plan
    baselines: dict                 # name -> (assignment, evaluation)
    costs: list                     # [NetworkCost] at the chosen worker count
    rm: object                      # ResourceModel at the chosen worker count
    tasks: list
    model_s: float = 0.0            # building the metric model
    notes: list = None

    def _energy_mj(self, ev, name):
        rate = sum(1 / t.period_s for t in self.tasks)
        return (ev["networks"][name]["energy_j"] + self.rm.idle_w_total / rate) * 1e3

    def summary(self):
        """The figures of ``dnnfab schedule --json`` (modelled; the runtime adds measured
        ones)."""
        p, first = self.plan, self.tasks[0].name
        base = {}
        for k, (a, ev) in self.baselines.items():
            base[k] = {"latency_ms": ev["networks"][first]["latency_s"] * 1e3,
                       "bound_ms": ev["networks"][first]["bound_s"] * 1e3,
                       "energy_mj_per_frame": self._energy_mj(ev, first),
                       "avg_power_w": ev["avg_power_w"], "meets_deadline": bool(ev["feasible"]),
                       "networks": {t.name: {"latency_ms": ev["networks"][t.name]["latency_s"] * 1e3,
                                             "meets_deadline": bool(ev["networks"][t.name]["meets"])}
                                    for t in self.tasks}}
        singles = [b for k, b in base.items() if k in ("all_fabric", "all_cpu") and b["meets_deadline"]]
        saving = None
        if p.feasible and singles:
            best = min(b["avg_power_w"] for b in singles)
            saving = 1.0 - p.avg_power_w / best
        n0 = p.networks[0]
        rate = sum(1 / t.period_s for t in self.tasks)
        return {
            "board": p.board, "host": p.host, "clock_mhz": p.clock_mhz, "workers": p.workers,
            "objective": p.objective, "power_cap_w": p.power_cap_w,
            "feasible": p.feasible, "why": p.why,
            "deadline_ms": n0.task.deadline_s * 1e3, "period_ms": n0.task.period_s * 1e3,
            "margin_ms": n0.task.margin_s * 1e3,
            "latency_ms": {"model": n0.latency_s * 1e3, "bound": n0.bound_s * 1e3},
            "energy_mj_per_frame": (n0.energy_j + p.idle_w / rate) * 1e3,
            "avg_power_w": p.avg_power_w, "idle_w": p.idle_w,
            "utilization": p.utilization,
            "baselines": base, "energy_saving_vs_best_single": saving,
            "solver": p.solver, "metric_model_s": round(self.model_s, 3),
            "networks": [{"network": n.name, "period_ms": n.task.period_s * 1e3,
                          "deadline_ms": n.task.deadline_s * 1e3, "margin_ms": n.task.margin_s * 1e3,
                          "latency_ms": n.latency_s * 1e3,
                          "bound_ms": n.bound_s * 1e3,
                          "energy_mj_per_frame": (n.energy_j + p.idle_w / rate) * 1e3,
                          "busy_ms": {k: v * 1e3 for k, v in n.busy_s.items()}}
                         for n in p.networks],
            "plan": [{"network": c.network, "layer": c.layer, "resource": c.resource,
                      "split": round(c.split, 4), "fabric_channels": c.fabric_channels,
                      "start_ms": c.start_s * 1e3, "end_ms": c.end_s * 1e3}
                     for n in p.networks for c in n.layers],
            "notes": list(self.notes or []),
        }


#: host "local": the fraction of a deadline a plan keeps free for this shared 2-core
#: machine's jitter (a real run's p99 frame latency was up to 1.4x its p50 here, see
#: benchmarks/runtime_real.json)
LOCAL_MARGIN = 0.3


def check_specs(specs):
    """One-line errors for [(name, fps or None, deadline_ms or None)] before any work:
    no network, a rate or deadline that is not positive, a name given twice."""
    if not specs:
        raise ConfigError("nothing to schedule: give at least one model")
    seen = set()
    for name, fps, deadline_ms in specs:
        if fps is not None and fps <= 0:
            raise ConfigError(f"{name}: --fps must be positive (got {fps:g})")
        if deadline_ms is not None and deadline_ms <= 0:
            raise ConfigError(f"{name}: --deadline-ms must be positive (got {deadline_ms:g})")
        if name in seen:
            raise ConfigError(f"two networks are called {name!r}; schedule each model once")
        seen.add(name)


def plan_networks(nets, board="ulx3s-85f", cfg=None, host="board", objective="energy",
                  power_cap_w=None, workers=None, clock_mhz=None, time_limit_s=30.0,
                  metric_model=None, splits=(0.25, 0.5, 0.75), margin=None):
    """``nets``: [(name, QuantizedGraph, fps or None, deadline_ms or None)]. A network
    without a rate runs at the rate its deadline allows (period = deadline); one without
    either gets :data:`DEADLINE_FACTOR` x its all-fabric latency as both. ``workers``: the
    CPU worker counts to try (default 1..the host's cores). ``margin``: the fraction of
    each deadline the plan keeps free (default :data:`LOCAL_MARGIN` for ``host="local"``,
    whose plans run for real on this shared machine, 0 for a board's modelled timeline)."""
    from ..metrics.model import MetricModel
    check_specs([(name, fps, d) for name, _, fps, d in nets])
    t0 = time.perf_counter()
    if metric_model is None:
        emu = None
        if host == "local":         # a real run here: launches last what the model takes
            from ..driver.emulation import LaunchProfile
            emu = LaunchProfile()
        metric_model = MetricModel(board=board, cfg=cfg, host=host, clock_mhz=clock_mhz,
                                   emulation=emu)
    mm = metric_model
    if workers is None:
        workers = list(range(1, mm.max_workers() + 1))
    elif isinstance(workers, int):
        workers = [workers]
    costs_by_w, rms = {}, {}
    for w in workers:
        rms[w] = mm.resources(w)
        costs_by_w[w] = [mm.network(qg, w, name=name, splits=splits) for name, qg, _, _ in nets]
    model_s = time.perf_counter() - t0
    notes = []
    if margin is None:
        margin = LOCAL_MARGIN if host == "local" else 0.0
    if not 0.0 <= margin < 1.0:
        raise ConfigError(f"margin={margin}: a fraction of the deadline in [0, 1)")
    tasks = []
    w0 = max(workers)
    for i, (name, qg, fps, deadline_ms) in enumerate(nets):
        if fps is None and deadline_ms is None:
            probe = Task(name, 1e9, 1e9)
            _, ev = baselines([probe], [costs_by_w[w0][i]], rms[w0])["all_fabric"]
            d = DEADLINE_FACTOR * ev["networks"][name]["latency_s"]
            notes.append(f"{name}: no --deadline-ms or --fps; deadline = period = "
                         f"{DEADLINE_FACTOR:g} x the all-fabric latency = {d * 1e3:.4g} ms")
            tasks.append(Task(name, d, d))
        elif fps is None:
            tasks.append(Task(name, deadline_ms / 1e3, deadline_ms / 1e3))
        else:
            tasks.append(Task(name, 1.0 / fps, deadline_ms / 1e3 if deadline_ms else 1.0 / fps))
    for t in tasks:
        t.margin_s = margin * t.deadline_s
    plan, rep = schedule(tasks, costs_by_w, rms, objective, power_cap_w, time_limit_s,
                         board=mm.board.id, host=host)
    return ScheduleResult(plan=plan, baselines=rep["baselines"], costs=rep["costs"], rm=rep["rm"],
                          tasks=tasks, model_s=model_s, notes=notes)
