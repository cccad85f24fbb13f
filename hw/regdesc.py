"""Register descriptions as plain Python (no HDL): :class:`Field`, :class:`Register`,
:class:`RegisterMap` and :func:`c_header`.

The same objects build the hardware (:class:`dnnfab.hw.csr.CSRBank`), the manifest's JSON
and the C header, and the host driver reads registers by name from them
(:mod:`dnnfab.sw.driver`), so driver and hardware cannot disagree on an offset or a bit.
The access kinds are documented in :mod:`dnnfab.hw.csr`.
"""

from dataclasses import dataclass
import json
import re

from ..errors import ConfigError

__all__ = ["Field", "Register", "RegisterMap", "c_header", "ACCESS_KINDS"]

ACCESS_KINDS = ("ro", "rw", "w1c", "pulse", "const")
_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass(frozen=True)
class Field:
    """A bit field ``[lsb + width - 1 : lsb]`` of a register."""
    name: str
    lsb: int
    width: int = 1
    doc: str = ""

    @property
    def mask(self):
        return ((1 << self.width) - 1) << self.lsb

    def to_dict(self):
        return {"name": self.name, "lsb": self.lsb, "width": self.width, "doc": self.doc}


@dataclass(frozen=True)
class Register:
    """One 32-bit word of the register map (``width`` <= 32 low bits are implemented)."""
    name: str
    offset: int
    access: str
    width: int = 32
    reset: int = 0
    fields: tuple = ()
    doc: str = ""
    #: For a ``X_LO`` counter half: name of the ``X_HI`` register latched when this is read.
    latch: str | None = None

    def __post_init__(self):
        if not _NAME_RE.match(self.name):
            raise ConfigError(f"register name {self.name!r} must be UPPER_CASE (letters, digits, _)")
        if self.access not in ACCESS_KINDS:
            raise ConfigError(f"register {self.name}: access {self.access!r} is not one of "
                              f"{', '.join(ACCESS_KINDS)}")
        if self.offset % 4:
            raise ConfigError(f"register {self.name}: offset {self.offset:#x} is not word aligned")
        if not 1 <= self.width <= 32:
            raise ConfigError(f"register {self.name}: width {self.width} is not in [1, 32]")
        if not 0 <= self.reset < (1 << self.width):
            raise ConfigError(f"register {self.name}: reset {self.reset:#x} does not fit {self.width} bits")
        used = 0
        for f in self.fields:
            if f.lsb < 0 or f.width < 1 or f.lsb + f.width > self.width:
                raise ConfigError(f"register {self.name}: field {f.name} [{f.lsb + f.width - 1}:{f.lsb}] "
                                  f"is outside the register's {self.width} bits")
            if used & f.mask:
                raise ConfigError(f"register {self.name}: field {f.name} overlaps another field")
            used |= f.mask

    @property
    def port_name(self):
        return self.name.lower()

    def to_dict(self):
        d = {"name": self.name, "offset": self.offset, "access": self.access, "width": self.width,
             "reset": self.reset, "doc": self.doc, "fields": [f.to_dict() for f in self.fields]}
        if self.latch:
            d["latch"] = self.latch
        return d


class RegisterMap:
    """An ordered, validated set of registers plus named constant groups.

    ``constants`` maps a group name to ``{NAME: value}`` (e.g. ``{"ERR": {"NONE": 0, ...}}``);
    the C header emits them as ``DNNFAB_<GROUP>_<NAME>``.
    """

    def __init__(self, registers, name="regs", constants=None):
        self.name = name
        self.registers = tuple(sorted(registers, key=lambda r: r.offset))
        self.constants = {g: dict(v) for g, v in (constants or {}).items()}
        seen_names, seen_offsets = set(), {}
        for r in self.registers:
            if r.name in seen_names:
                raise ConfigError(f"register map {name}: register {r.name} defined twice")
            if r.offset in seen_offsets:
                raise ConfigError(f"register map {name}: {r.name} and {seen_offsets[r.offset]} share "
                                  f"offset {r.offset:#x}")
            seen_names.add(r.name)
            seen_offsets[r.offset] = r.name
        for r in self.registers:
            if r.latch is not None:
                hi = self.get(r.latch)
                if hi is None or r.access != "ro" or hi.access != "ro":
                    raise ConfigError(f"register {r.name}: latch target {r.latch!r} must be an 'ro' "
                                      f"register of this map, and {r.name} 'ro' itself")

    def __iter__(self):
        return iter(self.registers)

    def __len__(self):
        return len(self.registers)

    def __getitem__(self, name):
        reg = self.get(name)
        if reg is None:
            raise KeyError(name)
        return reg

    def get(self, name):
        for r in self.registers:
            if r.name == name:
                return r
        return None

    @property
    def size(self):
        """Bytes spanned by the map (last offset + 4)."""
        return (self.registers[-1].offset + 4) if self.registers else 0

    def to_dict(self):
        return {"name": self.name, "word_bytes": 4,
                "registers": [r.to_dict() for r in self.registers],
                "constants": self.constants}

    def to_json(self):
        """JSON-serialisable dict (the manifest embeds it as ``regmap``)."""
        return json.loads(json.dumps(self.to_dict()))


def _c_ident(s):
    return re.sub(r"[^A-Za-z0-9_]", "_", str(s)).upper()


def c_header(regmap: RegisterMap, cfg=None, prefix="DNNFAB"):
    """C header text: offsets, field shifts/masks, constants and the accelerator config."""
    ident = _c_ident(regmap.name)
    guard = f"{ident}_H" if ident.startswith(prefix + "_") else f"{prefix}_{ident}_H"
    out = [f"/* Generated by dnnfab: register map '{regmap.name}'. Do not edit. */",
           f"#ifndef {guard}", f"#define {guard}", ""]
    if cfg is not None:
        out.append(f"#define {prefix}_CONFIG_HASH \"{cfg.config_hash()}\"")
        items = dict(cfg.to_dict())
        items["bus_bytes"] = cfg.bus_bytes
        for name in ("act_kib", "wgt_kib", "acc_kib", "out_kib"):
            items[name.replace("_kib", "_depth")] = cfg.sp_depth(name)
        for k, v in items.items():
            if isinstance(v, bool):
                v = int(v)
            if isinstance(v, str):
                val = f"\"{v}\""
            elif isinstance(v, float):
                val = repr(v)
            else:
                val = f"{v}u" if v >= 0 else str(v)
            out.append(f"#define {prefix}_CFG_{_c_ident(k)} {val}")
        out.append("")
    out.append(f"#define {prefix}_REGS_SIZE 0x{regmap.size:03X}u")
    for r in regmap:
        base = f"{prefix}_{_c_ident(r.name)}"
        out.append("")
        if r.doc:
            out.append(f"/* {r.name} ({r.access}): {r.doc.replace('*/', '* /')} */")
        out.append(f"#define {base}_OFFSET 0x{r.offset:03X}u")
        if r.access == "const" or r.reset:
            out.append(f"#define {base}_RESET 0x{r.reset:08X}u")
        for f in r.fields:
            fb = f"{base}_{_c_ident(f.name)}"
            out.append(f"#define {fb}_SHIFT {f.lsb}u")
            out.append(f"#define {fb}_MASK 0x{f.mask:08X}u")
    for group, consts in regmap.constants.items():
        out.append("")
        for name, value in consts.items():
            out.append(f"#define {prefix}_{_c_ident(group)}_{_c_ident(name)} {int(value)}u")
    out += ["", f"#endif /* {guard} */", ""]
    return "\n".join(out)


