"""The CPU workers with helper processes (``Options(pool="processes")``,
sw/cpu/procpool.py): bit-identical to the reference whatever goes to the helpers, errors
in a helper name the layer, a helper that dies leaves its slices to the caller, nothing is
left running after close() or garbage collection."""

from __future__ import annotations

import gc
import os
import signal

import numpy as np
import pytest

from dnnfab.errors import DnnfabError
from dnnfab.sw.cpu import procpool as PP
from dnnfab.sw.cpu import reference as R
from dnnfab.sw.cpu import workers as W
from dnnfab.sw.cpu.options import Options

from .test_workers import _zoo

PROC = Options(pool="processes")

# helper processes poll without sleeping while a run is on: never beside a real-time run
pytestmark = pytest.mark.xdist_group("realtime")


@pytest.fixture(scope="module")
def zoo():
    return {name: _zoo(name) for name in ("squeezenet", "inception_v1", "shufflenet")}


def _split_everything(mp):
    """Every layer cut into slices and every slice worth a helper."""
    mp.setattr(W, "SPLIT_MIN_MACS", 0)
    mp.setattr(W, "SPLIT_MIN_ELEMS", 0)
    mp.setattr(W, "BAND_MIN_ROWS", 1)
    mp.setattr(W, "PROC_HANDOFF_MIN_WORK", 0)


def _feeds(fq, n=3):
    """``fq`` and random int8 inputs of its shapes (extremes included)."""
    rng = np.random.default_rng(7)
    out = [fq]
    for i in range(n - 1):
        f = {k: rng.integers(-128, 128, v.shape).astype(np.int8) for k, v in fq.items()}
        if i == 0:
            f = {k: np.where(v > 0, 127, -128).astype(np.int8) for k, v in f.items()}
        out.append(f)
    return out


@pytest.mark.parametrize("name", ["squeezenet", "inception_v1", "shufflenet"])
def test_processes_equal_reference(zoo, name, monkeypatch):
    """Several runs with different inputs on one pool: the helpers keep their bindings
    from run to run (procpool.py), so a binding that held an input's *contents* would
    show here."""
    q, fq = zoo[name]
    feeds = _feeds(fq) + [fq]
    wants = [R.run_reference(q, f, options=Options()) for f in feeds]
    for threads, split in [(2, False), (2, True), (3, True)]:
        with monkeypatch.context() as mp:
            if split:
                _split_everything(mp)
            with W.CpuWorkers(q, threads=threads, options=PROC) as w:
                assert w.wait_ready(), w.pool_report()
                w._mode = "helpers"                     # no calibration: always the helpers
                rep = w.pool_report()
                assert rep["kind"] == "processes" and rep["helpers"] == threads - 1
                runs = [w.run(f) for f in feeds]            # the arena is reused per run
                last = w.pool_report()["last_run"]
        for got, want in zip(runs, wants):
            assert set(got) == set(want)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k], err_msg=f"{name} {threads} {split}")
        if split:   # the helpers really ran a share of the slices
            assert last["helper_slices"] >= last["caller_slices"] // (2 * threads), last


def test_processes_outputs_are_copies(zoo):
    """A run's outputs stay valid after the next run rewrites the shared arena."""
    q, fq = zoo["squeezenet"]
    with W.CpuWorkers(q, threads=2, options=PROC) as w:
        w.wait_ready()
        w._mode = "helpers"
        a = w.run(fq)
        keep = {k: v.copy() for k, v in a.items()}
        zeros = {k: np.zeros_like(v) for k, v in fq.items()}
        w.run(zeros)
        for k in keep:
            np.testing.assert_array_equal(a[k], keep[k])


@pytest.mark.parametrize("mode", ["helpers", "native"])
def test_helper_error_names_the_layer(zoo, monkeypatch, mode):
    """A fault injected in one layer of a slice helper or of the native helper."""
    q, fq = zoo["squeezenet"]
    with monkeypatch.context() as mp:
        if mode == "helpers":           # the failing layer's slices go to the helper
            _split_everything(mp)
        probe = W.CpuWorkers(q, threads=2)
        step = next(i for i, s in enumerate(probe._steps) if s.op == "conv" and
                    (mode == "native" or probe._step_progs[id(s)].slices > 1))
        name = probe._steps[step].name
        probe.close()
        with W.CpuWorkers(q, threads=2, options=PROC, _fail_step=step) as w:
            assert w.wait_ready()
            w._mode = mode
            with pytest.raises(W.CpuTaskError) as exc:
                w.run(fq)
            assert exc.value.layer == name
            msg = str(exc.value)
            where = "native helper process" if mode == "native" else "helper process"
            assert repr(name) in msg and where in msg and "\n" not in msg
            assert isinstance(exc.value, DnnfabError)


def test_dead_helper_leaves_its_slices_to_the_caller(zoo, monkeypatch):
    q, fq = zoo["inception_v1"]
    want = R.run_reference(q, fq, options=Options())
    with monkeypatch.context() as mp:
        _split_everything(mp)
        with W.CpuWorkers(q, threads=3, options=PROC) as w:
            assert w.wait_ready()
            w._mode = "helpers"
            w.run(fq)
            victim = w._procpool.helpers[0].proc
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            got = w.run(fq)                  # the dead helper's slices run in the caller
            rep = w.pool_report()
            assert rep["helpers"] == 1 and f"{victim.pid} exited" in rep["note"], rep
            got2 = w.run(fq)                 # and the pool goes on with the other helper
    for out in (got, got2):
        for k in want:
            np.testing.assert_array_equal(out[k], want[k])


def test_no_process_or_shared_memory_left(zoo):
    q, fq = zoo["squeezenet"]
    w = W.CpuWorkers(q, threads=3, options=PROC)
    assert w.wait_ready()
    w._mode = "helpers"
    procs = [h.proc for h in w._procpool.helpers] + [w._pp[1].proc]   # and the native one
    shm = "/dev/shm/" + w._procpool.arena.name.lstrip("/")
    w.run(fq)
    assert all(p.poll() is None for p in procs) and os.path.exists(shm)
    w.close()
    w.close()                                   # idempotent
    assert all(p.poll() is not None for p in procs)
    assert not os.path.exists(shm)
    with pytest.raises(DnnfabError, match="closed"):
        w.run(fq)
    w2 = W.CpuWorkers(q, threads=2, options=PROC)
    for _ in range(W.PROC_START_AFTER_RUNS):   # a few runs start no process
        w2.run(fq)
        assert w2._procpool is None
    w2.run(fq)                                  # started now; before it is ready: threads
    procs = [h.proc for h in w2._procpool.helpers] + [w2._pp[1].proc]
    del w2
    gc.collect()
    for p in procs:
        p.wait(timeout=10)


def test_calibration_keeps_the_faster_mode(zoo):
    """After the helpers are ready, CALIBRATION_WARMUP runs with the helpers, then runs
    with the helpers and in the caller alone in turn (CALIBRATION_RUNS each); the mode with
    the fastest run is kept, and every run is bit-exact whichever mode ran it."""
    q, fq = zoo["inception_v1"]
    want = R.run_reference(q, fq, options=Options())
    with W.CpuWorkers(q, threads=2, options=PROC) as w:
        assert w.wait_ready()
        # two helper modes (slices to a helper, the native helper) and the caller alone
        for _ in range(3 * W.CALIBRATION_RUNS + 2 * W.CALIBRATION_WARMUP):
            assert w.pool_report()["mode"] is None
            got = w.run(fq)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])
        rep = w.pool_report()
        cal = rep["calibration_ms"]
        assert set(cal) == {"helpers", "native", "caller"} and all(v > 0 for v in cal.values())
        assert rep["mode"] == min(cal, key=cal.get)
        # the modes not kept are stopped: nothing left idle
        assert (rep["helpers"] == 1) == (rep["mode"] == "helpers")
        assert rep["native"] == (rep["mode"] == "native")
        if rep["mode"] != "helpers":
            assert "helpers stopped" in rep["note"]
        got = w.run(fq)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("name", ["squeezenet", "inception_v1", "shufflenet"])
def test_native_helper_equals_reference(zoo, name):
    """The native helper (procpool.NativeHelper: the graph unsliced, its sessions on
    onnxruntime's process-wide pool of 2 threads) on several inputs: equal to the reference;
    the caller's own process keeps per-session threads (a user's 2-thread session still
    opens)."""
    import onnxruntime as ort
    q, fq = zoo[name]
    feeds = _feeds(fq) + [fq]
    wants = [R.run_reference(q, f, options=Options()) for f in feeds]
    with W.CpuWorkers(q, threads=2, options=PROC) as w:
        assert w.wait_ready(), w.pool_report()
        w._mode = "native"
        runs = [w.run(f) for f in feeds]
        rep = w.pool_report()
        assert rep["native"] and rep["kind"] == "processes"
        assert w._pp[1].runs == len(feeds)          # really ran there
    for got, want in zip(runs, wants):
        assert set(got) == set(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=name)
    assert not R._GLOBAL_POOL
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    ort.InferenceSession(q.export().SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_native_helper_death_and_hang(zoo, monkeypatch):
    """A native helper killed with SIGKILL, or stopped (a hang: SIGSTOP, past the
    timeout): the run completes bit-exact in the caller, the note names the process, later
    runs go on without it."""
    q, fq = zoo["squeezenet"]
    want = R.run_reference(q, fq, options=Options())
    with W.CpuWorkers(q, threads=2, options=PROC) as w:
        assert w.wait_ready()
        w._mode = "native"
        w.run(fq)
        victim = w._pp[1].proc
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        got = w.run(fq)
        rep = w.pool_report()
        assert not rep["native"] and f"{victim.pid} exited" in rep["note"], rep
        got2 = w.run(fq)
    monkeypatch.setattr(W, "NATIVE_TIMEOUT_S", 2.0)
    monkeypatch.setattr(W, "NATIVE_TIMEOUT_FACTOR", 0)
    with W.CpuWorkers(q, threads=2, options=PROC) as w:
        assert w.wait_ready()
        w._mode = "native"
        victim = w._pp[1].proc
        os.kill(victim.pid, signal.SIGSTOP)
        got3 = w.run(fq)
        rep = w.pool_report()
        assert not rep["native"] and "no answer within 2 s" in rep["note"], rep
        assert victim.wait(timeout=10) == -signal.SIGKILL
    for out in (got, got2, got3):
        for k in want:
            np.testing.assert_array_equal(out[k], want[k])


def test_small_shared_memory_keeps_threads(zoo, monkeypatch):
    """A /dev/shm too small for the arena (a container's 64 MiB): no helper is started
    (writing past a full tmpfs would kill the process), the note says why and how to fix
    it, and runs stay exact on the threads."""
    q, fq = zoo["squeezenet"]
    want = R.run_reference(q, fq, options=Options())
    monkeypatch.setattr(PP, "shm_free_bytes", lambda path="/dev/shm": 1 << 20)
    with W.CpuWorkers(q, threads=2, options=PROC) as w:
        assert not w.wait_ready()
        rep = w.pool_report()
        assert rep["helpers"] == 0 and "/dev/shm" in rep["note"] and "shm-size" in rep["note"]
        assert rep["native"]            # needs no shared memory
        for _ in range(W.PROC_START_AFTER_RUNS + 2):
            got = w.run(fq)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])
    assert PP.shm_free_bytes() is None or PP.shm_free_bytes() > 0


def test_pool_option():
    assert Options().pool == "processes"
    assert Options.from_env({}).pool == "processes"
    assert Options.from_env({"DNNFAB_POOL": "threads"}).pool == "threads"
    assert Options.from_env({"DNNFAB_POOL": "processes"}).pool == "processes"
    with pytest.raises(ValueError, match="pool"):
        Options(pool="forks")


def test_arena_codes_round_trip():
    a = PP._Arena(1 << 16)
    try:
        x = a.alloc((3, 5, 7), np.int8)
        x[...] = np.arange(105, dtype=np.int8).reshape(3, 5, 7)
        for v in (x, x[:, 1:4], x[..., ::2], x.reshape(15, 7), x[::-1]):
            code = a.encode(v)
            assert code is not None
            np.testing.assert_array_equal(a.decode(code), v)
        assert a.encode(np.zeros(4, np.int8)) is None          # not in the arena
        assert a.alloc((1 << 20,), np.int8) is None             # does not fit
        env = PP.ArenaEnv(None, a)
        y = env.empty((1 << 20,), np.int8)                      # falls back to private memory
        assert a.encode(y) is None
    finally:
        a.close()
