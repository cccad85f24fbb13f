"""Post-processing at the array output: requantize int32 accumulators to int8.

Implements the integer contract (docs/contract.md) lane by lane:

    y = clamp(z_y + ((acc * m + 2^(n-1)) >> n), lo, hi)

with ``m`` an unsigned 16-bit multiplier in [2^14, 2^15), ``n`` in [1, 63] and ``>>`` an
arithmetic shift. Bias (with the input zero point folded in) has already been added to
``acc`` by the accumulator. ReLU/clamp is ``lo``/``hi``.

Why the 49-bit datapath is exact for every ``n``: |acc * m| < 2^31 * 2^15 = 2^46, so for
n >= 47 the rounded quotient is 0 (x + 2^(n-1) lies in [0, 2^n)); for n <= 46 the sum
x + 2^(n-1) fits in 48 bits plus sign.

Fixed latency :data:`LATENCY` cycles, no backpressure.
"""

from amaranth.hdl import Signal, Module, Const, signed, unsigned, Mux
from amaranth.lib import wiring, data
from amaranth.lib.wiring import In, Out

__all__ = ["Requantizer", "LATENCY", "requantize_ref"]

LATENCY = 4


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
        pw = self.acc_bits + 17          # product width (signed acc x unsigned 16)
        big = self.acc_bits + 15          # n at or above this gives 0 (see module doc)

        # stage valid/side/scalars
        v = [Signal(name=f"v{i}") for i in range(LATENCY)]
        side = [Signal(self.side_bits, name=f"side{i}") for i in range(LATENCY)]
        zy = [Signal(signed(self.out_bits), name=f"zy{i}") for i in range(LATENCY - 1)]
        lo = [Signal(signed(self.out_bits), name=f"lo{i}") for i in range(LATENCY - 1)]
        hi = [Signal(signed(self.out_bits), name=f"hi{i}") for i in range(LATENCY - 1)]
        m.d.sync += [v[0].eq(self.i_valid), side[0].eq(self.i_side),
                     zy[0].eq(self.i_zy), lo[0].eq(self.i_lo), hi[0].eq(self.i_hi)]
        for i in range(1, LATENCY):
            m.d.sync += [v[i].eq(v[i - 1]), side[i].eq(side[i - 1])]
        for i in range(1, LATENCY - 1):
            m.d.sync += [zy[i].eq(zy[i - 1]), lo[i].eq(lo[i - 1]), hi[i].eq(hi[i - 1])]
        m.d.comb += [self.o_valid.eq(v[-1]), self.o_side.eq(side[-1])]

        for lane in range(self.lanes):
            # stage 1: multiply (maps to a DSP)
            prod = Signal(signed(pw), name=f"prod{lane}")
            n1 = Signal(6, name=f"n1_{lane}")
            m.d.sync += [prod.eq(self.i_acc[lane] * self.i_m[lane].as_unsigned()),
                         n1.eq(self.i_n[lane])]
            # stage 2: add the rounding constant
            rnd = Signal(signed(pw + 1), name=f"rnd{lane}")
            n2 = Signal(6, name=f"n2_{lane}")
            zero2 = Signal(name=f"zero2_{lane}")
            half = Signal(unsigned(pw), name=f"half{lane}")
            m.d.comb += half.eq(Mux(n1 == 0, 0, Const(1, pw) << (n1 - 1)[:6]))
            m.d.sync += [rnd.eq(prod + half), n2.eq(n1), zero2.eq(n1 >= big)]
            # stage 3: arithmetic shift
            shifted = Signal(signed(pw + 1), name=f"shifted{lane}")
            m.d.sync += shifted.eq(Mux(zero2, 0, rnd >> n2))
            # stage 4: zero point and clamp
            yz = Signal(signed(pw + 2), name=f"yz{lane}")
            m.d.comb += yz.eq(shifted + zy[-1])
            y = Signal(signed(self.out_bits), name=f"y{lane}")
            with m.If(yz < lo[-1]):
                m.d.sync += y.eq(lo[-1])
            with m.Elif(yz > hi[-1]):
                m.d.sync += y.eq(hi[-1])
            with m.Else():
                m.d.sync += y.eq(yz)
            m.d.comb += self.o_y[lane].eq(y)
        return m
