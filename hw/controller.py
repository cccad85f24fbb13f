"""Controller: fetches the instruction stream and runs the LOAD / COMPUTE / STORE engines.

::

    DRAM --fetch (DMA read, target INSN)--> beat FIFO --gearbox--> dispatcher
        dispatcher --> load queue    --> LOAD engine    --> DMA read commands
                   --> compute queue --> token gate     --> ComputeEngine
                   --> store queue   --> STORE engine   --> DMA write commands

* **Fetch** requests up to ``FETCH_CHUNK`` instructions at a time, only when the beat
  FIFO has room for all of them (so the DMA never has to wait for the FIFO).
* **Dispatcher** routes each instruction to its engine's queue in program order; an
  illegal opcode stops the machine with error 3 and the instruction index.
* **Tokens** (VTA's scheme): four counting semaphores, load->compute (l2c),
  compute->load (c2l), compute->store (c2s), store->compute (s2c). An engine's head
  instruction starts only when the tokens it pops are available. LOAD and STORE push
  their token when the DMA reports the command complete (DMA read commands complete in
  order, a small FIFO remembers which command was a fetch and which a load); COMPUTE
  pushes c2l when both feeders have read their inputs and c2s when its outputs are in the
  output scratchpad.
* **Done** when every instruction has been dispatched, every queue is empty and every
  engine, the DMA and the compute pipeline are idle. Any fault (``fault`` input: DMA
  errors, scratchpad range errors) or an illegal instruction ends the run with ``error``.
"""

from amaranth.hdl import Signal, Module, Const, Cat, unsigned
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out
from amaranth.lib.fifo import SyncFIFOBuffered, SyncFIFO

from .config import AcceleratorConfig
from .isa import (INSN_BITS, OP_LOAD, OP_COMPUTE, OP_STORE, TARGET_INSN, dma_insn_layout,
                  compute_insn_layout, insn_layout)

__all__ = ["Controller", "ERR_ILLEGAL_INSN", "FETCH_CHUNK", "QUEUE_DEPTH"]

ERR_ILLEGAL_INSN = 3
FETCH_CHUNK = 8
QUEUE_DEPTH = 8


class _TokenCounter:
    def __init__(self, m, name):
        self.count = Signal(8, name=f"tok_{name}")
        self.inc = Signal(name=f"tok_{name}_inc")
        self.dec = Signal(name=f"tok_{name}_dec")
        m.d.sync += self.count.eq(self.count + self.inc - self.dec)

    @property
    def available(self):
        return self.count != 0


class Controller(wiring.Component):
    """Instruction fetch, dispatch, dependency tokens and the LOAD/STORE engines.

    Members
    -------
    start : ``In(1)``
        Pulse: run ``prog_len`` instructions from ``prog_base``.
    prog_base, prog_len : ``In(32)``
    rd_cmd : ``Out(stream.Signature(desc_layout))``
        DMA read commands (fetches and LOADs). ``rd_done``: ``In(1)`` completion pulses.
    ins_we, ins_data : ``In(1)``, ``In(bus_bits)``
        Instruction beats arriving from the DMA.
    wr_cmd : ``Out(stream.Signature(desc_layout))``
        DMA write commands (STOREs). ``wr_done``: ``In(1)``.
    cinsn : ``Out(stream.Signature(compute_insn_layout()))``
        COMPUTE instructions whose tokens are taken, to the compute engine.
    c_done_read, c_done_write, c_idle : ``In(1)``
        Compute engine events and idle flag.
    dma_busy : ``In(1)``
    fault, fault_code, fault_info : ``In(1)``, ``In(4)``, ``In(32)``
        A fault detected elsewhere (DMA, scratchpads).
    busy, done, error : ``Out(1)``
        Running; finished (sticky until the next start); finished with an error.
    error_code, error_info : ``Out(4)``, ``Out(32)``
    retired : ``Out(1)``
        Pulse per instruction dispatched.
    compute_waiting : ``Out(1)``
        A COMPUTE is queued but blocked on a token (stall accounting).
    """

    def __init__(self, config: AcceleratorConfig, desc_layout):
        self.config = config
        self.desc_layout = desc_layout
        super().__init__({
            "start": In(1), "prog_base": In(32), "prog_len": In(32),
            "rd_cmd": Out(stream.Signature(desc_layout)), "rd_done": In(1),
            "ins_we": In(1), "ins_data": In(config.bus_bits),
            "wr_cmd": Out(stream.Signature(desc_layout)), "wr_done": In(1),
            "cinsn": Out(stream.Signature(compute_insn_layout())),
            "c_done_read": In(1), "c_done_write": In(1), "c_idle": In(1),
            "dma_busy": In(1),
            "fault": In(1), "fault_code": In(4), "fault_info": In(32),
            "busy": Out(1), "done": Out(1), "error": Out(1),
            "error_code": Out(4), "error_info": Out(32),
            "retired": Out(1), "compute_waiting": Out(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        m = Module()
        bus = cfg.bus_bits
        bpi = INSN_BITS // bus              # beats per instruction (bus_bits <= 256)
        assert bpi >= 1

        running = Signal()
        m.d.comb += self.busy.eq(running)

        # ---------------------------------------------------------------- fetch
        beat_depth = 2 * FETCH_CHUNK * bpi
        beats = SyncFIFO(width=bus, depth=beat_depth)
        m.submodules.beats = beats
        m.d.comb += [beats.w_en.eq(self.ins_we), beats.w_data.eq(self.ins_data)]
        requested = Signal(32)      # instructions requested so far
        reserved = Signal(range(beat_depth + 1))   # beats requested but not yet arrived
        fetch_n = Signal(range(FETCH_CHUNK + 1))
        remaining = Signal(32)
        m.d.comb += remaining.eq(self.prog_len - requested)
        with m.If(remaining >= FETCH_CHUNK):
            m.d.comb += fetch_n.eq(FETCH_CHUNK)
        with m.Else():
            m.d.comb += fetch_n.eq(remaining)
        fetch_want = Signal()
        m.d.comb += fetch_want.eq(running & (remaining != 0) &
                                  (beats.level + reserved + fetch_n * bpi <= beat_depth))
        fetch_go = Signal()
        reserve_inc = Signal(range(beat_depth + 1))
        with m.If(fetch_go):
            m.d.comb += reserve_inc.eq(fetch_n * bpi)
        m.d.sync += reserved.eq(reserved + reserve_inc - self.ins_we)

        # ------------------------------------------------------------- gearbox
        insn = Signal(INSN_BITS)
        insn_valid = Signal()
        insn_take = Signal()
        gcount = Signal(range(bpi + 1))
        m.d.comb += beats.r_en.eq(~insn_valid & beats.r_rdy)
        with m.If(beats.r_en):
            if bpi == 1:
                m.d.sync += [insn.eq(beats.r_data), insn_valid.eq(1)]
            else:
                m.d.sync += insn.eq(Cat(insn[bus:], beats.r_data))
                with m.If(gcount == bpi - 1):
                    m.d.sync += [gcount.eq(0), insn_valid.eq(1)]
                with m.Else():
                    m.d.sync += gcount.eq(gcount + 1)
        with m.If(insn_take):
            m.d.sync += insn_valid.eq(0)

        # ---------------------------------------------------------- dispatcher
        hdr = data.View(insn_layout(), insn)
        load_q = SyncFIFOBuffered(width=INSN_BITS, depth=QUEUE_DEPTH)
        comp_q = SyncFIFOBuffered(width=INSN_BITS, depth=QUEUE_DEPTH)
        store_q = SyncFIFOBuffered(width=INSN_BITS, depth=QUEUE_DEPTH)
        m.submodules.load_q, m.submodules.comp_q, m.submodules.store_q = load_q, comp_q, store_q
        dispatched = Signal(32)
        illegal = Signal()
        stopped = Signal()      # error: dispatch no more
        for q in (load_q, comp_q, store_q):
            m.d.comb += q.w_data.eq(insn)
        can = running & ~stopped & insn_valid
        with m.If(can):
            with m.Switch(hdr.opcode):
                with m.Case(OP_LOAD):
                    m.d.comb += [load_q.w_en.eq(load_q.w_rdy), insn_take.eq(load_q.w_rdy)]
                with m.Case(OP_COMPUTE):
                    m.d.comb += [comp_q.w_en.eq(comp_q.w_rdy), insn_take.eq(comp_q.w_rdy)]
                with m.Case(OP_STORE):
                    m.d.comb += [store_q.w_en.eq(store_q.w_rdy), insn_take.eq(store_q.w_rdy)]

        m.d.comb += illegal.eq(can & (hdr.opcode != OP_LOAD) & (hdr.opcode != OP_COMPUTE)
                                & (hdr.opcode != OP_STORE))
        m.d.comb += self.retired.eq(insn_take)
        with m.If(insn_take):
            m.d.sync += dispatched.eq(dispatched + 1)

        # --------------------------------------------------------------- tokens
        l2c = _TokenCounter(m, "l2c")
        c2l = _TokenCounter(m, "c2l")
        c2s = _TokenCounter(m, "c2s")
        s2c = _TokenCounter(m, "s2c")

        # -------------------------------------------------- LOAD engine + fetch arbitration
        lh = data.View(dma_insn_layout(), load_q.r_data)
        load_ok = Signal()
        m.d.comb += load_ok.eq(load_q.r_rdy & (~lh.pop_next | c2l.available))
        rd_pending = SyncFIFO(width=2, depth=16)      # [is_load, push_next] per command
        m.submodules.rd_pending = rd_pending
        desc = self.rd_cmd.payload
        fetch_sel = Signal()
        load_sel = Signal()
        m.d.comb += [
            fetch_sel.eq(fetch_want & rd_pending.w_rdy),
            load_sel.eq(~fetch_sel & load_ok & rd_pending.w_rdy & running & ~stopped),
            # token decrements as plain ANDs (no X from an empty queue's output in 4-state sims)
            c2l.dec.eq(load_sel & self.rd_cmd.ready & lh.pop_next),
        ]
        with m.If(fetch_sel):
            m.d.comb += [
                self.rd_cmd.valid.eq(1),
                desc.addr.eq(self.prog_base + requested * (INSN_BITS // 8)),
                desc.len0.eq(fetch_n * bpi), desc.n1.eq(1), desc.n2.eq(1),
                desc.sp_addr.eq(0), desc.target.eq(TARGET_INSN),
                fetch_go.eq(self.rd_cmd.ready),
                rd_pending.w_en.eq(self.rd_cmd.ready), rd_pending.w_data.eq(0),
            ]
        with m.Elif(load_sel):
            for f in ("addr", "len0", "n1", "stride1", "n2", "stride2", "sp_addr", "target"):
                m.d.comb += getattr(desc, f).eq(getattr(lh, f))
            m.d.comb += [
                self.rd_cmd.valid.eq(1),
                load_q.r_en.eq(self.rd_cmd.ready),
                rd_pending.w_en.eq(self.rd_cmd.ready),
                rd_pending.w_data.eq(Cat(Const(1, 1), lh.push_next)),
            ]
        with m.If(fetch_go):
            m.d.sync += requested.eq(requested + fetch_n)
        m.d.comb += [rd_pending.r_en.eq(self.rd_done),
                     l2c.inc.eq(self.rd_done & rd_pending.r_data[0] & rd_pending.r_data[1])]

        # ------------------------------------------------------------ STORE engine
        sh_ = data.View(dma_insn_layout(), store_q.r_data)
        wr_pending = SyncFIFO(width=1, depth=16)
        m.submodules.wr_pending = wr_pending
        store_sel = Signal()
        m.d.comb += store_sel.eq(store_q.r_rdy & (~sh_.pop_prev | c2s.available) & wr_pending.w_rdy & running & ~stopped)
        m.d.comb += c2s.dec.eq(store_sel & self.wr_cmd.ready & sh_.pop_prev)
        with m.If(store_sel):
            for f in ("addr", "len0", "n1", "stride1", "n2", "stride2", "sp_addr", "target"):
                m.d.comb += getattr(self.wr_cmd.payload, f).eq(getattr(sh_, f))
            m.d.comb += [
                self.wr_cmd.valid.eq(1),
                store_q.r_en.eq(self.wr_cmd.ready),
                wr_pending.w_en.eq(self.wr_cmd.ready),
                wr_pending.w_data.eq(sh_.push_prev),
            ]
        m.d.comb += [wr_pending.r_en.eq(self.wr_done), s2c.inc.eq(self.wr_done & wr_pending.r_data)]

        # ------------------------------------------------------------ COMPUTE gate
        ch = data.View(compute_insn_layout(), comp_q.r_data)
        comp_ok = Signal()
        m.d.comb += comp_ok.eq(comp_q.r_rdy & (~ch.pop_prev | l2c.available) & (~ch.pop_next | s2c.available))
        comp_sel = Signal()
        m.d.comb += comp_sel.eq(comp_ok & running & ~stopped)
        m.d.comb += [l2c.dec.eq(comp_sel & self.cinsn.ready & ch.pop_prev),
                     s2c.dec.eq(comp_sel & self.cinsn.ready & ch.pop_next)]
        with m.If(comp_sel):
            m.d.comb += [
                self.cinsn.valid.eq(1),
                self.cinsn.payload.eq(comp_q.r_data),
                comp_q.r_en.eq(self.cinsn.ready),
            ]
        m.d.comb += [c2l.inc.eq(self.c_done_read), c2s.inc.eq(self.c_done_write),
                     self.compute_waiting.eq(running & comp_q.r_rdy & ~comp_ok)]

        # ----------------------------------------------------------- run control
        all_idle = Signal()
        m.d.comb += all_idle.eq((dispatched == self.prog_len) & ~load_q.r_rdy & ~comp_q.r_rdy & ~store_q.r_rdy
                                & ~rd_pending.r_rdy & ~wr_pending.r_rdy & self.c_idle & ~self.dma_busy)
        with m.If(self.start & ~running):
            m.d.sync += [running.eq(1), self.done.eq(0), requested.eq(0), dispatched.eq(0),
                         stopped.eq(0), self.error.eq(0), self.error_code.eq(0), self.error_info.eq(0)]
        with m.Elif(running):
            with m.If(~stopped & illegal):
                m.d.sync += [stopped.eq(1), self.error.eq(1), self.error_code.eq(ERR_ILLEGAL_INSN),
                             self.error_info.eq(dispatched)]
            with m.Elif(~stopped & self.fault):
                m.d.sync += [stopped.eq(1), self.error.eq(1), self.error_code.eq(self.fault_code),
                             self.error_info.eq(self.fault_info)]
            # after an error, finish only once the DMA has drained its outstanding bursts
            # (a soft reset before that would leave responses in flight on the bus)
            with m.If((stopped & ~self.dma_busy) | all_idle):
                m.d.sync += [running.eq(0), self.done.eq(1)]
        return m
