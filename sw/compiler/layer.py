"""A quantized conv2d / GEMM layer as the accelerator sees it, with its integer reference.

:class:`ConvLayer` holds exactly the integers of the contract (docs/contract.md):
int8 weights (per output channel symmetric), int32 bias with the input zero point already
folded in, per-channel requantization multiplier ``m`` in [2^14, 2^15) and shift ``n``,
zero points and the clamp bounds of the fused activation. A GEMM is the 1x1 convolution
on a 1 x N "image" (see :meth:`ConvLayer.gemm`).

:meth:`ConvLayer.reference` is the straightforward numpy implementation used to check the
hardware bit for bit; ``dnnfab.sw.cpu.reference`` (the network-level golden model) must agree
with it (tested).
"""

from dataclasses import dataclass, field
import numpy as np

from ...errors import ModelError
from ..ir.qgraph import requantize   # the contract's requantization, shared with the reference

__all__ = ["ConvLayer", "requantize", "random_layer"]


@dataclass
class ConvLayer:
    """Integer parameters of one conv2d layer (NHWC activations, OIHW weights)."""

    weight: np.ndarray            # int8 [cout, cin, kh, kw]
    bias: np.ndarray              # int32 [cout], input zero point folded in
    m: np.ndarray                 # int32 [cout], in [2^14, 2^15)
    n: np.ndarray                 # int32 [cout], >= 1
    zx: int = 0
    zy: int = 0
    lo: int = -128
    hi: int = 127
    stride: tuple = (1, 1)
    pad: tuple = (0, 0, 0, 0)     # top, left, bottom, right
    dilation: tuple = (1, 1)
    in_hw: tuple = (1, 1)
    name: str = "conv"
    groups: int = 1               # weight is [cout, cin / groups, kh, kw]

    def __post_init__(self):
        self.weight = np.asarray(self.weight, np.int8)
        self.bias = np.asarray(self.bias, np.int64).astype(np.int32)
        self.m = np.asarray(self.m, np.int64)
        self.n = np.asarray(self.n, np.int64)
        cout = self.weight.shape[0]
        for nm in ("bias", "m", "n"):
            if getattr(self, nm).shape != (cout,):
                raise ModelError(f"layer {self.name}: {nm} has shape {getattr(self, nm).shape}, expected ({cout},)")
        if np.any(self.m < (1 << 14)) or np.any(self.m >= (1 << 15)):
            raise ModelError(f"layer {self.name}: requantization multipliers must lie in [2^14, 2^15)")
        if np.any(self.n < 1) or np.any(self.n > 63):
            raise ModelError(f"layer {self.name}: requantization shifts must lie in [1, 63]")
        self.stride = tuple(int(s) for s in self.stride)
        self.pad = tuple(int(p) for p in self.pad)
        self.dilation = tuple(int(d) for d in self.dilation)
        self.in_hw = tuple(int(v) for v in self.in_hw)
        self.groups = int(self.groups)
        if self.groups < 1 or cout % self.groups:
            raise ModelError(f"layer {self.name}: {cout} output channels do not split into "
                             f"{self.groups} groups")

    # -- shapes ------------------------------------------------------------------------
    @property
    def cout(self):
        return self.weight.shape[0]

    @property
    def cin(self):
        return self.weight.shape[1] * self.groups

    @property
    def kernel(self):
        return self.weight.shape[2], self.weight.shape[3]

    @property
    def out_hw(self):
        (h, w), (kh, kw) = self.in_hw, self.kernel
        (sh, sw), (dh, dw) = self.stride, self.dilation
        pt, pl, pb, pr = self.pad
        oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
        ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
        return oh, ow

    @property
    def macs(self):
        oh, ow = self.out_hw
        kh, kw = self.kernel
        return oh * ow * self.cout * self.weight.shape[1] * kh * kw

    @classmethod
    def gemm(cls, weight_kn, bias, m, n, rows=1, **kw):
        """GEMM ``y[rows, N] = x[rows, K] @ W[K, N]`` as a 1x1 conv over a 1 x rows image."""
        w = np.asarray(weight_kn).T.reshape(weight_kn.shape[1], weight_kn.shape[0], 1, 1)
        return cls(weight=w, bias=bias, m=m, n=n, in_hw=(1, rows), **kw)

    # -- reference ---------------------------------------------------------------------
    def accumulate(self, x):
        """int32 accumulators [oh, ow, cout] for int8 input ``x`` [h, w, cin] (NHWC, no batch)."""
        x = np.asarray(x)
        h, w = self.in_hw
        if x.shape != (h, w, self.cin):
            raise ModelError(f"layer {self.name}: input shape {x.shape}, expected {(h, w, self.cin)}")
        pt, pl, pb, pr = self.pad
        xp = np.full((h + pt + pb, w + pl + pr, self.cin), self.zx, np.int64)
        xp[pt:pt + h, pl:pl + w] = x
        oh, ow = self.out_hw
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.stride, self.dilation
        acc = np.zeros((oh, ow, self.cout), np.int64)
        wt = self.weight.astype(np.int64)
        g, cig, cog = self.groups, self.weight.shape[1], self.cout // self.groups
        for i in range(kh):
            for j in range(kw):
                patch = xp[i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
                for q in range(g):
                    acc[..., q * cog:(q + 1) * cog] += (patch[..., q * cig:(q + 1) * cig]
                                                         @ wt[q * cog:(q + 1) * cog, :, i, j].T)
        acc += self.bias.astype(np.int64)
        if np.any(acc > np.iinfo(np.int32).max) or np.any(acc < np.iinfo(np.int32).min):
            raise ModelError(f"layer {self.name}: accumulator overflows int32")
        return acc

    def reference(self, x):
        """int8 output [oh, ow, cout] of the layer for int8 input ``x`` [h, w, cin]."""
        return requantize(self.accumulate(x), self.m, self.n, self.zy, self.lo, self.hi)

    def random_input(self, rng):
        h, w = self.in_hw
        x = rng.integers(-128, 128, size=(h, w, self.cin)).astype(np.int8)
        x.flat[rng.choice(x.size, size=max(1, x.size // 16))] = -128
        x.flat[rng.choice(x.size, size=max(1, x.size // 16))] = 127
        return x


def random_layer(rng, cin, cout, k=3, stride=1, pad=0, in_hw=(8, 8), dilation=1, relu=None, name="conv"):
    """A layer with random weights and quantization parameters (tests, benchmarks).

    The bias and the requantization scale are chosen so outputs spread over the int8 range.
    """
    kh, kw = (k, k) if isinstance(k, int) else k
    w = rng.integers(-127, 128, size=(cout, cin, kh, kw)).astype(np.int8)
    w.flat[rng.choice(w.size, size=max(1, w.size // 16))] = -127
    w.flat[rng.choice(w.size, size=max(1, w.size // 16))] = 127
    zx = int(rng.integers(-128, 128))
    zy = int(rng.integers(-128, 128))
    bias = rng.integers(-(1 << 16), 1 << 16, size=cout) - zx * w.reshape(cout, -1).astype(np.int64).sum(1)
    # typical |acc| ~ 128*128*sqrt(K)/2 ; aim the scale at mapping that to ~64
    K = cin * kh * kw
    target = 64.0 / (128 * 128 * max(1.0, np.sqrt(K)) / 2)
    scale = target * np.exp(rng.uniform(-0.7, 0.7, size=cout))
    n = np.floor(np.log2((1 << 15) / scale)).astype(np.int64)
    n = np.clip(n, 1, 63)
    m = np.round(scale * (2.0 ** n)).astype(np.int64)
    m = np.clip(m, 1 << 14, (1 << 15) - 1)
    if relu is None:
        relu = bool(rng.integers(0, 2))
    lo = max(-128, zy) if relu else -128
    pads = (pad, pad, pad, pad) if isinstance(pad, int) else tuple(pad)
    return ConvLayer(weight=w, bias=bias, m=m, n=n, zx=zx, zy=zy, lo=lo, hi=127,
                     stride=(stride, stride) if isinstance(stride, int) else tuple(stride),
                     pad=pads, dilation=(dilation, dilation) if isinstance(dilation, int) else tuple(dilation),
                     in_hw=in_hw, name=name)
