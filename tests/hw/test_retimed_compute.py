"""The compute engine's (and the systolic array's) retimed signals against their plain
definitions, in the real :class:`~dnnfab.hw.compute.ComputeEngine` /
:class:`~dnnfab.hw.systolic.SystolicArray` (the feeders' credit counters and the job
queues' head register are proven on their own in tests/hw/test_retimed.py).

Exhaustive:

* the activation feeder's issue register and ``started`` (446d4c9, ea826a4): the real
  expressions (``go_i``, ``go_n``, ``st_i``, ``st_n``, ``started_nx``, the registers'
  next values, cut out of the elaborated engine with :func:`retimed_lib.cone`) over every
  combination of their inputs, against the definitions before those commits
  (``started & credit & ~blocked`` from the plain next values); equal exactly where an
  issue implies ``started``, and that condition is inductive (it holds after reset and
  every next state keeps it), so it holds on every reachable state;
* the array's registered ``wgt.ready`` (411088b) = ``~shadow_full & (drain == 0)``: the
  real array put into every (shadow_full, drain, wrow, output valid) state, every input
  combination, one clock.

In place (a random stream of small conv instructions: 1- and 2-pixel tiles, 1x1..3x3
kernels, strides 1-3, dilation, padding, several channel blocks), every cycle:

* every activation issue reads the plain im2col position's address, with the plain
  inside-the-image flag and first-of-tile flag, in loop order (kh, kw, cb, oh, ow): the
  look-ahead registers (``row_nx``, ``tile_nx``, the coordinate twins), the K-tile step
  a cycle after the jump (``jump_q``) and the registered step selects (``t_cb`` ..
  ``t_last``, checked at every jump against the counters) together; ``a_issue`` implies
  ``started``;
* every weight issue reads the job's next row; neither feeder writes its FIFO while
  full (the credits' purpose);
* every back-end beat has the plain accumulator / output addresses and first / last
  flags of its (K tile, pixel) (loads from flip-flops, ``bq`` / ``bj``);
* ``room``: no job queue is pushed while full; ``dstate`` is one-hot; ``done_read`` pulses
  when both feeders are done with a ``push_prev`` job (plain release rule with the
  registered delays); ``idle`` = the plain idle of three cycles ago with no instruction
  offered three, two or one cycle ago, never high with work in flight.
"""

import itertools
import random

import pytest
from amaranth.hdl import Signal, Value, signed, unsigned
from amaranth.lib import data

from dnnfab.hw.compute import ComputeEngine
from dnnfab.hw.config import AcceleratorConfig
from dnnfab.hw.spec import Compute
from dnnfab.hw.systolic import SystolicArray
from dnnfab.hw.spec import array_latency as latency


import retimed_lib as lib  # noqa: E402 - on sys.path through tests/hw/conftest.py

CFG = AcceleratorConfig(rows=2, cols=2, acc_kib=1)


def _job_layout():
    (lay,) = lib.source_locals(ComputeEngine.elaborate, ["act_job_layout"],
                               {"data": data, "signed": signed, "unsigned": unsigned, "A": 20})
    return lay


# ============================================================ the feeder's issue register
ISSUE_COMB = ["go_i", "go_n", "st_i", "st_n", "started_nx", "a_issue", "a_start", "tile_jump"]


def check_issue_register(cls=ComputeEngine):
    """Returns (combinations checked, combinations outside the condition that differ)."""
    dut = cls(CFG)
    frag = lib.elaborate(dut)
    m, outs, leaves = lib.cone(frag, comb=ISSUE_COMB, sync=["a_issue_r", "started"])
    assert set(leaves) == {"J", "aj", "a_cnt", "a_issue_r", "a_pop", "aj_valid", "c_oh", "c_ow",
                           "jump_q", "started", "$signal"}, sorted(leaves)
    # the unnamed leaf is t_last (registered last_cb & last_kw & last_kh)
    t_last = leaves["$signal"]
    S = lib.finder(frag)
    drivers = [st for st in frag.statements["sync"] if getattr(st, "lhs", None) is t_last]
    assert len(drivers) == 1 and {s.name for s in drivers[0].rhs._rhs_signals()} == {"c_cb", "c_kw", "c_kh"}
    assert leaves["a_cnt"] is S("a_cnt", ())
    lay = _job_layout()
    J, aj = data.View(lay, leaves["J"]), data.View(lay, leaves["aj"])
    assert len(leaves["J"]) == lay.size
    a_cnt = leaves["a_cnt"]
    AD = len(a_cnt)
    c_ow, c_oh = leaves["c_ow"], leaves["c_oh"]
    drv = lib.Driver(m, [leaves[n] for n in sorted(leaves)])
    top = lib.elaborate(drv)
    rng = random.Random(0)
    result = {"checked": 0, "outside": 0}

    async def bench(ctx):
        put = drv.put
        for bits in itertools.product((0, 1), repeat=11):
            issue, started, aj_valid, last_ow, last_oh, t_l, j_one, j_le2, aj_one, jump_q, a_pop = bits
            for k in (0, 1, AD - 2, AD - 1, AD):          # every (t[AD-1], t[AD-2]) pair
                if a_pop and k == 0:
                    continue                                # (a row is taken only after its read)
                put(leaves["a_issue_r"], issue)
                put(leaves["started"], started)
                put(leaves["aj_valid"], aj_valid)
                put(c_ow, (-1 if last_ow else rng.randrange(1 << 12)) & ((1 << len(c_ow)) - 1))
                put(c_oh, (-1 if last_oh else rng.randrange(1 << 12)) & ((1 << len(c_oh)) - 1))
                put(t_last, t_l)
                put(leaves["jump_q"], jump_q)
                put(leaves["a_pop"], a_pop)
                put(a_cnt, lib.therm(k))
                for view, one, le2 in ((J, j_one, j_le2), (aj, aj_one, rng.randrange(2))):
                    word = rng.getrandbits(lay.size)
                    for name, v in (("one_px", one), ("px_le2", le2)):
                        off = lay[name].offset
                        word = (word & ~(1 << off)) | (v << off)
                    put(Value.cast(view), word)
                drv.flush(ctx)
                # the plain definitions (before 446d4c9 / ea826a4)
                a_start = aj_valid & ~started & 1
                job_done = issue & last_ow & last_oh & t_l
                started_nx = a_start | (started & ~job_done & 1)
                cred = int(k + issue - a_pop < AD)
                blocked = (a_start & aj_one) | (issue & j_one) | (jump_q & j_le2)
                issue_nx = started_nx & cred & ~blocked & 1
                got = (ctx.get(outs["a_issue_r"]), ctx.get(outs["started"]))
                where = (f"issue {issue} started {started} aj_valid {aj_valid} last_ow/oh {last_ow}{last_oh} "
                         f"t_last {t_l} one_px {j_one} px_le2 {j_le2} aj.one_px {aj_one} jump_q {jump_q} "
                         f"pop {a_pop} count {k}")
                if issue and not started:           # outside the condition (unreachable)
                    result["outside"] += got != (issue_nx, started_nx)
                    continue
                assert got == (issue_nx, started_nx), \
                    f"{where}: (issue, started) next {got}, plain {(issue_nx, started_nx)}"
                assert not got[0] or got[1], f"{where}: the next state breaks 'issue implies started'"
                result["checked"] += 1

    lib.simulate(top, bench, clock=False)
    return result


def test_feeder_issue_register_exhaustive():
    res = check_issue_register()
    assert res["checked"] == 3 * 2 ** 8 * 9          # 3 of 4 (issue, started), 9 (pop, count), 8 more bits
    assert res["outside"] > 0                         # the condition is needed


def test_feeder_issue_proof_catches_a_go_i_without_its_credit():
    bad = lib.mutant(ComputeEngine, "~(jump_q & J.px_le2) & cred_i)", "~(jump_q & J.px_le2))")
    with pytest.raises(AssertionError, match="issue 1 started 1"):
        check_issue_register(bad)


# ============================================================ the array's weight ready
@pytest.mark.parametrize("rows,cols", [(2, 2), (4, 2), (1, 2)])
def test_array_weight_ready_exhaustive(rows, cols):
    check_array_weight_ready(rows, cols)


def check_array_weight_ready(rows, cols, cls=SystolicArray):
    cfg = AcceleratorConfig(rows=rows, cols=cols)
    dut = cls(cfg)
    frag = lib.elaborate(dut)
    S = lib.finder(frag)
    # the register's next value reads only these (the registers below are set directly)
    # (``en`` = ~out.valid | out.ready: both set below)
    cm, _, leaves = lib.cone(frag, comb=["sf_next", "drain_zero_next", "inject", "accept"], sync=["w_ready"])
    lib.elaborate(cm)       # (only its leaves are used here)
    assert {n.split("__")[0] for n in leaves} == {"shadow_full", "wgt", "w_ready", "act", "en", "drain",
                                                  "wrow"}, sorted(leaves)
    shadow_full, drain, w_ready = S("shadow_full", ()), S("drain", ()), S("w_ready", ())
    wrow = S("wrow", ()) if rows > 1 else None      # (zero bits wide for one row)
    L = latency(rows, cols)
    out_v = S(f"vline_{L - 1}", ())
    assert out_v is not None

    async def bench(ctx):
        n = 0
        for sf, dr, wr, ov in itertools.product((0, 1), range(rows + cols + 1), range(rows), (0, 1)):
            for wv, av, first, ordy in itertools.product((0, 1), repeat=4):
                ctx.set(shadow_full, sf)
                ctx.set(drain, dr)
                if wrow is not None:
                    ctx.set(wrow, wr)
                ctx.set(out_v, ov)
                ctx.set(w_ready, int(not sf and dr == 0))
                ctx.set(dut.wgt.valid, wv)
                ctx.set(dut.act.valid, av)
                ctx.set(dut.act.payload.first, first)
                ctx.set(dut.out.ready, ordy)
                await ctx.tick()
                got, plain = ctx.get(w_ready), int(not ctx.get(shadow_full) and ctx.get(drain) == 0)
                assert got == plain, (f"{rows}x{cols}: from shadow_full {sf} drain {dr} wrow {wr} out_valid {ov}, "
                                      f"wgt.valid {wv} act.valid {av} first {first} out.ready {ordy}: "
                                      f"wgt.ready {got}, plain {plain}")
                n += 1
        assert n == 2 * (rows + cols + 1) * rows * 2 * 16

    lib.simulate(frag, bench)


# ============================================================ the engine, in place
def gen_insn(rng):
    """A small random COMPUTE tile (at most a few dozen issues)."""
    while True:
        kh, kw = rng.choice([(1, 1), (1, 1), (3, 3), (2, 1), (1, 3), (2, 2), (1, 2)])
        cb = rng.choice([1, 1, 2, 3])
        oh, ow = rng.choice([(1, 1), (1, 1), (1, 2), (2, 1), (1, 3), (3, 1), (2, 2), (3, 2), (2, 3), (1, 5), (4, 3)])
        if kh * kw * cb * oh * ow <= 40:
            break
    sh, sw = rng.randint(1, 3), rng.randint(1, 3)
    dh, dw = rng.choice([1, 1, 2]), rng.choice([1, 1, 2])
    pt, pl = rng.choice([0, 0, 1, 2]), rng.choice([0, 0, 1, 2])
    hin = max(1, (oh - 1) * sh + (kh - 1) * dh + 1 - pt - rng.randint(0, 2))
    win = max(1, (ow - 1) * sw + (kw - 1) * dw + 1 - pl - rng.randint(0, 2))
    return Compute(acc_init=rng.randint(0, 1), finalize=rng.randint(0, 1), a_base=rng.randrange(1 << 16),
                   w_base=rng.randrange(1 << 16), acc_base=rng.randrange(1 << 7), aux_addr=rng.randrange(64),
                   out_base=rng.randrange(1 << 16), out_stride=rng.randint(1, 3), oh_n=oh, ow_n=ow,
                   kh_n=kh, kw_n=kw, cb_n=cb, hin=hin, win=win, cbp=cb + rng.randint(0, 1), sh=sh, sw=sw,
                   dh=dh, dw=dw, pt=pt, pl=pl, push_prev=rng.randint(0, 1), push_next=rng.randint(0, 1))


def plain_issues(c):
    """(address, inside, first of its K tile, (t_cb, t_kw, t_kh, t_last) if a jump) of
    every activation issue of ``c``, in order."""
    out = []
    for kh in range(c.kh_n):
        for kw in range(c.kw_n):
            for cb in range(c.cb_n):
                for oh in range(c.oh_n):
                    for ow in range(c.ow_n):
                        ih = oh * c.sh + kh * c.dh - c.pt
                        iw = ow * c.sw + kw * c.dw - c.pl
                        addr = (c.a_base + (ih * c.win + iw) * c.cbp + cb) % (1 << 16)
                        inside = 0 <= ih < c.hin and 0 <= iw < c.win
                        jump = None
                        if oh == c.oh_n - 1 and ow == c.ow_n - 1:
                            l_cb, l_kw, l_kh = cb == c.cb_n - 1, kw == c.kw_n - 1, kh == c.kh_n - 1
                            jump = (not l_cb, l_cb and not l_kw, l_cb and l_kw and not l_kh, l_cb and l_kw and l_kh)
                        out.append((addr, inside, oh == 0 and ow == 0, jump))
    return out


def plain_beats(c):
    """(accumulator row, output address, first K tile, last pixel, last K tile) of every
    back-end beat of ``c``."""
    px = c.oh_n * c.ow_n
    kt = c.kh_n * c.kw_n * c.cb_n
    return [((c.acc_base + p) % (1 << 16), (c.out_base + p * c.out_stride) % (1 << 16), k == 0, p == px - 1,
             k == kt - 1) for k in range(kt) for p in range(px)]


def _t_signals(frag):
    """``t_cb, t_kw, t_kh, t_last`` (unnamed registers): the top-level sync assignments
    from the K-tile counters' sign bits, in their source order."""
    from amaranth.hdl._ast import Assign
    found = []
    for st in frag.statements["sync"]:
        if isinstance(st, Assign) and isinstance(st.lhs, Signal) and st.lhs.name == "$signal":
            names = {s.name for s in st.rhs._rhs_signals()}
            if names and names <= {"c_cb", "c_kw", "c_kh"}:
                found.append((st.lhs, names))
    assert [n for _, n in found] == [{"c_cb"}, {"c_cb", "c_kw"}, {"c_cb", "c_kw", "c_kh"},
                                    {"c_cb", "c_kw", "c_kh"}], found
    return [s for s, _ in found]


def run_engine(insns, seed, max_cycles=8000, cls=ComputeEngine, p_valid=1.0):
    R = CFG.rows
    dut = cls(CFG)
    drv = lib.Driver(dut, [dut.insn.valid, dut.insn.payload])
    top = lib.elaborate(drv)
    frag = drv.fragment(top)
    S = lib.finder(frag)
    g = lambda n: S(n, ())          # noqa: E731
    a_issue, started, a_px, inside, tile_first = g("a_issue"), g("started"), g("a_px"), g("inside"), g("tile_first")
    tile_jump, a_job_done, w_job_done = g("tile_jump"), g("a_job_done"), g("w_job_done")
    t_sigs = _t_signals(frag)
    w_issue, w_addr = g("w_issue"), S("w_addr", (), domain="sync")     # (not the accumulator RAM port)
    beat, acc_addr, out_addr, kt_first = g("beat"), g("acc_addr"), g("out_addr"), g("kt_first")
    p_left, kt_left = g("p_left"), g("kt_left")
    dstate, push = g("dstate"), g("push")
    plain_idle = S("idle", (), domain="comb")
    queues = [lib.origin(frag, n) for n in ("act_q", "wgt_q", "back_q", "pay_q", "flag_q")]
    fifos = [lib.origin(frag, n) for n in ("afifo", "wfifo")]
    issues = [plain_issues(c) for c in insns]
    beats = [plain_beats(c) for c in insns]
    res = {"cycles": 0, "jumps": 0}
    rng = random.Random(seed)

    async def bench(ctx):
        k = 0               # next instruction to offer
        ai = [0, 0]         # activation (job, issue)
        wi = [0, 0]         # weight (job, row)
        bi = [0, 0]         # back end (job, beat)
        a_done, w_done = [], []
        release = []        # plain release cycles (both feeders done), per job
        dr = []             # done_read pulses
        dw = 0
        hist = [(1, 0)] * 3     # (plain idle, offered) one, two, three cycles ago
        quiet = 0
        for t in range(max_cycles):
            where = f"seed {seed} cycle {t}"
            valid = int(k < len(insns) and rng.random() < p_valid)
            drv.put(dut.insn.valid, valid)
            if k < len(insns):
                drv.put(dut.insn.payload, insns[k].encode())
            drv.flush(ctx)
            # ------------------------------------------------------------- decode
            ds = ctx.get(dstate)
            assert ds and ds & (ds - 1) == 0, f"{where}: dstate {ds:#b} not one-hot"
            if ctx.get(push):
                for q in queues:
                    assert ctx.get(q.w_rdy), f"{where}: a job queue pushed while full"
            if valid and ctx.get(dut.insn.ready):
                k += 1
            # ------------------------------------------------------- activation feeder
            iss = ctx.get(a_issue)
            if iss:
                assert ctx.get(started), f"{where}: an issue without 'started'"
                j, n = ai
                assert j < len(insns), f"{where}: an issue beyond the last job"
                addr, ins, first, jump = issues[j][n]
                got = (ctx.get(a_px) % (1 << 16), ctx.get(inside), ctx.get(tile_first))
                assert got == (addr, ins, first), \
                    f"{where}: job {j} issue {n}: (address, inside, first) {got}, plain {(addr, ins, first)}"
                assert ctx.get(dut.act_rd_en) == ins and (not ins or ctx.get(dut.act_rd_addr) == addr), where
                assert bool(ctx.get(tile_jump)) == (jump is not None), f"{where}: job {j} issue {n}: tile_jump"
                if jump is not None:
                    res["jumps"] += 1
                    tv = tuple(bool(ctx.get(s)) for s in t_sigs)
                    assert tv == jump, \
                        f"{where}: job {j} issue {n}: K-tile step (t_cb, t_kw, t_kh, t_last) {tv}, plain {jump}"
                assert ctx.get(a_job_done) == (n == len(issues[j]) - 1), f"{where}: job end"
                ai = [j + 1, 0] if n == len(issues[j]) - 1 else [j, n + 1]
            if ctx.get(a_job_done):
                a_done.append(t)
            # ---------------------------------------------------------- weight feeder
            if ctx.get(w_issue):
                j, n = wi
                kt = insns[j].kh_n * insns[j].kw_n * insns[j].cb_n
                assert ctx.get(w_addr) == (insns[j].w_base + n) % (1 << 16), f"{where}: job {j} weight row {n}"
                assert ctx.get(w_job_done) == (n == kt * R - 1), f"{where}: weight job end"
                wi = [j + 1, 0] if n == kt * R - 1 else [j, n + 1]
            if ctx.get(w_job_done):
                w_done.append(t)
            for f in fifos:
                if ctx.get(f.w_en):
                    assert ctx.get(f.w_rdy), f"{where}: a feeder FIFO written while full"
            # ------------------------------------------------------------- back end
            if ctx.get(beat):
                j, n = bi
                want = beats[j][n]
                got = (ctx.get(acc_addr), ctx.get(out_addr), bool(ctx.get(kt_first)),
                       ctx.get(p_left) < 0, ctx.get(kt_left) < 0)
                assert got == want, f"{where}: job {j} beat {n}: {got}, plain {want}"
                bi = [j + 1, 0] if n == len(beats[j]) - 1 else [j, n + 1]
            # --------------------------------------- inputs released, idle, done pulses
            while len(release) < min(len(a_done), len(w_done)):
                j = len(release)
                release.append(max(a_done[j] + 2, w_done[j] + 1, (release[-1] + 1) if release else 0))
            if ctx.get(dut.done_read):
                dr.append(t)
            dw += ctx.get(dut.done_write)
            idle_out = ctx.get(dut.idle)
            if t >= 3:  # (from the fourth cycle: the registers reset to 0)
                want = hist[2][0] and not any(v for _, v in hist)
                assert idle_out == want, f"{where}: idle {idle_out}"
            pi = ctx.get(plain_idle)
            assert pi or not idle_out, f"{where}: idle shown with work in flight"
            hist = [(pi, valid)] + hist[:2]
            quiet = quiet + 1 if (k == len(insns) and idle_out) else 0
            if quiet > 20:
                break
            await ctx.tick()
        else:
            raise AssertionError(f"seed {seed}: not idle after {max_cycles} cycles ({k} of {len(insns)} taken)")
        assert ai == [len(insns), 0] and wi == [len(insns), 0] and bi == [len(insns), 0], (ai, wi, bi)
        want_dr = [r + 1 for r, c in zip(release, insns) if c.push_prev]
        assert dr == want_dr, f"seed {seed}: done_read at {dr}, plain {want_dr}"
        assert dw == sum(c.push_next for c in insns), f"seed {seed}: {dw} done_write pulses"
        res["cycles"] = t

    lib.simulate(top, bench)
    return res


@pytest.mark.parametrize("seed,n,p_valid", [(1, 24, 1.0), (2, 16, 0.3), (3, 12, 0.01)])
def test_compute_engine_retimed_signals(seed, n, p_valid):
    rng = random.Random(seed)
    insns = [gen_insn(rng) for _ in range(n)]
    res = run_engine(insns, seed, p_valid=p_valid)
    assert res["jumps"] == sum(c.kh_n * c.kw_n * c.cb_n for c in insns)


def test_compute_harness_catches_a_jump_without_its_wait():
    """Without the wait after a K-tile jump (``jump_q & px_le2``), a tile of one or two
    pixels jumps on stale step selects: the in-place check names the issue."""
    bad = lib.mutant(ComputeEngine, ["~(jump_q & J.px_le2) & cred_i", "~(jump_q & J.px_le2) & cred_n"],
                     ["cred_i", "cred_n"])
    rng = random.Random(2)
    insns = [gen_insn(rng) for _ in range(16)]
    with pytest.raises(AssertionError, match=r"K-tile step"):
        run_engine(insns, 2, cls=bad, p_valid=0.3)


def test_compute_harness_catches_an_idle_flag_that_forgets_an_offer():
    """``idle`` shows the plain idle of three cycles ago (two register stages, then the
    output register) masked by the offers since: dropping the oldest offer from the mask
    shows the engine idle right after it accepted an instruction (sparse offers, so the
    engine drains between them)."""
    bad = lib.mutant(ComputeEngine, "idle_q & ~valid_qq & ~valid_q", "idle_q & ~valid_q")
    rng = random.Random(3)
    insns = [gen_insn(rng) for _ in range(12)]
    with pytest.raises(AssertionError, match=r"idle"):
        run_engine(insns, 3, cls=bad, p_valid=0.01)


def test_array_weight_ready_proof_catches_a_missed_inject():
    # the next drain flag forgetting that a ``first`` beat entering restarts the drain
    bad = lib.mutant(SystolicArray, "drain_zero_next.eq(~inject & Mux(", "drain_zero_next.eq(Mux(")
    with pytest.raises(AssertionError, match="first 1"):
        check_array_weight_ready(2, 2, cls=bad)
