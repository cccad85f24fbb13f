"""The DMA's retimed signals against their plain definitions, in the real
:class:`~dnnfab.hw.dma.DMA` (its FIFOs and thermometer counters are proven on their own
in tests/hw/test_retimed.py).

The testbench is an AXI slave with random stalls, latencies and SLVERR responses, a
scratchpad answering reads, a host issuing random read and write descriptors (near 4 KiB
boundaries, several rows and planes, some empty, some outside the output window) and
pulsing ``clear``. Every cycle it checks (names from hw/dma.py):

* write-engine ``credit`` = ``pending < w_buffer`` (and ``pending`` never passes it), with
  every reachable (pending, issue, W beat) combination visited;
* ``busy`` = the plain busy (``rd_busy | wr_busy``) of a cycle ago or a command taken a
  cycle ago, and never low while the plain busy is high;
* ``error`` / ``error_code`` / ``error_addr``: the plain sticky first-error registers fed
  by this cycle's events (read beat > B response > window, in that order), cleared by
  ``clear``; ``err_rd`` and ``err_wr`` equal ``error``; the ``*_q`` outputs are the
  same one cycle late;
* the write intake's flags: ``in_idle``, ``in_mul``, ``w_go`` = in state IDLE / MUL /
  START; ``mul_done`` = both multipliers exhausted (in MUL); the window verdict in CHECK
  = the descriptor's extent against the window; ``wc_lastbeat`` = no beat left;
* both burst generators, while active: ``dm``, ``hm``, ``em``, ``kd``, ``kh`` = their
  differences, ``to4k`` = beats to the 4 KiB boundary, ``blen`` = min(rem, max_burst,
  to4k), the row / plane flags, and ``nrow`` / ``npn`` = the next row's address and the
  first row of the plane after it, against a walk of the descriptor; the initial state
  loaded at a start = the plain one of the command (the intake registers it a cycle
  earlier: condition, the command sits there a cycle before the start).
"""

import random
from collections import deque

import pytest
from amaranth.hdl import Value
from amaranth.lib import data

from dnnfab.hw import dma as dma_mod
from dnnfab.hw.config import AcceleratorConfig
from dnnfab.hw.dma import DMA, Descriptor
from dnnfab.hw.regmap import ERR_AXI_READ, ERR_AXI_WRITE, ERR_OUT_WINDOW


import retimed_lib as lib  # noqa: E402 - on sys.path through tests/hw/conftest.py

WIN_LO, WIN_HI = 0x1000, 0x0F00_0000


def _desc(rng, bb, write, mb):
    P = 4096 // bb
    len0 = rng.choice([1, 2, 3, mb - 1 or 1, mb, mb + 1, 2 * mb + 1, rng.randint(1, 3 * mb + 2)])
    n1 = rng.choice([1, 1, 2, 3])
    n2 = rng.choice([1, 1, 2])
    # rows start just before, at or after a 4 KiB boundary (P - mb - 1: a full burst, then
    # a one-beat burst to the boundary)
    page = rng.randrange(1, 1 << 12)
    addr = page * 4096 + bb * rng.choice([P - 1, P - 2, P - 3, P - len0, P - mb - 1, 0, 1,
                                          rng.randrange(P)]) % (1 << 32)
    s1 = bb * rng.choice([len0, len0 + 1, P, P - 1, rng.randrange(len0, 3 * P)])
    s2 = bb * rng.choice([0, P * 2, rng.randrange(1, 4 * P)])
    r = rng.random()
    if r < 0.04:
        len0 = 0                            # empty commands
    elif r < 0.06:
        n2 = 0
    if write and rng.random() < 0.1:
        addr = bb * rng.randrange(WIN_LO // bb)         # below the output window: error 5
    return Descriptor(addr % (1 << 32), len0, n1, s1, n2, s2, sp_addr=rng.randrange(1 << 16),
                      target=0 if write else rng.randrange(4))


class _GenModel:
    """A plain walk of one descriptor's rows for a burst generator's monitor."""

    def __init__(self, d, cfg):
        bb = cfg.bus_bytes
        self.lb = (bb - 1).bit_length()
        self.mask = (1 << cfg.addr_bits) - 1
        al = lambda v: v & ~(bb - 1) & self.mask       # noqa: E731
        self.a, self.s1, self.s2 = al(d.addr), al(d.stride1) & 0xFFFF_FFFF, al(d.stride2) & 0xFFFF_FFFF
        self.n1, self.n2, self.len0 = d.n1, d.n2, d.len0
        self.i1 = self.i2 = 0

    def row(self, i2, i1):
        return (self.a + i2 * self.s2 + i1 * self.s1) & self.mask

    def next_rows(self):
        """(address of the row after the current one, first row of the plane after it)."""
        if self.i1 + 1 < self.n1:
            return self.row(self.i2, self.i1 + 1), self.row(self.i2 + 1, 0)
        return self.row(self.i2 + 1, 0), self.row(self.i2 + 2, 0)

    def advance_row(self):
        self.i1 += 1
        if self.i1 == self.n1:
            self.i1, self.i2 = 0, self.i2 + 1


def run_dma(seed, *, cycles=2500, bus_bits=64, max_burst=4, w_buffer=8, max_wr_bursts=8, max_rd_bursts=8,
            p_ready=0.6, p_err=0.02, cls=DMA):
    cfg = AcceleratorConfig(bus_bits=bus_bits, max_burst=max_burst)
    bb, MB = cfg.bus_bytes, max_burst
    P = 4096 // bb
    dut = cls(cfg, max_rd_bursts=max_rd_bursts, max_wr_bursts=max_wr_bursts, w_buffer=w_buffer)
    bus = dut.bus
    drv = lib.Driver(dut, [bus.arready, bus.awready, bus.wready, bus.rvalid, bus.rlast, bus.rresp, bus.rdata,
                           bus.bvalid, bus.bresp, dut.sp_rdata, dut.rd_cmd.valid, dut.rd_cmd.payload,
                           dut.wr_cmd.valid, dut.wr_cmd.payload, dut.clear, dut.window_lo, dut.window_hi])
    top = lib.elaborate(drv)
    frag = drv.fragment(top)
    S = lib.finder(frag)
    credit, pending, sp_issue, w_beat = S("credit", ()), S("pending", ()), S("sp_issue", ()), S("w_beat", ())
    rd_busy, wr_busy = S("rd_busy", ()), S("wr_busy", ())
    r_bad, b_bad, win_err, rd_err_addr = S("r_bad", ()), S("b_bad", ()), S("win_err", ()), S("rd_err_addr", ())
    err_rd, err_wr = S("err_rd", ()), S("err_wr", ())
    bfifo = lib.origin(frag, "wr_inflight")
    wdesc = data.View(dma_mod.desc_layout(cfg), S("wdesc", ()))
    rdesc = data.View(dma_mod.desc_layout(cfg), S("rdesc", ()))
    state = S("wr_intake_state", ())
    names = {state.decoder(i).split("/")[0]: i for i in range(8)}
    in_idle, in_mul, w_go, mul_done = S("in_idle", ()), S("in_mul", ()), S("w_go", ()), S("mul_done", ())
    mul1, mul2, win_wrap = S("mul1", ()), S("mul2", ()), S("win_wrap", ())
    win_bad = S("win_bad", ())
    wc_valid, wc_left, wc_lastbeat = S("wc_valid", ()), S("wc_left", ()), S("wc_lastbeat", ())
    gens = {}
    for g in ("rd_bursts", "wr_bursts"):
        gen = lib.origin(frag, g)
        regs = {n: S(n, (g,)) for n in ("cur", "rem", "to4k", "dm", "hm", "em", "kd", "kh", "len0", "n1",
                                        "rows_left", "rows_last", "rows_two", "nrl", "planes_left",
                                        "planes_last", "nrow", "npn", "nrow_offn")}
        gens[g] = (gen, regs)
    rng = random.Random(seed)
    ab_mask = (1 << cfg.addr_bits) - 1
    cover = {"credit": set(), "events": set(), "row_end": set(), "starts": 0}

    def off(a):
        return (a >> ((bb - 1).bit_length())) % P

    async def bench(ctx):
        put = drv.put
        put(dut.window_lo, WIN_LO)
        put(dut.window_hi, WIN_HI)
        ar_q, aw_q, b_q = deque(), deque(), deque()
        rd_next = _desc(rng, bb, False, MB)
        wr_next = _desc(rng, bb, True, MB)
        E = C = A = 0               # the plain first-error registers
        prevE = prevC = prevA = 0
        prev_plain = prev_hs = 0
        models = {"rd_bursts": None, "wr_bursts": None}
        prev_desc = {"rd": None, "wr": None}
        for t in range(cycles):
            where = f"seed {seed} cycle {t}"
            # ------------------------------------------------------------ registers
            busy = ctx.get(dut.busy)
            plain = ctx.get(rd_busy) | ctx.get(wr_busy)
            assert busy == (prev_plain | prev_hs), f"{where}: busy {busy}, plain a cycle ago {prev_plain}|{prev_hs}"
            assert busy or not plain, f"{where}: busy low with the DMA busy"
            e, code, addr = ctx.get(dut.error), ctx.get(dut.error_code), ctx.get(dut.error_addr)
            assert (e, code, addr) == (E, C, A), f"{where}: error {e, code, hex(addr)}, plain {E, C, hex(A)}"
            assert (ctx.get(dut.error_q), ctx.get(dut.error_code_q), ctx.get(dut.error_addr_q)) == (prevE, prevC, prevA)
            assert ctx.get(err_rd) == ctx.get(err_wr) == E, f"{where}: engine copies of the error flag"
            pend, cred = ctx.get(pending), ctx.get(credit)
            assert pend <= w_buffer and cred == (pend < w_buffer), f"{where}: pending {pend}, credit {cred}"
            st = ctx.get(state)
            assert ctx.get(in_idle) == (st == names["IDLE"]), f"{where}: in_idle in state {state.decoder(st)}"
            assert ctx.get(in_mul) == (st == names["MUL"]), f"{where}: in_mul in state {state.decoder(st)}"
            assert ctx.get(w_go) == (st == names["START"]), f"{where}: w_go in state {state.decoder(st)}"
            if st == names["MUL"]:
                assert ctx.get(mul_done) == (ctx.get(mul1) == 0 and ctx.get(mul2) == 0), f"{where}: mul_done"
            if st == names["CHECK"]:
                wd = Descriptor.unpack(ctx.get(Value.cast(wdesc)), cfg)
                lo, end = wd.extent(bb)
                plain_bad = lo < WIN_LO or (end & ab_mask) > WIN_HI or end >> cfg.addr_bits != 0
                if wd.beats:
                    assert ctx.get(win_bad) == plain_bad, f"{where}: window verdict for {wd}"
            if ctx.get(wc_valid):
                assert ctx.get(wc_lastbeat) == (ctx.get(wc_left) == 0), f"{where}: wc_lastbeat"
            for g, (gen, r) in gens.items():
                if not ctx.get(gen.active):
                    continue
                v = {n: ctx.get(s) for n, s in r.items()}
                gm = models[g]
                w = f"{where} {g}"
                assert v["dm"] == v["rem"] - MB - 1 and v["hm"] == v["rem"] - v["to4k"] - 1 \
                    and v["em"] == v["to4k"] - MB - 1, f"{w}: differences {v}"
                assert v["kd"] == v["len0"] - MB - 1 and v["kh"] == v["len0"] - 1 - P, f"{w}: row constants"
                assert v["to4k"] == P - off(v["cur"]), f"{w}: to4k {v['to4k']} at {v['cur']:#x}"
                blen = min(v["rem"], MB, v["to4k"])
                assert (ctx.get(gen.blen), ctx.get(gen.blen_m1), ctx.get(gen.blen_one)) == \
                    (blen, blen - 1, blen == 1), w
                assert v["rows_last"] == (v["rows_left"] == 1) and v["rows_two"] == (v["rows_left"] == 2), w
                assert v["planes_last"] == (v["planes_left"] == 1), w
                assert v["nrl"] == ((v["rows_left"] == 2) or (v["rows_left"] == 1 and v["n1"] == 1)), f"{w}: nrl {v}"
                assert v["rows_left"] == gm.n1 - gm.i1 and v["planes_left"] == gm.n2 - gm.i2, f"{w}: row/plane"
                nrow, npn = gm.next_rows()
                assert (v["nrow"], v["npn"]) == (nrow, npn), \
                    f"{w}: next row {v['nrow']:#x} / plane {v['npn']:#x}, plain {nrow:#x} / {npn:#x}"
                assert v["nrow_offn"] == (~off(v["nrow"])) % P, f"{w}: nrow_offn"
                row_end = v["rem"] <= min(MB, v["to4k"])
                final = row_end and v["rows_left"] == 1 and v["planes_left"] == 1
                assert ctx.get(gen.last) == final, f"{w}: last"
                cover["row_end"].add((row_end, v["to4k"] < MB and v["to4k"] < v["rem"]))

            # --------------------------------------------------------------- inputs
            arv, awv = ctx.get(bus.arvalid), ctx.get(bus.awvalid)
            ar_rdy, aw_rdy, w_rdy = (int(rng.random() < p_ready) for _ in range(3))
            if arv and ar_rdy:
                ar_q.append([ctx.get(bus.arlen) + 1, t + 1 + rng.randint(0, 3)])
            if awv and aw_rdy:
                aw_q.append(ctx.get(bus.awlen) + 1)
            rvalid = rlast = rresp = 0
            if ar_q and ar_q[0][1] <= t and rng.random() < 0.8:
                rvalid, rresp = 1, 2 if rng.random() < p_err else 0
                ar_q[0][0] -= 1
                rlast = int(ar_q[0][0] == 0)
                if rlast:
                    ar_q.popleft()
            bvalid = bresp = 0
            if b_q and b_q[0] <= t and rng.random() < 0.8:
                bvalid, bresp = 1, 2 if rng.random() < p_err else 0
                b_q.popleft()
            put(bus.arready, ar_rdy)
            put(bus.awready, aw_rdy)
            put(bus.wready, w_rdy)
            put(bus.rvalid, rvalid)
            put(bus.rlast, rlast)
            put(bus.rresp, rresp)
            put(bus.rdata, t)      # (the data are not checked here)
            put(bus.bvalid, bvalid)
            put(bus.bresp, bresp)
            put(dut.rd_cmd.valid, 1)
            put(dut.rd_cmd.payload.as_value(), rd_next.pack(cfg))
            put(dut.wr_cmd.valid, 1)
            put(dut.wr_cmd.payload.as_value(), wr_next.pack(cfg))
            clear = int(rng.random() < (0.25 if E else 0.03))
            put(dut.clear, clear)
            drv.flush(ctx)
            # ------------------------------------------------------ comb after inputs
            if ctx.get(bus.wvalid) and w_rdy and ctx.get(bus.wlast):
                b_q.append(t + 1 + rng.randint(0, 4))
            cover["credit"].add((pend, ctx.get(sp_issue), ctx.get(w_beat)))
            evs = [(ctx.get(r_bad), ERR_AXI_READ, ctx.get(rd_err_addr)),
                   (ctx.get(b_bad), ERR_AXI_WRITE, ctx.get(bfifo.r_data) & ab_mask),
                   (ctx.get(win_err), ERR_OUT_WINDOW, ctx.get(wdesc.addr))]
            fired = [x for x in evs if x[0]]
            cover["events"].add(tuple(x[1] for x in fired))
            hs_rd = ctx.get(dut.rd_cmd.ready)
            hs_wr = ctx.get(dut.wr_cmd.ready)
            # the initial state a start loads: the plain one of the command
            for g, kind, dsig in (("rd_bursts", "rd", rdesc), ("wr_bursts", "wr", wdesc)):
                gen, _ = gens[g]
                if ctx.get(gen.start):
                    cover["starts"] += 1
                    raw = ctx.get(Value.cast(dsig))
                    assert raw == prev_desc[kind], f"{where}: {g} started from a descriptor that just changed"
                    d = Descriptor.unpack(raw, cfg)
                    ini = ctx.get(gen.init)
                    a = d.addr & ~(bb - 1)
                    o = off(a)
                    plain_init = {"cur": a, "rem": d.len0, "to4k": P - o, "dm": d.len0 - MB - 1,
                                  "hm": d.len0 + o - P - 1, "em": P - MB - 1 - o, "kd": d.len0 - MB - 1,
                                  "kh": d.len0 - P - 1, "len0": d.len0, "n1": d.n1,
                                  "n1_one": d.n1 == 1, "n1_two": d.n1 == 2, "rows_left": d.n1,
                                  "rows_last": d.n1 == 1, "rows_two": d.n1 == 2, "nrl": d.n1 in (1, 2),
                                  "planes_left": d.n2, "planes_last": d.n2 == 1,
                                  "sp": d.sp_addr, "target": d.target}
                    got = {k: int(getattr(ini, k)) for k in plain_init}
                    assert got == {k: int(v) for k, v in plain_init.items()}, f"{where}: {g} initial state"
                    models[g] = gm = _GenModel(d, cfg)
                    assert (int(ini.nrow), int(ini.npn)) == gm.next_rows(), f"{where}: {g} initial next rows"
            for g, (gen, r) in gens.items():
                if ctx.get(gen.active) and ctx.get(gen.next) and not ctx.get(gen.abort):
                    v_rem, v_to4k = ctx.get(r["rem"]), ctx.get(r["to4k"])
                    if v_rem <= min(MB, v_to4k):
                        models[g].advance_row()
            prev_desc = {"rd": ctx.get(Value.cast(rdesc)), "wr": ctx.get(Value.cast(wdesc))}
            prevE, prevC, prevA = E, C, A
            if fired:
                cover["events"].add(("while set" if E else "first") + (" with clear" if clear else ""))
            if fired and (not E or clear):
                C, A = fired[0][1], fired[0][2]
            elif clear:
                C = A = 0
            E = int(bool(fired) or (E and not clear))
            prev_plain = plain
            prev_hs = hs_rd | hs_wr
            await ctx.tick()
            if hs_rd:
                rd_next = _desc(rng, bb, False, MB)
            if hs_wr:
                wr_next = _desc(rng, bb, True, MB)

    lib.simulate(top, bench)
    return cover


def _credit_reachable(wb):
    return {(p, s, b) for p in range(wb + 1) for s in (0, 1) for b in (0, 1)
            if (not s or p < wb) and (not b or p > 0)}


def _missing(cover, w_buffer):
    """What a run (or runs) left uncovered: credit states, error kinds, burst kinds."""
    miss = sorted(_credit_reachable(w_buffer) - cover["credit"])
    codes = {x for e in cover["events"] if isinstance(e, tuple) for x in e}
    miss += [f"error {c}" for c in (ERR_AXI_READ, ERR_AXI_WRITE, ERR_OUT_WINDOW) if c not in codes]
    tags = {e for e in cover["events"] if isinstance(e, str)}
    miss += [f"event {w}" for w in ("first", "while set", "with clear") if not any(w in e for e in tags)]
    miss += [f"burst {b}" for b in ((True, False), (False, False), (False, True)) if b not in cover["row_end"]]
    return miss


@pytest.mark.parametrize("seed,bus_bits,max_burst,w_buffer,max_wr_bursts,p_ready", [
    (4, 64, 4, 8, 8, 0.6), (2, 64, 4, 3, 2, 0.5), (5, 128, 16, 4, 4, 0.6)])
def test_dma_retimed_signals(seed, bus_bits, max_burst, w_buffer, max_wr_bursts, p_ready):
    """(w_buffer 8, 8 write bursts: the accelerator's DMA; smaller ones fill sooner.) Runs
    of 1200 cycles until every reachable (pending, issue, W beat), each error kind, an
    error while one is kept, an error with a clear, and each kind of burst (row end, full
    burst, to the 4 KiB boundary) have been seen (at most four runs)."""
    total = {"credit": set(), "events": set(), "row_end": set(), "starts": 0}
    for k in range(4):
        cover = run_dma(seed + 100 * k, cycles=1200, bus_bits=bus_bits, max_burst=max_burst, w_buffer=w_buffer,
                        max_wr_bursts=max_wr_bursts, p_ready=p_ready)
        for key in ("credit", "events", "row_end"):
            total[key] |= cover[key]
        total["starts"] += cover["starts"]
        if not _missing(total, w_buffer):
            break
    assert not _missing(total, w_buffer), _missing(total, w_buffer)
    assert total["starts"] > 50


def test_dma_proof_catches_a_credit_one_too_many():
    # the credit ignoring an issue in the cycle the count reaches w_buffer - 1
    bad = lib.mutant(DMA, "| ((pending == self.w_buffer - 1) & ~sp_issue))",
                     "| (pending == self.w_buffer - 1))")
    with pytest.raises(AssertionError, match=r"pending \d+, credit"):
        run_dma(2, cycles=600, w_buffer=3, max_wr_bursts=2, p_ready=0.5, cls=bad)


def test_dma_proof_catches_a_stale_one_beat_flag():
    # ``blen == 1`` not registered for the one-beat burst that follows a full burst to
    # one beat before a 4 KiB boundary (the row start P - max_burst - 1)
    from dnnfab.hw.dma import _BurstGen
    gen = lib.mutant(_BurstGen, "n_to4k_one.eq(em[:bw] == 0)", "n_to4k_one.eq(0)")
    bad = lib.mutant(DMA, _BurstGen=gen)
    with pytest.raises(AssertionError, match=r"cycle \d+ (wr|rd)_bursts"):
        for k in range(4):
            run_dma(5 + 100 * k, cycles=1200, bus_bits=128, max_burst=16, w_buffer=4, max_wr_bursts=4,
                    p_ready=0.6, cls=bad)
