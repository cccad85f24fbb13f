"""Post-processing at the array output: requantize int32 accumulators to int8.

Implements the integer contract (docs/contract.md) lane by lane:

    y = clamp(z_y + ((acc * m + 2^(n-1)) >> n), lo, hi)

with ``m`` an unsigned 16-bit multiplier in [2^14, 2^15), ``n`` in [1, 63] and ``>>`` an
arithmetic shift. Bias (with the input zero point folded in) has already been added to
``acc`` by the accumulator. ReLU/clamp is ``lo``/``hi``.

Why the 49-bit datapath is exact for every ``n``: |acc * m| < 2^31 * 2^15 = 2^46, so for
n >= 47 the rounded quotient is 0 (x + 2^(n-1) lies in [0, 2^n)); for n <= 46 the sum
x + 2^(n-1) fits in 48 bits plus sign.

Fixed latency :data:`LATENCY` cycles, no backpressure. Pipelined for Fmax: two 16-bit
partial products (one DSP each, with its input and output registers, then registered
again in the fabric), product sum and the
rounding constant 2^(n-1) decoded alongside, rounding add, a two-step barrel shift,
saturation to 11 bits (exact, since the clamp to int8 follows), the zero-point add and the
clamp decisions side by side (comparing against ``lo - zy`` and ``hi - zy``, prepared early),
then the clamp itself.
"""

from amaranth.hdl import Signal, Module, Const, Cat, signed, unsigned, Mux, Array
from amaranth.lib import wiring, data
from amaranth.lib.wiring import In, Out

from .pe import registered_mul, MUL_LATENCY, dreg
from .scratchpad import dup_reg
from .spec import RQ_LATENCY

__all__ = ["Requantizer", "LATENCY", "requantize_ref"]

LATENCY = RQ_LATENCY   # hw/spec.py


def requantize_ref(acc, m, n, zy, lo, hi):
    """Python reference of one lane (ints)."""
    v = zy + ((acc * m + (1 << (n - 1))) >> n)
    return max(lo, min(hi, v))


class Requantizer(wiring.Component):
    """C-lane requantizer with a side-band passed along unchanged.

    Members
    -------
    i_valid : ``In(1)``
    i_acc : ``In(ArrayLayout(signed(acc_bits), lanes))``
    i_m : ``In(ArrayLayout(unsigned(16), lanes))``
    i_n : ``In(ArrayLayout(unsigned(6), lanes))``
    i_zy, i_lo, i_hi : ``In(signed(8))``
    i_side : ``In(side_bits)``
        Carried to ``o_side`` with the data (addresses, flags).
    o_valid : ``Out(1)``
    o_y : ``Out(ArrayLayout(signed(out_bits), lanes))``
    o_side : ``Out(side_bits)``
    """

    def __init__(self, lanes, acc_bits=32, out_bits=8, side_bits=1):
        self.lanes, self.acc_bits, self.out_bits, self.side_bits = lanes, acc_bits, out_bits, side_bits
        super().__init__({
            "i_valid": In(1),
            "i_acc": In(data.ArrayLayout(signed(acc_bits), lanes)),
            "i_m": In(data.ArrayLayout(unsigned(16), lanes)),
            "i_n": In(data.ArrayLayout(unsigned(6), lanes)),
            "i_zy": In(signed(out_bits)),
            "i_lo": In(signed(out_bits)),
            "i_hi": In(signed(out_bits)),
            "i_side": In(side_bits),
            "o_valid": Out(1),
            "o_y": Out(data.ArrayLayout(signed(out_bits), lanes)),
            "o_side": Out(side_bits),
        })

    def elaborate(self, platform):
        m = Module()
        A = self.acc_bits
        assert 16 < A <= 34
        pw = A + 17                       # product width (signed acc x unsigned 16)
        big = A + 15                      # n at or above this gives 0 (see module doc)
        L = LATENCY
        assert MUL_LATENCY == 2

        # side-band and valid travel along the stages; stage k holds what is k cycles old.
        # Only the valid bits are reset: every other stage register is data (``dreg``).
        v = [Signal(name=f"v{i}") for i in range(L)]
        side = [dreg(self.side_bits, name=f"side{i}") for i in range(L)]
        m.d.sync += [v[0].eq(self.i_valid), side[0].eq(self.i_side)]
        for i in range(1, L):
            m.d.sync += [v[i].eq(v[i - 1]), side[i].eq(side[i - 1])]
        m.d.comb += [self.o_valid.eq(v[-1]), self.o_side.eq(side[-1])]
        # per-instruction scalars: zy, and the clamp bounds relative to it
        ob = self.out_bits
        zy = [dreg(signed(ob), name=f"zy{i}") for i in range(L - 1)]
        loz = [dreg(signed(ob + 1), name=f"loz{i}") for i in range(L - 1)]
        hiz = [dreg(signed(ob + 1), name=f"hiz{i}") for i in range(L - 1)]
        lo = [dreg(signed(ob), name=f"lo{i}") for i in range(L - 1)]
        hi = [dreg(signed(ob), name=f"hi{i}") for i in range(L - 1)]
        m.d.sync += [zy[0].eq(self.i_zy), lo[0].eq(self.i_lo), hi[0].eq(self.i_hi),
                     loz[0].eq(self.i_lo - self.i_zy), hiz[0].eq(self.i_hi - self.i_zy)]
        for i in range(1, L - 1):
            m.d.sync += [zy[i].eq(zy[i - 1]), lo[i].eq(lo[i - 1]), hi[i].eq(hi[i - 1]),
                         loz[i].eq(loz[i - 1]), hiz[i].eq(hiz[i - 1])]

        sat_bits = ob + 3                 # |shifted| is saturated to this many bits
        for lane in range(self.lanes):
            acc = self.i_acc[lane]
            mm = self.i_m[lane].as_unsigned()
            # 1, 2: two 16-bit partial products (DSP input and output registers)
            p_lo = registered_mul(m, platform, acc.as_unsigned()[:16], mm, f"rq_lo{lane}")
            p_hi = registered_mul(m, platform, acc[16:].as_signed(), mm, f"rq_hi{lane}")
            n1 = dreg(6, name=f"n1_{lane}")
            n2 = dreg(6, name=f"n2_{lane}")
            half2 = dreg(unsigned(pw), name=f"half2_{lane}")
            zero2 = dreg(name=f"zero2_{lane}")
            m.d.sync += [n1.eq(self.i_n[lane]), n2.eq(n1),
                         half2.eq((Const(1, pw + 1) << n1)[1:pw + 1]),  # 2^(n-1), 0 for n = 0: no subtract
                         zero2.eq(n1 >= big)]
            # 3: the partial products registered in the fabric (the route out of the DSP
            # column takes most of a cycle by itself: 4.2 of 6.9 ns when the add shared it)
            q_hi = dreg(signed(A - 16 + 17), name=f"q_hi{lane}")
            q_lo = dreg(unsigned(32), name=f"q_lo{lane}")
            n2b = dreg(6, name=f"n2b_{lane}")
            half2b = dreg(unsigned(pw), name=f"half2b_{lane}")
            zero2b = dreg(name=f"zero2b_{lane}")
            m.d.sync += [q_hi.eq(p_hi[:A - 16 + 17].as_signed()), q_lo.eq(p_lo[:32]),
                         n2b.eq(n2), half2b.eq(half2), zero2b.eq(zero2)]
            # 4: the full product (the low 16 bits need no add)
            prod = dreg(signed(pw), name=f"prod{lane}")
            n3 = dreg(6, name=f"n3_{lane}")
            half3 = dreg(unsigned(pw), name=f"half3_{lane}")
            zero3 = dreg(name=f"zero3_{lane}")
            m.d.sync += [prod.eq(Cat(q_lo[:16], q_hi + q_lo[16:])),
                         n3.eq(n2b), half3.eq(half2b), zero3.eq(zero2b)]
            # 5: add the rounding constant 2^(n-1)
            rnd = dreg(signed(pw + 1), name=f"rnd{lane}")
            n4 = dreg(6, name=f"n4_{lane}")
            zero4 = dreg(name=f"zero4_{lane}")
            m.d.sync += [rnd.eq(prod + half3), n4.eq(n3), zero4.eq(zero3)]
            # 6, 7: arithmetic shift right by n, in two steps (8s, then 1s)
            sh5 = dreg(signed(pw + 1), name=f"sh5_{lane}")
            n5 = dreg(3, name=f"n5_{lane}")
            m.d.sync += [sh5.eq(Mux(zero4, 0, rnd >> Cat(Const(0, 3), n4[3:]))), n5.eq(n4[:3])]
            sh6 = dreg(signed(pw + 1), name=f"sh6_{lane}")
            m.d.sync += sh6.eq(sh5 >> n5)
            # (beside the shift: whether sh5's bits from K up are all zeros / all ones; the
            # shift by n5 < 8 moves only bits K.. down into sh6[sat_bits-1:K], so with
            # these flags the range check below looks at 7 bits of sh6 instead of ~40:
            # the wide AND was on 8.3 ns paths in the whole design)
            K = sat_bits - 1 + 7
            hz = dreg(name=f"hz{lane}"); ho = dreg(name=f"ho{lane}")
            m.d.sync += [hz.eq(sh5[K:] == 0), ho.eq(sh5[K:] == (1 << len(sh5[K:])) - 1)]
            # (and whether sh6's bits sat_bits-1 .. K-1, i.e. sh5's bits sat_bits-1+n5 ..
            # K-1+n5, are all zeros / all ones, decided beside the shift too: for each n5,
            # the bits of sh5 from sat_bits-1+n5 up to K-1 (the rest is in hz / ho), picked
            # by n5; the 7-bit compares of sh6 in stage 8 were on 7.2 ns paths; proved equal to
            # the plain saturation: tests/hw/test_retimed.py::test_requantizer_range_flags_exhaustive)
            lo_b = sat_bits - 1
            mz = dreg(name=f"mz{lane}"); mo = dreg(name=f"mo{lane}")
            zc = Array([sh5[lo_b + s:K] == 0 if lo_b + s < K else Const(1) for s in range(8)])
            oc = Array([sh5[lo_b + s:K] == (1 << (K - lo_b - s)) - 1 if lo_b + s < K else Const(1)
                        for s in range(8)])
            m.d.sync += [mz.eq(zc[n5]), mo.eq(oc[n5])]
            # 8: saturate to a few bits more than the output (exact: the clamp follows)
            sat = dreg(signed(sat_bits), name=f"sat{lane}")
            lim = (1 << (sat_bits - 1)) - 1
            with m.If((mz & hz) | (mo & ho)):
                m.d.sync += sat.eq(sh6)
            with m.Elif(sh6 < 0):
                m.d.sync += sat.eq(-lim - 1)
            with m.Else():
                m.d.sync += sat.eq(lim)
            # 9: zero point added and the clamp decided side by side (sat compared against
            # lo - zy and hi - zy), 10: the clamp
            # (each lane compares against copies of the scalars of its own, on ECP5 as
            # instantiated flip-flops that yosys does not merge back: with one shared
            # register driving every lane, the placer put a lane's compare 5.7 ns of
            # routing away from its own ``sat``)
            cp = lambda v, n: dup_reg(m, platform, v, f"{n}_l{lane}").as_signed()   # noqa: E731
            loz_l, hiz_l, zy_l = cp(loz[L - 4], "loz"), cp(hiz[L - 4], "hiz"), cp(zy[L - 4], "zy")
            lo_l, hi_l = cp(lo[L - 3], "lo"), cp(hi[L - 3], "hi")
            lt = dreg(name=f"lt{lane}"); gt = dreg(name=f"gt{lane}")
            yz = dreg(signed(ob), name=f"yz{lane}")
            m.d.sync += [lt.eq(sat < loz_l), gt.eq(sat > hiz_l), yz.eq(sat + zy_l)]
            y = dreg(signed(ob), name=f"y{lane}")
            with m.If(lt):
                m.d.sync += y.eq(lo_l)
            with m.Elif(gt):
                m.d.sync += y.eq(hi_l)
            with m.Else():
                m.d.sync += y.eq(yz)
            m.d.comb += self.o_y[lane].eq(y)
        return m
