"""What a fabric backend provides: the interface the host driver (:class:`~.device.Device`)
is written against, and nothing more.

A backend is the accelerator as the host sees it over the bus: 32-bit register reads and
writes at byte offsets of the AXI4-Lite register bank, a DRAM the accelerator's DMA
masters (written and read in bulk by the host), an interrupt line, and an allocator of
DRAM buffers. The driver does everything else (register names, the launch sequence,
error decoding) in the same code for every backend, so what runs on the model is what
will run on a board.

Backends: ``"model"`` (:class:`~.model.ModelBackend`, the fast model acting as the
device) and ``"rtl"`` (the generated Verilog under cocotb, ``dnnfab.cosim.rtl_backend``,
found through :data:`~.device.PLUGINS`: cosim/ sits above the driver). A PYNQ backend is a small class, sketched in docs/driver.md: ``read_reg`` /
``write_reg`` are ``pynq.Overlay(bitfile).ip.read/write``, ``allocate`` is
``pynq.allocate`` (its ``physical_address`` is the device address), ``dram_write`` /
``dram_read`` copy into that buffer and flush / invalidate it, ``wait_irq`` awaits
``pynq.Interrupt`` or polls STATUS.
"""

from __future__ import annotations

from ...hw.config import AcceleratorConfig

__all__ = ["Backend"]


class Backend:
    """Base class of fabric backends (see the module docstring)."""

    name = "?"
    cfg: AcceleratorConfig

    def read_reg(self, offset: int) -> int:
        raise NotImplementedError

    def write_reg(self, offset: int, value: int) -> None:
        raise NotImplementedError

    def read_regs(self, offsets) -> list:
        """Several reads, in order (one bus transaction each); a backend with a slow
        channel to the bus (the RTL simulator's socket) does them in one round trip."""
        return [self.read_reg(o) for o in offsets]

    def write_regs(self, items) -> None:
        """Several ``(offset, value)`` writes, in order (see :meth:`read_regs`)."""
        for o, v in items:
            self.write_reg(o, v)

    def allocate(self, nbytes: int, align: int = 4096) -> int:
        """Reserve ``nbytes`` of device DRAM; returns the device (bus) address."""
        raise NotImplementedError

    def dram_write(self, addr: int, data) -> None:
        raise NotImplementedError

    def dram_read(self, addr: int, n: int) -> bytes:
        raise NotImplementedError

    def dram_read_into(self, addr: int, dst) -> None:
        """Read ``dst.nbytes`` bytes at ``addr`` into the uint8 array ``dst`` (a backend
        whose DRAM is host memory copies once)."""
        import numpy as np
        dst[:] = np.frombuffer(self.dram_read(addr, dst.nbytes), np.uint8)

    def batch(self):
        """A context for a sequence of launches (one inference): a backend may hold per-run
        set-up across them (the model keeps BLAS at one thread). Default: nothing."""
        import contextlib
        return contextlib.nullcontext()

    def wait_irq(self, timeout_s: float) -> bool:
        """Wait for the interrupt; False if none came within ``timeout_s``."""
        raise NotImplementedError

    def launch_timeout(self, model_cycles: int) -> float:
        """A default timeout (seconds of the device's time) for a launch the cycle model
        puts at ``model_cycles``: a board's 1 s of slack plus 20x the modelled time."""
        return 1.0 + 20 * model_cycles / (self.cfg.clock_mhz * 1e6)

    def diagnose(self) -> str:
        """What the backend knows about a run that did not finish ("" if nothing)."""
        return ""

    def close(self) -> None:
        pass
