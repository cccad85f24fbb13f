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

Timing model (asserted against RTL in tests): see :mod:`dnnfab.sw.perfmodel`.
"""

from amaranth.hdl import Signal, Module, Const, signed, unsigned, Cat, Mux
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out
from amaranth.lib.fifo import SyncFIFOBuffered, SyncFIFO
from amaranth.lib.memory import Memory

from .config import AcceleratorConfig
from .isa import compute_insn_layout
from .systolic import SystolicArray, min_tile_rows
from .postproc import Requantizer, LATENCY as RQ_LATENCY

__all__ = ["ComputeEngine", "aux_layout", "AUX_LANE_BITS"]

AUX_LANE_BITS = 64   # bias (32) | m (16) | n (8) | reserved (8)


def aux_layout(cfg):
    lane = data.StructLayout({"bias": signed(32), "m": unsigned(16), "n": unsigned(8), "rsv": unsigned(8)})
    return data.ArrayLayout(lane, cfg.cols)


class _Fifo:
    """A SyncFIFOBuffered carrying a data.Layout, with views on both ends."""

    def __init__(self, m, name, layout, depth):
        self.fifo = SyncFIFOBuffered(width=data.Layout.cast(layout).size, depth=depth)
        m.submodules[name] = self.fifo
        self.w = data.View(layout, self.fifo.w_data)
        self.r = data.View(layout, self.fifo.r_data)


class ComputeEngine(wiring.Component):
    """Executes COMPUTE instructions on the systolic array.

    Members
    -------
    insn : ``In(stream.Signature(compute_insn_layout()))``
        Instructions whose dependency tokens have already been taken.
    act_rd_en, act_rd_addr : ``Out`` / act_rd_data : ``In(R*input_bits)``
        Activation scratchpad read port (element units, 1-cycle latency).
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
        Nothing queued or in flight.
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
        act_job_layout = data.StructLayout({
            "kh_n": 4, "kw_n": 4, "cb_n": 10, "oh_n": 12, "ow_n": 12,
            "hin": 12, "win": 12, "sh": 3, "sw": 3, "dh": 3, "dw": 3, "pt": 4, "pl": 4,
            "zx": 8, "addr0": signed(A), "step_ow": A, "step_oh": A, "step_kw": A, "step_kh": A,
        })
        wgt_job_layout = data.StructLayout({"w_base": 16, "rows": 24})
        back_job_layout = data.StructLayout({
            "acc_base": 16, "out_base": 16, "out_stride": 8, "pixels": 24, "ktiles": 14,
            "acc_init": 1, "finalize": 1, "push": 1,
            "zy": 8, "lo": 8, "hi": 8, "aux": aux_layout(cfg),
        })
        act_q = _Fifo(m, "act_q", act_job_layout, 3)
        wgt_q = _Fifo(m, "wgt_q", wgt_job_layout, 3)
        back_q = _Fifo(m, "back_q", back_job_layout, 3)
        flag_q = SyncFIFO(width=1, depth=4)
        m.submodules.flag_q = flag_q

        # ------------------------------------------------------------------ decode
        insn = Signal(compute_insn_layout())
        row_stride = Signal(A)
        dstate = Signal(range(4))
        room = Signal()
        m.d.comb += room.eq(act_q.fifo.w_rdy & wgt_q.fifo.w_rdy & back_q.fifo.w_rdy & flag_q.w_rdy)
        m.d.comb += self.insn.ready.eq(dstate == 0)
        # small multiplies, one register stage each (decode takes 4 cycles per instruction)
        khkw = Signal(8)
        ktiles = Signal(14)
        pixels = Signal(24)
        addr0 = Signal(signed(A)); step_ow = Signal(A); step_oh = Signal(A)
        step_kw = Signal(A); step_kh = Signal(A)
        with m.Switch(dstate):
            with m.Case(0):
                with m.If(self.insn.valid):
                    m.d.sync += [insn.eq(self.insn.payload), dstate.eq(1)]
            with m.Case(1):
                m.d.comb += [self.aux_rd_en.eq(1), self.aux_rd_addr.eq(insn.aux_addr)]
                m.d.sync += [row_stride.eq(insn.win * insn.cbp), khkw.eq(insn.kh_n * insn.kw_n),
                             pixels.eq(insn.oh_n * insn.ow_n),
                             step_ow.eq(insn.sw * insn.cbp), step_kw.eq(insn.dw * insn.cbp),
                             dstate.eq(2)]
            with m.Case(2):
                m.d.sync += [ktiles.eq(khkw * insn.cb_n),
                             addr0.eq(insn.a_base - insn.pt * row_stride - insn.pl * insn.cbp),
                             step_oh.eq(insn.sh * row_stride), step_kh.eq(insn.dh * row_stride),
                             dstate.eq(3)]
            with m.Case(3):
                with m.If(room):
                    m.d.sync += dstate.eq(0)
        push = Signal()
        m.d.comb += push.eq((dstate == 3) & room)
        aux_now = data.View(aux_layout(cfg), self.aux_rd_data)
        m.d.comb += [
            act_q.fifo.w_en.eq(push), wgt_q.fifo.w_en.eq(push), back_q.fifo.w_en.eq(push),
            flag_q.w_en.eq(push), flag_q.w_data.eq(insn.push_prev),
        ]
        for f in ("kh_n", "kw_n", "cb_n", "oh_n", "ow_n", "hin", "win", "sh", "sw", "dh", "dw",
                  "pt", "pl", "zx"):
            m.d.comb += getattr(act_q.w, f).eq(getattr(insn, f))
        m.d.comb += [
            act_q.w.addr0.eq(addr0),
            act_q.w.step_ow.eq(step_ow),
            act_q.w.step_oh.eq(step_oh),
            act_q.w.step_kw.eq(step_kw),
            act_q.w.step_kh.eq(step_kh),
            wgt_q.w.w_base.eq(insn.w_base),
            wgt_q.w.rows.eq(ktiles * R),
            back_q.w.acc_base.eq(insn.acc_base),
            back_q.w.out_base.eq(insn.out_base),
            back_q.w.out_stride.eq(insn.out_stride),
            back_q.w.pixels.eq(pixels),
            back_q.w.ktiles.eq(ktiles),
            back_q.w.acc_init.eq(insn.acc_init),
            back_q.w.finalize.eq(insn.finalize),
            back_q.w.push.eq(insn.push_next),
            back_q.w.zy.eq(insn.zy), back_q.w.lo.eq(insn.lo), back_q.w.hi.eq(insn.hi),
            back_q.w.aux.eq(aux_now),
        ]

        # ---------------------------------------------------------- weight feeder
        wfifo = SyncFIFO(width=C * cfg.weight_bits, depth=4)
        m.submodules.wfifo = wfifo
        w_i = Signal(24)
        w_inflight = Signal()
        w_job_done = Signal()
        wj = wgt_q.r
        w_issue = Signal()
        m.d.comb += w_issue.eq(wgt_q.fifo.r_rdy & (wfifo.level + w_inflight < 4))
        m.d.comb += [self.wgt_rd_en.eq(w_issue), self.wgt_rd_addr.eq(wj.w_base + w_i)]
        m.d.sync += w_inflight.eq(w_issue)
        # (job-done strobes are plain ANDs: Icarus would turn a mux on the FIFO's still
        # undefined output into X even when w_issue is 0)
        m.d.comb += w_job_done.eq(w_issue & (w_i == wj.rows - 1))
        m.d.comb += wgt_q.fifo.r_en.eq(w_job_done)
        with m.If(w_job_done):
            m.d.sync += w_i.eq(0)
        with m.Elif(w_issue):
            m.d.sync += w_i.eq(w_i + 1)
        m.d.comb += [wfifo.w_en.eq(w_inflight), wfifo.w_data.eq(self.wgt_rd_data)]
        m.d.comb += [array.wgt.valid.eq(wfifo.r_rdy), array.wgt.payload.eq(wfifo.r_data),
                     wfifo.r_en.eq(array.wgt.ready)]

        # ------------------------------------------------------ activation feeder
        aj = act_q.r
        afifo = SyncFIFO(width=R * cfg.input_bits + 1, depth=4)
        m.submodules.afifo = afifo
        kh = Signal(4); kw = Signal(4); cb = Signal(10)
        oh = Signal(12); ow = Signal(12)
        a_kh = Signal(signed(A)); a_kw = Signal(signed(A)); a_cb = Signal(signed(A))
        a_row = Signal(signed(A)); a_px = Signal(signed(A))
        ih_k = Signal(signed(14)); iw_k = Signal(signed(14))
        ih = Signal(signed(14)); iw = Signal(signed(14))
        started = Signal()
        a_inflight = Signal(); a_pad_q = Signal(); a_first_q = Signal()
        a_job_done = Signal()
        a_issue = Signal()
        m.d.comb += a_issue.eq(act_q.fifo.r_rdy & started & (afifo.level + a_inflight < 4))
        inside = Signal()
        m.d.comb += inside.eq((ih >= 0) & (ih < aj.hin) & (iw >= 0) & (iw < aj.win))
        m.d.comb += [self.act_rd_en.eq(a_issue & inside), self.act_rd_addr.eq(a_px[:16])]
        m.d.sync += [a_inflight.eq(a_issue), a_pad_q.eq(~inside), a_first_q.eq((oh == 0) & (ow == 0))]
        with m.If(act_q.fifo.r_rdy & ~started):
            # first pixel of the first K tile of a new job
            m.d.sync += [started.eq(1), kh.eq(0), kw.eq(0), cb.eq(0), oh.eq(0), ow.eq(0),
                         a_kh.eq(aj.addr0), a_kw.eq(aj.addr0), a_cb.eq(aj.addr0),
                         a_row.eq(aj.addr0), a_px.eq(aj.addr0),
                         ih_k.eq(-aj.pt), iw_k.eq(-aj.pl), ih.eq(-aj.pt), iw.eq(-aj.pl)]
        with m.If(a_issue):
            last_ow = ow == aj.ow_n - 1
            last_oh = oh == aj.oh_n - 1
            last_cb = cb == aj.cb_n - 1
            last_kw = kw == aj.kw_n - 1
            last_kh = kh == aj.kh_n - 1
            with m.If(~last_ow):
                m.d.sync += [ow.eq(ow + 1), a_px.eq(a_px + aj.step_ow), iw.eq(iw + aj.sw)]
            with m.Elif(~last_oh):
                m.d.sync += [ow.eq(0), oh.eq(oh + 1), a_row.eq(a_row + aj.step_oh),
                             a_px.eq(a_row + aj.step_oh), ih.eq(ih + aj.sh), iw.eq(iw_k)]
            with m.Else():
                # next K tile
                m.d.sync += [ow.eq(0), oh.eq(0)]
                with m.If(~last_cb):
                    m.d.sync += [cb.eq(cb + 1), a_cb.eq(a_cb + 1), a_row.eq(a_cb + 1),
                                 a_px.eq(a_cb + 1), ih.eq(ih_k), iw.eq(iw_k)]
                with m.Elif(~last_kw):
                    nxt = a_kw + aj.step_kw
                    m.d.sync += [cb.eq(0), kw.eq(kw + 1), a_kw.eq(nxt), a_cb.eq(nxt), a_row.eq(nxt),
                                 a_px.eq(nxt), iw_k.eq(iw_k + aj.dw), ih.eq(ih_k), iw.eq(iw_k + aj.dw)]
                with m.Elif(~last_kh):
                    nxt = a_kh + aj.step_kh
                    m.d.sync += [cb.eq(0), kw.eq(0), kh.eq(kh + 1), a_kh.eq(nxt), a_kw.eq(nxt),
                                 a_cb.eq(nxt), a_row.eq(nxt), a_px.eq(nxt),
                                 ih_k.eq(ih_k + aj.dh), iw_k.eq(-aj.pl),
                                 ih.eq(ih_k + aj.dh), iw.eq(-aj.pl)]
                with m.Else():
                    m.d.sync += started.eq(0)
        m.d.comb += a_job_done.eq(a_issue & (ow == aj.ow_n - 1) & (oh == aj.oh_n - 1) & (cb == aj.cb_n - 1)
                                  & (kw == aj.kw_n - 1) & (kh == aj.kh_n - 1))
        m.d.comb += act_q.fifo.r_en.eq(a_job_done)
        zx_q = Signal(8)
        m.d.sync += zx_q.eq(aj.zx)
        m.d.comb += [
            afifo.w_en.eq(a_inflight),
            afifo.w_data.eq(Cat(Mux(a_pad_q, zx_q.replicate(R), self.act_rd_data), a_first_q)),
            array.act.valid.eq(afifo.r_rdy),
            array.act.payload.eq(afifo.r_data),
            afifo.r_en.eq(array.act.ready),
            self.act_beat.eq(array.act.valid & array.act.ready),
        ]

        # ---------------------------------- inputs released: both feeders done with a job
        a_ahead = Signal(3); w_ahead = Signal(3)
        resolve = Signal()
        m.d.comb += resolve.eq((a_ahead != 0) & (w_ahead != 0))
        m.d.sync += [a_ahead.eq(a_ahead + a_job_done - resolve),
                     w_ahead.eq(w_ahead + w_job_done - resolve)]
        m.d.comb += [flag_q.r_en.eq(resolve), self.done_read.eq(resolve & flag_q.r_data)]

        # ------------------------------------------------------------------ back end
        bj = back_q.r
        accmem = Memory(shape=unsigned(C * cfg.acc_bits), depth=self.acc_depth, init=[])
        m.submodules.accmem = accmem
        acc_wp = accmem.write_port()
        acc_rp = accmem.read_port(transparent_for=(acc_wp,))

        p = Signal(24); kt = Signal(14)
        out_addr = Signal(16)
        beat = Signal()
        m.d.comb += [beat.eq(array.out.valid), array.out.ready.eq(1)]
        last_p = p == bj.pixels - 1
        start_addr = Signal(16)      # output element of pixel p (pixel 0: straight from the job)
        m.d.comb += start_addr.eq(Mux(p == 0, bj.out_base, out_addr))
        last_kt = kt == bj.ktiles - 1
        job_end = Signal()
        m.d.comb += job_end.eq(beat & last_p & last_kt)
        m.d.comb += back_q.fifo.r_en.eq(job_end)
        m.d.comb += [acc_rp.addr.eq(bj.acc_base + p), acc_rp.en.eq(beat)]
        with m.If(beat):
            with m.If(last_p):
                m.d.sync += p.eq(0)
                with m.If(last_kt):
                    m.d.sync += kt.eq(0)
                with m.Else():
                    m.d.sync += kt.eq(kt + 1)
            with m.Else():
                m.d.sync += [p.eq(p + 1), out_addr.eq(start_addr + bj.out_stride)]

        # stage B registers
        b_valid = Signal(); b_first = Signal(); b_last = Signal(); b_end = Signal(); b_push = Signal()
        b_addr = Signal(16); b_out = Signal(16)
        b_psum = Signal(data.ArrayLayout(signed(cfg.acc_bits), C))
        b_aux = Signal(aux_layout(cfg))
        b_zy = Signal(8); b_lo = Signal(8); b_hi = Signal(8)
        m.d.sync += [
            b_valid.eq(beat),
            b_first.eq((kt == 0) & bj.acc_init),
            b_last.eq(last_kt & bj.finalize),
            b_end.eq(job_end),
            b_push.eq(bj.push),
            b_addr.eq(bj.acc_base + p),
            b_out.eq(start_addr),
            b_psum.eq(array.out.payload.data),
            b_aux.eq(bj.aux), b_zy.eq(bj.zy), b_lo.eq(bj.lo), b_hi.eq(bj.hi),
        ]
        # The accumulator read-modify-write is split over stages so that neither the block
        # RAM's clock-to-out nor its write setup shares a cycle with the 32-bit adders:
        #   A: read address   B: RAM data out   C: add (registered)   D: write + requantize
        # No forwarding is needed: a row is read again only by the same pixel of the next
        # K tile, at least min_tile_rows = 2R + C + 1 >= 4 cycles later (the array cannot
        # start a tile sooner), by which time the write (stage D, 3 cycles after the read)
        # has committed. The read port is transparent as well, for good measure.
        acc_row = data.ArrayLayout(signed(cfg.acc_bits), C)
        c_valid = Signal(); c_first = Signal(); c_last = Signal(); c_end = Signal(); c_push = Signal()
        c_addr = Signal(16); c_out = Signal(16)
        c_psum = Signal(acc_row); c_old = Signal(acc_row)
        c_aux = Signal(aux_layout(cfg))
        c_zy = Signal(8); c_lo = Signal(8); c_hi = Signal(8)
        m.d.sync += [
            c_valid.eq(b_valid), c_first.eq(b_first), c_last.eq(b_last), c_end.eq(b_end),
            c_push.eq(b_push), c_addr.eq(b_addr), c_out.eq(b_out), c_psum.eq(b_psum),
            c_old.eq(acc_rp.data), c_aux.eq(b_aux), c_zy.eq(b_zy), c_lo.eq(b_lo), c_hi.eq(b_hi),
        ]
        d_valid = Signal(); d_we = Signal(); d_rq = Signal(); d_side = Signal(19)
        d_addr = Signal(16); d_sum = Signal(acc_row)
        d_aux = Signal(aux_layout(cfg))
        d_zy = Signal(8); d_lo = Signal(8); d_hi = Signal(8)
        assert min_tile_rows(R, C) >= 4, "the accumulator pipeline relies on it"
        old = c_old
        s = Signal(acc_row)
        for c in range(C):
            m.d.comb += s[c].eq(Mux(c_first, c_aux[c].bias, old[c]) + c_psum[c])
        m.d.sync += [
            d_valid.eq(c_valid), d_we.eq(c_valid & ~c_last), d_rq.eq(c_valid & (c_last | c_end)),
            d_side.eq(Cat(c_out, c_last, c_end, c_push)), d_addr.eq(c_addr), d_sum.eq(s),
            d_aux.eq(c_aux), d_zy.eq(c_zy), d_lo.eq(c_lo), d_hi.eq(c_hi),
        ]
        m.d.comb += [acc_wp.addr.eq(d_addr), acc_wp.data.eq(d_sum), acc_wp.en.eq(d_valid & d_we)]

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
        m.d.comb += [
            self.out_wr_en.eq(rq.o_valid & o_we),
            self.out_wr_addr.eq(rq.o_side[:16]),
            self.out_wr_data.eq(rq.o_y),
            self.done_write.eq(rq.o_valid & o_end & o_push),
        ]

        # -------------------------------------------------------------------- idle
        pipe = Signal(RQ_LATENCY + 4)
        m.d.sync += pipe.eq(Cat(b_valid, pipe[:-1]))
        m.d.comb += self.idle.eq((dstate == 0) & ~act_q.fifo.r_rdy & ~wgt_q.fifo.r_rdy & ~back_q.fifo.r_rdy
                                 & ~afifo.r_rdy & ~wfifo.r_rdy & ~a_inflight & ~w_inflight
                                 & ~array.busy & ~b_valid & (pipe == 0) & (a_ahead == 0) & (w_ahead == 0))
        return m
