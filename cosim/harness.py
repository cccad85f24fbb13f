"""Generated Verilog of co-simulation test tops (DMA harness, CSR bank), cached.

Unlike :func:`dnnfab.cosim.designs.generated` (keyed by the config only), the cache key
here also hashes the Python source of the blocks involved, so editing the hardware
regenerates the Verilog (and the runner's build cache then rebuilds the simulator).
"""

from pathlib import Path
import hashlib
import json

from ..hw.config import AcceleratorConfig
from .runner import cache_root

__all__ = ["dma_harness_verilog", "csr_bank_verilog"]

_HERE = Path(__file__).resolve().parent
_HW = _HERE.parent / "hw"


def _cached(kind, key_obj, sources, build):
    h = hashlib.sha256(json.dumps(key_obj, sort_keys=True).encode())
    for src in sources:
        h.update(Path(src).read_bytes())
    outdir = cache_root() / "verilog" / f"{kind}-{h.hexdigest()[:12]}"
    vfile = outdir / f"{kind}.v"
    if not vfile.exists():
        outdir.mkdir(parents=True, exist_ok=True)
        tmp = vfile.with_suffix(".tmp")
        tmp.write_text(build())
        tmp.replace(vfile)
    return vfile


def dma_harness_verilog(cfg: AcceleratorConfig, sp_depth=1024):
    """``(verilog path, module name)`` of :class:`dnnfab.cosim.dma_harness.DMAHarness`."""
    from ..hw.generate import verilog_text
    from .dma_harness import DMAHarness
    name = "dnnfab_dma_harness"
    srcs = [_HW / "dma.py", _HW / "axi.py", _HW / "regmap.py", _HW / "csr.py",
            _HERE / "dma_harness.py"]
    vfile = _cached(name, {"cfg": cfg.to_dict(), "sp_depth": sp_depth}, srcs,
                    lambda: verilog_text(DMAHarness(cfg, sp_depth), name))
    return vfile, name


def csr_bank_verilog(regmap, addr_bits=12, name="dnnfab_csr"):
    """``(verilog path, module name)`` of a :class:`dnnfab.hw.csr.CSRBank` for ``regmap``."""
    from ..hw.generate import verilog_text
    from ..hw.csr import CSRBank
    srcs = [_HW / "csr.py", _HW / "axi.py"]
    vfile = _cached(name, {"regmap": regmap.to_json(), "addr_bits": addr_bits}, srcs,
                    lambda: verilog_text(CSRBank(regmap, addr_bits), name))
    return vfile, name
