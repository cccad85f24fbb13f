"""``dnnfab schedule`` and ``dnnfab run --fps/--frames`` (issue 20, part 4): the JSON the
issue names, the plan run for real and on the modelled timeline, bit-exact; bad input is
one line and exit 2; a deadline no plan meets is named and exits 1."""

import json
import threading

import pytest

from dnnfab.cli import main


def _json(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr().out
    return rc, json.loads(out)


def _err_line(capsys):
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dnnfab: error: "), cap.err
    assert "Traceback" not in cap.err + cap.out
    return lines[0]


def test_schedule_json_has_the_fields_and_a_gantt(capsys, tmp_path):
    png = tmp_path / "plan.png"
    rc, d = _json(capsys, "schedule", "eeg-seizure", "--board", "pynq-z2", "--json",
                  "--gantt", str(png))
    assert rc == 0 and d["feasible"]
    for k in ("plan", "deadline_ms", "latency_ms", "deadline_misses", "frames",
              "energy_mj_per_frame", "avg_power_w", "baselines",
              "energy_saving_vs_best_single", "solver", "bit_exact"):
        assert k in d, k
    assert {"network", "layer", "resource", "split"} <= set(d["plan"][0])
    assert {r["resource"] for r in d["plan"]} <= {"fabric", "cpu", "split"}
    assert set(d["baselines"]) == {"all_fabric", "all_cpu", "greedy"}
    for b in d["baselines"].values():
        assert {"latency_ms", "energy_mj_per_frame", "meets_deadline"} <= set(b)
    assert d["solver"]["status"] == "optimal" and d["solver"]["optimal"]
    assert d["solver"]["solve_s"] > 0
    # the plan is never worse than a single-resource plan that meets the deadline
    if d["energy_saving_vs_best_single"] is not None:
        assert d["energy_saving_vs_best_single"] >= -1e-9
    assert d["latency_ms"]["model"] <= d["deadline_ms"]
    assert png.stat().st_size > 10_000


def test_run_plan_modelled_and_real_bit_exact(capsys):
    before = set(threading.enumerate())
    rc, d = _json(capsys, "run", "digits-cnn", "--board", "pynq-z2", "--host", "board",
                  "--fps", "20", "--frames", "6", "--json")
    assert rc == 0 and d["frames"] == 6 and d["bit_exact"] is True
    assert d["run"]["mode"] == "modelled" and "modelled" in d["timeline"]
    assert d["deadline_misses"] == 0                 # the replay keeps the plan's timeline
    rc, d = _json(capsys, "run", "eeg-seizure", "--board", "pynq-z2", "--fps", "10",
                  "--frames", "4", "--also", "digits-cnn", "--also-fps", "5", "--json")
    assert rc == 0 and d["bit_exact"] is True and d["run"]["mode"] == "real"
    assert set(d["run"]["latency_ms"]) == {"eeg-seizure", "digits-cnn"}
    assert {p["network"] for p in d["plan"]} == {"eeg-seizure", "digits-cnn"}
    assert set(threading.enumerate()) <= before


def test_infeasible_deadline_is_named(capsys):
    rc = main(["schedule", "digits-cnn", "--board", "pynq-z2", "--deadline-ms", "0.001"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "no plan meets every deadline: digits-cnn: its fastest plan takes" in out


@pytest.mark.parametrize("argv,msg", [
    (["schedule", "digits-cnn", "--objective", "speed"], "unknown objective 'speed'"),
    (["schedule", "digits-cnn", "--also", "eeg-seizure"], "--also needs --also-fps"),
    (["schedule", "digits-cnn", "--fps", "-3"], "--fps must be positive"),
    (["schedule", "digits-cnn", "--power-cap-w", "0"], "--power-cap-w must be positive"),
    (["schedule", "digits-cnn", "--board", "arty-z7-20"], "no metric-model figures"),
    (["schedule", "digits-cnn", "--board", "icebreaker"], "iCE40UP5K has 30"),
    (["run", "digits-cnn", "--fps", "10", "--frames", "0"], "--frames must be at least 1"),
    (["schedule", "digits-cnn", "--also", "digits-cnn", "--also-fps", "3"], "two networks are called"),
    (["schedule", "digits-cnn", "--fps", "10", "--margin", "1.5"], "--margin=1.5: a fraction"),
])
def test_bad_schedule_input_is_one_line(capsys, argv, msg):
    assert main(argv) == 2
    assert msg in _err_line(capsys)


def test_schedule_an_onnx_file_with_and_without_calibration(capsys, tmp_path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])], "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel())])
    path = tmp_path / "tiny.onnx"
    onnx.save(onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])), path)
    cal = tmp_path / "cal.npy"
    np.save(cal, rng.standard_normal((4, 3, 8, 8)).astype(np.float32))
    rc, d = _json(capsys, "schedule", str(path), "--board", "pynq-z2", "--json")
    assert rc == 0 and d["feasible"] and any("random inputs" in n for n in d["notes"])
    rc, d = _json(capsys, "schedule", str(path), "--board", "pynq-z2", "--calibration", str(cal),
                  "--json")
    assert rc == 0 and not any("random inputs" in n for n in d["notes"])
    assert {p["network"] for p in d["plan"]} == {"tiny"}
