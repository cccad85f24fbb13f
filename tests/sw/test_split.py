"""Output-channel splits between fabric and CPU (sw/compiler/split.py): a split layer is
bit-identical to the unsplit one on the reference and through the session, at every cut."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import dnnfab
from dnnfab.errors import ConfigError
from dnnfab.sw.compiler.network import compile_network
from dnnfab.sw.compiler.split import apply_splits, out_channels, splittable
from dnnfab.sw.cpu.reference import run_reference

from .test_session import PRESETS, _conv_model


def _extreme_feed(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32) * 2
    x.flat[: x.size // 8] = 50.0           # saturates to the top code
    x.flat[x.size // 8: x.size // 4] = -50.0
    return x


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), cin=st.integers(1, 24), cout=st.integers(2, 70),
       k=st.sampled_from([1, 3]), h=st.integers(1, 14), w=st.integers(1, 14),
       second=st.booleans(), gemm=st.booleans(), cfg=st.sampled_from(["default", "small"]))
def test_random_splits_are_bit_exact(seed, cin, cout, k, h, w, second, gemm, cfg):
    rng = np.random.default_rng(seed)
    h, w = max(h, k), max(w, k)
    m = _conv_model(rng, cin, cout, k, 1, [k // 2] * 4, 1, 1, (h, w), second, gemm)
    cal = [{"x": rng.standard_normal((1, cin, h, w)).astype(np.float32)} for _ in range(3)]
    base = dnnfab.InferenceSession(m, calibration=cal, config=PRESETS[cfg], cache_dir=False)
    qg = base.qg
    cuts = {L.name: int(rng.integers(1, out_channels(L))) for L in qg.layers if splittable(L)
            and rng.random() < 0.8}
    q2 = apply_splits(qg, cuts)
    feed = {"x": _extreme_feed(rng, (1, cin, h, w))}
    xq = qg.quantize_inputs(feed)
    ref = run_reference(qg, xq)
    assert all(np.array_equal(ref[k_], v) for k_, v in run_reference(q2, xq).items())
    sess = dnnfab.InferenceSession(q2, config=PRESETS[cfg], cache_dir=False)
    out = sess.run_int(feed)
    assert all(np.array_equal(ref[k_], out[k_]) for k_ in ref)
    where = {r["name"]: r["target"] for r in sess.profile()}
    for n in cuts:
        assert where[n + "@cpu"] == "cpu"
        assert where[n] == "cpu"                     # the join
    sess.close()
    base.close()


def test_split_halves_are_placed_and_bad_splits_are_named():
    sess = dnnfab.InferenceSession("digits-cnn", cache_dir=False)
    qg = sess.qg
    q2 = apply_splits(qg, {"conv1": 5, "fc1": 1})
    net = compile_network(q2, sess.cfg, use_cache=False)
    assert net.layers["conv1@fab"].target == "fabric"
    assert net.layers["conv1@cpu"].target == "cpu"
    assert net.layers["fc1@fab"].target == "fabric"
    with pytest.raises(ConfigError, match="no layer of that name"):
        apply_splits(qg, {"nope": 1})
    with pytest.raises(ConfigError, match="use 1.."):
        apply_splits(qg, {"conv1": out_channels(qg.layers[0])})
    with pytest.raises(ConfigError, match="only convs"):
        apply_splits(qg, {"pool1": 1})
    # a plan's CPU layers stay on the CPU, and the cache key tells the two compiles apart
    forced = compile_network(qg, sess.cfg, use_cache=False, cpu_layers={"conv2"})
    assert forced.layers["conv2"].target == "cpu"
    assert forced.layers["conv2"].reason == "placed on the CPU by the plan"
    assert forced.key != compile_network(qg, sess.cfg, use_cache=False).key
    sess.close()
