"""Bad input gives one-line DnnfabError messages (and exit code 2 in the CLI)."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

import dnnfab
from dnnfab.cli import main
from dnnfab.errors import DnnfabError, InputError, ModelError, UnsupportedOpError

from . import models_helper as mh


@pytest.fixture
def files(tmp_path):
    good = tmp_path / "good.onnx"
    onnx.save(mh.case("conv_bn_relu"), str(good))
    data = good.read_bytes()
    trunc = tmp_path / "trunc.onnx"
    trunc.write_bytes(data[: len(data) // 2])
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n" * 20)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    unsup = tmp_path / "unsup.onnx"
    n = mh.helper.make_node
    m = mh.model([n("Relu", ["x"], ["r"]), n("Det", ["r"], ["y"], name="my_det")],
                 [mh.vi("x", [3, 3])], [mh.vi("y", None)])
    onnx.save(m, str(unsup))
    return dict(good=good, trunc=trunc, text=text, empty=empty, unsup=unsup,
                missing=tmp_path / "missing.onnx")


def _one_line(exc):
    msg = str(exc)
    assert "\n" not in msg and len(msg) < 300, msg
    return msg


@pytest.mark.parametrize("kind", ["trunc", "text", "empty", "missing"])
def test_unreadable_models(files, kind):
    with pytest.raises(ModelError) as ei:
        dnnfab.load(str(files[kind]))
    msg = _one_line(ei.value)
    assert str(files[kind].name) in msg or "missing" in msg


def test_unsupported_op_names_node_and_op(files):
    with pytest.raises(UnsupportedOpError) as ei:
        dnnfab.load(str(files["unsup"]))
    msg = _one_line(ei.value)
    assert "my_det" in msg and "Det" in msg


def test_custom_domain_op_is_unsupported():
    n = mh.helper.make_node("Foo", ["x"], ["y"], domain="com.example", name="foo1")
    m = mh.model([n], [mh.vi("x", [1, 4])], [mh.vi("y", None)])
    m.opset_import.append(mh.helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOpError, match="foo1.*Foo"):
        dnnfab.load(m)


def test_dynamic_non_batch_dim_needs_input_shapes():
    n = mh.helper.make_node("Relu", ["x"], ["y"])
    m = mh.model([n], [mh.vi("x", [1, "T"])], [mh.vi("y", None)])
    with pytest.raises(ModelError, match="input_shapes"):
        dnnfab.load(m)
    g = dnnfab.load(m, input_shapes={"x": (1, 7)})
    assert g.inputs[0].shape == (1, 7)


@pytest.mark.parametrize("quantized", [False, True])
def test_run_rejects_bad_feeds(quantized):
    g = dnnfab.load(mh.case("conv_bn_relu"))
    if quantized:
        g = dnnfab.quantize(g, calibration=mh.input_feed(g, n=2)["x"])
    x = mh.input_feed(g)["x"]
    bad = [
        ({"nope": x}, "unknown input"),
        ({}, "missing input"),
        ({"x": x[:, :, :5]}, "shape"),
        ({"x": x[0]}, "shape"),
        ({"x": x.astype(np.int32)}, "dtype"),
        ({"x": x.tolist()}, "numpy array"),
    ]
    for feed, what in bad:
        with pytest.raises(InputError, match=what) as ei:
            g.run(feed)
        _one_line(ei.value)
    # float64 is accepted (converted), and a bare array works for one-input models
    assert g.run({"x": x.astype(np.float64)})["y"].shape == g.run(x)["y"].shape


def test_batch_hint_in_shape_error():
    g = dnnfab.load(mh.case("keras_channel_last"))
    x = np.zeros((4, 8, 8, 3), np.float32)
    with pytest.raises(InputError, match="batch=N"):
        g.run({"x": x})


@pytest.mark.parametrize("kind", ["trunc", "text", "missing", "unsup"])
def test_cli_inspect_bad_models_exit_2_one_line(files, kind, capsys):
    rc = main(["inspect", str(files[kind])])
    cap = capsys.readouterr()
    assert rc == 2
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dnnfab: error:")
    assert "Traceback" not in cap.err + cap.out


def test_cli_inspect_good_model_table_and_json(files, capsys):
    assert main(["inspect", str(files["good"])]) == 0
    out = capsys.readouterr().out
    assert "conv3x3+relu" in out and "fabric" in out
    assert main(["inspect", str(files["good"]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["inputs"][0]["name"] == "x"
    assert doc["layers"][0]["target"] == "fabric" and doc["totals"]["macs"] > 0


def test_cli_subprocess_no_traceback(files):
    r = subprocess.run([sys.executable, "-m", "dnnfab.cli", "inspect", str(files["trunc"])],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("dnnfab: error:")


def test_errors_are_dnnfab_errors():
    assert issubclass(UnsupportedOpError, ModelError)
    assert issubclass(InputError, DnnfabError)
