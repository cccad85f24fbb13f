"""The co-simulation DRAM: an AXI4 slave memory in the simulated Verilog, or cocotbext-axi's AxiRam.

The accelerator testbench's top is ``dnnfab_tb_top``, generated here around the
accelerator. With ``dram="verilog"`` (the default) it also holds ``dnnfab_axi_dram``
(``cosim/models/axi_dram.v``, instance ``dram``): the accelerator's AXI4 master is wired to
the memory inside the simulator, so no Python runs per AXI beat, and the testbench reaches
the memory through ``dram_*`` ports (bulk load / dump / fill / compare commands, error
injection, AXI rule flags). With ``dram="axiram"`` (the former DRAM) the ``m_axi__*``
port is brought out and cocotbext-axi's ``AxiRam`` serves it from Python. The two answer
the accelerator cycle for cycle alike (the Verilog model replays AxiRam's queues and task
order, docs/cosim_dram.md); ``tests/cosim/test_cosim_dram.py`` checks it handshake by
handshake. The AXI4-Lite port, ``clk``, ``rst`` and ``irq`` are top-level ports.

Harness side: :func:`run_accel` builds (cached) and runs the accelerator testbench;
:func:`accel_target` / :func:`accel_design` give what it builds. Testbench side (inside
cocotb): :class:`VerilogDram` and :class:`AxiRamDram` share one API -- bulk ``load`` /
``read`` / ``write`` / ``fill`` / ``check_fill`` / ``first_change`` (async), error
injection ``fail_reads`` / ``fail_writes`` / ``clear_faults``, ``counters`` and
``protocol_error``.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np

__all__ = ["DRAMS", "DEFAULT_DRAM", "MODEL", "TOP", "DEFAULT_CAPACITY", "DEBUG_SIGNALS", "accel_design",
           "accel_target", "tb_top_verilog", "accel_vlt", "run_accel", "VerilogDram", "AxiRamDram", "open_dram"]

#: DRAM models of the accelerator testbench.
DRAMS = ("verilog", "axiram")
DEFAULT_DRAM = "verilog"
#: Clock period of the accelerator testbench (ns)
CLOCK_NS = 10
MODEL = Path(__file__).resolve().parent / "models" / "axi_dram.v"
#: the AXI4-Lite master in Verilog of the RTL driver backend (``axil="verilog"`` tops)
AXIL_HOST = Path(__file__).resolve().parent / "models" / "axil_host.v"
#: log2 of the largest batch of register transactions dnnfab_axil_host runs at once
AXIL_BATCH_LOG2 = 6
#: batches up to this many transactions go through dnnfab_axil_host's ports (no files)
AXIL_PORT_OPS = 16
#: who drives the accelerator's AXI4-Lite port: the testbench's Python through top-level
#: ports, or dnnfab_axil_host inside the top (batches of transactions, no Python per cycle)
AXIL_MASTERS = ("ports", "verilog")
TOP = "dnnfab_tb_top"
#: Bytes of the Verilog memory (a build parameter); a testbench uses a power-of-two window of it.
DEFAULT_CAPACITY = 16 << 20

LOAD_FILE = "dnnfab_dram_load.hex"
DUMP_FILE = "dnnfab_dram_dump.hex"
OP_LOAD, OP_DUMP, OP_FILL, OP_CHECK, OP_CLEAR = 1, 2, 3, 4, 5
INJ_RD_ADDR, INJ_RD_BEAT, INJ_WR_ADDR, INJ_WR_BURST = 1, 2, 4, 8

#: prot_err bits of dnnfab_axi_dram
PROTOCOL_RULES = {
    0: "AR INCR burst crosses a 4 KiB boundary", 1: "AW INCR burst crosses a 4 KiB boundary",
    2: "AR burst type not INCR", 3: "AW burst type not INCR",
    4: "AR burst longer than the maximum burst", 5: "AW burst longer than the maximum burst",
    6: "AR size wider than the bus", 7: "AW size wider than the bus",
    8: "WLAST not on the last beat of its burst",
    9: "ARVALID dropped or AR payload changed before ARREADY",
    10: "AWVALID dropped or AW payload changed before AWREADY",
    11: "WVALID dropped or W payload changed before WREADY",
}


#: Internal signals the accelerator testbench reads (hang report, ``trace``): the only
#: ones a fast Verilator build makes visible besides the top-level ports (:func:`accel_vlt`).
DEBUG_SIGNALS = {
    "controller": ["running", "dispatched", "tok_l2c", "tok_c2l", "tok_c2s", "tok_s2c",
                   "tok_l2c_avail", "tok_c2l_avail", "tok_c2s_avail", "tok_s2c_avail",
                   "load_h_valid", "comp_h_valid", "store_h_valid",
                   "insn_valid", "stopped", "all_idle", "comp_ok", "c_idle",
                   "fetch_go", "load_sel", "comp_sel", "store_sel", "insn_take"],
    "compute": ["dstate", "started", "a_ahead", "w_ahead", "idle"],
    "dma": ["busy", "error"],
}


#: dnnfab_axi_dram's host ports (``dram_<name>`` at dnnfab_tb_top): direction, width
#: (``wl``: log2 of the memory's words, ``aw``: address bits)
HOST_PORTS = {
    "mask": ("in", "wl"), "cmd_seq": ("in", 8), "cmd_op": ("in", 3), "cmd_lo": ("in", "wl+1"),
    "cmd_hi": ("in", "wl+1"), "cmd_byte": ("in", 8), "cmd_done": ("out", 8), "cmd_result": ("out", 32),
    "cmd_first": ("out", "wl+1"), "inj_en": ("in", 4), "inj_rd_addr": ("in", "aw"), "inj_rd_beat": ("in", 32),
    "inj_wr_addr": ("in", "aw"), "inj_wr_burst": ("in", 32), "rd_beats": ("out", 32), "rd_bursts": ("out", 32),
    "wr_beats": ("out", 32), "wr_bursts": ("out", 32), "prot_err": ("out", 16), "prot_err_addr": ("out", "aw"),
}


def _words_log2(capacity, bus_bytes):
    words = capacity // bus_bytes
    if words < 2 or words & (words - 1) or capacity % bus_bytes:
        raise ValueError(f"DRAM capacity {capacity} is not a power of two number of {bus_bytes}-byte words")
    return words.bit_length() - 1


def tb_top_text(cfg, ports, accel_module="dnnfab_accel", capacity=DEFAULT_CAPACITY, dram=DEFAULT_DRAM,
                axil="ports"):
    """Verilog of ``dnnfab_tb_top``: the accelerator (``ports``: the manifest's port list)
    with its ``m_axi__*`` port wired to ``dnnfab_axi_dram`` instance ``dram`` (``dram`` =
    ``"verilog"``) or brought out as top-level ports for AxiRam (``"axiram"``).

    The top registers ``rst`` once before the accelerator and the memory: Amaranth's
    next-state logic of every register depends on its (synchronous) reset, and logic that
    depends on a top-level input is re-evaluated by Verilator at every ``eval`` (its
    "ico" region, half the model's time per cycle); behind a register it is not.

    ``axil="verilog"``: the ``s_axil__*`` port is wired to ``dnnfab_axil_host`` (instance
    ``axil``, cosim/models/axil_host.v) and the top has its command ports ``axil_cmd_seq``,
    ``axil_cmd_n``, ``axil_cmd_ops``, ``axil_res_ops``, ``axil_done_seq``, ``axil_busy``
    instead."""
    wl = _words_log2(capacity, cfg.bus_bytes)
    aw = cfg.addr_bits
    top_ports, wires, conns = [], [], []
    for p in ports:
        rng = f"[{p['width'] - 1}:0] " if p["width"] > 1 else ""
        if (p["name"].startswith("m_axi__") and dram == "verilog") or \
                (p["name"].startswith("s_axil__") and axil == "verilog"):
            wires.append(f"    wire {rng}{p['name']};")
        else:
            top_ports.append(f"    {'input' if p['dir'] == 'in' else 'output'} wire {rng}{p['name']}")
        conns.append(f"        .{p['name']}({'rst_q' if p['name'] == 'rst' else p['name']})")
    widths = {"wl": wl, "wl+1": wl + 1, "aw": aw}
    host = [(d, n, widths.get(w, w)) for n, (d, w) in HOST_PORTS.items()]
    mem = []
    if dram == "verilog":
        for d, n, w in host:
            top_ports.append(f"    {'input' if d == 'in' else 'output'} wire [{w - 1}:0] dram_{n}")
        axi = ["awid", "awaddr", "awlen", "awsize", "awburst", "awvalid", "awready", "wdata", "wstrb", "wlast",
               "wvalid", "wready", "bid", "bresp", "bvalid", "bready", "arid", "araddr", "arlen", "arsize",
               "arburst", "arvalid", "arready", "rid", "rdata", "rresp", "rlast", "rvalid", "rready"]
        dconns = ["        .clk(clk)", "        .rst(rst_q)"] + [f"        .{s}(m_axi__{s})" for s in axi] + \
                 [f"        .{n}(dram_{n})" for _, n, _ in host]
        mem = [f"    dnnfab_axi_dram #(.ADDR_W({aw}), .DATA_W({cfg.bus_bits}), .ID_W({cfg.id_bits}), "
               f".MAX_BURST({cfg.max_burst}), .WORDS_LOG2({wl})) dram (",
               ",\n".join(dconns),
               "    );"]
    if axil == "verilog":
        reg_aw = next(p["width"] for p in ports if p["name"] == "s_axil__awaddr")
        top_ports += ["    input wire [7:0] axil_cmd_seq", f"    input wire [{AXIL_BATCH_LOG2}:0] axil_cmd_n",
                      f"    input wire [{64 * AXIL_PORT_OPS - 1}:0] axil_cmd_ops",
                      f"    output wire [{40 * AXIL_PORT_OPS - 1}:0] axil_res_ops",
                      "    output wire [7:0] axil_done_seq", "    output wire axil_busy"]
        sig = ["awaddr", "awprot", "awvalid", "awready", "wdata", "wstrb", "wvalid", "wready", "bresp", "bvalid",
               "bready", "araddr", "arprot", "arvalid", "arready", "rdata", "rresp", "rvalid", "rready"]
        mem += [f"    dnnfab_axil_host #(.ADDR_W({reg_aw}), .N_LOG2({AXIL_BATCH_LOG2}), .P({AXIL_PORT_OPS})) axil (",
                ",\n".join(["        .clk(clk)", "        .rst(rst_q)", "        .cmd_seq(axil_cmd_seq)",
                            "        .cmd_n(axil_cmd_n)", "        .cmd_ops(axil_cmd_ops)", "        .res_ops(axil_res_ops)",
                            "        .done_seq(axil_done_seq)", "        .busy(axil_busy)"]
                           + [f"        .{n}(s_axil__{n})" for n in sig]),
                "    );"]
    return "\n".join([
        f"// generated by dnnfab.cosim.dram: the accelerator for the testbench, DRAM: {dram}"
        + (f", AXI4-Lite: {axil}" if axil != "ports" else ""),
        "`default_nettype none",
        f"module {TOP} (",
        ",\n".join(top_ports),
        ");",
        *wires,
        "    reg rst_q = 1'b1;",
        "    always @(posedge clk) rst_q <= rst;",
        f"    {accel_module} accel (",
        ",\n".join(conns),
        "    );",
        *mem,
        "endmodule",
        "`default_nettype wire",
        "",
    ])


def tb_top_verilog(cfg, accel_module="dnnfab_accel", capacity=DEFAULT_CAPACITY, dram=DEFAULT_DRAM, axil="ports"):
    """Path of the generated ``dnnfab_tb_top`` Verilog for ``cfg`` (cached)."""
    from .designs import generated
    from .runner import cache_root
    _, _, manifest = generated(cfg, "accelerator")
    text = tb_top_text(cfg, manifest["ports"], accel_module, capacity, dram, axil)
    key = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = cache_root() / "verilog" / f"tbtop-{key}" / f"{TOP}.v"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def accel_vlt(cfg, dram=DEFAULT_DRAM, axil="ports"):
    """Path of the Verilator control file of fast accelerator builds: dnnfab_tb_top's
    ports writable, its ``m_axi__*`` wires (``dram="verilog"``) and the
    :data:`DEBUG_SIGNALS` of the accelerator's blocks readable; everything else is left
    to Verilator's optimiser.
    (Only the ports are ``rw``: Verilator re-evaluates the fan-out of every writable
    signal at each ``eval``, as for the top's inputs.)"""
    from .designs import generated
    from .runner import cache_root
    _, _, manifest = generated(cfg, "accelerator")
    lines = ["`verilator_config", "// dnnfab.cosim.dram.accel_vlt: what the accelerator testbench reads"]
    ports = [p["name"] for p in manifest["ports"]] + ([f"dram_{n}" for n in HOST_PORTS] if dram == "verilog" else [])
    if axil == "verilog":
        ports += ["axil_cmd_seq", "axil_cmd_n", "axil_cmd_ops", "axil_res_ops", "axil_done_seq", "axil_busy"]
    for name in ports:
        wire = (name.startswith("m_axi__") and dram == "verilog") or (name.startswith("s_axil__") and axil == "verilog")
        kind = "public_flat_rd" if wire else "public_flat_rw"
        lines.append(f'{kind} -module "{TOP}" -var "{name}"')
    for block, names in DEBUG_SIGNALS.items():
        for n in names:
            lines.append(f'public_flat_rd -module "*.{block}" -var "{n}"')
    text = "\n".join(lines) + "\n"
    path = cache_root() / "verilog" / f"accel-{hashlib.sha256(text.encode()).hexdigest()[:12]}.vlt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def accel_target(cfg, sim="verilator", dram=DEFAULT_DRAM, accel=None, fast=True, xwatch=False,
                 capacity=DEFAULT_CAPACITY, axil="ports"):
    """``(sources, toplevel, build_kw)`` to build the accelerator testbench's design: see
    :func:`accel_design`; ``build_kw`` for :func:`dnnfab.cosim.runner.build`: ``public``,
    the fast Verilator model (:func:`accel_vlt`) unless ``fast`` is off or ``xwatch``
    needs every signal."""
    sources, top = accel_design(cfg, dram, accel, capacity, axil)
    public = "all" if (not fast or sim != "verilator" or xwatch) else accel_vlt(cfg, dram, axil)
    return sources, top, {"public": public}


def run_accel(cfg, testcase, params, sim="verilator", dram=DEFAULT_DRAM, accel=None, fast=True, **kw):
    """Build (cached) and run the accelerator testbench :mod:`dnnfab.cosim.tb_accel`
    (``testcase`` ``"layers"`` or ``"errors"``) with ``dram``; ``params`` gets its
    ``config``. ``fast`` (Verilator): a model with only the top's signals and
    :data:`DEBUG_SIGNALS` visible (:func:`accel_vlt`) unless ``params`` asks for
    ``xwatch`` (any signal). Returns the :class:`~dnnfab.cosim.runner.CosimResult`;
    ``kw`` goes to :func:`dnnfab.cosim.runner.run`."""
    from . import runner
    params = {"config": cfg.to_dict(), **params}
    sources, top, build_kw = accel_target(cfg, sim, dram, accel, fast, bool(params.get("xwatch")))
    return runner.run(sources, top, "dnnfab.cosim.tb_accel", sim=sim, testcase=testcase, params=params,
                      **build_kw, **kw)


def accel_design(cfg, dram=DEFAULT_DRAM, accel=None, capacity=DEFAULT_CAPACITY, axil="ports"):
    """``(sources, toplevel)`` of the accelerator testbench for ``cfg`` with ``dram``.

    ``accel``: ``(sources, module)`` of the accelerator's Verilog (default: the generated
    one, :func:`dnnfab.cosim.designs.generated`); e.g. the ECP5 variant and its primitive
    models."""
    if dram not in DRAMS:
        from ..errors import ConfigError
        raise ConfigError(f"unknown DRAM model {dram!r}; use one of {', '.join(DRAMS)}")
    if accel is None:
        from .designs import generated
        vfile, module, _ = generated(cfg, "accelerator")
        accel = ([vfile], module)
    sources, module = list(accel[0]), accel[1]
    top = tb_top_verilog(cfg, module, capacity, dram, axil)
    return sources + ([MODEL] if dram == "verilog" else []) + ([AXIL_HOST] if axil == "verilog" else []) + [top], TOP


def open_dram(dut, cfg, size, clk=None):
    """The testbench's DRAM of ``size`` bytes: :class:`VerilogDram` if the top has the
    Verilog memory (``dram_cmd_seq``), else :class:`AxiRamDram` on the top's ``m_axi_`` port.
    ``clk``: the clock signal (default ``dut.clk``)."""
    if hasattr(dut, "dram_cmd_seq"):
        return VerilogDram(dut, cfg.bus_bytes, size, clk)
    return AxiRamDram(dut, cfg.bus_bytes, size, clk)


# --------------------------------------------------------------------------------------
# testbench side (inside cocotb)

def _hex_lines(words: np.ndarray, bus_bytes: int) -> bytes:
    """$readmemh lines (most significant byte first) of a ``[n, bus_bytes]`` uint8 array."""
    if not len(words):
        return b""
    h = words[:, ::-1].tobytes().hex().encode()
    lines = np.frombuffer(h, dtype=f"S{2 * bus_bytes}")
    return b"\n".join(lines.tolist()) + b"\n"


def _parse_hex(text: bytes, count: int, bus_bytes: int) -> np.ndarray:
    """``[count, bus_bytes]`` uint8 from $writememh output (comments and @ lines skipped)."""
    if b"//" in text:                       # Icarus writes "// 0x<address>" lines
        text = re.sub(rb"//[^\n]*", b"", text)
    toks = [t for t in text.split() if not t.startswith(b"@")]
    if len(toks) != count:
        raise RuntimeError(f"DRAM dump: {len(toks)} words, expected {count}")
    joined = b"".join(t.rjust(2 * bus_bytes, b"0") for t in toks)
    try:
        raw = bytes.fromhex(joined.decode())
    except ValueError:
        raise RuntimeError("DRAM dump holds undefined (x/z) words: read before it was written") from None
    return np.frombuffer(raw, np.uint8).reshape(count, bus_bytes)[:, ::-1]


class _DramBase:
    """Shared helpers; ``size`` is the DRAM in bytes (addresses wrap modulo it)."""

    def __init__(self, bus_bytes, size):
        if size & (size - 1) or size < bus_bytes:
            raise ValueError(f"DRAM size {size} is not a power of two >= {bus_bytes}")
        self.bus_bytes = bus_bytes
        self.size = size

    async def write(self, addr, data):
        await self.load([(addr, data)])

    async def first_change(self, byte, keep):
        """``None`` if every byte of the DRAM outside the ``keep`` ranges ``[(lo, hi)]``
        equals ``byte``, else the first address that differs."""
        pos = 0
        for lo, hi in sorted(keep) + [(self.size, self.size)]:
            if lo > pos:
                bad = await self.check_fill(byte, pos, lo)
                if bad is not None:
                    return bad
            pos = max(pos, hi)
        return None


class VerilogDram(_DramBase):
    """Host access to ``dnnfab_axi_dram`` inside the simulated top (its ``dram_*`` ports).

    Every bulk operation is one host command: the testbench sets the command ports and
    ``dram_cmd_seq``; the memory runs it at the next rising edge (``$readmemh`` of a file
    with ``@`` word addresses, ``$writememh`` of a range, a fill or a compare loop in
    Verilog), and the call returns at the falling edge after it (half a cycle, no Python per
    word). Error injection and the AXI rule flags are plain ports.
    """

    def __init__(self, dut, bus_bytes, size, clk=None):
        super().__init__(bus_bytes, size)
        self.dut = dut
        self.clk = dut.clk if clk is None else clk
        self.words_log2 = len(dut.dram_mask)
        if size // bus_bytes > 1 << self.words_log2:
            raise ValueError(f"DRAM of {size} bytes exceeds the Verilog memory "
                             f"({(bus_bytes << self.words_log2)} bytes; build it with a larger capacity)")
        dut.dram_mask.value = size // bus_bytes - 1
        for n in ("cmd_seq", "cmd_op", "cmd_lo", "cmd_hi", "cmd_byte", "inj_en", "inj_rd_addr", "inj_rd_beat",
                  "inj_wr_addr", "inj_wr_burst"):
            getattr(dut, f"dram_{n}").value = 0
        self.seq = 0
        self.inj = 0            # inj_en as written (a signal write lands later in the time step)
        self.cwd = Path(os.getcwd())

    async def _cmd(self, op, lo=0, hi=0, byte=0):
        from cocotb.triggers import RisingEdge, FallingEdge
        d = self.dut
        d.dram_cmd_op.value = op
        d.dram_cmd_lo.value = lo
        d.dram_cmd_hi.value = hi
        d.dram_cmd_byte.value = byte
        self.seq = (self.seq + 1) & 0xFF
        d.dram_cmd_seq.value = self.seq
        await RisingEdge(self.clk)
        await FallingEdge(self.clk)
        if int(d.dram_cmd_done.value) != self.seq:
            raise RuntimeError(f"DRAM command {op} not executed (clock stopped or in reset?)")

    def _words(self, addr, n):
        """Word range [w0, w1) covering bytes [addr, addr + n) (wrapping is not supported
        for bulk access)."""
        if addr < 0 or addr + n > self.size:
            raise ValueError(f"DRAM access [{addr:#x}, {addr + n:#x}) outside the {self.size:#x}-byte DRAM")
        b = self.bus_bytes
        return addr // b, -(-(addr + n) // b)

    async def load(self, images):
        """Write ``[(addr, bytes)]`` into the DRAM with one ``$readmemh`` (images sharing a
        bus word: one after the other, later ones win); partial words at the edges of an
        image keep their other bytes (read first)."""
        b = self.bus_bytes
        images = [(addr, data) for addr, data in images if len(data)]
        spans = sorted((addr // b, -(-(addr + len(data)) // b)) for addr, data in images)
        if any(nxt[0] < prev[1] for prev, nxt in zip(spans, spans[1:])):
            for image in images:                # images sharing a word: one after the other
                await self.load([image])
            return
        chunks = []
        for addr, data in images:
            data = np.frombuffer(bytes(data), np.uint8)
            if not len(data):
                continue
            w0, w1 = self._words(addr, len(data))
            buf = np.empty((w1 - w0) * b, np.uint8)
            if addr % b:                        # partial first / last word: keep its other bytes
                buf[:b] = (await self._read_words(w0, w0 + 1)).reshape(-1)
            if (addr + len(data)) % b:
                buf[-b:] = (await self._read_words(w1 - 1, w1)).reshape(-1)
            buf[addr - w0 * b:addr - w0 * b + len(data)] = data
            chunks.append(f"@{w0:x}\n".encode() + _hex_lines(buf.reshape(-1, b), b))
        if not chunks:
            return
        (self.cwd / LOAD_FILE).write_bytes(b"".join(chunks))
        await self._cmd(OP_LOAD)

    async def _read_words(self, w0, w1):
        await self._cmd(OP_DUMP, w0, w1)
        return _parse_hex((self.cwd / DUMP_FILE).read_bytes(), w1 - w0, self.bus_bytes)

    async def read(self, addr, n):
        """``n`` bytes from ``addr`` (one ``$writememh``)."""
        if n == 0:
            return b""
        w0, w1 = self._words(addr, n)
        words = await self._read_words(w0, w1)
        off = addr - w0 * self.bus_bytes
        return words.reshape(-1)[off:off + n].tobytes()

    async def fill(self, byte, lo=0, hi=None):
        """Every byte of ``[lo, hi)`` (default: the whole DRAM) = ``byte`` (a loop in Verilog)."""
        hi = self.size if hi is None else hi
        b = self.bus_bytes
        w0, w1 = -(-lo // b), hi // b
        if w1 <= w0:
            if hi > lo:
                await self.write(lo, bytes([byte]) * (hi - lo))
            return
        await self._cmd(OP_FILL, w0, w1, byte)
        if lo < w0 * b:
            await self.write(lo, bytes([byte]) * (w0 * b - lo))
        if w1 * b < hi:
            await self.write(w1 * b, bytes([byte]) * (hi - w1 * b))

    async def _first_diff(self, byte, lo, hi):
        if hi <= lo:
            return None
        got = np.frombuffer(await self.read(lo, hi - lo), np.uint8) != byte
        return lo + int(np.argmax(got)) if got.any() else None

    async def check_fill(self, byte, lo, hi):
        """``None`` if every byte of ``[lo, hi)`` equals ``byte``, else the first address
        that differs (whole words compared by a loop in Verilog, partial edge words read)."""
        b = self.bus_bytes
        w0, w1 = -(-lo // b), hi // b
        if w1 <= w0:
            return await self._first_diff(byte, lo, hi)
        bad = await self._first_diff(byte, lo, w0 * b)
        if bad is not None:
            return bad
        await self._cmd(OP_CHECK, w0, w1, byte)
        if int(self.dut.dram_cmd_result.value):
            w = int(self.dut.dram_cmd_first.value)
            return await self._first_diff(byte, w * b, (w + 1) * b)
        return await self._first_diff(byte, w1 * b, hi)

    # ---- error injection ----
    def counters(self):
        """Read beats / bursts and write beats / bursts served since reset."""
        d = self.dut
        return {n: int(getattr(d, f"dram_{n}").value) for n in ("rd_beats", "rd_bursts", "wr_beats", "wr_bursts")}

    def fail_reads(self, addr=None, beat=None):
        """SLVERR (data 0) on every read beat of the bus word at ``addr``, and/or on read
        beat number ``beat`` counted from now (0 = the next beat)."""
        d = self.dut
        en = self.inj & ~(INJ_RD_ADDR | INJ_RD_BEAT)
        if addr is not None:
            d.dram_inj_rd_addr.value = addr
            en |= INJ_RD_ADDR
        if beat is not None:
            d.dram_inj_rd_beat.value = (self.counters()["rd_beats"] + beat) & 0xFFFFFFFF
            en |= INJ_RD_BEAT
        d.dram_inj_en.value = self.inj = en

    def fail_writes(self, addr=None, burst=None):
        """SLVERR on the write burst holding a beat of the bus word at ``addr`` (that beat
        is not written), and/or on write burst number ``burst`` counted from now (0 = the
        next AW; none of its beats is written)."""
        d = self.dut
        en = self.inj & ~(INJ_WR_ADDR | INJ_WR_BURST)
        if addr is not None:
            d.dram_inj_wr_addr.value = addr
            en |= INJ_WR_ADDR
        if burst is not None:
            d.dram_inj_wr_burst.value = (self.counters()["wr_bursts"] + burst) & 0xFFFFFFFF
            en |= INJ_WR_BURST
        d.dram_inj_en.value = self.inj = en

    def clear_faults(self):
        self.dut.dram_inj_en.value = self.inj = 0

    def protocol_error(self):
        """``None``, or a message naming the AXI rules the master broke (sticky since
        reset or :meth:`clear_protocol_error`) and the first offending address."""
        flags = int(self.dut.dram_prot_err.value)
        if not flags:
            return None
        rules = [txt for bit, txt in PROTOCOL_RULES.items() if flags >> bit & 1]
        return f"AXI rule broken by the DRAM's master: {'; '.join(rules)} (first at {int(self.dut.dram_prot_err_addr.value):#x})"

    async def clear_protocol_error(self):
        await self._cmd(OP_CLEAR)


class AxiRamDram(_DramBase):
    """The same API over cocotbext-axi's ``AxiRam`` on the top's ``m_axi_`` port (the
    former DRAM): bulk access is a Python copy, error injection wraps its read/write hooks."""

    def __init__(self, dut, bus_bytes, size, clk=None):
        from cocotbext.axi import AxiBus, AxiRam
        super().__init__(bus_bytes, size)
        self.ram = AxiRam(AxiBus.from_prefix(dut, "m_axi_"), dut.clk if clk is None else clk, dut.rst, size=size)
        self._rd = self.ram.read_if._read
        self._wr = self.ram.write_if._write
        self._aw_recv = self.ram.write_if.aw_channel.recv
        self._n = {"rd_beats": 0, "wr_bursts": 0}
        self._fault = {}

        async def read(address, length):
            n = self._n["rd_beats"]
            self._n["rd_beats"] += 1
            f = self._fault
            if f.get("rd_addr") is not None and address // bus_bytes == f["rd_addr"] // bus_bytes:
                raise IOError("injected read error")
            if f.get("rd_beat") is not None and n == f["rd_beat"]:
                raise IOError("injected read error")
            return await self._rd(address, length)

        async def aw_recv():
            aw = await self._aw_recv()
            self._burst = self._n["wr_bursts"]
            self._n["wr_bursts"] += 1
            return aw

        async def write(address, data):
            f = self._fault
            if f.get("wr_addr") is not None and address // bus_bytes == f["wr_addr"] // bus_bytes:
                raise IOError("injected write error")
            if f.get("wr_burst") is not None and self._burst == f["wr_burst"]:
                raise IOError("injected write error")
            return await self._wr(address, data)

        self.ram.read_if._read = read
        self.ram.write_if._write = write
        self.ram.write_if.aw_channel.recv = aw_recv

    async def load(self, images):
        for addr, data in images:
            self.ram.write(addr, bytes(data))

    async def read(self, addr, n):
        return self.ram.read(addr, n)

    async def fill(self, byte, lo=0, hi=None):
        hi = self.size if hi is None else hi
        self.ram.write(lo, bytes([byte]) * (hi - lo))

    async def check_fill(self, byte, lo, hi):
        got = np.frombuffer(self.ram.read(lo, hi - lo), np.uint8)
        bad = got != byte
        return lo + int(np.argmax(bad)) if bad.any() else None

    def counters(self):
        return dict(self._n)

    def fail_reads(self, addr=None, beat=None):
        self._fault["rd_addr"] = addr
        self._fault["rd_beat"] = None if beat is None else self._n["rd_beats"] + beat

    def fail_writes(self, addr=None, burst=None):
        self._fault["wr_addr"] = addr
        self._fault["wr_burst"] = None if burst is None else self._n["wr_bursts"] + burst

    def clear_faults(self):
        self._fault = {}

    def protocol_error(self):
        return None          # AxiRam asserts in its own tasks (the test fails there)

    async def clear_protocol_error(self):
        pass
