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

import importlib.util
import pathlib
import random
import sys

import pytest
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.lib import data

from dnnfab.hw import compute, controller, dma


def _lib():
    name = "dnnfab_tests_retimed_lib"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, pathlib.Path(__file__).with_name("retimed_lib.py"))
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


lib = _lib()
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

    async def bench(ctx):
        s = (0, 0)
        for cyc, (inc, dec) in enumerate(walk + [(0, 0)]):
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
    assert cycles < 3 * n_edges


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
    ptr = find(frag, "consume", path=("q",))
    prod = find(frag, "produce", path=("q",))
    stored, occupied = find(frag, "stored", path=("q",)), find(frag, "occupied", path=("q",))
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
    rng = random.Random(depth)

    async def bench(ctx):
        st = ((), 0)
        vals = []           # values of the unconsumed entries, oldest first
        held = 0
        prev_w = 0
        for cyc, (w, c) in enumerate(walk + [(0, 0)]):
            ages, p = st
            v = held if prev_w else rng.randrange(256)
            ctx.set(q.fifo.w_en, w)
            ctx.set(q.w.v, v)
            ctx.set(consume, c)
            where = f"depth {depth} cycle {cyc}: ages {ages}"
            pv = plain_valid(ages)
            assert ctx.get(valid) == pv, where
            if pv:
                assert ctx.get(reg.v) == vals[0], where
            in_fifo = ages[1:] if pv else ages
            assert ctx.get(q.fifo.w_rdy) == (len(in_fifo) < depth), where
            # the queue's own registers, as the model's state gives them
            assert ctx.get(ptr) == p, where
            assert ctx.get(stored) == therm(sum(a >= 2 for a in in_fifo)), where
            assert ctx.get(occupied) == therm(len(in_fifo)), where
            assert ctx.get(prod) == (p + sum(a >= 2 for a in in_fifo)) % depth, where
            await ctx.tick()
            if c:
                vals.pop(0)
            if w:
                vals.append(v)
            held, prev_w = v, w
            st = step(st, (w, c))

    simulate(frag, bench)
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
