"""Fast model of the accelerator: bit-exact execution plus an analytical cycle count.

The model backend of the driver. It executes the same instruction stream the hardware
runs, on numpy copies of DRAM and the scratchpads, with the same integer arithmetic
(int32 wrap-around accumulators, the contract's requantization), so its DRAM result is
bit-identical to the RTL's. Timing comes from an event model of the three decoupled
engines and their dependency tokens (:func:`estimate_cycles`), whose constants are the
hardware's pipeline latencies; tests compare it against RTL-measured cycles per layer.
"""

from dataclasses import dataclass

import numpy as np

from ..errors import FabricError
from ..hw.config import AcceleratorConfig
from ..hw.isa import Load, Store, Compute, TARGET_ACT, TARGET_WGT, TARGET_AUX, INSN_BYTES, decode
from ..hw.systolic import latency as array_latency, min_tile_rows
from ..hw.postproc import LATENCY as RQ_LATENCY
from .quantize import requantize

__all__ = ["FastModel", "estimate_cycles", "CycleReport"]


def _wrap32(x):
    return ((x + (1 << 31)) % (1 << 32)) - (1 << 31)


class FastModel:
    """Executes programs on a model of the fabric (DRAM is a bytearray)."""

    def __init__(self, cfg: AcceleratorConfig, dram_bytes=1 << 24):
        self.cfg = cfg
        self.dram = bytearray(dram_bytes)
        self.sp = {
            TARGET_ACT: bytearray(cfg.act_kib * 1024),
            TARGET_WGT: bytearray(cfg.wgt_kib * 1024),
            TARGET_AUX: bytearray(cfg.aux_kib * 1024),
            "out": bytearray(cfg.out_kib * 1024),
        }
        self.acc = np.zeros((cfg.sp_depth("acc_kib"), cfg.cols), np.int64)
        self.counters = dict(macs=0, dma_rd_bytes=0, dma_wr_bytes=0, insns=0, array_beats=0)

    # -- memory helpers -------------------------------------------------------------
    def write(self, addr, data):
        if addr + len(data) > len(self.dram):
            raise FabricError(f"DRAM write at {addr:#x}+{len(data)} is beyond the model's "
                              f"{len(self.dram)} bytes")
        self.dram[addr:addr + len(data)] = data

    def read(self, addr, n):
        return bytes(self.dram[addr:addr + n])

    def _sp_check(self, buf, off, n, what):
        if off < 0 or off + n > len(buf):
            raise FabricError(f"{what}: scratchpad address out of range (error 4)")

    # -- execution --------------------------------------------------------------------
    def run_program(self, base, count):
        raw = self.read(base, count * INSN_BYTES)
        for i in range(count):
            word = int.from_bytes(raw[i * INSN_BYTES:(i + 1) * INSN_BYTES], "little")
            try:
                insn = decode(word)
            except ValueError:
                raise FabricError(f"illegal instruction at {base + i * INSN_BYTES:#x} (error 3)") from None
            self.execute(insn)

    def execute(self, insn):
        self.counters["insns"] += 1
        bus = self.cfg.bus_bytes
        if isinstance(insn, (Load, Store)):
            load = isinstance(insn, Load)
            sp = self.sp[insn.target] if load else self.sp["out"]
            off = insn.sp_addr * bus
            n = insn.len0 * bus
            for i2 in range(insn.n2):
                for i1 in range(insn.n1):
                    a = insn.addr + i2 * insn.stride2 + i1 * insn.stride1
                    self._sp_check(sp, off, n, "LOAD" if load else "STORE")
                    if load:
                        sp[off:off + n] = self.dram[a:a + n]
                    else:
                        self.dram[a:a + n] = sp[off:off + n]
                    off += n
            self.counters["dma_rd_bytes" if load else "dma_wr_bytes"] += insn.beats * bus
        elif isinstance(insn, Compute):
            self._compute(insn)
        else:
            raise FabricError(f"illegal instruction {insn!r} (error 3)")

    def _compute(self, c: Compute):
        cfg = self.cfg
        R, C = cfg.rows, cfg.cols
        act = np.frombuffer(self.sp[TARGET_ACT], np.int8).reshape(-1, R)
        wgt = np.frombuffer(self.sp[TARGET_WGT], np.int8).reshape(-1, C)
        aux = np.frombuffer(self.sp[TARGET_AUX], dtype=[("bias", "<i4"), ("m", "<u2"), ("n", "u1"),
                                                         ("rsv", "u1")]).reshape(-1, C)
        out = np.frombuffer(self.sp["out"], np.int8).reshape(-1, C).copy()
        P = c.oh_n * c.ow_n
        oh, ow = np.meshgrid(np.arange(c.oh_n), np.arange(c.ow_n), indexing="ij")
        oh, ow = oh.ravel(), ow.ravel()
        if c.acc_base + P > self.acc.shape[0]:
            raise FabricError("COMPUTE: accumulator address out of range (error 4)")
        acc = self.acc[c.acc_base:c.acc_base + P].copy()
        row_stride = c.win * c.cbp
        kt = 0
        for kh in range(c.kh_n):
            for kw in range(c.kw_n):
                for cb in range(c.cb_n):
                    ih = oh * c.sh + kh * c.dh - c.pt
                    iw = ow * c.sw + kw * c.dw - c.pl
                    inside = (ih >= 0) & (ih < c.hin) & (iw >= 0) & (iw < c.win)
                    addr = c.a_base + ih * row_stride + iw * c.cbp + cb
                    if np.any(inside & ((addr < 0) | (addr >= act.shape[0]))):
                        raise FabricError("COMPUTE: activation address out of range (error 4)")
                    a = np.full((P, R), c.zx, np.int64)
                    a[inside] = act[addr[inside]]
                    wrow = c.w_base + kt * R
                    if wrow + R > wgt.shape[0]:
                        raise FabricError("COMPUTE: weight address out of range (error 4)")
                    psum = a @ wgt[wrow:wrow + R].astype(np.int64)
                    if kt == 0 and c.acc_init:
                        if c.aux_addr >= aux.shape[0]:
                            raise FabricError("COMPUTE: aux address out of range (error 4)")
                        acc = aux[c.aux_addr]["bias"].astype(np.int64)[None, :] + psum
                    else:
                        acc = acc + psum
                    acc = _wrap32(acc)
                    kt += 1
        self.counters["array_beats"] += kt * P
        self.counters["macs"] += kt * P * R * C
        if c.finalize:
            lane = aux[c.aux_addr]
            y = requantize(acc, lane["m"], lane["n"], c.zy, c.lo, c.hi)
            idx = c.out_base + np.arange(P) * c.out_stride
            if idx.max() >= out.shape[0]:
                raise FabricError("COMPUTE: output address out of range (error 4)")
            out[idx] = y
            self.sp["out"][:] = out.tobytes()
        else:
            self.acc[c.acc_base:c.acc_base + P] = acc

    # -- convenience ------------------------------------------------------------------
    def run_layer(self, prog, x):
        """Run a :class:`~dnnfab.sw.program.LayerProgram` on input ``x`` (int8 NHWC)."""
        if prog.dram_size > len(self.dram):
            self.dram.extend(bytes(prog.dram_size - len(self.dram)))
        for addr, blob in prog.dram_images(x):
            self.write(addr, blob)
        self.run_program(prog.regions["program"][0], len(prog.insns))
        addr, size = prog.regions["output"]
        return prog.unpack_output(self.read(addr, size))


@dataclass
class CycleReport:
    cycles: int
    array_beats: int
    compute_cycles: int        # cycles the array stream is busy (incl. weight-preload stalls)
    load_cycles: int
    store_cycles: int

    def utilization(self, cfg, macs):
        return macs / (self.cycles * cfg.rows * cfg.cols)


# Pipeline constants of the RTL (cycles); calibrated against RTL measurements in the
# tests (tests/cosim/test_accel_layers.py asserts the estimate within a tolerance).
START_LATENCY = 8          # CTRL write -> first fetch request (registered CSR write, start, fetch decision + rd_cmd)
FETCH_LATENCY = 14         # read command -> instructions in the queue (incl. the DMA's registered initial state)
DMA_READ_LATENCY = 7       # AR -> first beat in a scratchpad (AXI RAM model)
DMA_WRITE_LATENCY = 10     # last W beat -> B response (incl. the scratchpad read)
DECODE_LATENCY = 11        # COMPUTE dequeued -> job in the feeders (incl. the cinsn and job-head registers)
FEED_LATENCY = 9           # feeder read -> array input (incl. the FIFO head register)
BACKEND_LATENCY = 6 + RQ_LATENCY   # (incl. the back end's input register)


def estimate_cycles(prog) -> CycleReport:
    """Analytical cycle count of a program: an event model of the three engines.

    Loads run back to back on the read channel (one beat per cycle), stores on the write
    channel, computes stream their K tiles through the array at one pixel per cycle (or
    the weight-preload rate for tiles shorter than ``2R + C + 1``); tokens delay each
    engine until its producer finished.
    """
    cfg = prog.cfg
    R, C = cfg.rows, cfg.cols
    bus = cfg.bus_bytes
    lat = array_latency(R, C)
    mtr = min_tile_rows(R, C)
    t_load = START_LATENCY + FETCH_LATENCY
    t_comp_free = 0          # the array can accept the next instruction's first beat
    t_store = 0
    done = []                # completion time of each instruction (program order)
    read_done = {}           # compute idx -> inputs released
    l2c = []; c2l = []; c2s = []; s2c = []       # token push times, in order
    pops = {"l2c": 0, "c2l": 0, "c2s": 0, "s2c": 0}
    load_cycles = store_cycles = compute_cycles = 0
    beats_total = 0
    first_compute = True
    for ins in prog.insns:
        if isinstance(ins, Load):
            start = t_load
            if ins.pop_next:
                start = max(start, c2l[pops["c2l"]]); pops["c2l"] += 1
            beats = ins.beats
            end = start + DMA_READ_LATENCY + beats
            t_load = start + beats          # the next request pipelines behind this one
            load_cycles += beats
            if ins.push_next:
                l2c.append(end)
            done.append(end)
        elif isinstance(ins, Compute):
            start = t_comp_free
            if ins.pop_prev:
                start = max(start, l2c[pops["l2c"]] + DECODE_LATENCY); pops["l2c"] += 1
            if ins.pop_next:
                start = max(start, s2c[pops["s2c"]] + DECODE_LATENCY); pops["s2c"] += 1
            P, KT = ins.pixels, ins.k_tiles
            if first_compute:
                start += R + FEED_LATENCY       # the first weight tile preloads unhidden
                first_compute = False
            stream = KT * max(P, mtr) - (max(P, mtr) - P)
            end_stream = start + stream
            compute_cycles += stream
            beats_total += KT * P
            t_comp_free = end_stream
            if ins.push_prev:
                c2l.append(end_stream)
            end = end_stream + lat + BACKEND_LATENCY
            if ins.push_next:
                c2s.append(end)
            done.append(end)
        else:
            start = t_store
            if ins.pop_prev:
                start = max(start, c2s[pops["c2s"]]); pops["c2s"] += 1
            beats = ins.beats
            end = start + 2 + beats + DMA_WRITE_LATENCY
            t_store = start + beats
            store_cycles += beats
            if ins.push_prev:
                s2c.append(end)
            done.append(end)
    total = max(done) + 2 if done else 0
    return CycleReport(cycles=total, array_beats=beats_total, compute_cycles=compute_cycles,
                       load_cycles=load_cycles, store_cycles=store_cycles)
