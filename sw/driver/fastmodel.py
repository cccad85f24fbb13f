"""Fast model of the accelerator: the driver's model backend.

It executes the same instruction stream the hardware runs, on numpy copies of DRAM and the
scratchpads, with the same integer arithmetic (int32 wrap-around accumulators, the
contract's requantization), so its DRAM result is bit-identical to the RTL's. Before
anything runs, the program is played through the compiler's token machine
(:func:`dnnfab.sw.compiler.fastmodel.check_tokens`); the cycle count of the same program is
:func:`dnnfab.sw.compiler.fastmodel.estimate_cycles`.
"""

import numpy as np

from ...errors import FabricError
from ...hw.config import AcceleratorConfig
from ...hw.spec import Load, Store, Compute, TARGET_ACT, TARGET_WGT, TARGET_AUX, INSN_BYTES, AUX_DTYPE, decode
from ..ir.qgraph import requantize
from ..compiler.fastmodel import check_tokens, _wrap32

__all__ = ["FastModel"]


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
        """Run ``count`` instructions from DRAM address ``base``, as the controller would.

        The program is first played through the token machine (:func:`check_tokens`): a
        program that would hang the hardware raises :class:`~dnnfab.errors.FabricDeadlock`
        and changes nothing. Then the instructions execute in the machine's take order
        (each engine in program order, interleaved as the tokens allow). An illegal
        instruction stops dispatch (error 3) once every instruction before it has been
        dispatched; what was taken by then has executed.
        """
        raw = self.read(base, count * INSN_BYTES)
        insns = []
        bad = None
        for i in range(count):
            word = int.from_bytes(raw[i * INSN_BYTES:(i + 1) * INSN_BYTES], "little")
            try:
                insns.append(decode(word))
            except ValueError:
                bad = i
                break
        rep = check_tokens(insns, halt_at_end=bad is not None)
        for i in rep.order:
            self.execute(insns[i])
        if bad is not None:
            raise FabricError(f"illegal instruction at {base + bad * INSN_BYTES:#x} (error 3)")

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
        aux = np.frombuffer(self.sp[TARGET_AUX], dtype=AUX_DTYPE).reshape(-1, C)
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
        """Run a :class:`~dnnfab.sw.compiler.program.LayerProgram` on input ``x`` (int8 NHWC)."""
        if prog.dram_size > len(self.dram):
            self.dram.extend(bytes(prog.dram_size - len(self.dram)))
        for addr, blob in prog.dram_images(x):
            self.write(addr, blob)
        self.run_program(prog.regions["program"][0], len(prog.insns))
        addr, size = prog.regions["output"]
        return prog.unpack_output(self.read(addr, size))
