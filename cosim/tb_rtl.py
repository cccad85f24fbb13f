"""cocotb side of the RTL driver backend (:mod:`dnnfab.cosim.rtl_backend`): one test,
``serve``, that runs for the whole life of a backend and answers the host's requests.

The host process (the synchronous driver) and this simulator process share a socket (the
fd in ``$DNNFAB_RTL_FD``); each request is one length-prefixed pickle, answered by one
reply. While the test waits for a request, simulated time stands still (the coroutine
blocks the simulator in ``recv``): the accelerator sees a host that is infinitely fast
between bus transactions, and no Python runs per cycle. Requests:

* ``rd off`` / ``wr off value``: one AXI4-Lite read / write transaction on
  ``s_axil__*``; ``rds [off, ...]`` / ``wrs [(off, value), ...]``: several, in order, one
  reply. The master: :class:`VerilogAxilHost` (``dnnfab_axil_host`` in the top runs the
  batch; params ``axil`` ``"verilog"``, the default when the top has it), else
  :class:`AxiLiteHost` (``"lean"``) or cocotbext-axi's ``AxiLiteMaster`` (``"cocotbext"``);
* ``dram_w addr bytes`` / ``dram_r addr n``: one bulk load (``$readmemh``) / dump
  (``$writememh``) of the Verilog DRAM (:class:`~dnnfab.cosim.dram.VerilogDram`);
* ``wait cycles``: simulate until the interrupt's rising edge or ``cycles`` clock
  periods, in chunks of :data:`CHUNK` cycles (between chunks the test checks that the
  host is still alive: a dead host ends the simulation);
* ``fail_reads`` / ``fail_writes`` / ``clear_faults``: the DRAM's error injection;
* ``state``: the controller/compute/DMA state and the AXI rule flags (hang report);
* ``time``: simulated cycles since the start; ``hard_reset``: the top's ``rst`` for 5
  cycles (the DRAM's contents are kept);
* ``close``: reply, then end the test (the simulator exits).

Errors in a request are returned to the host as ``("err", type, message)``.
"""

import os
import re
import select
import socket
import time

import cocotb
from cocotb.triggers import ClockCycles, First, RisingEdge, Timer

from dnnfab.cosim import params
from dnnfab.cosim.dram import CLOCK_NS
from dnnfab.cosim.rtl_backend import recv_msg, send_msg
from dnnfab.cosim.tb_accel import setup
from dnnfab.hw.config import AcceleratorConfig

_T_IMPORT = time.time()

#: cycles simulated between two checks that the host process is alive
CHUNK = 1 << 17


class VerilogAxilHost:
    """Register transactions run by ``dnnfab_axil_host`` inside the simulated top
    (cosim/models/axil_host.v): a batch of reads and writes is one command (up to
    ``AXIL_PORT_OPS`` through its ports, a longer one through a file); the call returns
    when the master drops ``busy`` after the last response. No Python runs per clock cycle
    of a register access."""

    OPS, RES = "dnnfab_axil_ops.hex", "dnnfab_axil_res.hex"

    def __init__(self, dut):
        from dnnfab.cosim.dram import AXIL_BATCH_LOG2, AXIL_PORT_OPS
        self.d = dut
        self.clk = dut.clk
        self.batch = 1 << AXIL_BATCH_LOG2
        self.port_ops = AXIL_PORT_OPS
        self.seq = 0
        dut.axil_cmd_seq.value = 0
        dut.axil_cmd_n.value = 0
        dut.axil_cmd_ops.value = 0
        self.cwd = os.getcwd()

    @staticmethod
    def _word(w, a, v):
        return ((2 if w else 1) << 60) | ((a & 0xFFFFFFF) << 32) | (v & 0xFFFFFFFF)

    async def _go(self, n):
        from cocotb.triggers import FallingEdge
        d = self.d
        d.axil_cmd_n.value = n
        self.seq = (self.seq + 1) & 0xFF
        d.axil_cmd_seq.value = self.seq
        await FallingEdge(d.axil_busy)
        if int(d.axil_done_seq.value) != self.seq:
            await FallingEdge(self.clk)                 # the edge's other updates, to be sure
            if int(d.axil_done_seq.value) != self.seq:
                raise RuntimeError("AXI4-Lite batch not executed (clock stopped or in reset?)")

    async def run(self, ops):
        """``ops``: [(False, addr, 0) read | (True, addr, value) write]; returns the read
        data (0 for writes), in order. Raises IOError on an error response."""
        out = []
        for k in range(0, len(ops), self.batch):
            part = ops[k:k + self.batch]
            if len(part) <= self.port_ops:          # through the command ports, no files
                word = 0
                for j, op in enumerate(part):
                    word |= self._word(*op) << (64 * j)
                self.d.axil_cmd_ops.value = word
                await self._go(len(part))
                res = int(self.d.axil_res_ops.value)
                words = [(res >> (40 * j)) & ((1 << 40) - 1) for j in range(len(part))]
            else:
                with open(os.path.join(self.cwd, self.OPS), "w") as f:
                    f.write("".join(f"{self._word(*op):016x}\n" for op in part))
                await self._go(len(part))
                with open(os.path.join(self.cwd, self.RES)) as f:
                    text = re.sub(r"//[^\n]*", "", f.read())      # Icarus writes "// 0x<address>" lines
                words = [int(t, 16) for t in text.split() if not t.startswith("@")]
            out += self._check(part, words)
        return out

    @staticmethod
    def _check(ops, words):
        out = []
        for (w, a, _), r in zip(ops, words):
            if r >> 32 & 3:
                raise IOError(f"AXI4-Lite {'write' if w else 'read'} of {a:#x}: response {r >> 32 & 3}")
            out.append(r & 0xFFFFFFFF)
        return out

    async def read_dword(self, addr):
        return (await self.run([(False, addr, 0)]))[0]

    async def write_dword(self, addr, value):
        await self.run([(True, addr, value)])


class AxiLiteHost:
    """A lean AXI4-Lite master on ``s_axil__*``: one coroutine per transaction, no
    background tasks (cocotbext-axi's master costs ~1 ms of Python per register access; this
    one a few clock edges). Signals change only at falling edges; whether a handshake
    happens at the next rising edge is read in the ReadOnly phase after the change (the
    slave's ready/valid as that edge will sample them). Valid is held until its handshake,
    as AXI requires; every transaction returns at a falling edge."""

    def __init__(self, dut):
        self.d = dut
        self.clk = dut.clk
        for n in ("awvalid", "wvalid", "bready", "arvalid", "rready", "awaddr", "wdata", "araddr",
                  "awprot", "arprot"):
            getattr(dut, f"s_axil__{n}").value = 0
        dut.s_axil__wstrb.value = 0xF

    _at = None          # simulated time (steps) at which the last transaction returned

    async def _start(self):
        """Be at a falling edge: the one the last transaction returned at, if no time has
        passed since (back-to-back transactions), else the next."""
        from cocotb.utils import get_sim_time
        if self._at is None or get_sim_time("step") != self._at:
            await self._fall()

    def _done(self):
        from cocotb.utils import get_sim_time
        self._at = get_sim_time("step")

    async def _fall(self):
        from cocotb.triggers import FallingEdge
        await FallingEdge(self.clk)

    async def _sampled(self):
        from cocotb.triggers import ReadOnly
        await ReadOnly()

    async def read_dword(self, addr):
        d = self.d
        await self._start()
        d.s_axil__araddr.value = addr
        d.s_axil__arvalid.value = 1
        d.s_axil__rready.value = 1
        ar = False
        while True:
            await self._sampled()
            ar_now = not ar and int(d.s_axil__arready.value)
            r_now = int(d.s_axil__rvalid.value)
            data, resp = (int(d.s_axil__rdata.value), int(d.s_axil__rresp.value)) if r_now else (0, 0)
            await self._fall()                       # the rising edge in between took them
            if ar_now:
                ar = True
                d.s_axil__arvalid.value = 0
            if r_now and ar:
                d.s_axil__rready.value = 0
                self._done()
                if resp:
                    raise IOError(f"AXI4-Lite read of {addr:#x}: RRESP {resp}")
                return data

    async def write_dword(self, addr, value):
        d = self.d
        await self._start()
        d.s_axil__awaddr.value = addr
        d.s_axil__wdata.value = value
        d.s_axil__awvalid.value = 1
        d.s_axil__wvalid.value = 1
        d.s_axil__bready.value = 1
        aw = w = False
        while True:
            await self._sampled()
            aw_now = not aw and int(d.s_axil__awready.value)
            w_now = not w and int(d.s_axil__wready.value)
            b_now = int(d.s_axil__bvalid.value)
            resp = int(d.s_axil__bresp.value) if b_now else 0
            await self._fall()
            if aw_now:
                aw = True
                d.s_axil__awvalid.value = 0
            if w_now:
                w = True
                d.s_axil__wvalid.value = 0
            if b_now and aw and w:
                d.s_axil__bready.value = 0
                self._done()
                if resp:
                    raise IOError(f"AXI4-Lite write of {addr:#x}: BRESP {resp}")
                return


def _host_gone(sock, ppid):
    """The host died: the socket is readable with nothing in it (EOF), or we were
    re-parented."""
    if os.getppid() != ppid:
        return True
    r, _, _ = select.select([sock], [], [], 0)
    if r:
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True
    return False


@cocotb.test()
async def serve(dut):
    p = params()
    cfg = AcceleratorConfig.from_dict(p["config"])
    sock = socket.socket(fileno=int(os.environ["DNNFAB_RTL_FD"]))
    ppid = int(os.environ.get("DNNFAB_RTL_PPID", os.getppid()))
    t_test = time.time()
    master = p.get("axil", "verilog")
    if master == "verilog" and not hasattr(dut, "axil_cmd_seq"):
        master = "lean"                     # a top without dnnfab_axil_host
    host = await setup(dut, cfg, int(p["dram_bytes"]),
                       axil={"verilog": VerilogAxilHost, "lean": AxiLiteHost, "cocotbext": None}[master])
    batched = isinstance(host.axil, VerilogAxilHost)
    dram, axil = host.dram, host.axil
    t_start = host.cycle
    busy_wall = [0.0]

    async def wait(cycles):
        """(True, cycles, now) at the interrupt's rising edge, (False, cycles, now) after
        ``cycles`` (now: simulated cycles since the start)."""
        t0 = host.cycle
        if int(dut.irq.value):
            return True, 0, t0 - t_start
        left = int(cycles)
        w0 = time.monotonic()
        try:
            while left > 0:
                n = min(left, CHUNK)
                edge = RisingEdge(dut.irq)
                fired = await First(edge, Timer(n * CLOCK_NS, "ns"))
                if isinstance(fired, RisingEdge):
                    await RisingEdge(host.clk)
                    return True, host.cycle - t0, host.cycle - t_start
                left -= n
                if _host_gone(sock, ppid):
                    raise SystemExit("host gone")
            return False, host.cycle - t0, host.cycle - t_start
        finally:
            busy_wall[0] += time.monotonic() - w0

    async def state():
        line = host.dump_state()
        bad = dram.protocol_error()
        return line + (f"; {bad}" if bad else "")

    async def hard_reset():
        dut.rst.value = 1
        await ClockCycles(host.clk, 5)
        dut.rst.value = 0
        await ClockCycles(host.clk, 5)
        dram.clear_faults()

    async def rd(off):
        return int(await axil.read_dword(off))

    async def wr(off, value):
        await axil.write_dword(off, value & 0xFFFFFFFF)

    async def rds(offs):
        if batched:
            return await axil.run([(False, o, 0) for o in offs])
        return [int(await axil.read_dword(o)) for o in offs]

    async def wrs(items):
        if batched:
            await axil.run([(True, o, v) for o, v in items])
            return
        for o, v in items:
            await axil.write_dword(o, v & 0xFFFFFFFF)

    async def dram_w(addr, data):
        await dram.load([(addr, data)])

    async def dram_r(addr, n):
        return await dram.read(addr, n)

    async def sync(fn):
        return fn

    handlers = {
        "rd": rd, "wr": wr, "rds": rds, "wrs": wrs, "dram_w": dram_w, "dram_r": dram_r, "wait": wait, "state": state,
        "hard_reset": hard_reset,
        "time": lambda: sync((host.cycle - t_start, busy_wall[0])),
        "fail_reads": lambda addr=None, beat=None: sync(dram.fail_reads(addr, beat)),
        "fail_writes": lambda addr=None, burst=None: sync(dram.fail_writes(addr, burst)),
        "clear_faults": lambda: sync(dram.clear_faults()),
        "counters": lambda: sync(dram.counters()),
    }
    send_msg(sock, ("ready", host.cycle, {"import": _T_IMPORT, "test": t_test, "ready": time.time()}))
    while True:
        try:
            msg = recv_msg(sock)
        except (EOFError, OSError):
            return                          # the host closed the socket or died
        op, args = msg[0], msg[1:]
        if op == "close":
            send_msg(sock, ("ok", None))
            return
        try:
            out = await handlers[op](*args)
            reply = ("ok", out)
        except SystemExit:
            return
        except Exception as exc:            # noqa: BLE001 - reported to the host
            reply = ("err", type(exc).__name__, str(exc))
        try:
            send_msg(sock, reply)
        except OSError:
            return
