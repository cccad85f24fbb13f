"""Proofs that the retimed control blocks equal their plain definitions (self-contained
blocks, instantiated on their own; blocks written inline in an engine are checked in
tests/hw/test_retimed_engines.py).

Each test runs the real block in the Amaranth simulator beside a plain Python model and
drives an input sequence from :func:`retimed_lib.edge_cover`: every reachable (state,
allowed input) pair of the model is taken at least once, and every cycle the block's
registers are compared with the values the model's state gives them and its outputs with
the plain definitions. Since the model's state determines all of the block's registers
(each test asserts that it observes every register :func:`retimed_lib.registers` lists),
this is an exhaustive proof over the reachable states. ``test_*_catches_*`` re-run a proof
on a copy of the block with an old or plausible wrong definition and expect it to fail.

Blocks, plain definitions, conditions: docs/accelerator.md, "Retimed control blocks".
"""

import itertools
import random

import pytest
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.lib import data

from dnnfab.hw import compute, controller, dma


import retimed_lib as lib  # noqa: E402 - on sys.path through tests/hw/conftest.py
elaborate, find, registers, edge_cover, simulate, therm, mutant = (
    lib.elaborate, lib.find, lib.registers, lib.edge_cover, lib.simulate, lib.therm, lib.mutant)


class _Wrap(Elaboratable):
    """Runs ``build(m)`` in a fresh module (for blocks that are functions of a module)."""

    def __init__(self, build):
        self.build = build
        self.h = None

    def elaborate(self, platform):
        m = Module()
        self.h = self.build(m)
        return m


def _wrapped(build):
    w = _Wrap(build)
    frag = elaborate(w)
    return frag, w.h


# ======================================================================== _TokenCounter
TOKEN_MAX = 255     # 8-bit count; the count (a pending decrement included) stays <= 255

GE2_NOW, GE2_OLD = lib.GE2_NOW, lib.GE2_OLD     # ge2 now / before 636dedf


def check_token_counter(cls=controller._TokenCounter):
    """Plain definition: a counter ``p`` (every ``dec`` applied at once), ``available`` =
    ``p > 0``. Contract: ``dec`` only while ``available``; the count never passes 255.
    The block keeps ``count = p + dec_d`` (a decrement applied a cycle late) and
    ``available`` as a register; both must follow the plain counter on every state."""
    frag, t = _wrapped(lambda m: cls(m, "x"))
    dec_d = find(frag, "tok_x_dec_d")
    assert registers(frag) == {((), "tok_x"), ((), "tok_x_dec_d"), ((), "tok_x_avail")}

    def inputs(s):
        p, _ = s
        return [(inc, dec) for inc in (0, 1) for dec in (0, 1)
                if (not dec or p > 0) and p + inc <= TOKEN_MAX]

    def step(s, i):
        (p, _), (inc, dec) = s, i
        return (p + inc - dec, dec)

    walk, n_states, n_edges = edge_cover((0, 0), inputs, step)
    # then a random walk (up to the top and back, in phases), as the engines drive it
    rng = random.Random(15)
    s, rand = (0, 0), []
    for (inc, dec) in walk:
        s = step(s, (inc, dec))
    for i in range(1500):
        up = (i // 250) % 2 == 0
        choices = inputs(s)
        weights = [(3 if inc and not dec else 1) if up else (3 if dec and not inc else 1) for inc, dec in choices]
        x = rng.choices(choices, weights)[0]
        rand.append(x)
        s = step(s, x)

    async def bench(ctx):
        s = (0, 0)
        for cyc, (inc, dec) in enumerate(walk + rand + [(0, 0)]):
            p, d = s
            got = (ctx.get(t.count), ctx.get(dec_d), ctx.get(t.available))
            want = (p + d, d, int(p > 0))
            assert got == want, (f"cycle {cyc}: plain count {p}, decrement pending {d}: "
                                 f"(count, dec_d, available) = {got}, want {want}")
            ctx.set(t.inc, inc)
            ctx.set(t.dec, dec)
            await ctx.tick()
            s = step(s, (inc, dec))

    simulate(frag, bench)
    return n_states, n_edges, len(walk)


def test_token_counter_exhaustive():
    n_states, n_edges, cycles = check_token_counter()
    # counts 0..255, with and without a decrement pending (none pending at 255)
    assert n_states == 256 + 255
    assert n_edges == 2038      # 4 inputs from each, but no dec at 0, no inc at 255
    assert cycles < 3 * n_edges     # (the covering walk's length, before the random part)


def test_token_counter_deadlock_case():
    """The hang of issue 15: three tokens arrive, nothing takes one for a while; the flag
    must stay up (it dropped at count 3 with no decrement pending)."""
    frag, t = _wrapped(lambda m: controller._TokenCounter(m, "x"))

    async def bench(ctx):
        for i in range(3):
            ctx.set(t.inc, 1)
            await ctx.tick()
        ctx.set(t.inc, 0)
        for _ in range(4):
            await ctx.tick()
            assert (ctx.get(t.count), ctx.get(t.available)) == (3, 1)
        for left in (2, 1, 0):
            ctx.set(t.dec, 1)
            await ctx.tick()
            ctx.set(t.dec, 0)
            assert ctx.get(t.available) == (left > 0)
            await ctx.tick()
            assert ctx.get(t.available) == (left > 0)

    simulate(frag, bench)


def test_token_counter_proof_catches_the_old_ge2():
    old = mutant(controller._TokenCounter, GE2_NOW, GE2_OLD)
    with pytest.raises(AssertionError, match=r"plain count 3, decrement pending 0"):
        check_token_counter(old)


# =========================================================================== thermometer
def check_thermometer(n, fn=dma.thermometer):
    """Plain definition: a count ``k`` of ``0..n`` stepped by ``up``/``down`` (both or
    neither: unchanged; saturating at 0 and ``n``), bit ``i`` = ``k > i``. No condition."""
    def build(m):
        up, down = Signal(), Signal()
        return up, down, fn(m, "t", n, up, down)
    frag, (up, down, t) = _wrapped(build)
    assert registers(frag) == {((), "t")}
    walk, n_states, n_edges = edge_cover(
        0, lambda k: [(u, d) for u in (0, 1) for d in (0, 1)],
        lambda k, i: min(n, max(0, k + i[0] - i[1])))

    async def bench(ctx):
        k = 0
        for cyc, (u, d) in enumerate(walk + [(0, 0)]):
            assert ctx.get(t) == therm(k), f"n={n} cycle {cyc}: count {k}: t={ctx.get(t):#b}"
            ctx.set(up, u)
            ctx.set(down, d)
            await ctx.tick()
            k = min(n, max(0, k + u - d))

    simulate(frag, bench)
    assert n_states == n + 1 and n_edges == 4 * (n + 1)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 11, 13, 16])
def test_thermometer_exhaustive(n):
    check_thermometer(n)


# =============================================================================== RegFIFO
def check_regfifo(depth, late_write, cls=dma.RegFIFO, seed=0):
    """Plain definition: a first-word-fall-through FIFO of ``depth`` entries.
    ``r_rdy`` = (entries stored) > 0, ``w_rdy`` = (entries stored or being stored) <
    ``depth``, ``r_data`` = the oldest entry. With ``late_write`` an entry written with
    ``w_en`` in cycle t is stored in t + 1 with the ``w_data`` of t + 1 and counts as
    stored from t + 2. Contract: ``w_en`` only with ``w_rdy``, ``r_en`` only with ``r_rdy``.

    Model state ``(s, p, c)``: entries stored, one being stored (late write), consume
    pointer; produce pointer, both thermometer codes and ``we_d`` follow from it."""
    width = 8
    dut = cls(width, depth, late_write=late_write)
    frag = elaborate(dut)
    stored, produce, consume = find(frag, "stored"), find(frag, "produce"), find(frag, "consume")
    occupied = find(frag, "occupied") if late_write else None
    want_regs = {((), "stored"), ((), "produce"), ((), "consume")}
    if late_write:
        want_regs |= {((), "occupied"), ((), "we_d")}
    assert registers(frag) == want_regs

    def inputs(st):
        s, p, _ = st
        return [(w, r) for w in (0, 1) for r in (0, 1) if (not w or s + p < depth) and (not r or s > 0)]

    def step(st, i):
        (s, p, c), (w, r) = st, i
        if late_write:
            return (s + p - r, w, (c + r) % depth)
        return (s + w - r, 0, (c + r) % depth)

    walk, n_states, n_edges = edge_cover((0, 0, 0), inputs, step)
    rng = random.Random(seed)

    async def bench(ctx):
        st = (0, 0, 0)
        q = []          # entries stored, oldest first
        for cyc, (w, r) in enumerate(walk + [(0, 0)]):
            s, p, c = st
            v = rng.randrange(1 << width)
            ctx.set(dut.w_en, w)
            ctx.set(dut.r_en, r)
            ctx.set(dut.w_data, v)
            where = f"depth {depth} late_write {late_write} cycle {cyc}: stored {s}, being stored {p}"
            assert ctx.get(dut.r_rdy) == (s > 0), where
            assert ctx.get(dut.w_rdy) == (s + p < depth), where
            assert ctx.get(stored) == therm(s), where
            assert ctx.get(consume) == c, where
            assert ctx.get(produce) == (c + s) % depth, where
            if late_write:
                assert ctx.get(occupied) == therm(s + p), where
                assert ctx.get(dut.we_d) == p, where
            if s:
                assert ctx.get(dut.r_data) == q[0], where
            await ctx.tick()
            if late_write and p or not late_write and w:
                q.append(v)
            if r:
                q.pop(0)
            st = step(st, (w, r))
            assert len(q) == st[0]

    simulate(frag, bench)
    return n_states, n_edges


@pytest.mark.parametrize("depth", [2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("late_write", [False, True])
def test_regfifo_exhaustive(depth, late_write):
    n_states, _ = check_regfifo(depth, late_write)
    assert n_states == ((2 * depth + 1) if late_write else (depth + 1)) * depth


def test_regfifo_proof_catches_a_full_flag_one_early():
    # a plausible slip: w_rdy from the next-to-last bit (the FIFO would hold depth - 1)
    bad = mutant(dma.RegFIFO, "~occupied[n - 1]", "~occupied[n - 2]")
    with pytest.raises(AssertionError, match="depth 4 late_write True"):
        check_regfifo(4, True, cls=bad)


# ======================================================================== compute._credit
def check_credit(limit, split, fn=compute._credit):
    """Plain definition: ``k`` = reads issued and not yet taken (0..``limit``), the
    credit = ``k + inc - dec < limit`` (with ``split``: the pair for ``inc`` = 1 and 0,
    ``k + 1 - dec < limit`` and ``k - dec < limit``). Contract (how the feeders use it):
    ``inc`` only while ``k < limit`` (the registered credit), ``dec`` only while
    ``k > 0`` (a row is taken only after its read)."""
    def build(m):
        inc, dec = Signal(), Signal()
        out = fn(m, "cnt", inc, dec, limit, split=split)
        outs = out if split else (out,)
        sigs = [Signal(name=f"o{j}") for j in range(len(outs))]
        m.d.comb += [s.eq(o) for s, o in zip(sigs, outs)]
        return inc, dec, sigs
    frag, (inc, dec, outs) = _wrapped(build)
    t = find(frag, "cnt")
    assert registers(frag) == {((), "cnt")}

    def inputs(k):
        return [(i, d) for i in (0, 1) for d in (0, 1) if (not i or k < limit) and (not d or k > 0)]
    walk, n_states, n_edges = edge_cover(0, inputs, lambda k, x: k + x[0] - x[1])

    async def bench(ctx):
        k = 0
        for cyc, (i, d) in enumerate(walk + [(0, 0)]):
            ctx.set(inc, i)
            ctx.set(dec, d)
            where = f"limit {limit} split {split} cycle {cyc}: count {k}, inc {i}, dec {d}"
            assert ctx.get(t) == therm(k), where
            if split:
                assert (ctx.get(outs[0]), ctx.get(outs[1])) == (k + 1 - d < limit, k - d < limit), where
            else:
                assert ctx.get(outs[0]) == (k + i - d < limit), where
            await ctx.tick()
            k += i - d

    simulate(frag, bench)
    assert n_states == limit + 1


@pytest.mark.parametrize("limit", [2, 3, 4, 11, 13])      # 11: weight feeder, 13: activation
@pytest.mark.parametrize("split", [False, True])
def test_feeder_credit_exhaustive(limit, split):
    check_credit(limit, split)


def test_credit_proof_catches_a_missed_decrement():
    # the credit ignoring a take in the same cycle as the issue
    bad = mutant(compute._credit, "return Mux(inc, Mux(dec, lt, lt_m1), Mux(dec, 1, lt))",
                 "return Mux(inc, lt_m1, Mux(dec, 1, lt))")
    with pytest.raises(AssertionError, match="inc 1, dec 1"):
        check_credit(11, False, fn=bad)


# ========================================================================== _Fifo.head
def _queue_regs(frag):
    """The job queue's own registers (consume / produce pointers, stored / occupied thermometers)."""
    return tuple(find(frag, n, path=("q",)) for n in ("consume", "produce", "stored", "occupied"))


def _check_queue(ctx, q, regs, fifo, p, depth, where):
    """``w_rdy`` and the queue's registers as the model gives them: ``fifo`` the ages of the
    entries in the queue itself, ``p`` its consume pointer."""
    ptr, prod, stored, occupied = regs
    assert ctx.get(q.fifo.w_rdy) == (len(fifo) < depth), where
    assert ctx.get(ptr) == p, where
    assert ctx.get(stored) == therm(sum(a >= 2 for a in fifo)), where
    assert ctx.get(occupied) == therm(len(fifo)), where
    assert ctx.get(prod) == (p + sum(a >= 2 for a in fifo)) % depth, where


def _drive_queue(frag, q, consume, init, walk, step, depth, check):
    """Run a queue-head proof: the inputs of ``walk`` (push ``w`` with a random value held
    a cycle, ``consume`` ``c``), ``check(ctx, st, vals, popped, where)`` before every
    tick with the model state, the unconsumed values (oldest first) and the last value
    consumed."""
    rng = random.Random(depth)

    async def bench(ctx):
        st, vals, held, prev_w, popped = init, [], 0, 0, None
        for cyc, (w, c) in enumerate(walk + [(0, 0)]):
            v = held if prev_w else rng.randrange(256)
            ctx.set(q.fifo.w_en, w)
            ctx.set(q.w.v, v)
            ctx.set(consume, c)
            check(ctx, st, vals, popped, f"depth {depth} cycle {cyc}: state {st}")
            await ctx.tick()
            if c:
                popped = vals.pop(0)
            if w:
                vals.append(v)
            held, prev_w = v, w
            st = step(st, (w, c))

    simulate(frag, bench)


def check_fifo_head(depth, cls=compute._Fifo):
    """Plain definition of the queue-head register (``_Fifo.head``): ``valid`` = some
    entry pushed at least 3 cycles ago is still unconsumed, and then ``reg`` is the oldest
    unconsumed entry (pushed in cycle t: late write in t + 1, readable in t + 2, in the
    register from t + 3); ``w_rdy`` = fewer than ``depth`` entries are pushed and not
    consumed besides the one in the register. Contract: ``w_en`` only with ``w_rdy``,
    ``consume`` only with ``valid``, ``w_data`` held in the cycle after a push.

    Model state: the ages (capped at 3) of the unconsumed entries, oldest first, and the
    number of takes from the queue modulo ``depth`` (its consume pointer)."""
    layout = data.StructLayout({"v": 8})

    def build(m):
        q = cls(m, "q", layout, depth)
        consume = Signal(name="consume")
        reg, valid = q.head(m, consume, "h")
        return q, consume, reg, valid
    frag, (q, consume, reg, valid) = _wrapped(build)
    qregs = _queue_regs(frag)
    assert registers(frag) == {((), "h"), ((), "h_valid"),
                               *{(("q",), n) for n in ("stored", "occupied", "produce", "consume", "we_d")}}

    def plain_valid(ages):
        return bool(ages) and ages[0] >= 3

    def inputs(st):
        ages, _ = st
        n_fifo = len(ages) - plain_valid(ages)
        return [(w, c) for w in (0, 1) for c in (0, 1)
                if (not w or n_fifo < depth) and (not c or plain_valid(ages))]

    def took(ages, c):
        """Whether the queue hands an entry to the register this cycle (the oldest not
        in the register, once readable: age >= 2), as the plain timing above implies."""
        v = plain_valid(ages)
        nxt = ages[1:] if v else ages
        return bool(nxt) and nxt[0] >= 2 and (not v or c)

    def step(st, i):
        (ages, ptr_), (w, c) = st, i
        t = took(ages, c)
        rest = ages[1:] if c else ages
        rest = tuple(min(3, a + 1) for a in rest) + ((1,) if w else ())
        return (rest, (ptr_ + t) % depth)

    walk, n_states, n_edges = edge_cover(((), 0), inputs, step)

    def check(ctx, st, vals, _, where):
        ages, p = st
        pv = plain_valid(ages)
        assert ctx.get(valid) == pv, where
        if pv:
            assert ctx.get(reg.v) == vals[0], where
        _check_queue(ctx, q, qregs, ages[1:] if pv else ages, p, depth, where)
    _drive_queue(frag, q, consume, ((), 0), walk, step, depth, check)
    return n_states, n_edges


@pytest.mark.parametrize("depth", [2, 3, 4])          # the engine's job queues have 3
def test_fifo_head_exhaustive(depth):
    check_fifo_head(depth)


def test_fifo_head_proof_catches_a_refill_that_waits():
    # a head register that refills only once empty (a bubble per job)
    bad = mutant(compute._Fifo, "take.eq(self.fifo.r_rdy & (~valid | consume))",
                 "take.eq(self.fifo.r_rdy & ~valid)")
    with pytest.raises(AssertionError, match="depth 3"):
        check_fifo_head(3, cls=bad)


def check_fifo_head_lazy(depth, cls=compute._Fifo):
    """Plain definition of the lazily popped queue head (``_Fifo.head_lazy``, the back
    end's ``bq``): as :func:`check_fifo_head` (``valid`` = an entry pushed >= 3 cycles ago
    is unconsumed, ``head`` = the oldest), with ``w_rdy`` = fewer than ``depth`` entries
    outside the two registers. Contract: as there.

    Model state: the ages (capped at 3) of the unconsumed entries, oldest first; whether
    there was a consume in the last cycle (``popped``); how long the oldest has been the
    head (0 not yet, 1 from this cycle, 2 longer); the queue's take count modulo
    ``depth``. The registers then follow: the oldest sits in ``reg`` iff it has been the
    head for more than this cycle and nothing was popped in the last (else, once shown,
    in ``reg2``); with the oldest in ``reg``, ``reg2`` holds the next iff it was pushed >= 3
    cycles ago; ``reg`` after a pop holds the entry popped (its flag set)."""
    layout = data.StructLayout({"v": 8})

    def build(m):
        q = cls(m, "q", layout, depth)
        consume = Signal(name="consume")
        head, valid, busy = q.head_lazy(m, consume, "h")
        return q, consume, head, valid, busy
    frag, (q, consume, head, valid, busy) = _wrapped(build)
    qregs = _queue_regs(frag)
    reg, reg2 = find(frag, "h"), find(frag, "h2")
    v1, v2, popped = find(frag, "h_valid"), find(frag, "h2_valid"), find(frag, "h_popped")
    both = find(frag, "h_both")
    assert registers(frag) == {((), "h"), ((), "h_valid"), ((), "h2"), ((), "h2_valid"), ((), "h_popped"),
                               ((), "h_both"),
                               *{(("q",), n) for n in ("stored", "occupied", "produce", "consume", "we_d")}}

    def shown(ages):
        return bool(ages) and ages[0] >= 3

    def where_(st):
        """(oldest in reg, index of the entry in reg2 or None)"""
        ages, pop, vis, _ = st
        in1 = not pop and vis == 2
        if in1:
            return True, (1 if len(ages) > 1 and ages[1] >= 3 else None)
        return False, (0 if shown(ages) else None)

    def in_fifo(st):
        ages = st[0]
        in1, k2 = where_(st)
        skip = (1 if in1 else 0) + (1 if k2 is not None else 0)
        return ages[skip:]

    def inputs(st):
        return [(w, c) for w in (0, 1) for c in (0, 1)
                if (not w or len(in_fifo(st)) < depth) and (not c or shown(st[0]))]

    def step(st, i):
        (ages, pop, vis, p), (w, c) = st, i
        rest = ages[1:] if c else ages
        rest = tuple(min(3, a + 1) for a in rest) + ((1,) if w else ())
        vis2 = 0 if not shown(rest) else (2 if (not c and vis) else 1)
        nxt = (rest, c, vis2, 0)
        takes = len(in_fifo(st)) + w - len(in_fifo(nxt))
        assert takes in (0, 1), (st, i)
        return (rest, c, vis2, (p + takes) % depth)

    init = ((), 0, 0, 0)
    walk, n_states, n_edges = edge_cover(init, inputs, step)

    def check(ctx, st, vals, last_popped, where):
        ages, pop, vis, p = st
        assert ctx.get(valid) == shown(ages), where
        if shown(ages):
            assert ctx.get(head.v) == vals[0], where
        in1, k2 = where_(st)
        assert ctx.get(popped) == pop, where
        assert ctx.get(v1) == int(pop or in1), where
        if in1:
            assert ctx.get(reg) == vals[0], where
        elif pop:
            assert ctx.get(reg) == last_popped, where
        assert ctx.get(v2) == (k2 is not None), where
        if k2 is not None:
            assert ctx.get(reg2) == vals[k2], where
        assert ctx.get(busy) == bool(in1 or k2 is not None), where
        assert ctx.get(both) == int((pop or in1) and k2 is not None), f"{where}: both"
        _check_queue(ctx, q, qregs, in_fifo(st), p, depth, where)
    _drive_queue(frag, q, consume, init, walk, step, depth, check)
    return n_states, n_edges


@pytest.mark.parametrize("depth", [2, 3, 4])          # the back end's job queue has 3
def test_fifo_head_lazy_exhaustive(depth):
    check_fifo_head_lazy(depth)


def test_fifo_head_lazy_proof_catches_a_refill_that_waits_for_the_move():
    # reg2 refilled only once empty: after a pop it is moved up and refilled a cycle
    # later, so a consume in two consecutive cycles finds no head
    bad = mutant(compute._Fifo, "refill.eq(sel2 | ~valid2)", "refill.eq(~valid2)")
    with pytest.raises(AssertionError, match="depth 3"):
        check_fifo_head_lazy(3, cls=bad)


def test_fifo_head_lazy_proof_catches_a_head_without_the_pop():
    # the head taken from reg unless it is empty, ignoring the pop: a consumed entry shows again
    bad = mutant(compute._Fifo, "sel2.eq(popped | ~valid)", "sel2.eq(~valid)")
    with pytest.raises(AssertionError, match="depth 3"):
        check_fifo_head_lazy(3, cls=bad)


def test_fifo_head_lazy_proof_catches_a_stale_both_flag():
    # ``both`` (valid & valid2, the queue read's own register) missing reg2's refill
    bad = mutant(compute._Fifo, "& Mux(refill, self.fifo.r_rdy, valid2))", "& valid2)")
    with pytest.raises(AssertionError, match="both"):
        check_fifo_head_lazy(3, cls=bad)


# ============================================================================ Scratchpad
def _de_bruijn(k, n):
    """A sequence over ``range(k)`` in which every length-``n`` word occurs (cyclically)."""
    a = [0] * k * n
    seq = []

    def db(t, p):
        if t > n:
            if n % p == 0:
                seq.extend(a[1:p + 1])
        else:
            a[t] = a[t - p]
            db(t + 1, p)
            for j in range(a[t - p] + 1, k):
                a[t] = j
                db(t + 1, t)
    db(1, 1)
    return seq + seq[:n - 1]


def check_scratchpad(w_unit, r_unit, rows=8, cls=None, seed=0):
    """Plain definition: ``r_data`` shows the unit read ``SP_READ_LATENCY`` cycles after
    an in-range ``r_en`` and holds otherwise (an out-of-range read is dropped); ``oob`` is
    high the cycle after an out-of-range access. Condition: a row is not read within a
    few cycles of a write to it. The read requests go through every sequence of five
    (none, in range, out of range) reads (a de Bruijn sequence): the lane select follows
    a read through the RAM's registers, so its state is a function of the last five."""
    from dnnfab.hw.scratchpad import Scratchpad
    from dnnfab.hw.spec import SP_READ_LATENCY
    cls = cls or Scratchpad
    row_bits = max(w_unit, r_unit)
    sp = cls(rows * row_bits // 8, w_unit, r_unit)
    frag = elaborate(sp)
    rng = random.Random(seed)
    kinds = _de_bruijn(3, SP_READ_LATENCY)
    reads = [(k, rng.randrange(sp.r_units) if k == 1 else rng.randrange(sp.r_units, 1 << 16)) for k in kinds]
    wk, rk = sp.w_k, sp.r_k
    mem = [rng.getrandbits(row_bits) for _ in range(rows)]

    async def bench(ctx):
        # fill the scratchpad first (every unit, known values)
        for a in range(sp.w_units):
            ctx.set(sp.w_en, 1)
            ctx.set(sp.w_addr, a)
            row, lane = divmod(a, wk)
            ctx.set(sp.w_data, (mem[row] >> (lane * w_unit)) & ((1 << w_unit) - 1))
            await ctx.tick()
        ctx.set(sp.w_en, 0)
        for _ in range(4):
            await ctx.tick()
        shown = None        # what r_data must hold (None: not checked yet)
        pipe = [None] * SP_READ_LATENCY
        prev_oob = 0
        for t, (kind, addr) in enumerate(reads + [(0, 0)] * (SP_READ_LATENCY + 1)):
            near = {a // rk for k, a in reads[max(0, t - 8):t + 9] if k == 1}
            w_en = int(rng.random() < 0.5)
            w_bad = w_en and rng.random() < 0.1
            w_addr = rng.randrange(sp.w_units, 1 << 16) if w_bad else rng.randrange(sp.w_units)
            if w_en and not w_bad and w_addr // wk in near:
                w_en = 0                        # (the contract: no row read near its write)
            w_data = rng.getrandbits(w_unit)
            ctx.set(sp.w_en, w_en)
            ctx.set(sp.w_addr, w_addr)
            ctx.set(sp.w_data, w_data)
            ctx.set(sp.r_en, int(kind != 0))
            ctx.set(sp.r_addr, addr)
            done = pipe.pop(0)
            if done is not None:
                shown = done
            where = f"w {w_unit} r {r_unit} cycle {t}"
            if shown is not None:
                assert ctx.get(sp.r_data) == shown, f"{where}: r_data {ctx.get(sp.r_data):#x}, plain {shown:#x}"
            assert ctx.get(sp.oob) == prev_oob, f"{where}: oob"
            if kind == 1:
                row, lane = divmod(addr, rk)
                pipe.append((mem[row] >> (lane * r_unit)) & ((1 << r_unit) - 1))
            else:
                pipe.append(None)
            prev_oob = int(kind == 2 or w_bad)
            if w_en and not w_bad:
                row, lane = divmod(w_addr, wk)
                mask = ((1 << w_unit) - 1) << (lane * w_unit)
                mem[row] = (mem[row] & ~mask) | (w_data << (lane * w_unit))
            await ctx.tick()

    simulate(frag, bench)
    return len(kinds)


@pytest.mark.parametrize("w_unit,r_unit", [(64, 16), (16, 64), (32, 32), (64, 32)])
def test_scratchpad_lanes_exhaustive(w_unit, r_unit):
    assert check_scratchpad(w_unit, r_unit) == 3 ** 5 + 4


def test_scratchpad_proof_catches_a_lane_that_does_not_hold():
    from dnnfab.hw.scratchpad import Scratchpad
    # the lane shifted along every cycle instead of with the read (RAM data hold, the
    # lane would not)
    bad = mutant(Scratchpad, ["            with m.If(r_en):\n                m.d.sync += lane[1].eq(lane[0])",
                              "            with m.If(r_en_q):\n                m.d.sync += lane[2].eq(lane[1])"],
                 ["            m.d.sync += lane[1].eq(lane[0])", "            m.d.sync += lane[2].eq(lane[1])"])
    with pytest.raises(AssertionError, match="r_data"):
        check_scratchpad(64, 16, cls=bad)


# ========================================================== Requantizer saturation flags
def check_requantizer_flags(cls=None):
    """Plain definition of stage 8: ``sat`` = ``sh6`` = ``sh5 >> n5`` saturated to
    ``sat_bits`` (the range check decided from flags registered beside the shift, 48c8ece).
    The flags depend on ``sh5`` only through its sign and the highest bit that differs
    from it: every (shift 0..7, sign, highest differing bit or none) is driven into the
    stage registers, with random bits below, twice; ``sat`` is read two cycles later."""
    from dnnfab.hw.postproc import Requantizer
    rq = (cls or Requantizer)(1, side_bits=1)
    frag = elaborate(rq)
    S = lib.finder(frag)
    cm, _, leaves = lib.cone(frag, sync=["sh6_0", "hz0", "ho0", "mz0", "mo0"])
    elaborate(cm)
    assert set(leaves) == {"sh5_0", "n5_0"}, sorted(leaves)
    sh5, n5, sat = S("sh5_0"), S("n5_0"), S("sat0")
    width, sat_bits = len(sh5), len(sat)
    lim = (1 << (sat_bits - 1)) - 1
    rng = random.Random(5)
    cases = []
    for n in range(8):
        for sign in (0, 1):
            for b in range(-1, width - 1):
                for _ in range(2):
                    v = -1 if sign else 0
                    if b >= 0:
                        v ^= 1 << b
                        v = (v & ~((1 << b) - 1)) | rng.getrandbits(b) if b else v
                    cases.append((v, n))

    async def bench(ctx):
        for i in range(len(cases) + 2):
            if i < len(cases):
                v, n = cases[i]
                ctx.set(sh5, v)
                ctx.set(n5, n)
            if i >= 2:
                v, n = cases[i - 2]
                plain = max(-lim - 1, min(lim, v >> n))
                assert ctx.get(sat) == plain, f"sh5 {v:#x} >> {n}: sat {ctx.get(sat)}, plain {plain}"
            await ctx.tick()

    simulate(frag, bench)
    return len(cases)


def test_requantizer_range_flags_exhaustive():
    assert check_requantizer_flags() == 8 * 2 * 50 * 2


def test_requantizer_flags_proof_catches_a_missed_bit():
    from dnnfab.hw.postproc import Requantizer
    bad = mutant(Requantizer, "zc = Array([sh5[lo_b + s:K] == 0 if", "zc = Array([sh5[lo_b + s + 1:K] == 0 if")
    with pytest.raises(AssertionError, match="sat"):
        check_requantizer_flags(bad)


# ================================================================ CSRBank write decode
def check_csr(seed=0, cycles=1500, cls=None):
    """Plain definition of the register bank with its write decode registered (b323acc):
    a write is applied in the cycle after ``bvalid`` rises, so a read whose address
    handshake follows the B handshake sees it: an ``rw`` port shows the new value (byte
    strobes applied) from the second cycle after ``bvalid`` rises, a ``pulse`` port the
    written bits for that one cycle, a ``w1c`` register loses the written bits then (a
    set in the same cycle wins). A read returns what the port shows in its address
    handshake cycle (``ro``: the input; LO latches HI). Random AXI-Lite traffic: address
    and data in either order or together, B stalls, reads right after a B handshake."""
    from dnnfab.hw.csr import CSRBank, Register, RegisterMap
    regs = [Register("A", 0x0, "rw"), Register("B", 0x4, "rw", width=12, reset=0x5A5),
            Register("EV", 0x8, "w1c", width=8), Register("P", 0xC, "pulse", width=4),
            Register("S", 0x10, "ro", width=16), Register("K", 0x44, "const", reset=0x1234ABCD),
            Register("C_LO", 0x20, "ro", latch="C_HI"), Register("C_HI", 0x3C, "ro")]
    rm = RegisterMap(regs, name="t")
    # (the map has gaps: two unmapped words read as 0, one between registers, one beyond)
    unmapped = {"U1": 0x28, "U2": 0x60}
    bank = (cls or CSRBank)(rm, addr_bits=8)
    frag = elaborate(bank)
    bus = bank.bus
    rng = random.Random(seed)
    model = {"A": 0, "B": 0x5A5, "EV": 0}
    stats = {"writes": 0, "reads": 0, "reads_after_b": 0}

    async def bench(ctx):
        wr = None           # the write in flight: [name, data, strb, aw done, w done]
        rd = None           # (name, plain value) of the read in flight
        pulse = 0           # the pulse port's plain value this cycle
        shadow = 0
        hs_b_at = -10
        prev_bv = 0
        for t in range(cycles):
            where = f"seed {seed} cycle {t}"
            ev_set = rng.getrandbits(8) if rng.random() < 0.3 else 0
            s_val, lo_val, hi_val = rng.getrandbits(16), rng.getrandbits(32), rng.getrandbits(32)
            ctx.set(bank.ev_set, ev_set)
            ctx.set(bank.s, s_val)
            ctx.set(bank.c_lo, lo_val)
            ctx.set(bank.c_hi, hi_val)
            assert (ctx.get(bank.a), ctx.get(bank.b)) == (model["A"], model["B"]), f"{where}: rw ports"
            assert ctx.get(bank.ev) == model["EV"], f"{where}: w1c {ctx.get(bank.ev):#x}, plain {model['EV']:#x}"
            assert ctx.get(bank.p) == pulse, f"{where}: pulse {ctx.get(bank.p)}, plain {pulse}"
            bv = ctx.get(bus.bvalid)
            # -- write channel
            if wr is None and rng.random() < 0.3:
                wr = [rng.choice(["A", "B", "EV", "P", "K", "S"]), rng.getrandbits(32),
                      rng.choice([0xF, 0xF, 0x1, 0x2, 0x4, 0x8, 0x3, 0xC, rng.getrandbits(4)]), False, False]
            aw_now = wr is not None and not wr[3] and rng.random() < 0.6
            w_now = wr is not None and not wr[4] and rng.random() < 0.6
            ctx.set(bus.awvalid, int(aw_now))
            ctx.set(bus.wvalid, int(w_now))
            if wr is not None:
                ctx.set(bus.awaddr, rm[wr[0]].offset)
                ctx.set(bus.wdata, wr[1])
                ctx.set(bus.wstrb, wr[2])
            if aw_now and ctx.get(bus.awready):
                wr[3] = True
            if w_now and ctx.get(bus.wready):
                wr[4] = True
            bready = int(rng.random() < 0.7)
            ctx.set(bus.bready, bready)
            # -- read channel
            ar = rd is None and not ctx.get(bus.rvalid) and (rng.random() < 0.2 or hs_b_at == t - 1)
            name = rng.choice([r.name for r in regs] + list(unmapped))
            ctx.set(bus.arvalid, int(ar))
            ctx.set(bus.araddr, unmapped[name] if name in unmapped else rm[name].offset)
            ctx.set(bus.rready, 1)
            if ctx.get(bus.rvalid):
                assert rd is not None
                assert ctx.get(bus.rdata) == rd[1], f"{where}: read {rd[0]}: {ctx.get(bus.rdata):#x}, plain {rd[1]:#x}"
                rd = None
            if ar and ctx.get(bus.arready):
                stats["reads"] += 1
                stats["reads_after_b"] += hs_b_at == t - 1
                rd = (name, {"A": model["A"], "B": model["B"], "EV": model["EV"], "P": 0, "S": s_val,
                             "K": 0x1234ABCD, "C_LO": lo_val, "C_HI": shadow, "U1": 0, "U2": 0}[name])
                if name == "C_LO":
                    shadow = hi_val
            # -- the plain model's next cycle: the write lands in the cycle after bvalid rose
            pulse = 0
            ev_next = model["EV"] | ev_set
            if bv and not prev_bv:
                name_w, data_w, strb = wr[0], wr[1], wr[2]
                stats["writes"] += 1
                mask = sum(0xFF << (8 * i) for i in range(4) if strb >> i & 1)
                width = rm[name_w].width
                mask &= (1 << width) - 1
                if name_w in ("A", "B"):
                    model[name_w] = (model[name_w] & ~mask) | (data_w & mask)
                elif name_w == "P":
                    pulse = data_w & mask
                elif name_w == "EV":
                    ev_next = (model["EV"] & ~(data_w & mask)) | ev_set
            model["EV"] = ev_next
            if bv and bready:
                hs_b_at = t
                wr = None
            prev_bv = bv
            await ctx.tick()

    simulate(frag, bench)
    return stats


def test_csr_write_decode():
    stats = check_csr()
    assert stats["writes"] > 100 and stats["reads_after_b"] > 20, stats


def test_csr_proof_catches_an_unregistered_pulse():
    # a pulse applied a cycle early (from the decode itself rather than its register)
    from dnnfab.hw.csr import CSRBank
    bad = mutant(CSRBank, "with m.If(h):\n                    m.d.sync += reg.eq(wdat & mask)",
                 "with m.If(do_write & (word(aw_addr) == (r.offset >> 2))):\n"
                 "                    m.d.sync += reg.eq(w_data[:r.width])")
    with pytest.raises(AssertionError, match="pulse"):
        check_csr(cls=bad)


# ===================================================== top: performance-counter increments
def test_perf_counter_increments():
    """STALL_CYCLES' increment, combined in the second stage from its four terms each
    registered on its own (92d5056), = ``busy & ~beat & (waiting | ~idle)`` of the terms
    (every combination); term i is registered from its source port; every other counter's
    increment is its single registered term (two registers on every increment, the lag
    the counters always had)."""
    from dnnfab.hw.config import AcceleratorConfig
    from dnnfab.hw.regmap import COUNTERS
    from dnnfab.hw.top import Accelerator
    cfg = AcceleratorConfig(rows=2, cols=2, act_kib=1, wgt_kib=1, acc_kib=1, out_kib=1, aux_kib=1, bus_bits=64)
    frag = elaborate(Accelerator(cfg))

    def block(name, cls_name):
        return next(o for o in frag.find_subfragment(name).origins if type(o).__name__ == cls_name)
    ctrl, comp = block("controller", "Controller"), block("compute", "ComputeEngine")
    sources = [ctrl.busy, comp.act_beat, ctrl.compute_waiting, comp.idle]
    for i, src in enumerate(sources):
        cm, _, leaves = lib.cone(frag, sync=[f"perf_stall_cycles_t{i}"])
        elaborate(cm)
        assert [id(v) for v in leaves.values()] == [id(src)], (i, leaves)
    cm, outs, leaves = lib.cone(frag, sync=["perf_stall_cycles_inc"])
    terms = [leaves[f"perf_stall_cycles_t{i}"] for i in range(4)]
    assert len(leaves) == 4
    for name in COUNTERS:
        if name != "STALL_CYCLES":
            c2, _, lv = lib.cone(frag, sync=[f"perf_{name.lower()}_inc"])
            elaborate(c2)
            assert list(lv) == [f"perf_{name.lower()}_inc_p"], (name, sorted(lv))

    async def bench(ctx):
        for bits in itertools.product((0, 1), repeat=4):
            for s, b in zip(terms, bits):
                ctx.set(s, b)
            busy, beat, waiting, idle = bits
            assert ctx.get(outs["perf_stall_cycles_inc"]) == (busy & ~beat & (waiting | ~idle) & 1), bits

    simulate(elaborate(cm), bench, clock=False)
