"""Board descriptions: FPGA part and resources, clock, DRAM, host CPU, power figures.

One TOML file per board lives next to this module (``ulx3s_85f.toml``, ...). Every
number in it carries its source (datasheet or manual name, URL) as citation text, and
figures that are estimates rather than datasheet values say so (``basis``). The files
are the single place the rest of dnnfab reads board facts from:

* :mod:`dnnfab.boards.fit` sizes and checks a configuration against ``resources``;
* :mod:`dnnfab.boards.synth` drives yosys / nextpnr with ``fpga`` (part, package, speed);
* the metric model reads ``clock_mhz``, ``dram``, ``host`` and ``power``.

Where amaranth-boards (``pip install amaranth-boards``) has a platform for the board,
the file names it in ``amaranth_board`` and the facts it shares with that platform
(device, package, speed grade, oscillator) are cross-checked against it in the tests;
amaranth-boards is not needed at run time.

>>> b = get_board("ulx3s-85f")
>>> b.fpga.part, b.resources["dsp"], b.clock_mhz        # doctest: +SKIP
('LFE5U-85F', 156, 100.0)
"""

from dataclasses import dataclass, field
from pathlib import Path
import functools

try:                                    # Python >= 3.11
    import tomllib as _toml
except ModuleNotFoundError:             # pragma: no cover - Python 3.10
    import tomli as _toml

from ..errors import ConfigError

__all__ = ["Board", "Fpga", "get_board", "list_boards", "board_ids", "FAMILIES",
           "RESOURCE_NAMES"]

#: FPGA families the fit model and the synthesis flow know.
FAMILIES = ("ecp5", "ice40", "xc7")

#: Generic resource names used by the fit model, ``dnnfab synth`` and the board files,
#: with what they count in each family.
RESOURCE_NAMES = {
    "lut": "logic: LUT4 (ECP5 TRELLIS_COMB, iCE40 logic cells) or LUT6 (7-series)",
    "ff": "flip-flops",
    "dsp": "hard multipliers: MULT18X18D (ECP5), SB_MAC16 (iCE40UP), DSP48E1 (7-series)",
    "bram": "block RAMs: DP16KD 18 Kbit (ECP5), SB_RAM40_4K 4 Kbit (iCE40), RAMB36E1 36 Kbit (7-series)",
    "spram": "single-port RAM: SB_SPRAM256KA 256 Kbit (iCE40UP only)",
}

_DIR = Path(__file__).parent


@dataclass(frozen=True)
class Fpga:
    family: str              # "ecp5" | "ice40" | "xc7"
    part: str                # vendor part name without speed/package, e.g. LFE5U-85F
    package: str             # as nextpnr / Vivado spell it, e.g. CABGA381, sg48, clg400
    speed: str               # speed grade ("6", "8", "1"; "" where the family has none)
    source: str = ""

    @property
    def full_part(self):
        """Orderable part name as the vendor tools spell it (e.g. LFE5U-85F-6CABGA381)."""
        if self.family == "xc7":
            return f"{self.part.lower()}{self.package.lower()}-{self.speed}"
        if self.family == "ice40":
            return f"{self.part}-{self.package.upper()}"
        return f"{self.part}-{self.speed}{self.package}"


@dataclass(frozen=True)
class Board:
    """One board. Build with :func:`get_board`; every field comes from the TOML file.

    Attributes
    ----------
    id : str
        Command-line name (``ulx3s-85f``).
    name : str
        Human readable name.
    fpga : Fpga
        Family, part, package, speed grade.
    resources : dict[str, int]
        Available resources by generic name (:data:`RESOURCE_NAMES`), plus
        ``bram_kbits`` (Kbit per block RAM) and ``spram_kbits`` where present.
    clock_mhz : float
        Default accelerator clock: the clock generate/synth constrain for and the metric
        model assumes. Chosen to close timing with margin on the open toolchain (see the
        ``clock_basis`` text), never above what ``dnnfab synth`` measured.
    dram, host, power : dict
        Off-chip memory, host CPU and power figures, each with ``source`` text.
    toolchain : str
        ``"nextpnr"`` (open place and route on PyPI) or ``"vivado"`` (yosys resource
        counts only; Fmax needs Vivado).
    """

    id: str
    name: str
    fpga: Fpga
    resources: dict
    clock_mhz: float
    toolchain: str
    url: str = ""
    aliases: tuple = ()
    amaranth_board: str | None = None
    oscillator_mhz: float | None = None
    clock_basis: str = ""
    resources_source: str = ""
    dram: dict = field(default_factory=dict)
    host: dict = field(default_factory=dict)
    power: dict = field(default_factory=dict)
    path: Path | None = None
    sections: dict = field(default_factory=dict)   # every table of the file, as read

    def section(self, name):
        """A table of the board file by name (``{}`` if absent), e.g. ``cpu_model``."""
        return dict(self.sections.get(name, {}))

    @property
    def family(self):
        return self.fpga.family

    @property
    def part(self):
        return self.fpga.part

    @property
    def has_open_pnr(self):
        return self.toolchain == "nextpnr"

    def summary(self):
        """Plain dict for ``dnnfab boards --json`` and manifests."""
        return {
            "id": self.id, "name": self.name, "family": self.family,
            "part": self.fpga.part, "package": self.fpga.package, "speed": self.fpga.speed,
            "full_part": self.fpga.full_part, "clock_mhz": self.clock_mhz,
            "toolchain": self.toolchain, "resources": dict(self.resources),
            "dram": dict(self.dram), "host": dict(self.host), "power": dict(self.power),
            "url": self.url, "aliases": list(self.aliases),
            "amaranth_board": self.amaranth_board,
        }


def _load(path: Path) -> Board:
    with open(path, "rb") as f:
        d = _toml.load(f)
    try:
        fp = d["fpga"]
        fpga = Fpga(family=fp["family"], part=fp["part"], package=fp["package"],
                    speed=str(fp.get("speed", "")), source=fp.get("source", ""))
        res = dict(d["resources"])
        src = res.pop("source", "")
        clk = d["clock"]
        board = Board(
            id=d["id"], name=d["name"], fpga=fpga,
            resources={k: v for k, v in res.items()},
            clock_mhz=float(clk["default_mhz"]), toolchain=d["toolchain"],
            url=d.get("url", ""), aliases=tuple(d.get("aliases", ())),
            amaranth_board=d.get("amaranth_board"),
            oscillator_mhz=clk.get("oscillator_mhz"), clock_basis=clk.get("basis", ""),
            resources_source=src,
            dram=d.get("dram", {}), host=d.get("host", {}), power=d.get("power", {}),
            path=path, sections={k: v for k, v in d.items() if isinstance(v, dict)})
    except KeyError as exc:  # a broken board file is a bug in dnnfab, but say where
        raise ConfigError(f"board file {path.name} lacks key {exc.args[0]!r}; fix the file") from None
    if fpga.family not in FAMILIES:
        raise ConfigError(f"board file {path.name}: unknown family {fpga.family!r}; "
                          f"use one of {', '.join(FAMILIES)}")
    return board


@functools.lru_cache(maxsize=None)
def _registry():
    boards = {}
    for path in sorted(_DIR.glob("*.toml")):
        b = _load(path)
        boards[b.id] = b
    return boards


def list_boards():
    """All known boards, sorted by id."""
    return [b for _, b in sorted(_registry().items())]


def board_ids():
    return [b.id for b in list_boards()]


def get_board(name) -> Board:
    """Board by id or alias (case-insensitive); :class:`ConfigError` lists the known ones."""
    if isinstance(name, Board):
        return name
    key = str(name).strip().lower().replace("_", "-")
    reg = _registry()
    if key in reg:
        return reg[key]
    for b in reg.values():
        if key in (a.lower() for a in b.aliases):
            return b
    raise ConfigError(f"unknown board {name!r}; known boards: {', '.join(board_ids())} "
                      f"(see `dnnfab boards`)")
