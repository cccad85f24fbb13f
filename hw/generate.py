"""Verilog generation: component -> ``<top>.v`` + ``manifest.json`` (+ ``regs.h``).

The manifest records the exact config, the top-level ports (name, direction, width) and
any block-specific facts (latency, register map), so that the driver, compiler and test
benches read the same numbers the hardware was built with. It also lists every file of the
generation (``files``): an output directory holds one generation, so generating another
top or config into it removes the previous generation's files that the new one does not
write (``regs.h`` of an accelerator replaced by a bare array), and nothing else.
"""

from pathlib import Path
import json

from amaranth.back import verilog
from amaranth.hdl import Value
from amaranth.lib import wiring

from .config import AcceleratorConfig
from ..errors import ConfigError

__all__ = ["TOPS", "build_top", "generate", "verilog_text", "port_list", "record_files"]


def _array_top(cfg, **kw):
    from .systolic import SystolicArray
    return SystolicArray(cfg, tag_bits=kw.get("tag_bits", 8))


def _accel_top(cfg, **kw):
    from .top import Accelerator
    return Accelerator(cfg)


#: Generatable top levels: name -> (factory, Verilog module name)
TOPS = {
    "array": (_array_top, "dnnfab_systolic"),
    "accelerator": (_accel_top, "dnnfab_accel"),
}


def build_top(cfg: AcceleratorConfig, top="array", **kw):
    if top not in TOPS:
        raise ConfigError(f"unknown top {top!r}; use one of {', '.join(TOPS)}")
    factory, name = TOPS[top]
    return factory(cfg, **kw), name


def port_list(component):
    """[(name, 'in'|'out', width)] of a component's signature, as named in the Verilog."""
    ports = []
    for path, member, value in component.signature.flatten(component):
        name = "__".join(str(p) for p in path)
        ports.append({"name": name, "dir": "in" if member.flow == wiring.In else "out",
                      "width": len(Value.cast(value))})
    return ports


#: Amaranth's Verilog mixes operand widths on purpose (it is width-correct by construction);
#: these pragmas keep ``verilator --lint-only`` quiet about exactly those classes of warning
#: (and about ``case`` statements whose default assignment precedes them).
LINT_PRAGMAS = ("/* verilator lint_off WIDTHEXPAND */\n"
                "/* verilator lint_off WIDTHTRUNC */\n"
                "/* verilator lint_off CASEINCOMPLETE */\n")


class SynthHints:
    """A stand-in platform carrying hints for technology-specific elaboration
    (``dnnfab_mult = "ecp5"`` puts the PE registers inside ECP5 DSP blocks)."""

    def __init__(self, **hints):
        self.__dict__.update(hints)


def verilog_text(component, name, platform=None):
    return LINT_PRAGMAS + verilog.convert(component, name=name, emit_src=False, platform=platform)


def _previous_files(outdir):
    """Files of the dnnfab generation already in ``outdir`` (from its manifest)."""
    try:
        old = json.loads((outdir / "manifest.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(old, dict) or old.get("generator") != "dnnfab":
        return []
    names = set(old.get("files") or ()) | {old.get("verilog"), old.get("header")}
    return [outdir / n for n in sorted(n for n in names if isinstance(n, str) and n
                                       and Path(n).name == n and n != "manifest.json")]


def record_files(manifest_path, paths):
    """Add ``paths`` (written next to the manifest, e.g. constraints) to its ``files``."""
    manifest_path = Path(manifest_path)
    manifest = json.loads(manifest_path.read_text())
    files = set(manifest.get("files") or ())
    files |= {Path(p).name for p in paths}
    manifest["files"] = sorted(files)
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")


def generate(cfg: AcceleratorConfig, outdir, top="array", extra=None):
    """Write ``<name>.v`` and ``manifest.json`` (and ``regs.h`` for the accelerator) into
    ``outdir``; return ``{kind: path}``. Files of a previous generation in ``outdir`` that
    this one does not write are removed; ``"removed"`` lists them (if any)."""
    component, name = build_top(cfg, top)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    previous = _previous_files(outdir)
    text = verilog_text(component, name)
    vpath = outdir / f"{name}.v"
    vpath.write_text(text)
    manifest = {
        "generator": "dnnfab",
        "top": top,
        "module": name,
        "verilog": vpath.name,
        "config": cfg.to_dict(),
        "config_hash": cfg.config_hash(),
        "ports": [{"name": "clk", "dir": "in", "width": 1},
                  {"name": "rst", "dir": "in", "width": 1}] + port_list(component),
    }
    if hasattr(component, "manifest_extra"):
        manifest.update(component.manifest_extra())
    elif top == "array":
        from .spec import array_latency as latency, min_tile_rows
        manifest["array"] = {"latency": latency(cfg.rows, cfg.cols),
                             "min_tile_rows": min_tile_rows(cfg.rows, cfg.cols),
                             "tag_bits": component.tag_bits}
    if extra:
        manifest.update(extra)
    paths = {"verilog": vpath, "manifest": outdir / "manifest.json"}
    if hasattr(component, "regmap"):
        from .csr import c_header
        hpath = outdir / "regs.h"
        hpath.write_text(c_header(component.regmap, cfg))
        paths["header"] = hpath
        manifest["header"] = hpath.name
    manifest["files"] = sorted(p.name for p in paths.values())
    paths["manifest"].write_text(json.dumps(manifest, indent=2) + "\n")
    removed = []
    for p in previous:
        if p.name not in manifest["files"] and p.is_file():
            p.unlink()
            removed.append(p)
    if removed:
        paths["removed"] = removed
    return paths
