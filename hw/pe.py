"""Processing element of the weight-stationary systolic array."""

from amaranth.hdl import Signal, Module, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ProcessingElement"]


class ProcessingElement(wiring.Component):
    """One multiply-accumulate cell with a double-buffered (shadow/active) weight.

    Activations travel left to right, partial sums top to bottom. A new weight is written
    into the *shadow* register while the *active* one is in use; the activation that
    starts a new tile carries ``first`` and, as it enters the PE, copies shadow into
    active. Because ``first`` travels with the skewed data, every PE switches exactly
    when the new tile reaches it and tiles follow each other with no bubble.

    Pipeline (all registers advance only while ``en`` is high, the array's global stall):
    ``a_in -> a_reg -> prod = a_reg * w_act -> psum_out = psum_in + prod``.
    The product register lets the multiplier map onto a DSP block with registered
    inputs and outputs.

    Parameters
    ----------
    input_bits, weight_bits, acc_bits : int
        Signed widths of activation, weight and partial sum.

    Members
    -------
    en : ``In(1)``
        Pipeline advance (global clock enable of the array).
    a_in : ``In(signed(input_bits))``
        Activation from the left neighbour (or the skew line).
    f_in : ``In(1)``
        ``a_in`` is the first activation of a new weight tile.
    a_out : ``Out(signed(input_bits))``
        Registered activation to the right neighbour.
    f_out : ``Out(1)``
        Registered ``f_in`` to the right neighbour.
    w_in : ``In(signed(weight_bits))``
        Weight to store in the shadow register ...
    w_we : ``In(1)``
        ... when this is high (independent of ``en``).
    psum_in : ``In(signed(acc_bits))``
        Partial sum from the PE above (zero at the top row).
    psum_out : ``Out(signed(acc_bits))``
        ``psum_in + a * w``, registered, to the PE below.
    """

    def __init__(self, input_bits=8, weight_bits=8, acc_bits=32):
        self.input_bits = input_bits
        self.weight_bits = weight_bits
        self.acc_bits = acc_bits
        super().__init__({
            "en": In(1),
            "a_in": In(signed(input_bits)),
            "f_in": In(1),
            "a_out": Out(signed(input_bits)),
            "f_out": Out(1),
            "w_in": In(signed(weight_bits)),
            "w_we": In(1),
            "psum_in": In(signed(acc_bits)),
            "psum_out": Out(signed(acc_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        w_shadow = Signal(signed(self.weight_bits))
        w_active = Signal(signed(self.weight_bits))
        prod = Signal(signed(self.input_bits + self.weight_bits))

        with m.If(self.w_we):
            m.d.sync += w_shadow.eq(self.w_in)
        with m.If(self.en):
            m.d.sync += [
                self.a_out.eq(self.a_in),
                self.f_out.eq(self.f_in),
                prod.eq(self.a_out * w_active),
                self.psum_out.eq(self.psum_in + prod),
            ]
            with m.If(self.f_in):
                m.d.sync += w_active.eq(w_shadow)
        return m
