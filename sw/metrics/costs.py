"""What the metric model tells the scheduler: per layer, the ways it can run and what each costs.

The metric model (:mod:`dnnfab.sw.metrics.model`) fills these for one network, one board
profile and one CPU worker count; the scheduler (:mod:`dnnfab.sw.sched`) reads nothing
else. All times are seconds, energies joules, powers watts.

Resources: ``"fabric"`` (the accelerator: one launch at a time) and ``"cpu"`` (the worker
pool: one layer at a time, its threads share the layer). A layer's :class:`Option` says how
long it keeps each resource busy, how long it takes, and the *dynamic* energy it costs,
i.e. above the idle power of the resources, which :class:`ResourceModel` holds: the energy
of a frame period is ``sum(option.energy_j) + sum(transfers) + idle_w_total * period``.

A tensor lives where its producer ran (a split layer's output is joined on the host, so it
lives on the ``cpu`` side; the graph inputs arrive on the host and the outputs must end
there). A consumer on the other side pays :meth:`ResourceModel.transfer_s` and
:meth:`ResourceModel.transfer_j` for the tensor's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RESOURCES", "Option", "LayerCost", "NetworkCost", "ResourceModel"]

RESOURCES = ("fabric", "cpu")


@dataclass
class Option:
    """One way to run a layer: ``key`` is ``"fabric"``, ``"cpu"`` or ``"split:C"`` (the
    first C output channels on the fabric, the rest on the CPU at the same time)."""

    key: str
    fabric_s: float = 0.0            # time the fabric is busy with it
    cpu_s: float = 0.0               # time the CPU pool is busy with it
    latency_s: float = 0.0           # its own duration (a split: the longer half + the join)
    energy_j: float = 0.0            # dynamic energy (above idle) of every resource it uses
    fabric_channels: int = 0         # output channels on the fabric (split), else 0
    detail: dict = field(default_factory=dict)   # what the figures came from (cycles, ms, ...)

    @property
    def uses(self):
        """The resources the option keeps busy."""
        if self.key == "fabric":
            return ("fabric",)
        if self.key == "cpu":
            return ("cpu",)
        return ("fabric", "cpu")

    @property
    def out_side(self):
        """Where the layer's output lives afterwards."""
        return "fabric" if self.key == "fabric" else "cpu"

    @property
    def in_sides(self):
        """Where the layer needs its inputs."""
        return self.uses


@dataclass
class LayerCost:
    """One layer of a network: ``inputs`` are the names of the layers producing its inputs
    (graph inputs are left out: they are on the host), ``out_bytes`` its output tensor's
    size, ``options`` keyed by :attr:`Option.key` (``"cpu"`` always present), ``reason``
    why there is no fabric option."""

    name: str
    op: str
    macs: int
    inputs: list
    out_bytes: int
    options: dict
    reason: str = ""
    graph_input_bytes: int = 0       # bytes it reads straight from graph inputs (host side)
    is_output: bool = False          # it produces a graph output (must end on the host)


@dataclass
class NetworkCost:
    """A network's layers in topological order, for one worker count."""

    name: str
    layers: list
    workers: int = 1

    def layer(self, name) -> LayerCost:
        idx = self.__dict__.get("_index")
        if idx is None or len(idx) != len(self.layers):
            idx = self.__dict__["_index"] = {L.name: L for L in self.layers}
        return idx[name]


@dataclass
class ResourceModel:
    """Board-level figures the scheduler needs besides the per-layer options."""

    board: str
    clock_mhz: float
    workers: int
    host: str                        # "board" (the board's own CPU, modelled) | "local"
    idle_w: dict                     # {"fabric": W, "cpu": W, "board": W}: always drawn
    transfer_bytes_per_s: float      # host <-> fabric tensor moves
    transfer_fixed_s: float = 0.0    # per move (a sync / a DMA setup)
    transfer_j_per_byte: float = 0.0
    max_cpu_workers: int = 1
    sources: dict = field(default_factory=dict)   # figure -> citation

    @property
    def idle_w_total(self):
        return float(sum(self.idle_w.values()))

    def transfer_s(self, nbytes):
        return 0.0 if nbytes <= 0 else self.transfer_fixed_s + nbytes / self.transfer_bytes_per_s

    def transfer_j(self, nbytes):
        return max(0, nbytes) * self.transfer_j_per_byte
