"""The model zoo (dnnfab.models): names, files, shapes, and the measured quality of the
bundled models. Every number here is measured now, with onnxruntime on the committed ONNX
files (or the int8 reference), never read back from the metrics JSON."""

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from dnnfab import errors, models
from dnnfab.models import datasets

REPO = Path(__file__).resolve().parents[2]
BUNDLED = ["digits-cnn", "eeg-seizure"]
FROM_ONNX = ["alexnet", "densenet121", "inception-v1", "inception-v2", "resnet50",
             "shufflenet", "squeezenet", "vgg19", "zfnet512"]
ALL = BUNDLED + FROM_ONNX
# What the bundled models may use: what the importer and the fabric handle natively.
BUNDLED_OPS = {"Conv", "Relu", "MaxPool", "GlobalAveragePool", "AveragePool", "Gemm", "MatMul",
               "Flatten", "Reshape"}


def _session(name):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3  # the light models carry unused initializers: silence warnings
    return ort.InferenceSession(str(models.model_path(name)), so,
                                providers=["CPUExecutionProvider"])


def _ort_logits(name, x):
    sess = _session(name)
    inp = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {inp: x[i:i + 1]})[0] for i in range(len(x))])


@pytest.fixture(scope="module")
def digits():
    return datasets.digits_split()


@pytest.fixture(scope="module")
def eeg_test():
    _, _, x, y = datasets.eeg_split(n_train=0)
    return x, y


# ------------------------------------------------------------------ names and files
def test_list_models_lists_every_model_with_table_fields():
    rows = models.list_models()
    assert [r["name"] for r in rows] == ALL
    for r in rows:
        assert r["available"], r.get("error")
        assert r["source"] == ("bundled" if r["name"] in BUNDLED else "onnx")
        assert isinstance(r["input"], str) and r["input"]
        assert all(isinstance(d, int) and d > 0 for d in r["input_shape"])
        assert r["outputs"] and r["description"] and r["provenance"]
        assert Path(r["path"]).is_file()
    assert all(len(r) == len(rows[0]) for r in rows)  # same columns for a table


@pytest.mark.parametrize("name", ALL)
def test_load_model_matches_listing(name):
    proto = models.load_model(name)
    assert isinstance(proto, onnx.ModelProto)
    row = next(r for r in models.list_models() if r["name"] == name)
    inits = {t.name for t in proto.graph.initializer}
    data = [i for i in proto.graph.input if i.name not in inits]
    assert [i.name for i in data] == [row["input"]]
    assert [d.dim_value for d in data[0].type.tensor_type.shape.dim] == row["input_shape"]
    assert [o.name for o in proto.graph.output] == row["outputs"]
    assert models.load_model(name) is not proto  # a fresh copy each time


def test_known_input_shapes():
    rows = {r["name"]: r for r in models.list_models()}
    assert rows["digits-cnn"]["input_shape"] == [1, 1, 8, 8]
    assert rows["eeg-seizure"]["input_shape"] == [1, 23, 1, 256]
    for name in FROM_ONNX:
        assert rows[name]["input_shape"] == [1, 3, 224, 224]
    assert rows["resnet50"]["input"] == "gpu_0/data_0"
    assert rows["squeezenet"]["input"] == "data_0"


def test_unknown_name_lists_known_names():
    with pytest.raises(errors.ModelError) as exc:
        models.load_model("resnet-51")
    msg = str(exc.value)
    assert "resnet-51" in msg and "\n" not in msg
    for name in ALL:
        assert name in msg
    with pytest.raises(errors.DnnfabError):
        models.model_path("")


@pytest.mark.parametrize("alias, name", [("ResNet-50", "resnet50"), ("light_resnet50", "resnet50"),
                                         ("GoogLeNet", "inception-v1"), ("inception_v2", "inception-v2"),
                                         ("DenseNet-121", "densenet121"), ("bvlc_alexnet", "alexnet"),
                                         ("digits_cnn", "digits-cnn"), ("EEG-Seizure", "eeg-seizure")])
def test_name_aliases(alias, name):
    assert models.model_path(alias) == models.model_path(name)


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_files_are_small_checked_and_simple(name):
    path = models.model_path(name)
    assert path.parent == Path(models.__file__).resolve().parent
    assert path.stat().st_size < 1_000_000
    proto = models.load_model(name)
    onnx.checker.check_model(proto, full_check=True)
    assert {n.op_type for n in proto.graph.node} <= BUNDLED_OPS
    info = models.model_info(name)
    assert info["metrics"]["onnx_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest(), \
        "metrics JSON is stale: rerun the training script"


@pytest.mark.parametrize("name", ALL)
def test_onnxruntime_runs_on_listed_shape(name):
    row = next(r for r in models.list_models() if r["name"] == name)
    sess = _session(name)
    x = np.random.default_rng(0).random(row["input_shape"], dtype=np.float32)
    outs = sess.run(None, {row["input"]: x})
    info = models.model_info(name)
    assert [list(o.shape) for o in outs] == info["output_shapes"]
    assert all(np.isfinite(o).all() for o in outs)


# ------------------------------------------------------------------ digits-cnn
def test_digits_split_is_fixed_and_normalized(digits):
    x_tr, y_tr, x_te, y_te = digits
    assert x_tr.shape == (1437, 1, 8, 8) and x_te.shape == (360, 1, 8, 8)
    assert x_tr.dtype == np.float32 and 0.0 <= x_tr.min() and x_tr.max() <= 1.0
    assert np.bincount(y_te).min() >= 35  # stratified: every digit 35-37 times
    again = datasets.digits_split()
    assert np.array_equal(again[2], x_te) and np.array_equal(again[3], y_te)


def test_digits_cnn_float_accuracy(digits):
    _, _, x_te, y_te = digits
    acc = float((_ort_logits("digits-cnn", x_te).argmax(1) == y_te).mean())
    assert acc >= 0.97, f"digits-cnn top-1 {acc:.4f} on the held-out split"
    metrics = models.model_info("digits-cnn")["metrics"]
    assert metrics["test_accuracy"] == pytest.approx(acc, abs=1e-6)  # JSON tells the truth


# ------------------------------------------------------------------ eeg-seizure
def test_eeg_generator_is_deterministic_per_seed():
    x1, y1 = datasets.eeg_windows(16, seed=5)
    x2, y2 = datasets.eeg_windows(16, seed=5)
    x3, _ = datasets.eeg_windows(16, seed=6)
    assert x1.shape == (16, 23, 256) and x1.dtype == np.float32
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert not np.allclose(x1, x3)
    assert y1.sum() == 8  # exactly half are seizures
    assert np.isfinite(x1).all() and 5.0 < x1.std() < 500.0  # microvolt scale
    _, y4, meta = datasets.eeg_windows(16, seed=5, artifacts=False, return_meta=True)
    assert not any(k in m for m in meta for k in ("blink", "muscle", "pop", "line"))
    assert all(("onset" in m) == m["seizure"] == bool(t) for m, t in zip(meta, y4))


def test_eeg_seizure_windows_differ_spectrally():
    x, y = datasets.eeg_windows(400, seed=11)
    f = np.fft.rfftfreq(x.shape[-1], 1.0 / datasets.EEG_FS)
    power = np.abs(np.fft.rfft(x, axis=-1)) ** 2

    def band(lo, hi):  # strongest channel's band power per window
        return power[:, :, (f >= lo) & (f < hi)].sum(-1).max(-1)

    delta = band(2.0, 4.5)
    ratio = np.median(delta[y == 1]) / np.median(delta[y == 0])
    assert ratio > 2.0, f"2-4 Hz power of seizure windows only {ratio:.2f}x background"
    # Not just louder everywhere: the 2-4 Hz share of the 1-30 Hz power rises as well.
    share = delta / band(1.0, 30.0)
    assert np.median(share[y == 1]) > np.median(share[y == 0])


def test_eeg_seizure_sensitivity_specificity(eeg_test):
    x, y = eeg_test
    assert x.shape == (datasets.EEG_N_TEST, 23, 1, 256) and y.mean() == 0.5
    pred = _ort_logits("eeg-seizure", x).argmax(1)
    sens = float((pred[y == 1] == 1).mean())
    spec = float((pred[y == 0] == 0).mean())
    assert sens >= 0.95 and spec >= 0.95, f"sensitivity {sens:.4f}, specificity {spec:.4f}"
    test = models.model_info("eeg-seizure")["metrics"]["test"]
    assert (test["sensitivity"], test["specificity"]) == pytest.approx((sens, spec), abs=1e-6)


# ------------------------------------------------------------------ int8
def _int8_vs_float(name, x_cal, x, y, reduce_range=False):
    import dnnfab

    graph = dnnfab.load(name)
    qgraph = dnnfab.quantize(graph, calibration=x_cal, reduce_range=reduce_range)
    inp = models.model_info(name)["input"]
    out = models.model_info(name)["outputs"][0]
    q = np.concatenate([qgraph.run({inp: x[i:i + 1]})[out] for i in range(len(x))]).argmax(1)
    f = _ort_logits(name, x).argmax(1)
    return float((f == y).mean()), float((q == y).mean()), q


@pytest.mark.parametrize("reduce_range", [False, True], ids=["w8", "w7_reduce_range"])
def test_digits_cnn_int8_within_one_point(digits, reduce_range):
    x_tr, _, x_te, y_te = digits
    acc_f, acc_q, _ = _int8_vs_float("digits-cnn", x_tr[:200], x_te, y_te, reduce_range)
    assert acc_q >= acc_f - 0.01, f"int8 {acc_q:.4f} vs float {acc_f:.4f}"


@pytest.mark.parametrize("reduce_range", [False, True], ids=["w8", "w7_reduce_range"])
def test_eeg_seizure_int8_within_one_point(eeg_test, reduce_range):
    x, y = eeg_test
    x_cal = datasets.eeg_model_input(datasets.eeg_windows(200, seed=datasets.EEG_TRAIN_SEED)[0])
    acc_f, acc_q, q = _int8_vs_float("eeg-seizure", x_cal, x, y, reduce_range)
    assert acc_q >= acc_f - 0.01, f"int8 {acc_q:.4f} vs float {acc_f:.4f}"
    assert (q[y == 1] == 1).mean() >= 0.95 and (q[y == 0] == 0).mean() >= 0.95


# ------------------------------------------------------------------ the trainer itself
def test_training_backprop_matches_finite_differences():
    spec = importlib.util.spec_from_file_location("_numpy_cnn", REPO / "scripts" / "_numpy_cnn.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.gradient_check() < 1e-4


def test_metrics_json_records_seeds_and_sizes():
    for name, file in [("digits-cnn", "digits_cnn.json"), ("eeg-seizure", "eeg_seizure.json")]:
        m = json.loads((Path(models.__file__).parent / file).read_text())
        assert m["model"] == name and m["seeds"] and m["n_train"] > 0 and m["n_test"] > 0
