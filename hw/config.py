"""The one accelerator configuration, validated once.

Every hardware block reads its parameters from an :class:`AcceleratorConfig`; the
generator writes the same config into the JSON manifest and the C header, so hardware,
driver and compiler never disagree (Gemmini's ``GemminiArrayConfig`` / VTA's
``vta_config.json`` idea).

Presets live in :data:`PRESETS`; ``AcceleratorConfig.from_dict`` and ``.to_dict`` round
trip, and :meth:`AcceleratorConfig.config_hash` names build directories and caches.
"""

from dataclasses import dataclass, asdict, fields, replace
import hashlib
import json
import math

from ..errors import ConfigError

__all__ = ["AcceleratorConfig", "PRESETS", "DATAFLOWS"]

#: Dataflows the generator knows. Only weight-stationary is implemented so far.
DATAFLOWS = ("ws",)
_PLANNED_DATAFLOWS = {"os": "output-stationary is planned but not implemented yet"}


@dataclass(frozen=True)
class AcceleratorConfig:
    """Parameters of one generated accelerator.

    Parameters
    ----------
    rows, cols:
        Systolic array size R x C. Weight-stationary: rows index the reduction (K)
        dimension, columns index output channels (M).
    input_bits, weight_bits:
        Signed activation / weight widths (int8 by default: the integer contract).
    acc_bits:
        Signed accumulator width of partial sums inside the array and in the
        accumulator scratchpad (int32 by default).
    dataflow:
        ``"ws"`` (weight-stationary).
    bus_bits:
        AXI4 data bus width of the DMA (64, 128, 256 or 512).
    addr_bits:
        AXI address width.
    id_bits:
        AXI ID width (the ports carry IDs: cocotbext-axi needs them).
    max_burst:
        Longest AXI INCR burst the DMA issues, in beats (1..256).
    act_kib, wgt_kib, acc_kib, out_kib, aux_kib:
        Scratchpad sizes in KiB: activations, weights, int32 accumulators, int8 results,
        per-channel bias/requantization parameters. The compiler double-buffers them
        (ping-pong halves or a ring of slots ordered by dependency tokens).
    clock_mhz:
        Target clock, used by constraints and the metric model.
    """

    rows: int = 8
    cols: int = 8
    input_bits: int = 8
    weight_bits: int = 8
    acc_bits: int = 32
    dataflow: str = "ws"
    bus_bits: int = 128
    addr_bits: int = 32
    id_bits: int = 4
    max_burst: int = 64
    act_kib: int = 64
    wgt_kib: int = 64
    acc_kib: int = 64
    out_kib: int = 32
    aux_kib: int = 4
    clock_mhz: float = 100.0

    def __post_init__(self):
        self.validate()

    # -- validation -------------------------------------------------------------------
    def validate(self):
        def need_int(name, lo, hi=None):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{name}={v!r} is not an integer; pass a whole number")
            if v < lo or (hi is not None and v > hi):
                rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
                raise ConfigError(f"{name}={v} is out of range; use a value {rng}")

        need_int("rows", 1, 128)
        need_int("cols", 1, 128)
        need_int("input_bits", 2, 16)
        need_int("weight_bits", 2, 16)
        need_int("acc_bits", 8, 64)
        need_int("addr_bits", 16, 64)
        need_int("id_bits", 1, 16)
        need_int("max_burst", 1, 256)
        for name in ("act_kib", "wgt_kib", "acc_kib", "out_kib", "aux_kib"):
            need_int(name, 1, 1 << 16)
        if self.dataflow not in DATAFLOWS:
            why = _PLANNED_DATAFLOWS.get(self.dataflow, "unknown dataflow")
            raise ConfigError(f"dataflow={self.dataflow!r}: {why}; use one of {', '.join(DATAFLOWS)}")
        if self.bus_bits not in (64, 128, 256):
            raise ConfigError(f"bus_bits={self.bus_bits} is not a bus width the accelerator supports; "
                              f"use 64, 128 or 256")
        for name in ("rows", "cols"):
            v = getattr(self, name)
            if v & (v - 1):
                raise ConfigError(f"{name}={v} is not a power of two; scratchpad lanes need one "
                                  f"(use e.g. {1 << (v.bit_length() - 1)} or {1 << v.bit_length()})")
        need = self.min_acc_bits
        if self.acc_bits < need:
            raise ConfigError(
                f"acc_bits={self.acc_bits} cannot hold a sum of {self.rows} products of "
                f"int{self.input_bits} x int{self.weight_bits}; use acc_bits >= {need}")
        if not (self.clock_mhz > 0):
            raise ConfigError(f"clock_mhz={self.clock_mhz} must be positive")
        for name, width in (("act_kib", self.act_row_bits), ("wgt_kib", self.wgt_row_bits),
                            ("acc_kib", self.acc_row_bits), ("out_kib", self.out_row_bits),
                            ("aux_kib", self.aux_row_bits)):
            if self.sp_depth(name) < 4:
                raise ConfigError(f"{name}={getattr(self, name)} holds fewer than 4 rows of "
                                  f"{width} bits; make it larger")

    # -- derived quantities -----------------------------------------------------------
    @property
    def min_acc_bits(self):
        """Bits needed for the sum of ``rows`` worst-case products (plus sign)."""
        prod = (1 << (self.input_bits - 1)) * (1 << (self.weight_bits - 1))
        return (prod * self.rows).bit_length() + 1

    @property
    def bus_bytes(self):
        return self.bus_bits // 8

    @property
    def act_row_bits(self):
        """One activation scratchpad row: the wider of one array input row and one bus beat."""
        return max(self.rows * self.input_bits, self.bus_bits)

    @property
    def wgt_row_bits(self):
        return max(self.cols * self.weight_bits, self.bus_bits)

    @property
    def acc_row_bits(self):
        return self.cols * self.acc_bits

    @property
    def out_row_bits(self):
        return max(self.cols * self.input_bits, self.bus_bits)

    @property
    def aux_row_bits(self):
        return max(self.cols * 64, self.bus_bits)

    def sp_depth(self, name):
        """Depth (rows) of scratchpad ``name`` (``act_kib``, ``wgt_kib``, ...)."""
        width = {"act_kib": self.act_row_bits, "wgt_kib": self.wgt_row_bits,
                 "acc_kib": self.acc_row_bits, "out_kib": self.out_row_bits,
                 "aux_kib": self.aux_row_bits}[name]
        return (getattr(self, name) * 1024 * 8) // width

    @property
    def macs_per_cycle(self):
        return self.rows * self.cols

    # -- (de)serialisation --------------------------------------------------------------
    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, data):
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config key(s) {', '.join(unknown)}; "
                              f"known keys: {', '.join(sorted(known))}")
        return cls(**data)

    def replace(self, **changes):
        return replace(self, **changes)

    def config_hash(self, n=12):
        """Stable short hash of the config (names build directories and caches)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:n]

    @property
    def name(self):
        return f"{self.dataflow}{self.rows}x{self.cols}_b{self.bus_bits}_{self.config_hash(8)}"


def _lcm(*xs):
    return math.lcm(*xs)


#: Named starting points (``dnnfab generate --preset NAME``).
PRESETS = {
    "tiny": AcceleratorConfig(rows=4, cols=4, bus_bits=64, act_kib=8, wgt_kib=8, acc_kib=8, out_kib=4,
                              aux_kib=1),
    "small": AcceleratorConfig(rows=8, cols=8, bus_bits=64, act_kib=32, wgt_kib=32, acc_kib=32, out_kib=8),
    "default": AcceleratorConfig(),
    "large": AcceleratorConfig(rows=16, cols=16, bus_bits=128, act_kib=128, wgt_kib=128,
                               acc_kib=128, out_kib=32),
}
