"""The ``rtl`` driver backend: the generated accelerator's Verilog, simulated, as the device.

>>> from dnnfab.sw import driver
>>> dev = driver.open("rtl", config)                 # Verilator; sim="icarus" for Icarus
>>> dev.run(driver.Program(addr, count, lo, hi), timeout_s=0.01)   # simulated seconds

The host driver (:class:`~dnnfab.sw.driver.device.Device`) is the same code that runs
on the model backend. Under it this backend starts **one simulator process** for its
whole life (many launches): cocotb 2.x running :mod:`dnnfab.cosim.tb_rtl` against
``dnnfab_tb_top`` (the accelerator and the Verilog AXI4 DRAM ``dnnfab_axi_dram`` of
:mod:`dnnfab.cosim.dram`), built once per design hash by :mod:`dnnfab.cosim.runner` (a
fresh Verilator build of the 8x8 accelerator takes ~3 minutes, a cached one a second).

The synchronous driver talks to the simulator over a socket pair (one length-prefixed
pickle per request and reply): every register access is a real AXI4-Lite transaction on
the accelerator's ``s_axil`` port, every buffer sync one bulk ``$readmemh`` /
``$writememh`` of the simulated DRAM, and ``wait_irq`` simulates until the interrupt's
rising edge -- no Python runs per cycle or per AXI beat. While the host computes,
simulated time stands still.

**Time.** ``wait_irq(timeout_s)`` bounds *simulated* time: ``timeout_s`` seconds at the
configuration's clock (a board's timeout in the board's time); the simulator runs at
~10^5-10^6 cycles per wall second. :meth:`launch_timeout` (used by the session when it
is given none) is 4x the modelled cycles plus 100,000 cycles.

**Faults.** :meth:`fail_reads` / :meth:`fail_writes` / :meth:`clear_faults` arm the
DRAM's error injection (SLVERR on a read beat by address or number, on a write burst by
address or number; docs/cosim_dram.md); :meth:`hard_reset` pulses the top's reset.

**Lifetime.** :meth:`close` (also at interpreter exit, ``atexit``) asks the simulator to
finish and waits for it (killing it after a few seconds). If the host process dies
instead, the simulator dies too: it is started with ``PR_SET_PDEATHSIG`` (Linux; when
opened from the main thread, since the signal follows the thread that forked), and it
also ends when its socket reports end-of-file -- at once while it waits for a request,
within one :data:`~dnnfab.cosim.tb_rtl.CHUNK` of cycles while it simulates.
"""

from __future__ import annotations

import atexit
import itertools
import os
import pickle
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
import weakref
from pathlib import Path

from ..errors import ConfigError, FabricError, ToolchainError
from ..hw.config import AcceleratorConfig
from ..sw.driver.backend import Backend

__all__ = ["RtlBackend", "send_msg", "recv_msg", "live_backends"]

_HDR = struct.Struct("<Q")


def send_msg(sock, obj):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HDR.pack(len(data)) + data)


def _recv_exact(sock, n):
    chunks, got = [], 0
    while got < n:
        b = sock.recv(min(n - got, 1 << 20))
        if not b:
            raise EOFError("socket closed")
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def recv_msg(sock):
    (n,) = _HDR.unpack(_recv_exact(sock, _HDR.size))
    return pickle.loads(_recv_exact(sock, n))


_LIVE = weakref.WeakSet()
_counter = itertools.count()


def live_backends():
    """The RTL backends of this process whose simulator is still running."""
    return [b for b in list(_LIVE) if not b.closed]


@atexit.register
def _close_all():
    for b in live_backends():
        try:
            b.close()
        except Exception:           # noqa: BLE001 - best effort at exit
            pass


def _pdeathsig():
    """preexec_fn: the child gets SIGKILL when the thread that forked it exits (Linux)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)          # PR_SET_PDEATHSIG
    except Exception:               # noqa: BLE001 - other systems: the socket EOF path remains
        pass


def _pow2(n):
    return 1 << max(16, (int(n) - 1).bit_length())


class RtlBackend(Backend):
    """See the module docstring. ``sim`` ``"verilator"`` | ``"icarus"``; ``dram_bytes``
    the DRAM the accelerator sees (rounded up to a power of two; above the default 16 MiB
    build capacity a larger memory is built); ``waves`` a waveform-recording build (VCD /
    FST in the run directory) from simulated time ``waves_from_ns`` on; ``run_dir`` where
    the simulator runs (default: a fresh directory under the build's ``runs/``, removed on
    :meth:`close` unless ``keep_run_dir`` or ``waves``); ``options`` is accepted and
    ignored (the session passes the CPU side's Options to every backend); ``axil`` the
    register bus master: ``"verilog"`` (``dnnfab_axil_host`` in the simulated top,
    cosim/models/axil_host.v: a batch of accesses per request, no Python per cycle; its
    own build of the top), ``"lean"`` (:class:`~dnnfab.cosim.tb_rtl.AxiLiteHost`, Python
    at a few clock edges per access, the accelerator testbench's build) or ``"cocotbext"``
    (cocotbext-axi's ``AxiLiteMaster``, ~1 ms per access)."""

    name = "rtl"

    def __init__(self, cfg: AcceleratorConfig, sim="verilator", dram_bytes=16 << 20, waves=False,
                 waves_from_ns=0, run_dir=None, keep_run_dir=False, options=None, start_timeout_s=600,
                 axil="verilog"):
        from . import runner
        from .dram import accel_target, DEFAULT_CAPACITY
        self.cfg = cfg
        self.sim = sim
        self.closed = True
        self.proc = None
        runner.check_simulator(sim)
        size = _pow2(dram_bytes)
        capacity = max(DEFAULT_CAPACITY, size)
        self.dram_size = size
        self._next = 0
        self._lock = threading.Lock()
        self._diagnosis = ""
        self.launches = 0
        self.stats = {}             # request -> [count, wall seconds] (host side, round trips)
        self.wait_end_cycle = 0     # simulated cycle at which the last wait_irq ended
        if axil not in ("verilog", "lean", "cocotbext"):
            raise ConfigError(f"unknown AXI4-Lite master {axil!r}; use verilog, lean or cocotbext")
        sources, top, build_kw = accel_target(cfg, sim, capacity=capacity,
                                              axil="verilog" if axil == "verilog" else "ports")
        host, child = socket.socketpair()
        self._sock = host
        if run_dir is None:
            tag = f"rtl-{os.getpid()}-{next(_counter)}-{int(time.time() * 1e3) % 10**8}"
            run_dir = Path(runner.cache_root()) / "cosim" / "rtl-runs" / tag
        self.run_dir = Path(run_dir)
        self._keep = keep_run_dir
        main = threading.current_thread() is threading.main_thread()
        t0 = time.monotonic()
        self.times = {"start": time.time()}
        try:
            proc, build_dir, built, build_s, log = runner.spawn(
                sources, top, "dnnfab.cosim.tb_rtl", self.run_dir, sim=sim,
                params={"config": cfg.to_dict(), "dram_bytes": size, "axil": axil},
                testcase="serve", waves=waves,
                extra_env={"DNNFAB_RTL_FD": str(child.fileno()), "DNNFAB_RTL_PPID": str(os.getpid()),
                           "DNNFAB_TRACE_FROM_NS": str(int(waves_from_ns)),
                           # no pytest assertion rewriting of every imported module (numpy
                           # included: ~3 s of the simulator's start), no pytest plugins
                           "COCOTB_REWRITE_ASSERTION_FILES": "", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
                pass_fds=(child.fileno(),), preexec_fn=_pdeathsig if main else None, **build_kw)
        except BaseException:
            host.close()
            child.close()
            raise
        child.close()
        self.times["spawned"] = time.time()
        self.proc, self.build_dir, self.built, self.build_s, self.log = proc, build_dir, built, build_s, log
        self.pid = proc.pid
        self.closed = False
        _LIVE.add(self)
        # the simulator answers "ready" after its reset and DRAM clear
        host.settimeout(start_timeout_s)
        try:
            msg = recv_msg(host)
        except (EOFError, OSError, socket.timeout):
            self._kill()
            raise ToolchainError(f"the {sim} simulator did not start; see {log}") from None
        host.settimeout(None)
        if msg[0] != "ready":
            self._kill()
            raise ToolchainError(f"the {sim} simulator answered {msg!r} on start; see {log}")
        self.start_s = time.monotonic() - t0
        self.times.update(msg[2] if len(msg) > 2 else {})
        self.waves = self._wave_file() if waves else None

    # -- the request channel ---------------------------------------------------------
    def _call(self, *req):
        if self.closed:
            raise FabricError("the RTL backend is closed; open a new device")
        with self._lock:
            t0 = time.perf_counter()
            try:
                send_msg(self._sock, req)
                reply = recv_msg(self._sock)
                st = self.stats.setdefault(req[0], [0, 0.0])
                st[0] += 1
                st[1] += time.perf_counter() - t0
            except (EOFError, OSError) as exc:
                code = self.proc.poll()
                self._kill()
                raise FabricError(f"the {self.sim} simulator died ({exc}; exit code {code}); "
                                  f"see {self.log}") from None
        if reply[0] == "ok":
            return reply[1]
        raise FabricError(f"simulator request {req[0]} failed: {reply[1]}: {reply[2]}")

    # -- Backend ---------------------------------------------------------------------
    def read_reg(self, offset):
        return self._call("rd", int(offset))

    def write_reg(self, offset, value):
        self._call("wr", int(offset), int(value))

    def read_regs(self, offsets):
        return self._call("rds", [int(o) for o in offsets])

    def write_regs(self, items):
        self._call("wrs", [(int(o), int(v)) for o, v in items])

    def allocate(self, nbytes, align=4096):
        addr = -(-self._next // align) * align
        if addr + nbytes > self.dram_size:
            raise FabricError(f"device DRAM exhausted: {nbytes} bytes at {addr:#x} exceed the simulated "
                              f"{self.dram_size} bytes; open the backend with a larger dram_bytes")
        self._next = addr + nbytes
        return addr

    def dram_write(self, addr, data):
        self._call("dram_w", int(addr), data if isinstance(data, bytes) else bytes(data))

    def dram_read(self, addr, n):
        return self._call("dram_r", int(addr), int(n))

    def wait_irq(self, timeout_s):
        cycles = max(1, int(round(timeout_s * self.cfg.clock_mhz * 1e6)))
        fired, _, self.wait_end_cycle = self._call("wait", cycles)
        self.launches += 1
        self._diagnosis = "" if fired else self._call("state")
        return fired

    def launch_timeout(self, model_cycles):
        return (4 * int(model_cycles) + 100_000) / (self.cfg.clock_mhz * 1e6)

    def diagnose(self):
        return self._diagnosis

    # -- simulator extras ------------------------------------------------------------
    def sim_cycles(self):
        """Simulated clock cycles since the simulator started."""
        return self._call("time")[0]

    def sim_stats(self):
        """``(cycles, wall seconds spent simulating in waits)`` since start."""
        return tuple(self._call("time"))

    def state(self):
        """The controller / compute / DMA state and the AXI rule flags, as one line."""
        return self._call("state")

    def fail_reads(self, addr=None, beat=None):
        """SLVERR on every read beat of the bus word at byte ``addr`` and/or on read beat
        number ``beat`` from now (0: the next)."""
        self._call("fail_reads", addr, beat)

    def fail_writes(self, addr=None, burst=None):
        """SLVERR on the write burst holding the bus word at byte ``addr`` (not written)
        and/or on write burst number ``burst`` from now (nothing of it written)."""
        self._call("fail_writes", addr, burst)

    def clear_faults(self):
        self._call("clear_faults")

    def dram_counters(self):
        return self._call("counters")

    def hard_reset(self):
        """The top's reset for 5 cycles: the whole accelerator restarts (DRAM kept)."""
        self._call("hard_reset")

    def _wave_file(self):
        """Where the waveform goes: cocotb's Verilator main writes VCD, Icarus FST."""
        return self.run_dir / ("dump.vcd" if self.sim == "verilator" else "dump.fst")

    # -- lifetime --------------------------------------------------------------------
    def _kill(self):
        self.closed = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        try:
            self._sock.close()
        except OSError:
            pass

    def close(self, timeout_s=10.0):
        """End the simulator (asked to finish; killed after ``timeout_s``)."""
        if self.closed:
            return
        try:
            with self._lock:
                self._sock.settimeout(timeout_s)
                send_msg(self._sock, ("close",))
                recv_msg(self._sock)
        except (EOFError, OSError, socket.timeout):
            pass
        self.closed = True
        try:
            self._sock.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        if not self._keep and self.waves is None:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __del__(self):
        try:
            if not self.closed:
                self.close()
        except Exception:           # noqa: BLE001
            pass


def open_rtl(cfg, **kw):
    """The driver's factory for ``driver.open("rtl", cfg, **kw)``."""
    if not isinstance(cfg, AcceleratorConfig):
        raise ConfigError("the rtl backend needs an AcceleratorConfig")
    return RtlBackend(cfg, **kw)
