"""The host driver: one synchronous API for every fabric backend, in the PYNQ idiom.

>>> from dnnfab.sw import driver
>>> dev = driver.open("model", config)            # or board="ulx3s-85f"
>>> buf = dev.allocate((4096,), np.uint8)         # ndarray with .device_address
>>> buf[:] = image; buf.sync_to_device()
>>> dev.regs.STATUS.BUSY                          # registers by name (generated map)
>>> counters = dev.run(driver.Program(addr, count, out_lo, out_hi), timeout_s=5)
>>> dev.reset()

:meth:`Device.run` is the launch sequence a board runs: clear and enable the interrupts,
write PROG_BASE / PROG_LEN and the DMA write window, pulse CTRL.START, wait for the
interrupt, decode STATUS, read the 64-bit performance counters (LO then HI). A fault comes
back as a typed error carrying the hardware's own report (:class:`~dnnfab.errors.DmaError`
with the code and ERROR_INFO's address, :class:`~dnnfab.errors.IllegalInstruction` with
the program index, :class:`~dnnfab.errors.ScratchpadError`,
:class:`~dnnfab.errors.FabricTimeout` with STATUS and the counters); after any of them
the device needs :meth:`Device.reset`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import (ConfigError, DnnfabError, DmaError, FabricError, FabricTimeout,
                       IllegalInstruction, ScratchpadError)
from ...hw.config import AcceleratorConfig
from ...hw.regmap import accelerator_regmap, COUNTERS, ID_MAGIC
from ...hw.spec import (INSN_BYTES, ERR_AXI_READ, ERR_AXI_WRITE, ERR_ILLEGAL_INSN, ERR_SP_RANGE,
                        ERR_OUT_WINDOW, ERR_PROG_FETCH, ErrorCode)
from .backend import Backend

__all__ = ["open", "Device", "DeviceBuffer", "Program", "BACKENDS", "PLUGINS"]

BACKENDS = ("model", "rtl")

#: Backends that live above sw/ (the RTL co-simulation in cosim/ imports the driver, so
#: the driver cannot import it): name -> ``"module:factory"``, imported by name when the
#: backend is opened, like PYNQ's device registry. This table is the only place where sw/
#: names a module above it; tests/test_architecture.py checks that (docs/architecture.md).
PLUGINS = {"rtl": "dnnfab.cosim.rtl_backend:open_rtl"}


@dataclass(frozen=True)
class Program:
    """A launch: ``count`` instructions at device address ``addr``; the DMA may write only
    into ``[out_lo, out_hi)`` (``out_hi <= out_lo``: no window)."""
    addr: int
    count: int
    out_lo: int = 0
    out_hi: int = 0


class RegValue(int):
    """A register value; its fields are attributes (``dev.regs.STATUS.ERROR_CODE``)."""

    def __new__(cls, value, reg):
        obj = super().__new__(cls, value)
        obj._reg = reg
        return obj

    def __getattr__(self, name):
        for f in self._reg.fields:
            if f.name == name:
                return (int(self) >> f.lsb) & ((1 << f.width) - 1)
        raise AttributeError(f"register {self._reg.name} has no field {name}; fields: "
                             f"{', '.join(f.name for f in self._reg.fields) or 'none'}")


class Registers:
    """Registers by name: ``regs.STATUS`` reads, ``regs.PROG_BASE = a`` writes."""

    def __init__(self, device):
        object.__setattr__(self, "_dev", device)

    def _reg(self, name):
        try:
            return self._dev.regmap[name]
        except KeyError:
            raise AttributeError(f"no register {name}; registers: "
                                 f"{', '.join(r.name for r in self._dev.regmap)}") from None

    def __getattr__(self, name):
        r = self._reg(name)
        return RegValue(self._dev.backend.read_reg(r.offset), r)

    def __setattr__(self, name, value):
        r = self._reg(name)
        self._dev.backend.write_reg(r.offset, int(value))

    def __dir__(self):
        return [r.name for r in self._dev.regmap]


class DeviceBuffer(np.ndarray):
    """Host array mirrored in device DRAM (like ``pynq.allocate``'s buffers).

    ``device_address`` is the bus address of this array's first element (a view of a
    buffer has its own); ``sync_to_device()`` / ``sync_from_device()`` copy this array's
    bytes to / from the device."""

    def __array_finalize__(self, obj):
        self._device = getattr(obj, "_device", None)
        self._root = getattr(obj, "_root", None)
        self._root_addr = getattr(obj, "_root_addr", None)

    def _offset(self):
        root = self._root
        if root is None or self._device is None:
            raise DnnfabError("this array is not device memory; use Device.allocate")
        lo = root.__array_interface__["data"][0]
        me = self.__array_interface__["data"][0]
        if not (lo <= me and me + self.nbytes <= lo + root.nbytes):
            raise DnnfabError("this array is a copy, not a view of device memory; write into "
                              "the allocated buffer (buf[...] = x) instead")
        return me - lo

    @property
    def device_address(self):
        return self._root_addr + self._offset()

    def _contig(self):
        if not self.flags.c_contiguous:
            raise DnnfabError("sync of a non-contiguous view; sync the whole buffer or a "
                              "contiguous slice")

    def sync_to_device(self):
        self._contig()
        self._device.backend.dram_write(self.device_address, np.asarray(self).view(np.uint8).reshape(-1))

    def sync_from_device(self):
        self._contig()
        self._device.backend.dram_read_into(self.device_address,
                                            np.asarray(self).reshape(-1).view(np.uint8))

    def freebuffer(self):
        """PYNQ compatibility; the memory is returned when the device closes."""


class Device:
    """The accelerator behind a :class:`~.backend.Backend`; see the module docstring."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.cfg = backend.cfg
        self.regmap = accelerator_regmap(self.cfg)
        self.regs = Registers(self)
        self._counter_offs = None
        self._launch_offs = None
        self.closed = False
        self._check_identity()

    def _check_identity(self):
        ident = int(self.regs.ID)
        if ident != ID_MAGIC:
            raise ConfigError(f"no dnnfab accelerator at the register bank (ID reads "
                              f"{ident:#010x}, expected {ID_MAGIC:#010x}); load the bitstream "
                              "generated by dnnfab")
        want = self.regmap["CONFIG0"].reset
        got = int(self.regs.CONFIG0)
        if got != want:
            raise ConfigError(f"the accelerator's CONFIG0 is {got:#010x} but the driver was "
                              f"opened for {self.cfg.rows}x{self.cfg.cols}, {self.cfg.bus_bits}-bit "
                              f"bus ({want:#010x}); open it with the accelerator's config")

    # -- memory -----------------------------------------------------------------------
    def allocate(self, shape, dtype=np.uint8) -> DeviceBuffer:
        """A zeroed host array backed by device DRAM (``buf.device_address``)."""
        host = np.zeros(shape, dtype)
        addr = self.backend.allocate(max(1, host.nbytes))
        buf = host.view(DeviceBuffer)
        buf._device, buf._root, buf._root_addr = self, buf, addr
        buf.sync_to_device()
        return buf

    def write(self, addr, data):
        self.backend.dram_write(addr, data)

    def read(self, addr, n) -> bytes:
        return self.backend.dram_read(addr, n)

    # -- running ------------------------------------------------------------------------
    def counters(self):
        """The 64-bit performance counters, by name (LO read first: it latches HI)."""
        return self._status_and_counters(False)[1]

    def _status_and_counters(self, status=True):
        """(STATUS or None, counters): one ``read_regs`` (STATUS first, then each counter's
        LO before its HI)."""
        rm = self.regmap
        offs = self._counter_offs
        if offs is None:
            offs = self._counter_offs = [rm[f"{name}_{half}"].offset for name in COUNTERS
                                         for half in ("LO", "HI")]
        vals = self.backend.read_regs(([rm["STATUS"].offset] if status else []) + offs)
        st = RegValue(vals.pop(0), rm["STATUS"]) if status else None
        return st, {name.lower(): (int(vals[2 * i + 1]) << 32) | int(vals[2 * i])
                    for i, name in enumerate(COUNTERS)}

    def run(self, program: Program, timeout_s=10.0):
        """Launch ``program`` and wait for it; returns the performance counters.

        Raises a typed :class:`~dnnfab.errors.FabricError` (see the module docstring);
        after it the device needs :meth:`reset`."""
        if self.closed:
            raise DnnfabError("the device is closed; open a new one")
        regs = self.regs
        if regs.STATUS.BUSY:
            raise FabricError("the accelerator is still busy with an earlier launch; call "
                              "dev.reset() first")
        rm = self.regmap
        o = self._launch_offs
        if o is None:
            o = self._launch_offs = [rm[n].offset for n in (
                "IRQ_STATUS", "IRQ_ENABLE", "PROG_BASE", "PROG_LEN", "OUT_LO", "OUT_HI", "CTRL")]
        self.backend.write_regs(list(zip(o, (0x3, 0x3, program.addr, program.count,
                                             program.out_lo, program.out_hi, 0x1))))
        ok = self.backend.wait_irq(timeout_s)
        status, counters = self._status_and_counters()
        if not ok:
            why = self.backend.diagnose()
            raise FabricTimeout(
                f"no interrupt within {timeout_s:g} s: STATUS={int(status):#06x} (BUSY "
                f"{status.BUSY}, DONE {status.DONE}, ERROR {status.ERROR}), "
                f"{counters['insns']} of {program.count} instructions retired"
                + (f"; {why}" if why else "") + "; the device needs dev.reset()",
                int(status), counters, why)
        regs.IRQ_STATUS = 0x3
        if status.ERROR:
            self._raise(status, program, counters)
        return counters

    def _raise(self, status, program, counters):
        code = status.ERROR_CODE
        info = int(self.regs.ERROR_INFO)
        try:
            cname = ErrorCode(code).name
        except ValueError:
            cname = f"code {code}"
        tail = f" (STATUS={int(status):#06x}, {counters['insns']} instructions retired)"
        if code in (ERR_AXI_READ, ERR_AXI_WRITE, ERR_OUT_WINDOW, ERR_PROG_FETCH):
            what = {ERR_AXI_READ: "AXI read error (SLVERR/DECERR) on a load",
                    ERR_AXI_WRITE: "AXI write error (SLVERR/DECERR) on a store",
                    ERR_OUT_WINDOW: "store outside the write window [OUT_LO, OUT_HI); not issued",
                    ERR_PROG_FETCH: "AXI read error while fetching instructions"}[code]
            raise DmaError(f"DMA error {code} ({cname}) at {info:#x}: {what}{tail}", code, info,
                           int(status), counters)
        if code == ERR_ILLEGAL_INSN:
            # ERROR_INFO holds the instruction's program index (the controller's dispatch count)
            index, addr = info, program.addr + info * INSN_BYTES
            raise IllegalInstruction(f"illegal instruction at {addr:#x} (program index {index})"
                                     f"{tail}", index, addr, int(status), counters)
        if code == ERR_SP_RANGE:
            raise ScratchpadError(f"scratchpad address out of range (error 4) by the instruction "
                                  f"at {info:#x}{tail}", info, int(status), counters)
        raise FabricError(f"accelerator error {code} ({cname}), ERROR_INFO={info:#x}{tail}")

    def reset(self):
        """SOFT_RESET then CLEAR_ERROR: the datapath idles, STATUS clears."""
        self.regs.CTRL = 0x2
        self.regs.CTRL = 0x4
        self.regs.IRQ_STATUS = 0x3

    def close(self):
        if not self.closed:
            self.closed = True
            self.backend.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _plugin(name):
    """The factory of plugin backend ``name`` (:data:`PLUGINS`)."""
    import importlib
    modname, _, attr = PLUGINS[name].partition(":")
    try:
        module = importlib.import_module(modname)
    except ImportError as exc:
        raise ConfigError(f"backend {name!r} needs {modname} ({exc}); install dnnfab with its "
                          "co-simulation extras: pip install -e '.[cosim]'") from None
    return getattr(module, attr)


def open(backend="model", config: AcceleratorConfig = None, board=None, **kw) -> Device:  # noqa: A001
    """Open a device: ``backend`` ``"model"`` (the fast model) or ``"rtl"`` (the generated
    Verilog under cocotb, :mod:`dnnfab.cosim.rtl_backend`; ``kw``: ``sim``, ``dram_bytes``,
    ``waves``), or a :class:`~.backend.Backend` instance; ``config`` the accelerator
    configuration, or ``board`` a board name whose default configuration is used."""
    if config is None:
        if board is not None:
            from ...hw.config import AcceleratorConfig as _C
            config = _board_config(board) or _C()
        else:
            config = AcceleratorConfig()
    if isinstance(backend, Backend):
        return Device(backend)
    if backend == "model":
        from .model import ModelBackend
        return Device(ModelBackend(config, **kw))
    if backend in PLUGINS:
        be = _plugin(backend)(config, **kw)
        try:
            return Device(be)
        except BaseException:
            be.close()
            raise
    raise ConfigError(f"unknown backend {backend!r}; known backends: {', '.join(BACKENDS)}")


def _board_config(board):
    """The default accelerator config of ``board`` (its clock), or None."""
    try:
        from ...boards import get_board    # boards/ is pure data (toml); optional here
    except ImportError:
        return None
    b = get_board(board)
    return AcceleratorConfig(clock_mhz=float(b.clock_mhz))
