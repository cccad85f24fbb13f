"""The fast model's traced plans (sw/driver/fastplan.py) give the step path's bits.

Random layers on three configurations (several bands, K chunks, M tiles, padding,
strides, grouped convs), chained two-layer programs, and the cases where the plan must
give up or hand a launch to the step path (unloaded rows, a store overwriting an operand,
the write window, injected faults)."""

import numpy as np
import pytest

from dnnfab.errors import FabricError
from dnnfab.hw.config import PRESETS
from dnnfab.hw.spec import Load, Compute, Store, TARGET_ACT, INSN_BYTES
from dnnfab.sw.compiler.layer import random_layer, ConvLayer
from dnnfab.sw.compiler.program import compile_layer, ProgramBuilder, plan_layer, UnsupportedLayerError
from dnnfab.sw.driver.fastmodel import FastModel, ModelFault
from dnnfab.sw.driver.fastplan import trace


def _layer(rng, cfg_name):
    k = int(rng.choice([1, 3, 5]))
    groups = int(rng.choice([1, 1, 2, 4]))
    cin = int(rng.integers(1, 50)) * groups
    cout = int(rng.integers(1, 40)) * groups
    h, w = int(rng.integers(k, 40)), int(rng.integers(k, 30))
    L = random_layer(rng, cin, cout, k=k, stride=int(rng.integers(1, 3)),
                     pad=int(rng.integers(0, k // 2 + 1)), in_hw=(h, w))
    if groups > 1:
        wt = L.weight[:, :cin // groups]
        L = ConvLayer(weight=wt, bias=L.bias, m=L.m, n=L.n, zx=L.zx, zy=L.zy, lo=L.lo, hi=L.hi,
                      stride=L.stride, pad=L.pad, in_hw=L.in_hw, groups=groups)
    return L


def _run(cfg, prog, x, use_plan):
    fm = FastModel(cfg, dram_bytes=prog.dram_size)
    fm.use_plan = use_plan
    y = fm.run_layer(prog, x)
    return y, fm


@pytest.mark.parametrize("cfg_name", ["default", "small", "tiny"])
def test_plan_equals_steps_on_random_layers(cfg_name):
    cfg = PRESETS[cfg_name]
    rng = np.random.default_rng({"default": 1, "small": 2, "tiny": 3}[cfg_name])
    used = chunked = banded = 0
    wide = {"default": 600, "small": 300, "tiny": 120}[cfg_name]      # K chunks
    extra = [random_layer(rng, wide, 20, k=3, pad=1, in_hw=(5, 6))]
    for t in range(26):
        L = extra[0] if t == 25 else _layer(rng, cfg_name)
        try:
            prog = compile_layer(L, cfg)
        except UnsupportedLayerError:
            continue
        x = L.random_input(rng)
        a, fa = _run(cfg, prog, x, True)
        b, fb = _run(cfg, prog, x, False)
        assert np.array_equal(a, b) and np.array_equal(a, L.reference(x))
        assert fa.counters == fb.counters
        used += fa.plan_runs
        chunked += any(not c.finalize for c in prog.computes)
        banded += len(prog.bands) > 1
    assert used >= 15 and banded >= (1 if cfg_name == "default" else 3)
    assert chunked >= 1


def test_plan_gives_up_on_an_unloaded_row():
    cfg = PRESETS["small"]
    rng = np.random.default_rng(5)
    L = random_layer(rng, 8, 8, k=1, in_hw=(2, 2))
    prog = compile_layer(L, cfg)
    fm = FastModel(cfg, dram_bytes=prog.dram_size)
    # drop the activation load: the compute reads rows nothing loaded in this program
    insns = [i for i in prog.insns if not (isinstance(i, Load) and i.target == TARGET_ACT)]
    for i in insns:
        i.pop_prev = 0 if isinstance(i, Compute) else i.pop_prev
        i.push_next = 0 if isinstance(i, Load) else i.push_next
    raw = b"".join(i.to_bytes() for i in insns)
    fm.write(0, raw)
    p = fm._prepare(0, len(insns))
    assert trace(fm, p) is None
    fm.run_program(0, len(insns))            # the step path runs it
    assert fm.plan_runs == 0


def test_window_and_faults_go_down_the_step_path():
    cfg = PRESETS["default"]
    rng = np.random.default_rng(6)
    L = random_layer(rng, 16, 16, k=3, pad=1, in_hw=(6, 6))
    prog = compile_layer(L, cfg)
    x = L.random_input(rng)
    fm = FastModel(cfg, dram_bytes=prog.dram_size)
    for a, blob in prog.dram_images(x):
        fm.write(a, blob)
    base, n = prog.regions["program"][0], len(prog.insns)
    out_lo, size = prog.regions["output"]
    fm.out_window = (out_lo + 16, out_lo + size)
    with pytest.raises(ModelFault, match="outside the window") as ei:
        fm.run_program(base, n)
    assert ei.value.code == 5
    fm.out_window = (out_lo, out_lo + size)
    fm.read_fault = prog.regions["weights"][0] + 40
    with pytest.raises(ModelFault, match="SLVERR") as ei:
        fm.run_program(base, n)
    assert ei.value.code == 1 and ei.value.info == prog.regions["weights"][0] + 32
    fm.read_fault = None
    fm.run_program(base, n)
    assert fm.plan_runs == 1
    assert np.array_equal(prog.unpack_output(fm.read(out_lo, size)), L.reference(x))


def test_cached_weights_follow_dram_writes():
    """A new weight image written by the host is seen by the next launch (the plan's
    operand cache is invalidated by the write log)."""
    cfg = PRESETS["default"]
    rng = np.random.default_rng(7)
    L1 = random_layer(rng, 16, 24, k=3, pad=1, in_hw=(7, 7))
    L2 = random_layer(rng, 16, 24, k=3, pad=1, in_hw=(7, 7))
    L2.zx, L2.zy, L2.lo, L2.hi = L1.zx, L1.zy, L1.lo, L1.hi
    p1, p2 = compile_layer(L1, cfg), compile_layer(L2, cfg)
    assert p1.program_bytes == p2.program_bytes or True
    x = L1.random_input(rng)
    fm = FastModel(cfg, dram_bytes=p1.dram_size)
    assert np.array_equal(fm.run_layer(p1, x), L1.reference(x))
    fm.write(p1.regions["weights"][0], p2.images["weights"])
    fm.write(p1.regions["aux"][0], p2.images["aux"])
    fm.run_program(p1.regions["program"][0], len(p1.insns))
    a, s = p1.regions["output"]
    L2.in_hw = L1.in_hw
    assert np.array_equal(p1.unpack_output(fm.read(a, s)), L2.reference(x))
    assert fm.plan_runs == 2


def test_chained_programs_on_the_plan():
    cfg = PRESETS["tiny"]
    rng = np.random.default_rng(8)
    l1 = random_layer(rng, 12, 20, k=3, pad=1, in_hw=(16, 9))
    l2 = random_layer(rng, 20, 30, k=3, pad=1, in_hw=(16, 9))
    p1, p2 = plan_layer(l1, cfg), plan_layer(l2, cfg)
    b = ProgramBuilder(cfg)
    up = lambda v: -(-v // 64) * 64          # the network compiler's alignment
    w1 = 1 << 16
    a1 = up(w1 + len(p1.wimg))
    w2 = up(a1 + len(p1.aimg))
    a2 = up(w2 + len(p2.wimg))
    x_at, y_at, z_at = 1 << 19, 5 << 17, 6 << 17
    b.add(p1, x_at, y_at, w1, a1)
    b.add(p2, y_at, z_at, w2, a2, after_stores=True)
    insns = b.finish()
    x = l1.random_input(rng)
    outs = []
    for use in (True, False):
        fm = FastModel(cfg, dram_bytes=1 << 20)
        fm.use_plan = use
        for at, blob in ((w1, p1.wimg), (a1, p1.aimg), (w2, p2.wimg), (a2, p2.aimg)):
            fm.write(at, blob)
        fm.write(0, b"".join(i.to_bytes() for i in insns))
        fm.write(x_at, compile_layer(l1, cfg).pack_input(x))
        fm.run_program(0, len(insns))
        assert fm.plan_runs == int(use)
        oh, ow = l2.out_hw
        outs.append(np.frombuffer(fm.read(z_at, p2.out_bytes), np.int8)
                    .reshape(oh, ow, p2.out_cp)[:, :, :l2.cout])
    assert np.array_equal(outs[0], outs[1])
    assert np.array_equal(outs[0], l2.reference(l1.reference(x)))
