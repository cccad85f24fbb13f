"""A schedule: where every layer of every network runs, and what the model says it costs.

:func:`dnnfab.sw.sched.solve` returns a :class:`Plan`; the runtime
(:mod:`dnnfab.sw.runtime.realtime`) executes one, and ``dnnfab schedule --json`` prints
:meth:`Plan.to_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, asdict

__all__ = ["Task", "LayerChoice", "NetworkPlan", "Plan"]


@dataclass
class Task:
    """One network to schedule: frames every ``period_s``, each due ``deadline_s`` after
    its release (default: the period). ``margin_s``: part of the deadline the plan keeps
    free (a real run on a shared machine: its jitter); the response bound must fit in
    :attr:`budget_s` = deadline - margin, a miss is still counted against the deadline."""

    name: str
    period_s: float
    deadline_s: float | None = None
    margin_s: float = 0.0

    def __post_init__(self):
        if self.deadline_s is None:
            self.deadline_s = self.period_s

    @property
    def budget_s(self):
        return self.deadline_s - self.margin_s


@dataclass
class LayerChoice:
    """Where one layer runs: ``resource`` is ``"fabric"``, ``"cpu"`` or ``"split"``;
    ``fabric_channels`` the output channels on the fabric for a split. ``start_s`` /
    ``end_s`` the modelled times within a frame on idle resources."""

    network: str
    layer: str
    resource: str
    fabric_channels: int = 0
    out_channels: int = 0
    start_s: float = 0.0
    end_s: float = 0.0
    energy_j: float = 0.0

    @property
    def split(self):
        """Fraction of the output channels on the fabric (1.0 all, 0.0 none)."""
        if self.resource == "fabric":
            return 1.0
        if self.resource == "cpu":
            return 0.0
        return self.fabric_channels / max(1, self.out_channels)


@dataclass
class NetworkPlan:
    task: Task
    layers: list                      # [LayerChoice] in topological order
    latency_s: float = 0.0            # one frame on idle resources
    bound_s: float = 0.0              # the worst-case response bound with the other tasks
    energy_j: float = 0.0             # per frame, dynamic (layers + transfers)
    busy_s: dict = field(default_factory=dict)   # resource -> seconds per frame

    @property
    def name(self):
        return self.task.name

    def cpu_layers(self):
        """Names of the layers the plan puts on the CPU (for compile_network)."""
        return {c.layer for c in self.layers if c.resource == "cpu"}

    def splits(self):
        """{layer: fabric channels} of the split layers (for apply_splits)."""
        return {c.layer: c.fabric_channels for c in self.layers if c.resource == "split"}

    def choice(self, layer) -> LayerChoice:
        for c in self.layers:
            if c.layer == layer:
                return c
        raise KeyError(layer)


@dataclass
class Plan:
    networks: list                    # [NetworkPlan]
    objective: str = "energy"
    workers: int = 1
    board: str = ""
    host: str = "board"
    clock_mhz: float = 0.0
    power_cap_w: float | None = None
    avg_power_w: float = 0.0
    idle_w: float = 0.0
    feasible: bool = True
    why: str = ""                     # infeasible: which layer / resource is the bottleneck
    solver: dict = field(default_factory=dict)     # status, optimal, solve_s, ...
    utilization: dict = field(default_factory=dict)

    def network(self, name) -> NetworkPlan:
        for n in self.networks:
            if n.name == name:
                return n
        raise KeyError(name)

    def energy_per_frame_j(self, name):
        """A network's frame energy: its dynamic energy plus the idle power over its period
        (the idle power shared between the networks by their share of the frame rate)."""
        n = self.network(name)
        rate = sum(1 / m.task.period_s for m in self.networks)
        return n.energy_j + self.idle_w / rate

    def to_dict(self):
        d = asdict(self)
        return d
