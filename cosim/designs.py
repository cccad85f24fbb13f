"""Generated Verilog for co-simulation, cached per (top, config) in the dnnfab cache."""

from pathlib import Path
import hashlib
import json

from ..hw.config import AcceleratorConfig
from .runner import cache_root

__all__ = ["generated"]


def hw_source_hash():
    """Hash of the hardware generator's sources: a change regenerates cached Verilog."""
    h = hashlib.sha256()
    hw_dir = Path(__file__).resolve().parent.parent / "hw"
    for f in sorted(hw_dir.glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:10]


def generated(cfg: AcceleratorConfig, top="array"):
    """Generate (once per config and generator version) and return
    ``(verilog_path, module_name, manifest dict)``."""
    from ..hw.generate import generate
    outdir = cache_root() / "verilog" / f"{top}-{cfg.config_hash()}-{hw_source_hash()}"
    manifest_path = outdir / "manifest.json"
    if not manifest_path.exists():
        generate(cfg, outdir, top=top)
    manifest = json.loads(manifest_path.read_text())
    return outdir / manifest["verilog"], manifest["module"], manifest
