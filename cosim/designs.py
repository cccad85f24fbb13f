"""Generated Verilog for co-simulation, cached per (top, config) in the dnnfab cache."""

from pathlib import Path
import json

from ..hw.config import AcceleratorConfig
from .runner import cache_root

__all__ = ["generated"]


def generated(cfg: AcceleratorConfig, top="array"):
    """Generate (once) and return ``(verilog_path, module_name, manifest dict)``."""
    from ..hw.generate import generate
    outdir = cache_root() / "verilog" / f"{top}-{cfg.config_hash()}"
    manifest_path = outdir / "manifest.json"
    if not manifest_path.exists():
        generate(cfg, outdir, top=top)
    manifest = json.loads(manifest_path.read_text())
    return outdir / manifest["verilog"], manifest["module"], manifest
