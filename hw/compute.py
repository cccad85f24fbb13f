"""Compute engine: COMPUTE instructions -> array -> accumulator -> requantizer -> output.

One COMPUTE instruction is a convolution tile (GEMM is the 1x1 case): ``C`` output channels
over ``oh_n x ow_n`` output pixels, reduced over ``kh_n x kw_n x cb_n`` K tiles of ``R``
input channels. Blocks, each running on its own, connected by small job FIFOs:

``decode``
    Latches the instruction, reads the aux scratchpad row (bias', m, n of C channels),
    computes address steps, then hands one job to each of the three blocks below.
``weight feeder``
    Streams ``KT x R`` weight rows from the weight scratchpad into the array's shadow
    registers (they preload while the previous K tile streams).
``activation feeder`` (implicit im2col)
    For every K tile (kh, kw, cb) and output pixel (oh, ow) it reads the R-channel block
    of input pixel ``(oh*sh + kh*dh - pt, ow*sw + kw*dw - pl)``, or the input zero point
    ``zx`` where that lies in the padding, and marks the first pixel of each K tile.
``back end``
    Accumulates each K tile's partial sums in the accumulator memory (the first K tile
    starts from the bias, read-modify-write with a transparent read so back-to-back
    updates of one row are exact), and on the last K tile requantizes (postproc.py) and
    writes C int8 values per pixel to the output scratchpad at
    ``out_base + pixel * out_stride``.

Because the array switches weights in flight, K tiles and even consecutive instructions
stream with no bubble once a tile has at least ``2R + C + 1`` pixels.

Timing model (asserted against RTL in tests): see :func:`dnnfab.sw.compiler.fastmodel.estimate_cycles`.
"""

from amaranth.hdl import Signal, Module, Const, Value, signed, unsigned, Cat, Mux
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory

from .config import AcceleratorConfig
from .isa import compute_insn_layout
from .spec import AUX_FIELDS, AUX_LANE_BITS, KTILE_BITS, RQ_LATENCY, min_tile_rows
from .systolic import SystolicArray
from .postproc import Requantizer
from .pe import registered_mul, MUL_LATENCY, dreg
from .scratchpad import RegisteredRAM, RAM_READ_LATENCY, SP_READ_LATENCY, dup_reg
from .dma import RegFIFO, thermometer

__all__ = ["ComputeEngine", "aux_layout", "AUX_LANE_BITS"]



def _credit(m, name, inc, dec, limit, split=False):
    """A count of ``0..limit`` (reads issued and not yet taken out of a FIFO of ``limit``
    entries) kept as a thermometer code (bit ``i``: count > ``i``), stepped by ``inc`` and
    ``dec``. Returns ``count + inc - dec < limit`` as a function of this cycle's ``inc``
    and ``dec`` (late signals: the issue decision, the array taking a row) and two bits
    of the register: no adder and no compare sits on the path (``cnt + inc`` put a carry
    chain into the feeder's issue loop, 7.6 ns; compares of a binary count, 7.1 ns).
    With ``split``, returns the two values for ``inc`` = 1 and ``inc`` = 0 instead.
    Proved equal to the plain compare: tests/hw/test_retimed.py::test_feeder_credit_exhaustive."""
    t = thermometer(m, name, limit, inc, dec)
    lt = ~t[limit - 1]                                   # count < limit
    lt_m1 = ~t[limit - 2]                                # count < limit - 1
    if split:
        return Mux(dec, lt, lt_m1), Mux(dec, 1, lt)
    return Mux(inc, Mux(dec, lt, lt_m1), Mux(dec, 1, lt))


def aux_layout(cfg):
    lane = data.StructLayout({name: (signed if sgn else unsigned)(width) for name, width, sgn in AUX_FIELDS})
    return data.ArrayLayout(lane, cfg.cols)


class _Fifo:
    """A job queue carrying a data.Layout, with views on both ends.

    A :class:`~dnnfab.hw.dma.RegFIFO` with a late write: its flags are registers and the
    write enable of its (wide, distributed) RAM is a register too, so the decoder's push
    does not have to reach hundreds of RAM slices in the cycle it is decided (that was the
    compute engine's worst path: 7.05 ns, 5.7 ns of it routing). ``w_data`` holds for the
    cycle after a push: it comes from decode registers that change at the next accept.
    """

    def __init__(self, m, name, layout, depth):
        self.fifo = RegFIFO(data.Layout.cast(layout).size, depth, late_write=True)
        m.submodules[name] = self.fifo
        self.layout = layout
        self.w = data.View(layout, self.fifo.w_data)
        self.r = data.View(layout, self.fifo.r_data)

    def head(self, m, consume, name):
        """The queue's head in a register of its own, ``(reg, valid)``: filled as soon as
        the queue has an entry and refilled as ``consume`` (a signal the caller drives)
        takes it, so whatever loads from it starts at flip-flops, not at the queue's
        asynchronous distributed-RAM read. Proved equal to the plain queue head (three
        cycles after a push): tests/hw/test_retimed.py::test_fifo_head_exhaustive.
        (:meth:`head_lazy` keeps the consume off the queue's read and the enables.)"""
        reg = dreg(self.layout, name=name)
        valid = Signal(name=f"{name}_valid")
        take = Signal(name=f"{name}_take")
        m.d.comb += [take.eq(self.fifo.r_rdy & (~valid | consume)), self.fifo.r_en.eq(take)]
        with m.If(take):
            m.d.sync += reg.eq(self.r)
        with m.If(take):
            m.d.sync += valid.eq(1)
        with m.Elif(consume):
            m.d.sync += valid.eq(0)
        return reg, valid

    def head_lazy(self, m, consume, name):
        """The queue's head behind two registers, popped a cycle late: ``(head, valid,
        busy)``, where ``head`` / ``valid`` are a 2:1 select of the registers ``reg`` /
        ``reg2`` and ``busy`` is high while either holds an entry (for idle flags).
        ``consume`` is only registered (``popped``): a cycle after a consume, ``reg`` still
        holds the consumed entry and the head is ``reg2`` (the next one, taken from the
        queue in the consume's cycle); that cycle moves ``reg2`` into ``reg`` and refills
        ``reg2``. So the queue's read, both registers' enables and their flags are
        functions of flip-flops (``popped``, the flags, the queue's ``r_rdy``), and the
        consume's own logic (the back end's job end, far from the queue) ends at one
        flip-flop. Same timing as :meth:`head`: ``valid`` = an entry pushed
        >= 3 cycles ago is unconsumed, ``head`` = the oldest (a consume every cycle
        included). Proved: tests/hw/test_retimed.py::test_fifo_head_lazy_exhaustive."""
        reg = dreg(self.layout, name=name)
        valid = Signal(name=f"{name}_valid")
        reg2 = dreg(self.layout, name=f"{name}2")
        valid2 = Signal(name=f"{name}2_valid")
        popped = Signal(name=f"{name}_popped")
        sel2 = Signal(name=f"{name}_sel2")
        refill = Signal(name=f"{name}_refill")
        take = Signal(name=f"{name}_take")
        head = Signal(self.layout, name=f"{name}_head")
        head_valid = Signal(name=f"{name}_head_valid")
        busy = Signal(name=f"{name}_busy")
        # ``both`` = valid & valid2, a register of its own, so the queue's read (``take``,
        # which also enables the queue's pointer and occupancy) is one gate of three
        # flip-flops: through ``sel2`` and ``refill`` it was four LUTs and 5.8 ns of routing
        # from ``valid`` into the occupancy's enables (7.25 ns at 150 MHz)
        both = Signal(name=f"{name}_both")
        m.d.comb += [
            sel2.eq(popped | ~valid),           # the head is reg2
            refill.eq(sel2 | ~valid2),          # reg2 moves up or is empty
            take.eq(self.fifo.r_rdy & (popped | ~both)), self.fifo.r_en.eq(take),
            head.eq(Mux(sel2, reg2, reg)), head_valid.eq(Mux(sel2, valid2, valid)),
            busy.eq(valid2 | (valid & ~popped)),
        ]
        m.d.sync += [popped.eq(consume),
                     both.eq(Mux(sel2, valid2, valid) & Mux(refill, self.fifo.r_rdy, valid2))]
        with m.If(sel2):
            m.d.sync += [reg.eq(reg2), valid.eq(valid2)]
        with m.If(refill):
            m.d.sync += [reg2.eq(self.r), valid2.eq(self.fifo.r_rdy)]
        return data.View(self.layout, head), head_valid, busy


class ComputeEngine(wiring.Component):
    """Executes COMPUTE instructions on the systolic array.

    Members
    -------
    insn : ``In(stream.Signature(compute_insn_layout()))``
        Instructions whose dependency tokens have already been taken.
    act_rd_en, act_rd_addr : ``Out`` / act_rd_data : ``In(R*input_bits)``
        Activation scratchpad read port (element units, data ``SP_READ_LATENCY`` = 5
        cycles after the enable; so are the other two read ports).
    wgt_rd_en, wgt_rd_addr : ``Out`` / wgt_rd_data : ``In(C*weight_bits)``
        Weight scratchpad read port.
    aux_rd_en, aux_rd_addr : ``Out`` / aux_rd_data : ``In(C*64)``
        Aux scratchpad read port (bias, m, n per channel).
    out_wr_en, out_wr_addr, out_wr_data : ``Out``
        Output scratchpad write port (C int8 per element).
    done_read : ``Out(1)``
        Pulse: both feeders finished an instruction flagged ``push_prev`` (its inputs may
        be overwritten: give COMPUTE -> LOAD a token).
    done_write : ``Out(1)``
        Pulse: the outputs of an instruction flagged ``push_next`` are in the output
        scratchpad (give COMPUTE -> STORE a token).
    act_beat : ``Out(1)``
        An activation row entered the array (R*C MACs).
    idle : ``Out(1)``
        Nothing queued or in flight (a register: one cycle late, and low while an
        instruction is offered on ``insn``).
    """

    def __init__(self, config: AcceleratorConfig):
        self.config = config
        cfg = config
        self.acc_depth = cfg.sp_depth("acc_kib")
        super().__init__({
            "insn": In(stream.Signature(compute_insn_layout())),
            "act_rd_en": Out(1), "act_rd_addr": Out(16), "act_rd_data": In(cfg.rows * cfg.input_bits),
            "wgt_rd_en": Out(1), "wgt_rd_addr": Out(16), "wgt_rd_data": In(cfg.cols * cfg.weight_bits),
            "aux_rd_en": Out(1), "aux_rd_addr": Out(16), "aux_rd_data": In(cfg.cols * AUX_LANE_BITS),
            "out_wr_en": Out(1), "out_wr_addr": Out(16), "out_wr_data": Out(cfg.cols * cfg.input_bits),
            "done_read": Out(1),
            "done_write": Out(1),
            "act_beat": Out(1),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        R, C = cfg.rows, cfg.cols
        m = Module()
        m.submodules.array = array = SystolicArray(cfg)

        A = 20  # signed address arithmetic width (addresses are 16 bits)
        # Jobs carry loop bounds as "count - 2": a down-counter loaded with it reaches -1
        # (its sign bit, a plain flip-flop) on the last iteration.
        act_job_layout = data.StructLayout({
            "kh_m2": signed(5), "kw_m2": signed(5), "cb_m2": signed(11), "oh_m2": signed(13),
            "ow_m2": signed(13),
            "sh": 3, "sw": 3, "dh": 3, "dw": 3,
            "npt": signed(14), "npl": signed(14), "ih1": signed(14),
            "npt_r": signed(14), "npl_r": signed(14), "ih1_r": signed(14), "row1": signed(A), "one_px": 1, "px_le2": 1,
            "zx": 8, "addr0": signed(A), "step_ow": A, "step_oh": A, "step_kw": A, "step_kh": A,
        })
        wgt_job_layout = data.StructLayout({"w_base": 16, "rows_m2": signed(25)})
        back_job_layout = data.StructLayout({
            "acc_base": 16, "out_base": 16, "out_stride": 8, "pix_m2": signed(25), "kt_m2": signed(15),
            "acc_init": 1, "finalize": 1,
        })
        # what the back end needs only from stage X on travels in a queue of its own, popped a
        # cycle after a job's last beat (see the back end)
        pay_layout = data.StructLayout({"push": 1, "zy": 8, "lo": 8, "hi": 8, "aux": aux_layout(cfg)})
        act_q = _Fifo(m, "act_q", act_job_layout, 3)
        wgt_q = _Fifo(m, "wgt_q", wgt_job_layout, 3)
        back_q = _Fifo(m, "back_q", back_job_layout, 3)
        pay_q = _Fifo(m, "pay_q", pay_layout, 3)
        flag_q = SyncFIFO(width=1, depth=4)
        m.submodules.flag_q = flag_q

        # ------------------------------------------------------------------ decode
        # One state per step; every multiply is a registered_mul (operands and product
        # registered, MUL_LATENCY cycles), the products of step 1 feed those of step 2.
        #   0 accept, aux read   1 step-1 operands   2, 3 step-1 products, step-2
        #   operands   4   5 aux data (SP_READ_LATENCY cycles after the read), step-2
        #   products: last adds   6 push
        assert MUL_LATENCY == 2
        insn = Signal(compute_insn_layout())
        # one-hot (bit k: in state k), so each state's enables are a flip-flop, not a
        # compare of an encoded state (``dstate == 5`` enabling ~60 flip-flops was a
        # 7.4 ns path)
        dstate = Signal(7, init=1)
        # room in every queue, registered: only this decoder pushes, at most once every
        # 7 cycles, so room seen a cycle ago is still there
        room = Signal()
        m.d.sync += room.eq(act_q.fifo.w_rdy & wgt_q.fifo.w_rdy & back_q.fifo.w_rdy & pay_q.fifo.w_rdy
                            & flag_q.w_rdy)
        m.d.comb += self.insn.ready.eq(dstate[0])
        with m.If(dstate[0]):
            # (the instruction register loads every idle cycle, offered or not: its ~200
            # clock enables then come from the state register here, not from the
            # controller's ``valid`` across the die; only the state waits for it)
            m.d.sync += insn.eq(self.insn.payload)
            with m.If(self.insn.valid):
                m.d.sync += dstate.eq(0b10)
        with m.Elif(dstate[6]):
            with m.If(room):
                m.d.sync += dstate.eq(1)
        with m.Else():
            m.d.sync += dstate.eq(dstate << 1)
        # (the aux read is issued with the accept, from the offered instruction)
        m.d.comb += [self.aux_rd_en.eq(dstate[0] & self.insn.valid),
                     self.aux_rd_addr.eq(self.insn.payload.aux_addr)]
        aux_q = dreg(aux_layout(cfg))
        assert SP_READ_LATENCY < 6
        with m.If(dstate[SP_READ_LATENCY]):
            m.d.sync += aux_q.eq(self.aux_rd_data)
        # addresses only matter modulo 2^16 (act_rd_addr is 16 bits), so 16-bit factors do
        mul = lambda a, b, name: registered_mul(m, platform, a, b, name)
        row_stride_p = mul(insn.win, insn.cbp, "dec_rs")
        row_stride = row_stride_p[:16]
        pixels = mul(insn.oh_n, insn.ow_n, "dec_px")[:24]
        khkw = mul(insn.kh_n, insn.kw_n, "dec_khkw")[:8]
        step_ow = mul(insn.sw, insn.cbp, "dec_sow")[:A]
        step_kw = mul(insn.dw, insn.cbp, "dec_skw")[:A]
        plcbp = mul(insn.pl, insn.cbp, "dec_pl")[:A]
        ktiles = mul(khkw, insn.cb_n, "dec_kt")[:KTILE_BITS]
        ptrs = mul(insn.pt, row_stride, "dec_pt")[:A]
        step_oh = mul(insn.sh, row_stride, "dec_soh")[:A]
        step_kh = mul(insn.dh, row_stride, "dec_skh")[:A]
        a_tmp = Signal(signed(A)); addr0 = Signal(signed(A))
        pix_m2 = Signal(signed(25)); kt_m2 = Signal(signed(15)); rows_m2 = Signal(signed(25))
        with m.If(dstate[3]):
            m.d.sync += [a_tmp.eq(insn.a_base - plcbp), pix_m2.eq(pixels - 2)]
        with m.If(dstate[5]):
            m.d.sync += [addr0.eq(a_tmp - ptrs), kt_m2.eq(ktiles - 2), rows_m2.eq(ktiles * R - 2)]
        push = Signal()
        m.d.comb += push.eq(dstate[6] & room)
        m.d.comb += [
            act_q.fifo.w_en.eq(push), wgt_q.fifo.w_en.eq(push), back_q.fifo.w_en.eq(push),
            pay_q.fifo.w_en.eq(push),
            flag_q.w_en.eq(push), flag_q.w_data.eq(insn.push_prev),
        ]
        # The feeder's job is computed into registers (every cycle: its inputs are stable
        # from state 6 on), which the queue's late write stores the cycle after the push:
        # the adds between the decode registers and the queue's distributed RAM were on
        # paths of 7.9 ns in the whole design.
        # Those registers read a copy of the instruction's fields of their own (``aj_i``,
        # one cycle behind ``insn``, which is stable from state 1 on): ``insn.pt`` sits by
        # the DSP it feeds, and its route across the die to the job's subtract chains was
        # the whole design's worst path (7.7 ns, 5.1 of it routing, seed 1 at 150 MHz).
        aj_i = dreg(compute_insn_layout(), name="aj_i")
        m.d.sync += aj_i.eq(insn)
        aj_w = dreg(act_job_layout, name="aj_w")
        m.d.comb += act_q.w.eq(aj_w)
        for f in ("sh", "sw", "dh", "dw", "zx"):
            m.d.sync += getattr(aj_w, f).eq(getattr(aj_i, f))
        m.d.sync += [
            aj_w.kh_m2.eq(aj_i.kh_n - 2), aj_w.kw_m2.eq(aj_i.kw_n - 2),
            aj_w.cb_m2.eq(aj_i.cb_n - 2), aj_w.oh_m2.eq(aj_i.oh_n - 2),
            aj_w.ow_m2.eq(aj_i.ow_n - 2),
            aj_w.npt.eq(-aj_i.pt), aj_w.npl.eq(-aj_i.pl),
            # the second output row's input row and address (so the feeder's start loads
            # registers without adding), and whether K tiles are one pixel each
            aj_w.ih1.eq(aj_i.sh - aj_i.pt), aj_w.row1.eq(addr0 + step_oh),
            # the same coordinates minus the image height / width (the feeder's edge twins)
            aj_w.npt_r.eq(-aj_i.pt - aj_i.hin), aj_w.npl_r.eq(-aj_i.pl - aj_i.win),
            aj_w.ih1_r.eq(aj_i.sh - aj_i.pt - aj_i.hin),
            aj_w.one_px.eq((aj_i.oh_n == 1) & (aj_i.ow_n == 1)),
            aj_w.px_le2.eq(((aj_i.oh_n == 1) & (aj_i.ow_n <= 2)) | ((aj_i.ow_n == 1) & (aj_i.oh_n <= 2))),
            aj_w.addr0.eq(addr0),
            aj_w.step_ow.eq(step_ow),
            aj_w.step_oh.eq(step_oh),
            aj_w.step_kw.eq(step_kw),
            aj_w.step_kh.eq(step_kh),
        ]
        m.d.comb += [
            wgt_q.w.w_base.eq(insn.w_base),
            wgt_q.w.rows_m2.eq(rows_m2),
            back_q.w.acc_base.eq(insn.acc_base),
            back_q.w.out_base.eq(insn.out_base),
            back_q.w.out_stride.eq(insn.out_stride),
            back_q.w.pix_m2.eq(pix_m2),
            back_q.w.kt_m2.eq(kt_m2),
            back_q.w.acc_init.eq(insn.acc_init),
            back_q.w.finalize.eq(insn.finalize),
            pay_q.w.push.eq(insn.push_next),
            pay_q.w.zy.eq(insn.zy), pay_q.w.lo.eq(insn.lo), pay_q.w.hi.eq(insn.hi),
            pay_q.w.aux.eq(aux_q),
        ]

        # ---------------------------------------------------------- weight feeder
        # The current job sits in local registers (loaded from the queue as the previous
        # one issues its last row, so jobs follow each other without a bubble). Scratchpad
        # data (SP_READ_LATENCY cycles) is registered once more before the FIFO; issue is credit-based (w_cnt counts rows
        # issued and not yet taken out of the FIFO).
        WD = 11
        wfifo = SyncFIFO(width=C * cfg.weight_bits, depth=WD)
        m.submodules.wfifo = wfifo
        wj = wgt_q.r
        w_valid = Signal(); w_addr = Signal(16); w_left = Signal(signed(25))
        w_cred = Signal()
        w_issue = Signal(); w_job_done = Signal(); w_load = Signal()
        w_rd = [Signal(name=f"w_rd{i}") for i in range(SP_READ_LATENCY + 1)]   # read in flight
        w_data2 = dreg(C * cfg.weight_bits)
        m.d.comb += [
            w_issue.eq(w_valid & w_cred),
            w_job_done.eq(w_issue & w_left[-1]),
            w_load.eq(wgt_q.fifo.r_rdy & (~w_valid | w_job_done)),
            wgt_q.fifo.r_en.eq(w_load),
            self.wgt_rd_en.eq(w_issue), self.wgt_rd_addr.eq(w_addr),
        ]
        with m.If(w_load):
            m.d.sync += w_valid.eq(1)
        with m.Elif(w_job_done):
            m.d.sync += w_valid.eq(0)
        # The counters' enable and load select are functions of flip-flops only (not of
        # ``w_load``, which needs the queue flag and the issue decision: that enable,
        # fanned out to 41 flip-flops, was a 7.4 ns path). While idle they load the queue's
        # head every cycle (harmless until it is valid: ``w_valid`` says when), and a
        # job's last issue loads it too (the next job's start values, or don't-care).
        with m.If(~w_valid | w_cred):
            with m.If(~w_valid | w_left[-1]):
                m.d.sync += [w_addr.eq(wj.w_base), w_left.eq(wj.rows_m2)]
            with m.Else():
                m.d.sync += [w_addr.eq(w_addr + 1), w_left.eq(w_left - 1)]
        w_pop = Signal()
        m.d.comb += w_pop.eq(wfifo.r_rdy & wfifo.r_en)
        m.d.sync += w_cred.eq(_credit(m, "w_cnt", w_issue, w_pop, WD))
        m.d.sync += [w_rd[0].eq(w_issue), w_data2.eq(self.wgt_rd_data)]
        m.d.sync += [w_rd[i + 1].eq(w_rd[i]) for i in range(SP_READ_LATENCY)]
        m.d.comb += [wfifo.w_en.eq(w_rd[-1]), wfifo.w_data.eq(w_data2)]
        m.d.comb += [array.wgt.valid.eq(wfifo.r_rdy), array.wgt.payload.eq(wfifo.r_data),
                     wfifo.r_en.eq(array.wgt.ready)]

        # ------------------------------------------------------ activation feeder
        # A job is copied out of the queue as it starts (one cycle, as before); the loop
        # nest runs on down-counters whose sign bits are the "last" flags. Every address
        # the next pixel can jump to is a register computed ahead: the next row's
        # (``row_nx``, stepped by itself on consecutive rows) and the next K tile's
        # (``tile_nx``, recomputed every cycle from the current tile's registers), so a
        # new address is at most one add and a mux on registered selects. A K-tile jump
        # within two cycles of another (tiles of one or two pixels, where the array is
        # limited by the weight preload, ``min_tile_rows`` cycles per tile, anyway) waits
        # for ``tile_nx`` (see ``jump_q``).
        AD = 13
        afifo = SyncFIFO(width=R * cfg.input_bits + 1, depth=AD)
        m.submodules.afifo = afifo
        J = Signal(act_job_layout)
        c_kh = Signal(signed(5)); c_kw = Signal(signed(5)); c_cb = Signal(signed(11))
        c_oh = Signal(signed(13)); c_ow = Signal(signed(13))
        a_kh = Signal(signed(A)); a_kw = Signal(signed(A)); a_cb = Signal(signed(A))
        a_px = Signal(signed(A))
        row_nx = Signal(signed(A)); tile_nx = Signal(signed(A))
        ih_k = Signal(signed(14)); iw_k = Signal(signed(14))
        ih = Signal(signed(14)); iw = Signal(signed(14))
        ih_nx = Signal(signed(14)); ihk_nx = Signal(signed(14)); iwk_nx = Signal(signed(14))
        tile_first = Signal()
        started = Signal()
        # tile_nx is stale for two cycles after a K-tile jump and one after a job start:
        # with tiles of one or two pixels (job constants) the next jump would come sooner
        # and waits (the next cycle is such a wait: see ``go_i`` / ``go_n``)
        # per read in flight: issued, padding, first of its K tile, zero point (the next
        # job may be in J by the time the data comes)
        a_rd = [Signal(name=f"a_rd{i}") for i in range(SP_READ_LATENCY + 1)]
        a_pad = [dreg(name=f"a_pad{i}") for i in range(SP_READ_LATENCY)]
        a_first = [dreg(name=f"a_first{i}") for i in range(SP_READ_LATENCY)]
        a_zx = [dreg(8, name=f"a_zx{i}") for i in range(SP_READ_LATENCY)]
        a_data2 = dreg(R * cfg.input_bits + 1)
        a_job_done = Signal()
        a_issue = Signal()
        a_start = Signal()
        last_ow, last_oh, last_cb, last_kw, last_kh = c_ow[-1], c_oh[-1], c_cb[-1], c_kw[-1], c_kh[-1]
        tile_jump = Signal()
        m.d.comb += tile_jump.eq(last_ow & last_oh)
        # which counter the next K-tile jump steps (cb, else kw, else kh; or the job ends),
        # registered from the tile counters every cycle: stale for two cycles after a jump
        # (the counters step a cycle late, ``jump_q``) and one after a job start, when no
        # jump can follow (tiles of one or two pixels wait, ``go_i`` / ``go_n``; a longer
        # tile's last pixel is at least three issues away)
        t_cb, t_kw, t_kh, t_last = Signal(), Signal(), Signal(), Signal()
        m.d.sync += [t_cb.eq(~last_cb), t_kw.eq(last_cb & ~last_kw),
                     t_kh.eq(last_cb & last_kw & ~last_kh), t_last.eq(last_cb & last_kw & last_kh)]
        # a_issue = started & (credit) & ~(blocked), a register computed from the next
        # values of the three conditions (it enables most of the feeder's registers: one
        # LUT level and a high-fan-out net less on every path that starts with it).
        # Its next value is computed twice, for "an issue this cycle" (``go_i``) and "none"
        # (``go_n``), from other registers only, and the issue register itself selects
        # between the two in the last LUT: its own slow, high-fan-out net is one LUT from
        # its input (it was at the start of five LUT levels, 7.8 ns). ``go_i`` uses that
        # an issue implies ``started``. The two are ``keep`` wires, so that yosys' LUT
        # mapping keeps them as cut points. (Proved equal to the plain next value
        # ``started_nx & credit & ~blocked`` over every input combination, and the
        # condition inductive: tests/hw/test_retimed_compute.py.)
        a_issue_r = Signal()
        started_nx = Signal()
        go_i = Signal(attrs={"keep": 1})
        go_n = Signal(attrs={"keep": 1})
        m.d.sync += a_issue_r.eq(Mux(a_issue_r, go_i, go_n))
        # the next job, registered out of the queue's distributed RAM (whose asynchronous
        # read would otherwise sit at the start of every path from a job start: the
        # padding compare, the counters' loads)
        aj, aj_valid = act_q.head(m, a_start, "aj")
        m.d.comb += [a_issue.eq(a_issue_r),
                     a_start.eq(aj_valid & ~started)]
        # inside the image (not padding), from sign bits of registers only, so the
        # scratchpad's read enable and the padding flag leave the feeder one LUT after
        # flip-flops, and no compare sits on any path. Every input coordinate is kept
        # twice: ``ih``/``iw`` (negative: above / left of the image) and ``ihr``/``iwr``
        # = the same minus ``hin``/``win`` (negative: above / left of the bottom / right
        # edge). Each twin steps by the same adds as its coordinate; the job start loads
        # the twins the decoder computed (``*_r`` fields). (A column step used to compare
        # ``iw`` against the job's limits after the add: the whole design's worst path,
        # 8.7 ns.)
        ihr_k = Signal(signed(14)); iwr_k = Signal(signed(14))
        ihr = Signal(signed(14)); iwr = Signal(signed(14))
        ihr_nx = Signal(signed(14)); ihkr_nx = Signal(signed(14)); iwkr_nx = Signal(signed(14))
        inside = Signal()
        m.d.comb += inside.eq(~ih[-1] & ihr[-1] & ~iw[-1] & iwr[-1])
        m.d.comb += [self.act_rd_en.eq(a_issue & inside), self.act_rd_addr.eq(a_px[:16])]
        # the next K tile's start, from this tile's registers (they change only on a jump)
        m.d.sync += [
            tile_nx.eq(Mux(~last_cb, a_cb + 1, Mux(~last_kw, a_kw + J.step_kw, a_kh + J.step_kh))),
            ihk_nx.eq(Mux(~last_cb | ~last_kw, ih_k, ih_k + J.dh)),
            ihkr_nx.eq(Mux(~last_cb | ~last_kw, ihr_k, ihr_k + J.dh)),
            iwk_nx.eq(Mux(~last_cb, iw_k, Mux(~last_kw, iw_k + J.dw, J.npl))),
            iwkr_nx.eq(Mux(~last_cb, iwr_k, Mux(~last_kw, iwr_k + J.dw, J.npl_r))),
        ]
        # (a one-pixel job's every issue is a K-tile jump: its ow/oh counters stay at -1;
        # after a jump, a tile of one or two pixels also waits in the second cycle: see
        # ``jump_q`` below)
        jump_q = Signal()         # a jump within the job happened last cycle (see below)
        with m.If(a_start):
            # first pixel of the first K tile of a new job
            m.d.sync += [J.eq(aj), tile_first.eq(1),
                         c_kh.eq(aj.kh_m2), c_kw.eq(aj.kw_m2), c_cb.eq(aj.cb_m2),
                         c_oh.eq(aj.oh_m2), c_ow.eq(aj.ow_m2),
                         a_kh.eq(aj.addr0), a_kw.eq(aj.addr0), a_cb.eq(aj.addr0),
                         a_px.eq(aj.addr0), row_nx.eq(aj.row1),
                         ih_k.eq(aj.npt), iw_k.eq(aj.npl), ih_nx.eq(aj.ih1),
                         ihr_k.eq(aj.npt_r), iwr_k.eq(aj.npl_r), ihr_nx.eq(aj.ih1_r),
                         ih.eq(aj.npt), iw.eq(aj.npl), ihr.eq(aj.npt_r), iwr.eq(aj.npl_r)]
        with m.If(a_issue):
            m.d.sync += tile_first.eq(0)
            with m.If(~last_ow):
                m.d.sync += [c_ow.eq(c_ow - 1), a_px.eq(a_px + J.step_ow),
                             iw.eq(iw + J.sw), iwr.eq(iwr + J.sw)]
            with m.Elif(~last_oh):
                m.d.sync += [c_ow.eq(J.ow_m2), c_oh.eq(c_oh - 1),
                             a_px.eq(row_nx), row_nx.eq(row_nx + J.step_oh),
                             ih_nx.eq(ih_nx + J.sh), ihr_nx.eq(ihr_nx + J.sh),
                             ih.eq(ih_nx), ihr.eq(ihr_nx), iw.eq(iw_k), iwr.eq(iwr_k)]
            with m.Else():
                # next K tile (cb, else kw, else kh)
                m.d.sync += [c_ow.eq(J.ow_m2), c_oh.eq(J.oh_m2), tile_first.eq(1),
                             a_px.eq(tile_nx), row_nx.eq(tile_nx + J.step_oh),
                             ih_k.eq(ihk_nx), iw_k.eq(iwk_nx), ihr_k.eq(ihkr_nx), iwr_k.eq(iwkr_nx),
                             ih_nx.eq(ihk_nx + J.sh), ihr_nx.eq(ihkr_nx + J.sh),
                             ih.eq(ihk_nx), iw.eq(iwk_nx), ihr.eq(ihkr_nx), iwr.eq(iwkr_nx)]
        # The K-tile counters and addresses (cb, kw, kh: only ``tile_nx``/``*k_nx`` and the
        # step selects read them) step a cycle after the jump, from a registered pulse: the
        # issue decision's high fan-out net no longer reaches them (a_issue_r -> c_kw was
        # the whole design's worst path, 9.9 ns with 7.7 of routing). What they feed is
        # then valid three cycles after a jump, so a tile of at most two pixels waits
        # (``go_i`` / ``go_n``); such tiles are bound by the weight preload, ``min_tile_rows``
        # >= 5 cycles per tile, anyway. (A job's last jump needs no step: the next start
        # loads them.)
        m.d.sync += jump_q.eq(a_issue & tile_jump & ~t_last)
        with m.If(jump_q):
            m.d.sync += a_cb.eq(tile_nx)
            with m.If(t_cb):
                m.d.sync += c_cb.eq(c_cb - 1)
            with m.Elif(t_kw):
                m.d.sync += [c_cb.eq(J.cb_m2), c_kw.eq(c_kw - 1), a_kw.eq(tile_nx)]
            with m.Elif(t_kh):
                m.d.sync += [c_cb.eq(J.cb_m2), c_kw.eq(J.kw_m2), c_kh.eq(c_kh - 1),
                             a_kh.eq(tile_nx), a_kw.eq(tile_nx)]
        m.d.comb += a_job_done.eq(a_issue & tile_jump & t_last)
        a_pop = Signal()
        m.d.comb += a_pop.eq(array.act.valid & array.act.ready)
        # (``started`` is set by a job start and cleared by the job's last issue; its next
        # value also feeds ``a_issue_r``)
        cred_i, cred_n = _credit(m, "a_cnt", a_issue, a_pop, AD, split=True)
        # (= a_start | (started & ~a_job_done), with the issue register selecting in the
        # last LUT, as for ``a_issue_r``; an issue implies ``started``)
        st_i = Signal(attrs={"keep": 1})
        st_n = Signal(attrs={"keep": 1})
        m.d.comb += [st_i.eq(~(tile_jump & t_last)), st_n.eq(aj_valid | started),
                     started_nx.eq(Mux(a_issue, st_i, st_n))]
        m.d.sync += started.eq(started_nx)
        m.d.comb += [
            # (an issue this cycle: started, so no job start; the job goes on unless this
            # is its last pixel)
            go_i.eq(~(tile_jump & t_last) & ~J.one_px & ~(jump_q & J.px_le2) & cred_i),
            go_n.eq((aj_valid | started) & ~(a_start & aj.one_px) & ~(jump_q & J.px_le2) & cred_n),
        ]
        # read (scratchpad: request register, block RAM, its output register), then the
        # data (or the zero point) registered, then the FIFO
        m.d.sync += [a_rd[0].eq(a_issue), a_pad[0].eq(~inside), a_first[0].eq(tile_first),
                     a_zx[0].eq(J.zx)]
        for i in range(SP_READ_LATENCY - 1):
            m.d.sync += [a_pad[i + 1].eq(a_pad[i]), a_first[i + 1].eq(a_first[i]), a_zx[i + 1].eq(a_zx[i])]
        m.d.sync += [a_rd[i + 1].eq(a_rd[i]) for i in range(SP_READ_LATENCY)]
        m.d.sync += a_data2.eq(Cat(Mux(a_pad[-1], a_zx[-1].replicate(R), self.act_rd_data), a_first[-1]))
        m.d.comb += [
            afifo.w_en.eq(a_rd[-1]),
            afifo.w_data.eq(a_data2),
            self.act_beat.eq(array.act.valid & array.act.ready),
        ]
        # the FIFO's head goes through a register before the array: the array's ready
        # depends on the row's ``first`` bit, which would otherwise come from the FIFO's
        # asynchronous distributed-RAM read (consume pointer -> RAM -> ready -> pointer:
        # the compute engine's worst path, 7.4 ns). Full rate: refilled as it is taken.
        h_valid = Signal()
        h_data = dreg(R * cfg.input_bits + 1)
        h_take = Signal()
        m.d.comb += [
            h_take.eq(afifo.r_rdy & (~h_valid | array.act.ready)),
            afifo.r_en.eq(h_take),
            array.act.valid.eq(h_valid),
            array.act.payload.eq(h_data),
        ]
        with m.If(h_take):
            m.d.sync += [h_valid.eq(1), h_data.eq(afifo.r_data)]
        with m.Elif(array.act.ready):
            m.d.sync += h_valid.eq(0)

        # ---------------------------------- inputs released: both feeders done with a job
        a_ahead = Signal(3); w_ahead = Signal(3)
        resolve = Signal()
        m.d.comb += resolve.eq((a_ahead != 0) & (w_ahead != 0))
        a_done_q = Signal()       # (registered: a_job_done is the feeder's deepest signal)
        m.d.sync += a_done_q.eq(a_job_done)
        m.d.sync += [a_ahead.eq(a_ahead + a_done_q - resolve),
                     w_ahead.eq(w_ahead + w_job_done - resolve)]
        # (registered: the controller's token counter is far away)
        m.d.comb += flag_q.r_en.eq(resolve)
        m.d.sync += self.done_read.eq(resolve & flag_q.r_data)

        # ------------------------------------------------------------------ back end
        # The current job sits in local registers, loaded from the queue as the previous
        # job's last beat arrives (or as soon as it is queued, long before its first beat:
        # the array's latency is longer than the queue's); addresses are counters and the
        # "last pixel" / "last K tile" flags are sign bits of down-counters. The next job
        # waits in a register of its own (``bq``, filled from the queue as soon as there is
        # one), so the loads start at flip-flops, not at the queue's asynchronous
        # distributed-RAM read (the counters' loads were 7.4 ns paths); it is filled long
        # before the job's first beat, so this costs no cycle. ``bq`` is the head of
        # ``_Fifo.head_lazy``: two registers popped a cycle late, so a job end reaches one
        # flip-flop there (``bq_popped``), not the queue's read pointer and occupancy (job
        # end -> take -> ``back_q.occupied`` was the worst path of two placements, 7.4 / 8.0
        # ns, ~78 % routing) nor a second register's flags (job end -> ``bq2_valid``
        # enable with a register in between, 7.1 / 8.1 ns); the job registers and counters
        # load ``bq`` through a 2:1 select from flip-flops.
        m.submodules.accmem = accmem = RegisteredRAM(C * cfg.acc_bits, self.acc_depth)
        assert RAM_READ_LATENCY == 2

        bj = Signal(back_job_layout)
        bj_valid = Signal()
        p_left = Signal(signed(25)); kt_left = Signal(signed(15)); kt_first = Signal()
        acc_addr = Signal(16); out_addr = Signal(16)
        # the array's output is registered on its way in (valid and sums): every back-end
        # path then starts at a flip-flop here, not at the far end of the array (the
        # back end's counters were on 8-9 ns paths from its valid line)
        beat = Signal()
        out_q = dreg(array.out.payload.data.shape(), name="out_q")
        m.d.comb += array.out.ready.eq(1)
        m.d.sync += [beat.eq(array.out.valid), out_q.eq(array.out.payload.data)]
        last_p = p_left[-1]
        last_kt = kt_left[-1]
        job_end = Signal()
        b_load = Signal()
        bq, bq_valid, bq_busy = back_q.head_lazy(m, b_load, "bq")
        m.d.comb += [job_end.eq(beat & last_p & last_kt),
                     b_load.eq(bq_valid & (~bj_valid | job_end))]
        m.d.comb += [accmem.r_addr.eq(acc_addr), accmem.r_en.eq(beat)]
        with m.If(b_load):
            m.d.sync += bj_valid.eq(1)
        with m.Elif(job_end):
            m.d.sync += bj_valid.eq(0)
        # Enables and selects are functions of flip-flops only (``beat``, ``bj_valid`` and
        # the counters' sign bits), not of ``b_load``, which needs the queue head's flag
        # too: that enable, fanned out to ~70 flip-flops, was a 7.9 ns path. The job and
        # the counters load the queue head while no job is current (every cycle until
        # ``b_load``; don't-care until then) and at a job's last beat (the next job, or
        # don't-care when none is queued: ``bj_valid`` drops and the idle loading takes over).
        with m.If(~bj_valid | job_end):
            m.d.sync += bj.eq(bq)
        with m.If(~bj_valid | (beat & last_p & last_kt)):
            m.d.sync += [p_left.eq(bq.pix_m2), kt_left.eq(bq.kt_m2), kt_first.eq(1),
                         acc_addr.eq(bq.acc_base), out_addr.eq(bq.out_base)]
        with m.Elif(beat & last_p):
            m.d.sync += [p_left.eq(bj.pix_m2), kt_left.eq(kt_left - 1), kt_first.eq(0),
                         acc_addr.eq(bj.acc_base), out_addr.eq(bj.out_base)]
        with m.Elif(beat):
            m.d.sync += [p_left.eq(p_left - 1), acc_addr.eq(acc_addr + 1),
                         out_addr.eq(out_addr + bj.out_stride)]

        # stage B registers
        b_valid = Signal(); b_first = Signal(); b_last = Signal(); b_end = Signal()
        # (data registers, ``dreg``, have no reset; the flags beside them do)
        b_addr = dreg(16); b_out = dreg(16)
        b_psum = dreg(data.ArrayLayout(signed(cfg.acc_bits), C))
        m.d.sync += [
            b_valid.eq(beat),
            b_first.eq(kt_first & bj.acc_init),
            b_last.eq(last_kt & bj.finalize),
            b_end.eq(job_end),
            b_addr.eq(acc_addr),
            b_out.eq(out_addr),
            b_psum.eq(out_q),
        ]
        # The payload queue's head is the job of the beat in stage B: it is popped in the
        # cycle after a job's last beat left stage A, i.e. while that beat is in stage B.
        pay = pay_q.r
        m.d.comb += pay_q.fifo.r_en.eq(b_end)
        # The accumulator read-modify-write is split over stages so that neither the block
        # RAM's clock-to-out nor its write setup shares a cycle with the 32-bit adders:
        #   A: read address   B: RAM   X: RAM output register   C: RAM data (or bias) registered
        #   D: add (registered)   E: write + requantize
        # No forwarding is needed: a row is read again only by the same pixel of the next
        # K tile, at least min_tile_rows = 2R + C + 1 >= 5 cycles later (the array cannot
        # start a tile sooner), by which time the write (stage E, 4 cycles after the read)
        # has committed.
        acc_row = data.ArrayLayout(signed(cfg.acc_bits), C)
        x_valid = Signal(); x_last = Signal(); x_end = Signal(); x_push = Signal()
        x_addr = dreg(16); x_out = dreg(16)
        x_psum = dreg(acc_row)
        x_aux = dreg(aux_layout(cfg))
        x_zy = dreg(8); x_lo = dreg(8); x_hi = dreg(8)
        m.d.sync += [
            x_valid.eq(b_valid), x_last.eq(b_last), x_end.eq(b_end),
            x_push.eq(pay.push), x_addr.eq(b_addr), x_out.eq(b_out), x_psum.eq(b_psum),
            x_aux.eq(pay.aux), x_zy.eq(pay.zy), x_lo.eq(pay.lo), x_hi.eq(pay.hi),
        ]
        c_valid = Signal(); c_last = Signal(); c_end = Signal(); c_push = Signal()
        c_addr = dreg(16); c_out = dreg(16)
        c_psum = dreg(acc_row); c_base = dreg(acc_row)
        c_aux = dreg(aux_layout(cfg))
        c_zy = dreg(8); c_lo = dreg(8); c_hi = dreg(8)
        # the addend is selected as the RAM data is registered (bias for a K tile's first
        # beat, else the stored sum), with one copy of the select per lane: stage D is then
        # an adder between registers (the select's fan-out of C * acc_bits muxes in front
        # of the adders was a 7.5 ns path)
        x_first_l = dup_reg(m, platform, b_first.replicate(C), "x_first_l")
        old = data.View(acc_row, accmem.r_data)
        m.d.sync += [
            c_valid.eq(x_valid), c_last.eq(x_last), c_end.eq(x_end),
            c_push.eq(x_push), c_addr.eq(x_addr), c_out.eq(x_out), c_psum.eq(x_psum),
            c_aux.eq(x_aux), c_zy.eq(x_zy), c_lo.eq(x_lo), c_hi.eq(x_hi),
        ]
        m.d.sync += [c_base[c].eq(Mux(x_first_l[c], x_aux[c].bias, old[c])) for c in range(C)]
        d_we = Signal(); d_rq = Signal(); d_side = dreg(19)
        d_addr = dreg(16); d_sum = dreg(acc_row)
        d_aux = dreg(aux_layout(cfg))
        d_zy = dreg(8); d_lo = dreg(8); d_hi = dreg(8)
        assert min_tile_rows(R, C) >= 5, "the accumulator pipeline relies on it"
        s = Signal(acc_row)
        for c in range(C):
            m.d.comb += s[c].eq(c_base[c] + c_psum[c])
        m.d.sync += [
            d_we.eq(c_valid & ~c_last), d_rq.eq(c_valid & (c_last | c_end)),
            d_side.eq(Cat(c_out, c_last, c_end, c_push)), d_addr.eq(c_addr), d_sum.eq(s),
            d_aux.eq(c_aux), d_zy.eq(c_zy), d_lo.eq(c_lo), d_hi.eq(c_hi),
        ]
        # (d_we already includes c_valid: the block RAMs' write enable is a flip-flop, no
        # gate that the placer could put far from both ends: 7.8 ns of routing once)
        m.d.comb += [accmem.w_addr.eq(d_addr), accmem.w_data.eq(d_sum), accmem.w_en.eq(d_we)]

        m.submodules.rq = rq = Requantizer(C, cfg.acc_bits, cfg.input_bits, side_bits=19)
        m.d.comb += [
            rq.i_valid.eq(d_rq),
            rq.i_acc.eq(d_sum),
            rq.i_zy.eq(d_zy), rq.i_lo.eq(d_lo), rq.i_hi.eq(d_hi),
            rq.i_side.eq(d_side),
        ]
        for c in range(C):
            m.d.comb += [rq.i_m[c].eq(d_aux[c].m), rq.i_n[c].eq(d_aux[c].n)]
        o_we = rq.o_side[16]
        o_end = rq.o_side[17]
        o_push = rq.o_side[18]
        # (registered: the controller's token counter is far away)
        m.d.sync += self.done_write.eq(rq.o_valid & o_end & o_push)
        m.d.comb += [
            self.out_wr_en.eq(rq.o_valid & o_we),
            self.out_wr_addr.eq(rq.o_side[:16]),
            self.out_wr_data.eq(rq.o_y),

        ]

        # -------------------------------------------------------------------- idle
        pipe = Signal(RQ_LATENCY + 5)
        m.d.sync += pipe.eq(Cat(b_valid, pipe[:-1]))
        # registered (it crosses to the controller's run control), in two stages: the ~60
        # terms are ANDed in groups of at most 16 bits (two LUT levels) into registers
        # (``idle_p``), those into ``idle_q``: ``idle_q`` = the plain idle of two cycles
        # ago (the single 60-term AND into ``idle_q`` was the worst path of seeds 1 and 3 at
        # 150 MHz: 7.25 / 6.96 ns). ``idle`` = ``idle_q`` with no instruction offered in the
        # three cycles since (only an accepted instruction makes the engine busy, so it is
        # still idle now). The offer from the controller, across the die, meets one 4-input
        # gate here.
        idle_terms = [dstate[0], ~act_q.fifo.we_d, ~act_q.fifo.r_rdy, ~aj_valid, ~wgt_q.fifo.r_rdy,
                      ~back_q.fifo.r_rdy, ~bq_busy, ~pay_q.fifo.r_rdy, ~started, ~w_valid, ~bj_valid,
                      ~afifo.r_rdy, ~h_valid, ~wfifo.r_rdy, ~Cat(*a_rd, *w_rd), ~array.busy,
                      ~beat, ~b_valid, ~pipe, ~a_done_q, ~a_ahead, ~w_ahead]
        bits = [b for t in idle_terms for b in Value.cast(t)]
        groups = [bits[i:i + 16] for i in range(0, len(bits), 16)]
        idle_p = Signal(len(groups))
        m.d.sync += [idle_p[i].eq(Cat(*g).all()) for i, g in enumerate(groups)]
        idle = Signal()           # the plain idle (combinational; for the proofs)
        m.d.comb += idle.eq(Cat(*bits).all())
        idle_q = Signal(); valid_q = Signal(); valid_qq = Signal()
        m.d.sync += [idle_q.eq(idle_p.all()), valid_q.eq(self.insn.valid), valid_qq.eq(valid_q),
                     self.idle.eq(idle_q & ~valid_qq & ~valid_q & ~self.insn.valid)]
        return m
