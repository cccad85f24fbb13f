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
  errors, scratchpad range errors) or an illegal instruction ends the run with ``error``
  (a fault's code and address are taken from registered copies, a cycle after the fault
  stopped dispatch; ``error`` rises with them).

Fmax: ``rd_cmd``, ``wr_cmd`` and ``cinsn`` are registers (no combinational path between the
queues and the DMA / compute engine; a register takes a new command only when empty, the
consumers never accept two in consecutive cycles); each engine first moves its queue's
head into a head register; the fetch decision, FIFO flags and token availability are
registered, and so are ``start`` and copies of ``prog_base``/``prog_len``. Cycle cost
against a purely combinational controller: the first fetch command three cycles later
after ``start`` (with the CSR bank's registered write: ``START_LATENCY`` in the fast model),
and a command two cycles later through an empty queue (queue write, head register,
command register).
"""

from amaranth.hdl import Signal, Module, Const, Cat, Mux, unsigned
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out
from amaranth.lib.fifo import SyncFIFO

from .config import AcceleratorConfig
from .dma import RegFIFO
from .pe import dreg
from .spec import ERR_ILLEGAL_INSN, FETCH_CHUNK, QUEUE_DEPTH, TOKEN_BITS
from .isa import (INSN_BITS, OP_LOAD, OP_COMPUTE, OP_STORE, TARGET_INSN, dma_insn_layout,
                  compute_insn_layout, insn_layout)

__all__ = ["Controller", "ERR_ILLEGAL_INSN", "FETCH_CHUNK", "QUEUE_DEPTH"]

_CHUNK_LOG2 = FETCH_CHUNK.bit_length() - 1
assert FETCH_CHUNK == 1 << _CHUNK_LOG2


class _TokenCounter:
    """Counting semaphore with a registered ``available`` flag (Fmax).

    ``dec`` is applied to ``count`` one cycle late (``dec_d``), so neither the counter nor
    the flag sits behind a long path: ``available`` is 1 iff the effective count
    ``count - dec_d`` is non-zero, and ``dec`` may only be raised while it is 1.

    Proved equal to the plain counter (``available`` = count > 0) on every reachable
    state, counts 0..255: tests/hw/test_retimed.py::test_token_counter_exhaustive.
    """

    def __init__(self, m, name):
        self.count = Signal(TOKEN_BITS, name=f"tok_{name}")
        self.inc = Signal(name=f"tok_{name}_inc")
        self.dec = Signal(name=f"tok_{name}_dec")
        self.available = Signal(name=f"tok_{name}_avail")
        dec_d = Signal(name=f"tok_{name}_dec_d")
        c = self.count
        ge2 = Signal(name=f"tok_{name}_ge2")    # count - dec_d >= 2
        eq1 = Signal(name=f"tok_{name}_eq1")    # count - dec_d == 1
        m.d.comb += [
            # count >= 3, or count == 2 with no decrement pending (count is never 0 while
            # dec_d is set: dec is raised only while available)
            ge2.eq((c[2:] != 0) | (c == 3) | ((c == 2) & ~dec_d)),
            eq1.eq(((c == 1) & ~dec_d) | ((c == 2) & dec_d)),
        ]
        m.d.sync += [
            dec_d.eq(self.dec),
            self.count.eq(self.count + self.inc - dec_d),
            self.available.eq(self.inc | ge2 | (eq1 & ~self.dec)),
        ]


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
        A fault detected elsewhere (DMA, scratchpads); its code and address are read
        a cycle after ``fault`` rises, and must be registered at their source then.
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
        stopped = Signal()      # error: dispatch no more
        m.d.comb += self.busy.eq(running)

        # ---------------------------------------------------------------- fetch
        beat_depth = 2 * FETCH_CHUNK * bpi
        beats = RegFIFO(bus, beat_depth, late_write=False)
        m.submodules.beats = beats
        m.d.comb += [beats.w_en.eq(self.ins_we), beats.w_data.eq(self.ins_data)]
        # The fetch decision is registered (Fmax): ``remaining`` counts down the
        # instructions not yet requested, ``fetch_n``/``rem_nz`` are derived from it one
        # cycle later and ``fetch_want`` one cycle after that, so a fetch command issues at
        # most every fifth cycle (a chunk is 8 instructions = 8 * bpi beats, far apart).
        # Room (``free``) only grows between two fetches, so a one-cycle-old room check is
        # safe. (Checked against the plain definitions every cycle:
        # tests/hw/test_retimed_controller.py.)
        def chunk(n):
            """min(n, FETCH_CHUNK): the instructions the next fetch asks for."""
            return Mux(n[_CHUNK_LOG2:].any(), FETCH_CHUNK, n[:_CHUNK_LOG2])

        # (``remaining`` and ``fetch_addr`` are data registers, ``dreg``: a start loads both,
        # and they are read only while running; so are the instruction slots ``insn`` and
        # the ``dispatched`` count, which a start clears. Every reset flip-flop hangs on the
        # controller's one ``rst | SOFT_RESET`` net: 505 of them with these, and from that
        # net one more LUT ORs in the start to clear the run-control and error registers,
        # which was the whole design's worst path, 7.1 ns with 5.7 of routing; about 220
        # without them, and ``dispatched`` is cleared by the start alone.)
        remaining = dreg(32, name="remaining")      # instructions not yet requested
        # beat FIFO slots neither filled nor reserved by a fetch in flight
        # (= beat_depth - FIFO level - beats requested but not yet arrived)
        free = Signal(range(beat_depth + 1), init=beat_depth)
        fetch_n = Signal(range(FETCH_CHUNK + 1))   # min(remaining, FETCH_CHUNK), registered
        rem_nz = Signal()                          # remaining != 0, registered
        fetch_addr = dreg(32, name="fetch_addr")    # DRAM address of the next instruction to request
        fetch_want = Signal()       # registered: issue a fetch command this cycle
        fetch_go = Signal()
        fetch_go_d = Signal()
        fetch_go_dd = Signal()
        fetch_go_ddd = Signal()
        # (``remaining`` is split into registered flags first: whether any bit from
        # FETCH_CHUNK up is set, an OR of 29 bits, and the low bits; ``fetch_n`` and
        # ``rem_nz`` follow a cycle later. The OR and the select in one cycle were the
        # whole design's last late path, 6.8 ns. A start loads all of them from the
        # PROG_LEN copies, so the first fetch is not delayed; later fetches come at most
        # every fifth cycle, still far apart.)
        rem_hi = Signal()
        rem_lo = Signal(_CHUNK_LOG2)
        m.d.sync += [
            rem_hi.eq(remaining[_CHUNK_LOG2:].any()),
            rem_lo.eq(remaining[:_CHUNK_LOG2]),
            fetch_n.eq(Mux(rem_hi, FETCH_CHUNK, rem_lo)),
            rem_nz.eq(rem_hi | rem_lo.any()),
            fetch_go_d.eq(fetch_go),
            fetch_go_dd.eq(fetch_go_d),
            fetch_go_ddd.eq(fetch_go_dd),
            fetch_want.eq(running & ~stopped & rem_nz & (fetch_n * bpi <= free) & ~fetch_go & ~fetch_go_d
                          & ~fetch_go_dd & ~fetch_go_ddd),
        ]
        # The fetch's bookkeeping (``remaining``, ``fetch_addr``, ``free``) is updated a
        # cycle after the fetch, with ``fetch_go_d`` (a flip-flop) as the enable: from
        # ``fetch_go`` (fetch_want & rd_gate & ~rd_cmd.valid) the enable of those 70
        # flip-flops was a placement's worst path, 7.29 ns with 6.06 of routing. Nothing reads
        # them in between: the descriptor took ``fetch_addr`` / ``fetch_n`` in the fetch's
        # cycle, and the next fetch decision waits four cycles (``fetch_go_ddd``).
        with m.If(fetch_go_d):
            m.d.sync += [remaining.eq(remaining - fetch_n),
                         fetch_addr.eq(fetch_addr + fetch_n * (INSN_BITS // 8)),
                         free.eq(free - fetch_n * bpi + beats.r_en)]
        with m.Elif(beats.r_en):
            m.d.sync += free.eq(free + 1)

        # ------------------------------------------------------------- gearbox
        # The opcode is decoded as the instruction is assembled (registered one-hot flags),
        # so dispatch is a few gates from registers.
        insn = dreg(INSN_BITS, name="insn")     # (read only while ``insn_valid``)
        insn_valid = Signal()
        insn_take = Signal()
        gcount = Signal(range(bpi + 1))
        is_load, is_comp, is_store, is_bad = Signal(), Signal(), Signal(), Signal()
        m.d.comb += beats.r_en.eq(~insn_valid & beats.r_rdy)
        # beat k of an instruction goes to slot k; the slot's enable does not wait for the
        # FIFO (a slot written without a beat is rewritten before the instruction is valid),
        # which keeps the wide enables off the FIFO's ready path
        for k in range(bpi):
            with m.If(~insn_valid & (gcount == k)):
                m.d.sync += insn[k * bus:(k + 1) * bus].eq(beats.r_data)
        op = beats.r_data[:3] if bpi == 1 else insn[:3]     # at the last beat
        with m.If(beats.r_en):
            with m.If(gcount == bpi - 1):
                m.d.sync += [
                    gcount.eq(0), insn_valid.eq(1),
                    is_load.eq(op == OP_LOAD), is_comp.eq(op == OP_COMPUTE),
                    is_store.eq(op == OP_STORE),
                    is_bad.eq((op != OP_LOAD) & (op != OP_COMPUTE) & (op != OP_STORE)),
                ]
            with m.Else():
                m.d.sync += gcount.eq(gcount + 1)
        with m.If(insn_take):
            m.d.sync += insn_valid.eq(0)

        # ---------------------------------------------------------- dispatcher
        load_q = RegFIFO(INSN_BITS, QUEUE_DEPTH)
        comp_q = RegFIFO(INSN_BITS, QUEUE_DEPTH)
        store_q = RegFIFO(INSN_BITS, QUEUE_DEPTH)
        m.submodules.load_q, m.submodules.comp_q, m.submodules.store_q = load_q, comp_q, store_q
        dispatched = dreg(32, name="dispatched")    # (cleared by a start: no reset needed)
        illegal = Signal()
        for q in (load_q, comp_q, store_q):
            m.d.comb += q.w_data.eq(insn)
        # (insn_valid is only set while running: fetches stop at prog_len and after an
        # error. After an error, instructions already fetched may still move into the
        # queues, where they stay: the engines' gates are closed, and the datapath is
        # reset with SOFT_RESET before the next run. ``stopped`` is not on this path: it
        # was at the start of the dispatcher's worst path, 7.5 ns.)
        can = insn_valid
        m.d.comb += [
            load_q.w_en.eq(can & is_load & load_q.w_rdy),
            comp_q.w_en.eq(can & is_comp & comp_q.w_rdy),
            store_q.w_en.eq(can & is_store & store_q.w_rdy),
            insn_take.eq(load_q.w_en | comp_q.w_en | store_q.w_en),
            illegal.eq(can & is_bad),
        ]
        m.d.comb += self.retired.eq(insn_take)
        # counted a cycle after the dispatch (the take is the dispatcher's deepest signal;
        # the next instruction is valid two cycles after a take at the earliest, so an
        # illegal instruction still sees the count of those before it)
        take_q = Signal()
        m.d.sync += take_q.eq(insn_take)
        with m.If(take_q):
            m.d.sync += dispatched.eq(dispatched + 1)

        # --------------------------------------------------------------- tokens
        l2c = _TokenCounter(m, "l2c")
        c2l = _TokenCounter(m, "c2l")
        c2s = _TokenCounter(m, "c2s")
        s2c = _TokenCounter(m, "s2c")

        # ------------------------------------------------------------ engines
        # Each engine moves its queue's head into a head register (``*_h``) whenever that
        # is empty, and from there, once the tokens it pops are available, into its command
        # register: ``rd_cmd``, ``wr_cmd`` and ``cinsn`` are registers (Fmax, and no
        # combinational path between the queues and the DMA / compute engine). A command
        # moves into its register only when the register is empty: the DMA and the compute
        # engine never accept two commands in consecutive cycles anyway. ``*_gate`` are
        # registered preconditions (running, no error, room in the pending FIFO: the
        # pending FIFOs are written one cycle after the command, so the check is
        # conservative by two entries).
        def head(q, layout, name):
            valid = Signal(name=f"{name}_h_valid")
            payload = dreg(INSN_BITS, name=f"{name}_h")
            take = Signal(name=f"{name}_h_take")
            m.d.comb += q.r_en.eq(~valid & q.r_rdy)
            with m.If(~valid):
                m.d.sync += payload.eq(q.r_data)    # (kept only with r_en)
            with m.If(q.r_en):
                m.d.sync += valid.eq(1)
            with m.Elif(take):
                m.d.sync += valid.eq(0)
            return valid, data.View(layout, payload), take

        rd_pending = SyncFIFO(width=2, depth=16)      # [is_load, push_next] per command
        m.submodules.rd_pending = rd_pending
        wr_pending = SyncFIFO(width=1, depth=16)      # [push_prev] per STORE
        m.submodules.wr_pending = wr_pending
        rd_gate = Signal()
        wr_gate = Signal()
        c_gate = Signal()
        m.d.sync += [
            rd_gate.eq(running & ~stopped & (rd_pending.level < rd_pending.depth - 2)),
            wr_gate.eq(running & ~stopped & (wr_pending.level < wr_pending.depth - 2)),
            c_gate.eq(running & ~stopped),
        ]

        # -- LOAD engine + fetch arbitration (fetches first)
        lh_valid, lh, lh_take = head(load_q, dma_insn_layout(), "load")
        # (the command payloads are data registers without reset: ``dreg``)
        desc = dreg(self.rd_cmd.payload.shape(), name="rd_p")
        m.d.comb += self.rd_cmd.payload.eq(desc)
        fetch_sel = Signal()
        load_sel = Signal()
        m.d.comb += [
            fetch_sel.eq(fetch_want & rd_gate & ~self.rd_cmd.valid),
            load_sel.eq(~fetch_want & lh_valid & (~lh.pop_next | c2l.available) & rd_gate
                        & ~self.rd_cmd.valid),
            # token decrements as plain ANDs (no X from an empty queue's output in 4-state sims)
            c2l.dec.eq(load_sel & lh.pop_next),
            lh_take.eq(load_sel),
            fetch_go.eq(fetch_sel),
        ]
        rdp_we = Signal()
        rdp_data = Signal(2)
        m.d.sync += [rdp_we.eq(fetch_sel | load_sel), rdp_data.eq(Cat(load_sel, lh.push_next))]
        m.d.comb += [rd_pending.w_en.eq(rdp_we), rd_pending.w_data.eq(rdp_data)]
        with m.If(self.rd_cmd.ready):
            m.d.sync += self.rd_cmd.valid.eq(0)
        fdesc = Signal.like(desc)
        m.d.comb += [
            fdesc.addr.eq(fetch_addr), fdesc.len0.eq(fetch_n * bpi), fdesc.n1.eq(1),
            fdesc.n2.eq(1), fdesc.target.eq(TARGET_INSN),
        ]
        ldesc = Signal.like(desc)
        for f in ("addr", "len0", "n1", "stride1", "n2", "stride2", "sp_addr", "target"):
            m.d.comb += getattr(ldesc, f).eq(getattr(lh, f))
        # the payload registers load whenever their command register is empty (what they
        # take while nothing is selected is never presented): enables straight from a FF
        with m.If(~self.rd_cmd.valid):
            # fetch_sel implies fetch_want, load_sel its complement
            m.d.sync += desc.eq(Mux(fetch_want, fdesc, ldesc))
        with m.If(fetch_sel | load_sel):
            m.d.sync += self.rd_cmd.valid.eq(1)
        m.d.comb += [rd_pending.r_en.eq(self.rd_done),
                     l2c.inc.eq(self.rd_done & rd_pending.r_data[0] & rd_pending.r_data[1])]

        # -- STORE engine
        sh_valid, sh_, sh_take = head(store_q, dma_insn_layout(), "store")
        store_sel = Signal()
        m.d.comb += [
            store_sel.eq(sh_valid & (~sh_.pop_prev | c2s.available) & wr_gate & ~self.wr_cmd.valid),
            c2s.dec.eq(store_sel & sh_.pop_prev),
            sh_take.eq(store_sel),
        ]
        wrp_we = Signal()
        wrp_data = Signal()
        m.d.sync += [wrp_we.eq(store_sel), wrp_data.eq(sh_.push_prev)]
        m.d.comb += [wr_pending.w_en.eq(wrp_we), wr_pending.w_data.eq(wrp_data)]
        with m.If(self.wr_cmd.ready):
            m.d.sync += self.wr_cmd.valid.eq(0)
        wr_p = dreg(self.wr_cmd.payload.shape(), name="wr_p")
        m.d.comb += self.wr_cmd.payload.eq(wr_p)
        with m.If(~self.wr_cmd.valid):
            for f in ("addr", "len0", "n1", "stride1", "n2", "stride2", "sp_addr", "target"):
                m.d.sync += getattr(wr_p, f).eq(getattr(sh_, f))
        with m.If(store_sel):
            m.d.sync += self.wr_cmd.valid.eq(1)
        m.d.comb += [wr_pending.r_en.eq(self.wr_done), s2c.inc.eq(self.wr_done & wr_pending.r_data)]

        # -- COMPUTE gate
        ch_valid, ch, ch_take = head(comp_q, compute_insn_layout(), "comp")
        comp_ok = Signal()
        m.d.comb += comp_ok.eq(ch_valid & (~ch.pop_prev | l2c.available) & (~ch.pop_next | s2c.available))
        comp_sel = Signal()
        m.d.comb += [
            comp_sel.eq(comp_ok & c_gate & ~self.cinsn.valid),
            l2c.dec.eq(comp_sel & ch.pop_prev),
            s2c.dec.eq(comp_sel & ch.pop_next),
            ch_take.eq(comp_sel),
        ]
        with m.If(self.cinsn.ready):
            m.d.sync += self.cinsn.valid.eq(0)
        c_p = dreg(self.cinsn.payload.shape(), name="cinsn_p")
        m.d.comb += self.cinsn.payload.eq(c_p)
        with m.If(~self.cinsn.valid):
            m.d.sync += c_p.eq(ch.as_value())
        with m.If(comp_sel):
            m.d.sync += self.cinsn.valid.eq(1)
        m.d.comb += [c2l.inc.eq(self.c_done_read), c2s.inc.eq(self.c_done_write),
                     self.compute_waiting.eq(running & ch_valid & ~comp_ok)]

        # after an error no command is left behind for the next run
        with m.If(stopped):
            m.d.sync += [self.rd_cmd.valid.eq(0), self.wr_cmd.valid.eq(0), self.cinsn.valid.eq(0)]

        # ----------------------------------------------------------- run control
        # ``all_dispatched`` is registered (a 32-bit compare); it only matters once the
        # queues have drained, long after the last dispatch.
        # The program registers and the start pulse come from the CSR bank, which sits
        # apart from this block: they are registered here first, and what the start loads
        # is precomputed from the copies (PROG_BASE / PROG_LEN are written over AXI-Lite
        # well before START, so the copies have settled by then). Start therefore acts one
        # cycle after the CTRL write lands.
        start = Signal()
        prog_len = dreg(32, name="prog_len_q")
        prog_base = dreg(32, name="prog_base_q")
        len_nz = dreg(name="prog_len_nz")
        len_n = dreg(range(FETCH_CHUNK + 1), name="prog_len_n")
        len_hi = dreg(name="prog_len_hi")
        len_lo = dreg(_CHUNK_LOG2, name="prog_len_lo")
        # (the ORs over PROG_LEN's bits are taken in two registered steps, bytes first, at
        # the same latency: ``prog_len != 0`` in one cycle, 32 inputs, was a placement's
        # late path, 6.68 ns)
        nz_parts = dreg(4, name="prog_len_nz_parts")    # byte k of PROG_LEN != 0
        hi_parts = dreg(4, name="prog_len_hi_parts")    # byte k of PROG_LEN >> 3 != 0
        m.d.sync += [start.eq(self.start), prog_len.eq(self.prog_len), prog_base.eq(self.prog_base),
                     nz_parts.eq(Cat(*(self.prog_len[8 * k:8 * k + 8].any() for k in range(4)))),
                     hi_parts.eq(Cat(self.prog_len[_CHUNK_LOG2:8].any(),
                                     *(self.prog_len[8 * k:8 * k + 8].any() for k in range(1, 4)))),
                     len_nz.eq(nz_parts.any()),
                     len_n.eq(Mux(hi_parts.any(), FETCH_CHUNK, prog_len[:_CHUNK_LOG2])),
                     len_hi.eq(hi_parts.any()), len_lo.eq(prog_len[:_CHUNK_LOG2])]
        all_dispatched = Signal()
        m.d.sync += all_dispatched.eq(dispatched == prog_len)
        # the DMA's busy flag (a register there) is registered again here (it crosses the
        # die: 7.5 ns when the controller's run control read it directly), OR-ed with a
        # command handed over in the same cycle, so it is high from the cycle after the
        # handover, as the DMA's own flag is
        dma_busy = Signal()
        m.d.sync += dma_busy.eq(self.dma_busy | (self.rd_cmd.valid & self.rd_cmd.ready)
                                | (self.wr_cmd.valid & self.wr_cmd.ready))
        f_pend = Signal()
        # ``all_idle`` is registered too (done follows one cycle later): once true within a
        # run it stays true (everything dispatched, nothing in flight); a start clears it
        all_idle = Signal()
        m.d.sync += all_idle.eq(all_dispatched & ~load_q.r_rdy & ~comp_q.r_rdy & ~store_q.r_rdy
                                & ~load_q.we_d & ~comp_q.we_d & ~store_q.we_d
                                & ~lh_valid & ~ch_valid & ~sh_valid
                                & ~rd_pending.r_rdy & ~wr_pending.r_rdy & ~rdp_we & ~wrp_we
                                & ~self.rd_cmd.valid & ~self.wr_cmd.valid & ~self.cinsn.valid
                                & self.c_idle & ~dma_busy)
        with m.If(start & ~running):
            m.d.sync += [running.eq(1), self.done.eq(0), dispatched.eq(0), all_dispatched.eq(0),
                         all_idle.eq(0),
                         remaining.eq(prog_len), fetch_addr.eq(prog_base),
                         fetch_n.eq(len_n), rem_nz.eq(len_nz), rem_hi.eq(len_hi), rem_lo.eq(len_lo),
                         stopped.eq(0), self.error.eq(0), self.error_code.eq(0), self.error_info.eq(0)]
        with m.Elif(running):
            with m.If(~stopped & illegal):
                m.d.sync += [stopped.eq(1), self.error.eq(1), self.error_code.eq(ERR_ILLEGAL_INSN),
                             self.error_info.eq(dispatched)]
            with m.Elif(~stopped & self.fault):
                m.d.sync += [stopped.eq(1), f_pend.eq(1)]
            # the fault's code and address are taken a cycle later, as registered by their
            # source (the DMA's error muxes across the die were 6.8-7.7 ns paths); the
            # error flag waits for them, so status never shows an error without its code
            with m.If(f_pend):
                m.d.sync += [f_pend.eq(0), self.error.eq(1), self.error_code.eq(self.fault_code),
                             self.error_info.eq(self.fault_info)]
            # after an error, finish only once the DMA has drained its outstanding bursts
            # (a soft reset before that would leave responses in flight on the bus), and not
            # while a command is presented: one selected as the error stopped the run can be
            # handed over in that cycle, which ``dma_busy`` (registered) shows only a cycle
            # later (tests/hw/test_retimed_controller.py::test_controller_stop_while_a_command_is_handed_over).
            # (Tried: ``stopped & ~rd_cmd.valid & ~wr_cmd.valid`` as one register computed from
            # the three next states. Its input cone runs through the command selects and was
            # the critical path of a placement, 6.9 ns; read directly, the two flags cost one
            # LUT level on done's enable, from flip-flops only.)
            with m.If((stopped & ~dma_busy & ~self.rd_cmd.valid & ~self.wr_cmd.valid) | all_idle):
                m.d.sync += [running.eq(0), self.done.eq(1)]
        return m
