"""InferenceSession, the whole-network compiler and the host driver (issue 17).

Bit-exactness of whole networks against the integer reference, random single- and
two-layer models (hypothesis), compile determinism and the cache, the driver's typed
errors on the model backend (through the test-only :mod:`faulty_backend`), the CPU
fallback, and one-line errors for bad input.
"""

import os
import warnings

import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from onnx import helper, TensorProto

import dnnfab
from dnnfab.errors import (DnnfabError, InputError, ModelError, DmaError, IllegalInstruction,
                           FabricTimeout, ConfigError)
from dnnfab.hw.config import AcceleratorConfig, PRESETS
from dnnfab.sw import driver
from dnnfab.sw.compiler.network import compile_network, CompiledNetwork
from dnnfab.sw.cpu.reference import run_reference
from dnnfab.sw.compiler.layer import random_layer
from dnnfab.sw.compiler.program import compile_layer, ProgramBuilder, plan_layer
from dnnfab.hw.spec import INSN_BYTES, Load

from .faulty_backend import FaultyBackend
from . import models_helper as mh

LIGHT = mh.LIGHT_MODELS


def _feed(sess, seed=0):
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sess.get_inputs()}


def _exact(sess, feed):
    out = sess.run_int(feed)
    ref = run_reference(sess.qg, sess.qg.quantize_inputs(feed))
    return all(np.array_equal(out[k], ref[k]) for k in ref), out


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("compiled"))


# ------------------------------------------------------------------ whole networks
@pytest.mark.parametrize("name", ["digits-cnn", "eeg-seizure"])
def test_bundled_models_bit_exact_and_onnxruntime_api(name, cache):
    sess = dnnfab.InferenceSession(name, cache_dir=cache)
    inp, = sess.get_inputs()
    out, = sess.get_outputs()
    assert sess.get_modelmeta().producer_name == "dnnfab"
    from dnnfab.models import datasets
    x = (datasets.digits_split()[2][:1] if name == "digits-cnn"
         else datasets.eeg_split(n_train=1, n_test=2)[2][:1])
    ok, q = _exact(sess, {inp.name: x})
    assert ok
    (y,) = sess.run([out.name], {inp.name: x})
    ref = sess.qg.run({inp.name: x})[out.name]
    assert np.array_equal(y, ref) and y.dtype == np.float32
    prof = sess.profile()
    assert [r["name"] for r in prof] == [L.name for L in sess.qg.layers]
    fab = [r for r in prof if r["target"] == "fabric"]
    assert fab and all(r["cycles"] > 0 and 0 < r["utilization"] <= 1 for r in fab)
    # every fabric run is one launch per inference (two inferences here)
    assert sess.dev.backend.launches == 2 * len(sess.net.runs)


def test_results_are_the_callers_own_arrays(cache):
    """Outputs (and every tensor a fabric launch returns) are copies: the next run, which
    writes the same device buffers, must not change what an earlier run returned (a view
    of a device buffer whose channels need no padding once aliased them)."""
    sess = dnnfab.InferenceSession("digits-cnn", cache_dir=cache)
    inp, = sess.get_inputs()
    from dnnfab.models import datasets
    x = datasets.digits_split()[2][:3]
    first = sess.run_int({inp.name: x[:1]})
    kept = {k: v.copy() for k, v in first.items()}
    env = sess.last_env
    for k, v in first.items():
        assert v.base is None or not np.shares_memory(v, np.asarray(sess._mem)), k
    for _ in range(2):
        sess.run_int({inp.name: x[1:2]})
    assert all(np.array_equal(first[k], kept[k]) for k in kept)
    ref = run_reference(sess.qg, sess.qg.quantize_inputs({inp.name: x[:1]}))
    assert all(np.array_equal(first[k], ref[k]) for k in ref)
    assert env is not sess.last_env


@pytest.mark.parametrize("name", LIGHT)
def test_zoo_models_bit_exact(name, cache):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = dnnfab.InferenceSession(name, cache_dir=cache)
    ok, _ = _exact(sess, _feed(sess, 3))
    assert ok
    prof = sess.profile()
    assert any(r["target"] == "fabric" for r in prof)
    assert not sess.faults
    # the traced plans ran (not the instruction-by-instruction path)
    assert sess.dev.backend.fm.plan_runs == len(sess.net.runs)
    sess.close()


def test_consecutive_fabric_layers_share_a_launch_and_read_in_place(cache):
    """resnet50's bottlenecks chain: a run of several layers, fewer runs than fabric
    layers, and only run boundaries cross to the host."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = dnnfab.InferenceSession("resnet50", cache_dir=cache)
    net = sess.compile()
    fab = [L for L in net.layers.values() if L.target == "fabric"]
    assert len(net.runs) < len(fab)
    multi = [r for r in net.runs if len(r.layers) > 1]
    assert multi
    r = multi[0]
    inner = {net.produces[n] for n in r.layers[:-1]}
    # an in-run tensor consumed only inside the run never goes to the host
    assert any(b not in r.outputs for b in inner)
    assert net.dram_bytes > net.arena_bytes > 0


# ------------------------------------------------------------------ random models
def _conv_model(rng, cin, cout, k, stride, pad, dil, groups, hw, second, gemm):
    nodes, inits = [], []
    w = (rng.standard_normal((cout, cin // groups, k, k)) * 0.3).astype(np.float32)
    inits.append(helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()))
    b = rng.normal(0, 0.1, cout).astype(np.float32)
    inits.append(helper.make_tensor("b", TensorProto.FLOAT, b.shape, b))
    nodes.append(helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[stride, stride],
                                  pads=list(pad), dilations=[dil, dil], group=groups))
    nodes.append(helper.make_node("Relu", ["c"], ["r"]))
    last = "r"
    if second:
        c2 = int(rng.integers(1, 40))
        w2 = (rng.standard_normal((c2, cout, 3, 3)) * 0.2).astype(np.float32)
        inits.append(helper.make_tensor("w2", TensorProto.FLOAT, w2.shape, w2.ravel()))
        nodes.append(helper.make_node("Conv", ["r", "w2"], ["c2"], pads=[1, 1, 1, 1]))
        last = "c2"
    if gemm:
        nodes.append(helper.make_node("GlobalAveragePool", [last], ["g"]))
        nodes.append(helper.make_node("Flatten", ["g"], ["f"]))
        ch = c2 if second else cout
        wg = (rng.standard_normal((ch, 10)) * 0.3).astype(np.float32)
        inits.append(helper.make_tensor("wg", TensorProto.FLOAT, wg.shape, wg.ravel()))
        nodes.append(helper.make_node("MatMul", ["f", "wg"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    g = helper.make_graph(nodes, "rand", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                        [1, cin, hw[0], hw[1]])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    return onnx.shape_inference.infer_shapes(m)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), cin=st.integers(1, 40), cout=st.integers(1, 70),
       k=st.sampled_from([1, 3, 5, 7]), stride=st.integers(1, 3), dil=st.integers(1, 2),
       groups=st.sampled_from([1, 1, 2, 3, 4]), h=st.integers(1, 30), w=st.integers(1, 30),
       second=st.booleans(), gemm=st.booleans(), cfg=st.sampled_from(["default", "small", "tiny"]))
def test_random_models_bit_exact(seed, cin, cout, k, stride, dil, groups, h, w, second, gemm, cfg):
    rng = np.random.default_rng(seed)
    cin, cout = cin * groups, cout * groups
    pad = [int(v) for v in rng.integers(0, k // 2 + 1, 4)]
    span = dil * (k - 1) + 1
    h, w = max(h, span - pad[0] - pad[2]), max(w, span - pad[1] - pad[3])
    m = _conv_model(rng, cin, cout, k, stride, pad, dil, groups, (h, w), second, gemm)
    cal = [{"x": rng.standard_normal((1, cin, h, w)).astype(np.float32)} for _ in range(3)]
    sess = dnnfab.InferenceSession(m, calibration=cal, config=PRESETS[cfg], cache_dir=False)
    feed = {"x": rng.standard_normal((1, cin, h, w)).astype(np.float32) * 1.5}
    ok, _ = _exact(sess, feed)
    assert ok
    sess.close()


def test_grouped_conv_is_lowered_to_the_fabric(cache):
    rng = np.random.default_rng(2)
    m = _conv_model(rng, 32, 48, 3, 1, [1, 1, 1, 1], 1, 2, (9, 9), False, False)
    cal = [{"x": rng.standard_normal((1, 32, 9, 9)).astype(np.float32)}]
    sess = dnnfab.InferenceSession(m, calibration=cal, cache_dir=cache)
    ok, _ = _exact(sess, {"x": rng.standard_normal((1, 32, 9, 9)).astype(np.float32)})
    assert ok
    conv = next(r for r in sess.profile() if r["op"] == "conv")
    assert conv["target"] == "fabric"
    info = sess.net.layers[conv["name"]]
    assert info.hw_macs <= 2 * info.macs            # only its groups' input blocks


# ------------------------------------------------------------------ compile and cache
def _digits_q():
    from dnnfab.models import datasets
    g = dnnfab.load("digits-cnn")
    return dnnfab.quantize(g, calibration=datasets.digits_split()[0][:16])


def test_compile_is_deterministic_and_cached(tmp_path):
    q = _digits_q()
    a = compile_network(q, use_cache=False).to_bytes()
    b = compile_network(q, use_cache=False).to_bytes()
    assert a == b
    net = compile_network(q, cache_dir=str(tmp_path))
    files = os.listdir(tmp_path)
    assert files == [f"{net.key}.dnnc"]
    again = compile_network(q, cache_dir=str(tmp_path))
    assert again.to_bytes() == a == CompiledNetwork.from_bytes(a).to_bytes()
    # another config, another model: cache misses
    other = compile_network(q, AcceleratorConfig(rows=4, cols=4), cache_dir=str(tmp_path))
    assert other.key != net.key
    q.layers[0].qweight = q.layers[0].qweight.copy()
    q.layers[0].qweight.flat[0] ^= 1
    changed = compile_network(q, cache_dir=str(tmp_path))
    assert changed.key not in (net.key, other.key)
    assert len(os.listdir(tmp_path)) == 3


def test_chaining_saves_launches_and_keeps_bits():
    q = _digits_q()
    chained = compile_network(q, use_cache=False)
    single = compile_network(q, use_cache=False, chain=False)
    assert len(chained.runs) < len(single.runs)
    for layer in chained.fabric_layers:
        assert layer.cycles > 0 and layer.dram_rd_bytes > 0 and layer.occupancy["act"] > 0


def test_two_layer_program_matches_the_layers(tmp_path):
    """A layer that reads the previous layer's output in the same program (store
    barrier) gives the reference's bits; the token machine accepts the program."""
    cfg = PRESETS["small"]
    rng = np.random.default_rng(9)
    l1 = random_layer(rng, 12, 30, k=3, pad=1, in_hw=(30, 13))
    l2 = random_layer(rng, 30, 9, k=3, pad=1, in_hw=(30, 13))
    p1, p2 = plan_layer(l1, cfg), plan_layer(l2, cfg)
    assert len(p1.bands) > 1
    b = ProgramBuilder(cfg)
    base = 1 << 20
    w1, a1 = base, base + len(p1.wimg)
    w2, a2 = a1 + len(p1.aimg), a1 + len(p1.aimg) + len(p2.wimg)
    x_at, y_at, z_at = 2 << 20, 3 << 20, 4 << 20
    b.add(p1, x_at, y_at, w1, a1)
    b.add(p2, y_at, z_at, w2, a2, after_stores=True)
    insns = b.finish()
    dev = driver.open("model", cfg, dram_bytes=8 << 20)
    mem = dev.allocate((8 << 20,), np.uint8)
    x = l1.random_input(rng)
    for at, blob in ((w1, p1.wimg), (a1, p1.aimg), (w2, p2.wimg), (a2, p2.aimg)):
        mem[at:at + len(blob)] = np.frombuffer(blob, np.uint8)
    raw = b"".join(i.to_bytes() for i in insns)
    mem[:len(raw)] = np.frombuffer(raw, np.uint8)
    mem[x_at:x_at + p1.in_bytes] = np.frombuffer(compile_layer(l1, cfg).pack_input(x), np.uint8)
    mem.sync_to_device()
    c = dev.run(driver.Program(0, len(insns), 1 << 20, 8 << 20))
    assert c["insns"] == len(insns) and c["cycles"] > 0
    mem.sync_from_device()
    oh, ow = l2.out_hw
    z = mem[z_at:z_at + p2.out_bytes].view(np.int8).reshape(oh, ow, p2.out_cp)[:, :, :l2.cout]
    assert np.array_equal(z, l2.reference(l1.reference(x)))


# ------------------------------------------------------------------ driver and faults
def _one_layer_device(fault=None, at=0):
    cfg = AcceleratorConfig()
    rng = np.random.default_rng(4)
    layer = random_layer(rng, 20, 30, k=3, pad=1, in_hw=(9, 11))
    prog = compile_layer(layer, cfg)
    backend = FaultyBackend(cfg, fault, at) if fault else None
    dev = driver.open(backend or "model", cfg)
    mem = dev.allocate((prog.dram_size,), np.uint8)
    x = layer.random_input(rng)
    for a, blob in prog.dram_images(x):
        mem[a:a + len(blob)] = np.frombuffer(blob, np.uint8)
    mem.sync_to_device()
    lo, size = prog.regions["output"]
    return dev, mem, prog, layer, x, driver.Program(prog.regions["program"][0], len(prog.insns),
                                                    lo, lo + size)


def test_driver_runs_by_register_name():
    dev, mem, prog, layer, x, p = _one_layer_device()
    assert dev.regs.ID == 0x444E4E46 and dev.regs.STATUS.BUSY == 0
    assert dev.regs.CONFIG0.ROWS == 8
    c = dev.run(p, timeout_s=1)
    assert c["insns"] == len(prog.insns) and c["macs"] == prog.hw_macs
    assert dev.regs.STATUS.DONE == 1 and dev.regs.PROG_LEN == len(prog.insns)
    mem.sync_from_device()
    a, s = prog.regions["output"]
    assert np.array_equal(prog.unpack_output(mem[a:a + s].tobytes()), layer.reference(x))
    assert mem[a:].device_address == a
    with pytest.raises(AttributeError, match="no register NOPE"):
        dev.regs.NOPE


@pytest.mark.parametrize("fault,err", [("dma_read", DmaError), ("dma_write", DmaError),
                                       ("illegal", IllegalInstruction), ("hang", FabricTimeout)])
def test_driver_typed_errors_then_reset(fault, err):
    dev, mem, prog, layer, x, p = _one_layer_device(fault, at=0)
    with pytest.raises(err) as ei:
        dev.run(p, timeout_s=0.5)
    e = ei.value
    if fault == "dma_read":
        assert e.code == 1 and e.address % 16 == 0
    elif fault == "dma_write":
        assert e.code == 2 and p.out_lo <= e.address < p.out_hi
    elif fault == "illegal":
        assert e.index == len(prog.insns) // 2
    else:
        assert e.status & 1 and "deadlock" in e.diagnosis and "waits for" in e.diagnosis
    dev.reset()
    assert dev.regs.STATUS == 0
    c = dev.run(p, timeout_s=1)                    # the next launch is clean and exact
    mem.sync_from_device()
    a, s = prog.regions["output"]
    assert c["insns"] == len(prog.insns)
    assert np.array_equal(prog.unpack_output(mem[a:a + s].tobytes()), layer.reference(x))


def test_broken_token_assignment_is_a_deadlock_not_a_pass():
    dev, mem, prog, layer, x, p = _one_layer_device()
    k = next(i for i, ins in enumerate(prog.insns) if isinstance(ins, Load) and ins.push_next)
    bad = prog.insns[k]
    bad.push_next = 0
    at = p.addr + k * INSN_BYTES
    mem[at:at + INSN_BYTES] = np.frombuffer(bad.to_bytes(), np.uint8)
    mem[at:at + INSN_BYTES].sync_to_device()
    with pytest.raises(FabricTimeout, match="COMPUTE insn .* waits for l2c"):
        dev.run(p, timeout_s=0.2)
    bad.push_next = 1


@pytest.mark.parametrize("fault", ["dma_read", "dma_write", "illegal", "hang"])
def test_session_completes_on_the_cpu_after_a_fault(fault):
    from dnnfab.models import datasets
    x = datasets.digits_split()[2][:1]
    cfg = AcceleratorConfig()
    backend = FaultyBackend(cfg, fault, at=1)
    sess = dnnfab.InferenceSession("digits-cnn", backend=backend, cache_dir=False)
    ok, _ = _exact(sess, {"image": x})
    assert ok and backend.fired == 1
    prof = sess.profile()
    bad = [r for r in prof if r["degraded"]]
    run1 = sess.net.runs[1]
    assert [r["name"] for r in bad] == run1.layers
    assert all(r["target"] == "cpu (fallback)" and r["error"] for r in bad)
    assert sess.faults[0]["layer"] in run1.layers
    # the device was reset and the image reloaded: the next inference is clean
    ok, _ = _exact(sess, {"image": x})
    assert ok and not any(r["degraded"] for r in sess.profile())


# ------------------------------------------------------------------ bad input
def test_bad_input_one_line_errors():
    with pytest.raises(ModelError, match="unknown model"):
        dnnfab.InferenceSession("no-such-model")
    sess = dnnfab.InferenceSession("digits-cnn", cache_dir=False)
    x = np.zeros((1, 1, 8, 8), np.float32)
    for feed, pat in (({"img": x}, "unknown input 'img'"),
                      ({"image": x[:, :, :4]}, r"shape \[1, 1, 4, 8\], expected \[1, 1, 8, 8\]"),
                      ({"image": x.astype(np.int64)}, "dtype int64, expected float32")):
        with pytest.raises(InputError, match=pat) as ei:
            sess.run(None, feed)
        assert "\n" not in str(ei.value)
    with pytest.raises(InputError, match="unknown output"):
        sess.run(["nope"], {"image": x})
    g = dnnfab.load("digits-cnn")
    with pytest.raises(InputError, match=r"calibration has shape \[4, 8, 8\]"):
        dnnfab.InferenceSession(g, calibration=np.zeros((4, 8, 8), np.float32))
    with pytest.raises(InputError, match=r"calibration\[0\]: input 'image' has shape"):
        dnnfab.InferenceSession(g, calibration=[{"image": np.zeros((1, 1, 7, 8), np.float32)}])
    with pytest.raises(ModelError, match="no calibration data"):
        dnnfab.InferenceSession(g)
    with pytest.raises(DnnfabError, match="unknown backend 'fpga'"):
        dnnfab.InferenceSession("digits-cnn", backend="fpga")


def test_require_fabric_names_the_scratchpad_limit():
    tiny = AcceleratorConfig(rows=4, cols=4, bus_bits=64, act_kib=1, wgt_kib=8, acc_kib=1,
                             out_kib=1, aux_kib=1)
    sess = dnnfab.InferenceSession("eeg-seizure", config=tiny, cache_dir=False,
                                   require_fabric=True)
    with pytest.raises(ConfigError, match="does not fit the scratchpads .* use a larger "
                                          "configuration") as ei:
        sess.run(None, _feed(sess))
    assert "\n" not in str(ei.value)


def test_cpu_backend_is_bit_exact():
    sess = dnnfab.InferenceSession("digits-cnn", backend="cpu", cache_dir=False)
    ok, _ = _exact(sess, _feed(sess))
    assert ok and all(r["target"] == "cpu" and r["engine"] for r in sess.profile())
    sess.close()
    assert sess._workers is None


@pytest.mark.parametrize("name,batch", [("digits-cnn", 3), ("eeg-seizure", 2)])
def test_batches_run_in_one_launch_per_run(name, batch):
    """A batch of N: every conv runs once per element inside the same program."""
    g = dnnfab.load(name, batch=batch)
    inp = g.inputs[0]
    rng = np.random.default_rng(1)
    cal = [{inp.name: rng.standard_normal(inp.shape).astype(np.float32)} for _ in range(4)]
    sess = dnnfab.InferenceSession(g, calibration=cal, cache_dir=False)
    ok, _ = _exact(sess, {inp.name: rng.standard_normal(inp.shape).astype(np.float32)})
    assert ok and sess.dev.backend.launches == len(sess.net.runs)


def test_image_relocated_and_two_networks_share_one_device(tmp_path):
    """A network compiled for the address the device gives it (issue 17: relocation): two
    sessions on one model backend, each image at its own address, alternate launches and
    stay bit-exact; the relocated compile is cached under its own key."""
    from dnnfab.sw.driver.model import ModelBackend
    cfg = AcceleratorConfig()
    be = ModelBackend(cfg, dram_bytes=1 << 25)
    assert be.allocate(12345) == 0                 # something else owns the bottom
    a = dnnfab.InferenceSession("digits-cnn", backend=be, cache_dir=str(tmp_path))
    b = dnnfab.InferenceSession("eeg-seizure", backend=be, cache_dir=str(tmp_path))
    fa, fb = _feed(a, 1), _feed(b, 2)
    for _ in range(2):
        ok_a, _ = _exact(a, fa)
        ok_b, _ = _exact(b, fb)
        assert ok_a and ok_b
    assert a.net.origin == 16384 and b.net.origin > a.net.origin + a.net.dram_bytes - 1
    assert all(r.prog_addr >= a.net.origin for r in a.net.runs)
    assert a.net.key != compile_network(a.qg, cfg, use_cache=False).key
    assert be.launches >= 4
    with pytest.raises(DnnfabError, match="not a multiple of 4096"):
        compile_network(a.qg, cfg, use_cache=False, origin=100)
    a.close()
    b.close()
