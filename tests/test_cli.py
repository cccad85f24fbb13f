"""The CLI tells the truth (issue 14): the main job without scikit-learn, one placement
decision for inspect and run, clear one-line errors for bad input, up-front cosim checks,
fit messages whose suggestions fit, generate output directories without stale files."""

import json
import os
from pathlib import Path
import re
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import dnnfab
from dnnfab.cli import main
from dnnfab.boards.fit import check_fit, autosize
from dnnfab.errors import InputError, ConfigError
from dnnfab.hw.config import AcceleratorConfig
from dnnfab.models import datasets
from dnnfab.sw.runtime import plan_network, InferenceSession

ROOT = Path(__file__).resolve().parent.parent
RESNET_REASON = "2048 output channels exceed 255 C-blocks per pixel; use a config with more columns"


def _err_line(capsys):
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dnnfab: error: "), cap.err
    assert "Traceback" not in cap.err + cap.out
    return lines[0]


def _conv_model(path, cin=8, cout=16, hw=(6, 6), dims=None, seed=0):
    """A float Conv(3x3, pad 1) + Relu model saved at ``path``; ``dims`` overrides the
    input's dims (strings are dynamic)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32)
    b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    shape = dims or [1, cin, *hw]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


# ------------------------------------------------------------------ item 1: main job
def test_main_job_runs_without_scikit_learn(tmp_path):
    """``dnnfab run`` on a machine without scikit-learn: a module that refuses to import
    stands in for it (first on the path), the shipped digits file does the rest."""
    block = tmp_path / "block"
    (block / "sklearn").mkdir(parents=True)
    (block / "sklearn" / "__init__.py").write_text("raise ImportError('scikit-learn is not installed')\n")
    env = dict(os.environ, PYTHONPATH=str(block))
    r = subprocess.run([sys.executable, "-c", "import sklearn"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "scikit-learn is not installed" in r.stderr
    r = subprocess.run([sys.executable, "-m", "dnnfab.cli", "run", "--samples", "8"], env=env,
                       capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "bit-exact vs the integer reference on 8 samples: True" in r.stdout
    acc = re.search(r"int8 on fabric ([\d.]+)%", r.stdout)
    assert acc and float(acc.group(1)) >= 87.5, r.stdout   # 7 of 8 held-out digits at least


def test_shipped_digits_equal_scikit_learns():
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[:, None]
    y = d.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    for got, want in zip(datasets.digits_split(), (x_tr, y_tr, x_te, y_te)):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_digits_data.py"), "--check"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "matches" in r.stdout, r.stdout + r.stderr


def test_digits_file_is_package_data():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'"dnnfab\.models" = \[[^\]]*"\*\.npz"', text)
    assert datasets.DIGITS_FILE.parent == Path(datasets.__file__).parent
    assert "CC BY 4.0" in str(np.load(datasets.DIGITS_FILE)["source"])


# ------------------------------------------------------------------ item 3: placement
def test_inspect_and_run_place_resnet50_alike():
    """The float graph (inspect) and the quantized graph (run) get the same placement and
    reasons; resnet50's 2048-channel convs are on the CPU with the compiler's reason."""
    g = dnnfab.load("resnet50")
    plan_f = plan_network(g)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    plan_q = plan_network(dnnfab.quantize(g, calibration=x))
    assert list(plan_f) == list(plan_q)
    assert [(p.where, p.reason) for p in plan_f.values()] == [(p.where, p.reason) for p in plan_q.values()]
    cpu = {k: p.reason for k, p in plan_q.items() if p.where == "cpu"}
    assert len(cpu) == 24 and all(cpu.values())
    assert [k for k, r in cpu.items() if r == RESNET_REASON] == ["n146", "n148", "n158", "n168"]
    # the fix the reason names works: with 16 columns they map
    wide = plan_network(g, AcceleratorConfig(rows=8, cols=16))
    assert all(wide[k].where == "fabric" for k in ("n146", "n148", "n158", "n168"))


def test_inspect_cli_shows_reasons_uncut_when_piped():
    r = subprocess.run([sys.executable, "-m", "dnnfab.cli", "inspect", "resnet50"], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if re.match(r"│ n1(46|48|58|68) ", ln)]
    assert len(rows) == 4 and all(RESNET_REASON in ln and " cpu " in ln for ln in rows)
    assert re.search(r"│ total .* 24 on cpu", r.stdout)
    assert "…" not in r.stdout


def test_run_table_gives_a_reason_for_every_cpu_layer(tmp_path, capsys):
    """A 4096-channel conv does not map onto 8 columns: run puts it on the CPU, says why,
    and the piped table prints the reason in full; inspect agrees."""
    m = _conv_model(tmp_path / "wide.onnx", cin=8, cout=4096, hw=(1, 1))
    np.save(tmp_path / "x.npy", np.random.default_rng(1).standard_normal((4, 8, 1, 1)).astype(np.float32))
    assert main(["run", str(m), "--calibration", str(tmp_path / "x.npy"), "--samples", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (layer,) = doc["layers"]
    reason = "4096 output channels exceed 255 C-blocks per pixel; use a config with more columns"
    assert layer["where"] == "cpu" and layer["reason"] == reason and doc["bit_exact_vs_reference"]
    assert main(["run", str(m), "--calibration", str(tmp_path / "x.npy"), "--samples", "1"]) == 0
    out = capsys.readouterr().out
    assert reason in out and "why not fabric" in out
    assert main(["inspect", str(m), "--json"]) == 0
    ins = json.loads(capsys.readouterr().out)
    assert [(r["target"], r["reason"]) for r in ins["layers"]] == [("cpu", reason)]
    assert main(["run", str(m), "--calibration", str(tmp_path / "x.npy"), "--samples", "2",
                 "--cols", "32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layers"][0]["where"] == "fabric"


def test_run_json_reason_per_layer_digits(capsys):
    assert main(["run", "--samples", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    where = {r["name"]: (r["where"], r["reason"]) for r in doc["layers"]}
    assert {k for k, v in where.items() if v[0] == "fabric"} == {"conv1", "conv2", "fc1", "fc2"}
    assert all(v[1] == "" for v in where.values() if v[0] == "fabric")
    assert where["pool1"] == ("cpu", "maxpool: the accelerator runs conv and GEMM layers only")
    assert doc["calibration"] == "64 digits of the training split"
    assert main(["inspect", "digits-cnn", "--json"]) == 0
    ins = json.loads(capsys.readouterr().out)
    assert {r["name"]: (r["target"], r["reason"]) for r in ins["layers"]} == where


# ------------------------------------------------------------------ item 3: run input checks
@pytest.mark.parametrize("argv,needle", [
    (["--input-bits", "4", "--weight-bits", "4"], "--input-bits 4, --weight-bits 4: networks run as int8 x int8"),
    (["--acc-bits", "24"], "--acc-bits 24"),
    (["--samples", "0"], "--samples 0: run at least one sample"),
    (["--samples", "-1"], "--samples -1: run at least one sample"),
    (["--calib", "0"], "--calib 0: calibrate on at least one sample"),
    (["--samples", "361"], "--samples 361: digits-cnn has 360 held-out digits; use --samples 360 or fewer"),
    (["nonexistent.onnx"], "file not found: nonexistent.onnx"),
    (["no/such/dir/model.onnx"], "file not found: no/such/dir/model.onnx"),
])
def test_run_bad_options_one_line_exit_2(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", *argv]) == 2
    assert needle in _err_line(capsys)


def test_inspect_rejects_4bit_and_missing_file(capsys):
    assert main(["inspect", "digits-cnn", "--input-bits", "4"]) == 2
    assert "--input-bits 4" in _err_line(capsys)
    assert main(["inspect", "missing.onnx"]) == 2
    assert "file not found: missing.onnx" in _err_line(capsys)


def test_run_network_refuses_other_widths_and_nonfinite_inputs():
    q = dnnfab.quantize(dnnfab.load("digits-cnn"), calibration=datasets.digits_split()[0][:8])
    x = datasets.digits_split()[2][:1].copy()
    with pytest.raises(ConfigError, match="input_bits=4, weight_bits=4"):
        InferenceSession(q, config=AcceleratorConfig(input_bits=4, weight_bits=4))
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[0, 0, 3, 5] = bad
        with pytest.raises(InputError, match=r"'image' holds 1 NaN/inf value\(s\) \(first at index \(0, 0, 3, 5\)\)"):
            InferenceSession(q, cache_dir=False).run(None, {"image": y})
        with pytest.raises(InputError, match="NaN/inf"):
            dnnfab.quantize(dnnfab.load("digits-cnn"), calibration=y)


def test_run_random_data_says_so(tmp_path, capsys):
    m = _conv_model(tmp_path / "m.onnx")
    assert main(["run", str(m), "--samples", "2", "--calib", "4", "--json"]) == 0
    cap = capsys.readouterr()
    notes = [ln for ln in cap.err.splitlines() if ln.startswith("dnnfab: note:")]
    assert len(notes) == 1 and "random standard-normal" in notes[0] and "--calibration" in notes[0]
    doc = json.loads(cap.out)
    assert doc["calibration"] == "4 random standard-normal inputs" and doc["bit_exact_vs_reference"]


@pytest.mark.parametrize("form", ["npy", "npz", "dir"])
def test_run_calibrates_on_the_given_data(form, tmp_path):
    """The quantization ``run`` uses is the one of the given samples: its output codes
    equal those of ``dnnfab.quantize`` on the same data."""
    from dnnfab.sw.runtime.runcli import main_job
    m = _conv_model(tmp_path / "m.onnx")
    xs = 3.0 * np.random.default_rng(2).standard_normal((6, 8, 6, 6)).astype(np.float32)
    if form == "npy":
        path = tmp_path / "c.npy"
        np.save(path, xs)
    elif form == "npz":
        path = tmp_path / "c.npz"
        np.savez(path, x=xs)
    else:
        path = tmp_path / "cal"
        path.mkdir()
        for i in range(6):   # one sample per file, without the sample axis
            np.save(path / f"s{i}.npy", xs[i])
    summary, first = main_job(str(m), samples=2, calibration=str(path), progress=False)
    assert summary["calibration"] == f"6 samples from {path}" and summary["bit_exact_vs_reference"]
    q = dnnfab.quantize(dnnfab.load(str(m)), calibration=xs)
    assert np.array_equal(first.outputs["y"], q.run_int({"x": xs[:1]})["y"])
    # random calibration gives other codes (the data mattered)
    q0 = dnnfab.quantize(dnnfab.load(str(m)))
    assert not np.array_equal(first.outputs["y"], q0.run_int({"x": xs[:1]})["y"])


@pytest.mark.parametrize("content,needle", [
    ("nan", "holds 1 NaN/inf value(s)"),
    ("shape", "needs [N, 8, 6, 6]"),
    ("text", "expected a .npy file, an .npz file or a directory"),
    ("missing", "file not found:"),
    ("empty_dir", "holds no .npy or .npz files"),
    ("npz_names", "name the arrays after the inputs"),
])
def test_run_bad_calibration_data(content, needle, tmp_path, capsys):
    m = _conv_model(tmp_path / "m.onnx")
    xs = np.ones((3, 8, 6, 6), np.float32)
    path = tmp_path / "c.npy"
    if content == "nan":
        xs[1, 2, 3, 4] = np.nan
        np.save(path, xs)
    elif content == "shape":
        np.save(path, np.ones((3, 8, 5, 6), np.float32))
    elif content == "text":
        path = tmp_path / "c.txt"
        path.write_text("1 2 3\n")
    elif content == "missing":
        path = tmp_path / "nope.npy"
    elif content == "empty_dir":
        path = tmp_path / "d"
        path.mkdir()
    else:
        path = tmp_path / "c.npz"
        np.savez(path, a=xs, b=xs)
    assert main(["run", str(m), "--calibration", str(path)]) == 2
    assert needle in _err_line(capsys)


def test_run_dynamic_shape_needs_and_takes_input_shape(tmp_path, capsys):
    m = _conv_model(tmp_path / "dyn.onnx", dims=["N", 8, "H", "W"])
    assert main(["run", str(m)]) == 2
    assert "dynamic dimension 2 (H); give its shape with --input-shape x=D0,D1,..." in _err_line(capsys)
    assert main(["run", str(m), "--input-shape", "y=1,8,5,5"]) == 2
    assert "the model has no input 'y'; its inputs are x" in _err_line(capsys)
    assert main(["run", str(m), "--input-shape", "x=1,8,0,5"]) == 2
    assert "positive integers" in _err_line(capsys)
    assert main(["run", str(m), "--input-shape", "x=1,8,5,7", "--samples", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["layers"][0]["macs"] == 5 * 7 * 16 * 8 * 9
    assert main(["inspect", str(m), "--input-shape", "1,8,4,4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"] == [{"name": "x", "shape": [1, 8, 4, 4]}]


# ------------------------------------------------------------------ item 3: cosim, synth, generate
@pytest.mark.parametrize("argv,needle", [
    (["--top", "array", "--gemm", "0,0,0"], "--gemm 0,0,0: n=0, k=0, m=0; a GEMM needs n, k, m >= 1"),
    (["--top", "array", "--gemm", "4,-1,2"], "k=-1"),
    (["--layer", "16,16,3,1,1,0,8"], "h=0"),
    (["--layer", "16,16,9,1,0,4,4"], "output size -4x-4 is empty"),
    (["--layer", "16,16,3,1,1,8"], "expected 7 comma-separated integers"),
    (["--input-bits", "4"], "--input-bits 4"),
])
def test_cosim_checks_up_front(argv, needle, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("DNNFAB_CACHE", str(tmp_path / "cache"))
    assert main(["cosim", *argv]) == 2
    assert needle in _err_line(capsys)
    assert not (tmp_path / "cache").exists()       # nothing generated or built


def test_synth_icebreaker_says_nothing_fits_and_names_what_does(capsys):
    assert main(["synth", "--board", "icebreaker", "--rows", "2", "--cols", "2"]) == 2
    msg = _err_line(capsys)
    assert msg.count("no accelerator configuration fits") == 1
    m = re.search(r"--top array, up to (\d+)x(\d+)", msg)
    assert m, msg
    r, c = int(m.group(1)), int(m.group(2))
    check_fit(AcceleratorConfig(rows=r, cols=c), "icebreaker", top="array")   # it does fit
    boards = dict(re.findall(r"([\w-]+) \(up to (\d+x\d+)\)", msg))
    assert "ulx3s-85f" in boards and "icebreaker" not in boards
    for board, size in boards.items():
        cfg = autosize(board, {}, ["rows", "cols"], top="accelerator")
        assert f"{cfg.rows}x{cfg.cols}" == size
    # the old advice fails: --rows auto, or smaller scratchpads
    for argv in (["--rows", "auto", "--cols", "auto"],
                 ["--rows", "1", "--cols", "1", "--act-kib", "1", "--wgt-kib", "1", "--acc-kib", "1", "--out-kib", "1"]):
        assert main(["synth", "--board", "icebreaker", *argv]) == 2
        assert "no accelerator configuration fits" in _err_line(capsys)


def test_fit_suggestion_is_one_that_fits(capsys):
    assert main(["synth", "--board", "orangecrab-25f", "--rows", "8", "--cols", "8"]) == 2
    msg = _err_line(capsys)
    m = re.search(r"at most (\d+)x(\d+) fits", msg)
    assert m and "--rows auto --cols auto" in msg, msg
    cfg = autosize("orangecrab-25f", {}, ["rows", "cols"], top="accelerator")
    assert (cfg.rows, cfg.cols) == (int(m.group(1)), int(m.group(2)))
    check_fit(cfg, "orangecrab-25f", top="accelerator")


def test_synth_help_is_current():
    r = subprocess.run([sys.executable, "-m", "dnnfab.cli", "synth", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    assert "hw/top.py" not in r.stdout and "whole accelerator (default)" in r.stdout


def test_generate_replaces_the_previous_generation(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    assert main(["generate", "--rows", "2", "--cols", "2", "--board", "ulx3s-85f", "-o", str(out)]) == 0
    first = json.loads((out / "manifest.json").read_text())
    assert {"dnnfab_accel.v", "regs.h", "constraints.sdc", "synth.ys"} <= set(first["files"])
    assert all((out / f).exists() for f in first["files"])
    capsys.readouterr()
    assert main(["generate", "--rows", "2", "--cols", "2", "--top", "array", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["top"] == "array" and manifest["files"] == ["dnnfab_systolic.v", "manifest.json"]
    assert sorted(p.name for p in out.iterdir()) == ["dnnfab_systolic.v", "manifest.json", "notes.txt"]
    assert f"removed   {out / 'regs.h'}" in printed


@pytest.mark.parametrize("argv", [["run", "nonexistent.onnx"], ["run", "--samples", "0"],
                                  ["cosim", "--top", "array", "--gemm", "0,0,0"]])
def test_cli_process_prints_one_line_exit_2(argv, tmp_path):
    r = subprocess.run([sys.executable, "-m", "dnnfab.cli", *argv], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("dnnfab: error: ") and "Traceback" not in r.stderr


def test_run_require_fabric_names_the_scratchpad_limit(capsys):
    """A config whose scratchpads cannot hold one tile of a layer: with --require-fabric
    one line naming the fix and exit 2."""
    rc = main(["run", "eeg-seizure", "--samples", "1", "--calib", "4", "--rows", "4", "--cols", "4",
               "--bus-bits", "64", "--act-kib", "1", "--acc-kib", "1", "--out-kib", "1",
               "--require-fabric"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "does not fit the scratchpads" in err[0] and "use a larger configuration" in err[0]
