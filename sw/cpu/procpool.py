"""Helper *processes* for the CPU workers' whole-graph runs (``Options(pool="processes")``).

Why processes. Threads in one CPython process share one interpreter lock: a task of the
workers is a few native calls (im2col copies, an onnxruntime GEMM, a numba requantize)
glued by Python, and every return from a native call needs the lock back. With VNNI GEMMs
a squeezenet conv slice is 50-300 us, its glue 20-40 us: two threads then spend their time
handing the lock to each other (each hand-off can wake a halted vCPU), and measured here
two threads ran squeezenet / resnet50 *slower* than one (docs/cpu.md, section 2). A helper
process has its own interpreter, so its Python glue runs truly beside the caller's.

How. Each of the ``threads - 1`` helpers is a fresh interpreter
(``workers._helper_entry``, started with ``subprocess``: no re-import of the user's
``__main__``) that
prepares the same layers as the caller's :class:`~dnnfab.sw.cpu.workers.CpuWorkers` (same
engines, same slices). Tensors of a run live in one shared-memory arena: the caller's
environment (:class:`ArenaEnv`) allocates every layer output and layout conversion there.
When the caller binds a layer whose slices may go to a helper, it records what the
binding read from the environment (:class:`_RecEnv`: arena offsets, shapes, layouts); the
helper replays that record (:class:`_ReplayEnv`) to build the very same slice tasks over
the very same memory and runs the slices it is sent. Messages go over a socket pair as
small pickles; both sides poll it without sleeping while a run is on (a helper sleeps
after :data:`SPIN_S` without work). Only the caller schedules: a slice's completion message
is what makes its consumers ready, so every read of shared memory follows the write it
depends on.

Failure. A task that raises in a helper comes back as a message and fails the run with the
layer named, as a thread's would. A helper that dies (killed, crashed) is noticed at the
next message: its in-flight slices are run again in the caller (slices are idempotent:
they only write their own part of an output) and the pool carries on without it
(``CpuWorkers.pool_report``). Anything that cannot be shared (arena full, an array the
environment did not allocate) makes that layer run in the caller.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import pickle
import select
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

import numpy as np

from ...errors import DnnfabError
from . import reference as R

__all__ = ["ArenaEnv", "NativeHelper", "ProcPool", "SPIN_S"]

#: a helper polls for work this long after its last message before it sleeps
SPIN_S = 0.005
#: slices queued at a helper at once (one running, one waiting: hides the message latency)
HELPER_QUEUE = 2
_ALIGN = 64


# ====================================================================== shared arena
class _Arena:
    """A shared-memory block with a bump allocator, reset at every run. Allocation happens
    in the caller only; a helper maps the same block and decodes views by offset."""

    def __init__(self, size, name=None):
        from multiprocessing import shared_memory
        self.size = int(size)
        if name is None:
            self.shm = shared_memory.SharedMemory(create=True, size=self.size)
            self.owner = True
        else:
            self.shm = shared_memory.SharedMemory(name=name)
            self.owner = False
            if sys.version_info < (3, 13):    # the caller owns (and unlinks) the block
                try:
                    from multiprocessing import resource_tracker
                    resource_tracker.unregister(self.shm._name, "shared_memory")
                except Exception:  # noqa: BLE001 - tracker internals differ by version
                    pass
        self.name = self.shm.name
        self.buf = np.frombuffer(self.shm.buf, np.uint8)
        self.base = self.buf.__array_interface__["data"][0]
        self.top = 0
        self._codes = {}        # id(array) -> (array, code) of this run's allocations
        # (context, k) -> (offset, bytes): the k-th allocation of a step's binding (or
        # finish) gets the same place in every run, so a binding a helper holds stays valid
        self.slots = {}
        self.slot_top = 0
        self.ctx, self.k = None, 0

    def reset(self):
        if self.slot_top > self.size // 2:       # places kept for too many variants: anew
            self.slots.clear()
            self.slot_top = 0
        self.top = self.slot_top
        self.ctx, self.k = None, 0
        self._codes.clear()

    def context(self, key):
        """Allocations from now on belong to ``key`` (None: one-off, not kept)."""
        self.ctx, self.k = key, 0

    def alloc(self, shape, dtype):
        dtype = np.dtype(dtype)
        n = math.prod(shape) * dtype.itemsize
        key = None
        if self.ctx is not None:
            key = (self.ctx, self.k)
            self.k += 1
            slot = self.slots.get(key)
            if slot is not None and slot[1] == n:
                return self._view(shape, dtype, slot[0])
        start = (self.top + _ALIGN - 1) // _ALIGN * _ALIGN
        if start + n > self.size:
            return None
        self.top = start + n
        if key is not None:
            self.slots[key] = (start, n)
            self.slot_top = self.top
        return self._view(shape, dtype, start)

    def _view(self, shape, dtype, start):
        a = np.ndarray(shape, dtype, buffer=self.shm.buf, offset=start)
        self._codes[id(a)] = (a, (start, a.shape, a.strides, dtype.str))
        return a

    def encode(self, arr):
        """(offset, shape, strides, dtype) of an array that lies in the arena, else None."""
        hit = self._codes.get(id(arr))
        if hit is not None and hit[0] is arr:
            return hit[1]
        if not isinstance(arr, np.ndarray):
            return None
        addr = arr.__array_interface__["data"][0]
        off = addr - self.base
        if arr.size == 0:
            return None
        lo = hi = 0
        for n, st in zip(arr.shape, arr.strides):
            if st < 0:
                lo += (n - 1) * st
            else:
                hi += (n - 1) * st
        if off + lo < 0 or off + hi + arr.itemsize > self.size:
            return None
        return (off, arr.shape, arr.strides, arr.dtype.str)

    def decode(self, code):
        off, shape, strides, dt = code
        return np.ndarray(shape, np.dtype(dt), buffer=self.shm.buf, offset=off, strides=strides)

    def close(self):
        self.buf = None
        self._codes.clear()
        try:
            self.shm.close()
        except BufferError:        # a view still exported (a caller kept an output)
            pass
        if self.owner:
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass


class ArenaEnv(R.Env):
    """The caller's environment of a process-pool run: outputs, layout conversions and
    copies of foreign arrays (inputs, reference-layer outputs) in the shared arena (a
    private array when the arena is full: the layers reading it then stay in the caller)."""

    def __init__(self, graph, arena):
        super().__init__(graph)
        self.arena = arena

    def empty(self, shape, dtype):
        a = self.arena.alloc(shape, dtype)
        return np.empty(shape, dtype) if a is None else a

    def put(self, name, arr, layout):
        arr = np.asarray(arr)
        if arr.size and self.arena.encode(arr) is None:
            a = self.arena.alloc(arr.shape, arr.dtype)
            if a is not None:
                a[...] = arr
                arr = a
        self.v[name] = (arr, layout)

    def cl(self, name):
        arr, lay = self.v[name]
        if lay == "cl" or arr.ndim not in (3, 4):
            return arr
        src = R.to_cl(arr)
        y = self.empty(src.shape, arr.dtype)
        y[...] = src
        self.v[name] = (y, "cl")
        return y

    def lg(self, name):
        arr, lay = self.v[name]
        if lay == "lg":
            return arr
        src = R.from_cl(arr, self.rank(name))
        y = self.empty(src.shape, arr.dtype)
        y[...] = src
        return y


class _RecEnv:
    """Wraps the caller's :class:`ArenaEnv` while a layer binds and records every answer as
    arena codes; ``ok`` turns False if an answer is not in the arena."""

    def __init__(self, env):
        self.env, self.rec, self.ok = env, [], True
        self.g, self.v = env.g, env.v

    def _code(self, arr):
        c = self.env.arena.encode(arr)
        if c is None:
            self.ok = False
        return c

    def cl(self, name):
        a = self.env.cl(name)
        self.rec.append(("a", self._code(a)))
        return a

    def lg(self, name):
        a = self.env.lg(name)
        self.rec.append(("a", self._code(a)))
        return a

    def any(self, name):
        a, lay = self.env.any(name)
        self.rec.append(("t", self._code(a), lay))
        return a, lay

    def layout(self, name):
        lay = self.env.layout(name)
        self.rec.append(("s", lay))
        return lay

    def empty(self, shape, dtype):
        a = self.env.empty(shape, dtype)
        self.rec.append(("a", self._code(a)))
        return a

    def rank(self, name):
        return self.env.rank(name)

    def put(self, name, arr, layout):
        self.env.put(name, arr, layout)


class _ReplayEnv:
    """A helper's environment for one binding: the caller's recorded answers, in order."""

    def __init__(self, graph, arena, rec):
        self.g, self.arena, self.rec, self.i = graph, arena, rec, 0

    def _next(self, kind):
        r = self.rec[self.i]
        self.i += 1
        if r[0] != kind:
            raise DnnfabError(f"process pool: the helper's binding asked for {kind!r} where "
                              f"the caller's gave {r[0]!r}; the two preparations differ")
        return r

    def cl(self, name):
        return self.arena.decode(self._next("a")[1])

    lg = cl

    def empty(self, shape, dtype):
        return self.arena.decode(self._next("a")[1])

    def any(self, name):
        r = self._next("t")
        return self.arena.decode(r[1]), r[2]

    def layout(self, name):
        return self._next("s")[1]

    def rank(self, name):
        return len(self.g.shape(name))

    def put(self, name, arr, layout):
        pass


def shm_free_bytes(path="/dev/shm"):
    """Free bytes of the shared-memory filesystem, or None where there is none to ask."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def arena_bytes(qg):
    """Enough arena for one whole-graph run: every tensor twice (both layouts; 8 bytes per
    element for tensors that are not int8 codes), aligned."""
    n = 0
    names = [t.name for t in qg.inputs] + [L.output for L in qg.layers]
    for t in names:
        try:
            elems = int(np.prod(qg.shape(t), dtype=np.int64))
        except Exception:  # noqa: BLE001 - a tensor without a shape: room for 1 MiB
            elems = 1 << 20
        size = elems * (1 if t in qg.qtensors else 8)
        n += 2 * (size + _ALIGN)
    return n + (1 << 20)


# ====================================================================== messages
class _Chan:
    """A :class:`multiprocessing.connection.Connection` with a cheap readiness test (one
    ``poll`` object, ~1 us; ``Connection.poll`` builds a selector per call, ~10 us)."""

    def __init__(self, conn):
        self.conn = conn
        self._p = select.poll()
        self._p.register(conn.fileno(), select.POLLIN)

    def ready(self, timeout=0.0):
        """Whether a message (or EOF) waits; ``timeout`` seconds, None: forever."""
        return bool(self._p.poll(None if timeout is None else timeout * 1000.0))

    def send(self, obj):
        self.conn.send(obj)

    def recv(self):
        return self.conn.recv()

    def send_bytes(self, b):
        self.conn.send_bytes(b)

    def recv_bytes(self):
        return self.conn.recv_bytes()

    def close(self):
        self.conn.close()


# ====================================================================== helper process
def _open(fd):
    """A helper's end of the socket and the caller's payload (None: the caller went away
    before sending it)."""
    conn = _Chan(Connection(fd))
    try:
        return conn, pickle.loads(conn.recv_bytes())
    except EOFError:
        return conn, None


def serve(fd, build):
    """A helper process's life: ``build(payload)`` -> the caller's programs prepared here
    (a :class:`~dnnfab.sw.cpu.workers.CpuWorkers`, its engine sessions already run once),
    then serve slices until told to quit or the caller's socket closes."""
    conn, payload = _open(fd)
    if payload is None:
        return
    try:
        w = build(payload)
        arena = _Arena(payload["arena_size"], name=payload["arena_name"])
        steps = w._steps
        progs = [w._step_progs[id(s)] for s in steps]
        if step_layout(w) != payload["layout"]:
            raise DnnfabError("its steps and slices differ from the caller's")
        fail = payload.get("fail_step")
    except Exception as exc:  # noqa: BLE001 - reported to the caller, which goes on alone
        conn.send(("fail", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    bound = {}
    last = time.perf_counter()
    while True:
        if not conn.ready(0):
            if time.perf_counter() - last < SPIN_S:
                continue
            if not conn.ready(None):
                continue
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        last = time.perf_counter()
        kind = msg[0]
        if kind == "quit":
            break
        if kind == "run":               # a new run is starting (this message woke us)
            continue
        _, i, j, rec = msg
        err = None
        try:
            if rec is not None:
                stages, _ = progs[i].bind(_ReplayEnv(w.qg, arena, rec))
                bound[i] = stages[0]
            if i == fail:
                raise RuntimeError("fault injected in a helper process (test)")
            bound[i][j]()
        except Exception as exc:  # noqa: BLE001 - the caller names the layer
            err = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        conn.send(("done", i, j, err))
        last = time.perf_counter()
    w._helper_stop()
    arena.close()


def _portable(qg):
    """``qg`` for pickling: layers without their per-process caches (onnxruntime sessions
    of the reference's plan)."""
    import copy
    q2 = copy.copy(qg)
    layers = []
    for L in qg.layers:
        if getattr(L, "cache", None):
            L = copy.copy(L)
            L.cache = {}
        layers.append(L)
    q2.layers = layers
    return q2


def step_layout(w):
    """[(program class, slice ranges)] of a CpuWorkers' whole-graph steps: a helper checks
    that its preparation cut every step as the caller's did."""
    out = []
    for st in w._steps:
        p = w._step_progs[id(st)]
        out.append((type(p).__name__, p.slices, [tuple(x) for x in getattr(p, "parts", ())]))
    return out


def dependencies(steps):
    """({id(step): number of steps it waits for}, {tensor: [steps reading it]}) of a
    topological list of steps (layers or fused steps); inputs made outside it are ready."""
    produced = {S.output: S for S in steps}
    pending, consumers = {}, {}
    for S in steps:
        deps = {produced[t].output for t in S.inputs if t in produced and produced[t] is not S}
        pending[id(S)] = len(deps)
        for t in deps:
            consumers.setdefault(t, []).append(S)
    return pending, consumers


class _Helper:
    def __init__(self, proc, conn):
        self.proc, self.conn = proc, conn
        self.ready = False
        self.dead = False
        self.inflight = []          # [(step, slice)] in send order
        self.recs = {}              # step -> the binding record this helper holds


def _spawn(entry):
    """A fresh interpreter running ``dnnfab.sw.cpu.workers.<entry>(fd)`` on one end of a
    socket pair (no re-import of the user's ``__main__``)."""
    a, b = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-c",
                             f"import sys; from dnnfab.sw.cpu.workers import {entry}; "
                             f"{entry}(int(sys.argv[1]))", str(b.fileno())],
                            pass_fds=[b.fileno()], stdin=subprocess.DEVNULL)
    b.close()
    return _Helper(proc, _Chan(Connection(a.detach())))


def _drop(h, why, what="helper process"):
    """Give up on helper ``h`` (closed, killed if still running); returns the note."""
    h.dead = True
    rc = h.proc.poll()
    note = (f"{what} {h.proc.pid} exited (code {rc}): {why}" if rc is not None
            else f"{what} {h.proc.pid} dropped: {why}")
    try:
        h.conn.close()
    except OSError:
        pass
    if h.proc.poll() is None:
        h.proc.kill()
    return note


def _poll_ready(h, timeout=0.0, what="helper process"):
    """Take helper ``h``'s "ready" message if it waits (``timeout`` seconds); returns a
    note when the helper failed or exited while preparing, else None."""
    if h.ready or h.dead:
        return None
    try:
        if h.conn.ready(timeout):
            msg = h.conn.recv()
            if msg[0] == "ready":
                h.ready = True
                return None
            return _drop(h, f"helper failed to prepare: {msg[1]}", what)
    except (EOFError, OSError):
        return _drop(h, "helper exited while preparing", what)
    return None


def _stop(helpers):
    """Ask ``helpers`` to quit (kill those still preparing), wait for them, close."""
    for h in helpers:
        if not h.ready and h.proc.poll() is None:   # still preparing: nothing to lose
            h.proc.kill()
        elif not h.dead:
            try:
                h.conn.send(("quit",))
            except OSError:
                pass
    for h in helpers:
        try:
            h.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            h.proc.kill()
            h.proc.wait()
        try:
            h.conn.close()
        except OSError:
            pass
        h.dead = True


class ProcPool:
    """``n`` helper processes serving one :class:`CpuWorkers`' whole-graph runs (see the
    module docstring). Started at construction; the caller's runs use the helpers that
    have reported ready (:meth:`wait_ready` blocks for them)."""

    def __init__(self, workers, n, consts, _fail_step=None):
        self.qg = workers.qg
        size = arena_bytes(workers.qg)
        free = shm_free_bytes()
        if free is not None and size > free // 2:
            # a tmpfs that runs out while a page is first written kills the process (SIGBUS)
            raise OSError(f"the shared-memory arena needs {size >> 20} MiB and /dev/shm has "
                          f"{free >> 20} MiB free (a container's default is 64 MiB: "
                          "docker run --shm-size=1g, or DNNFAB_POOL=threads)")
        self.arena = _Arena(size)
        self.helpers = []
        self.note = None
        payload = dict(qg=_portable(workers.qg), threads=workers.threads, options=workers.options,
                       features=workers.features, prepared=workers._prepared,
                       arena_name=self.arena.name, arena_size=self.arena.size,
                       consts=consts,
                       layout=step_layout(workers), fail_step=_fail_step)
        self.last_run = None        # {'caller_slices', 'helper_slices'} of the last run
        for _ in range(n):
            self.helpers.append(_spawn("_helper_entry"))
        # pickling a big graph takes a while: send it from a thread, the caller goes on
        self._sender = threading.Thread(target=self._send_payload, args=(payload,),
                                        name="dnnfab-procpool-start", daemon=True)
        self._sender.start()

    def _send_payload(self, payload):
        try:
            data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001
            self.note = f"helpers not started: the graph does not pickle ({exc})"
            for h in self.helpers:
                h.dead = True
            return
        for h in self.helpers:
            try:
                h.conn.send_bytes(data)
            except (OSError, ValueError):     # closed meanwhile (shut down before ready)
                h.dead = True

    def _check_ready(self, h, timeout=0.0):
        note = _poll_ready(h, timeout)
        if note:
            self.note = note

    def wait_ready(self, timeout=120.0):
        """Block until every helper has prepared (or died); True if all are ready."""
        end = time.monotonic() + timeout
        for h in self.helpers:
            while not (h.ready or h.dead) and time.monotonic() < end:
                self._check_ready(h, 0.05)
        return all(h.ready for h in self.helpers)

    def live(self):
        for h in self.helpers:
            self._check_ready(h)
        return [h for h in self.helpers if h.ready and not h.dead]

    def _lose(self, h, why):
        self.note = _drop(h, why)

    def shutdown(self):
        _stop(self.helpers)
        self.helpers = []
        self.arena.close()


# ====================================================================== native helper
def serve_native(fd, build):
    """The life of the *native* helper (:class:`NativeHelper`): make onnxruntime's
    process-wide intra-op thread pool ``threads`` wide before any session exists, prepare
    the graph unsliced (``build(payload)``: a 1-thread CpuWorkers whose engine sessions
    all use that pool), then run whole graphs until told to quit or the caller's socket
    closes. Every GEMM is then parallel inside onnxruntime (native threads that spin
    between calls, as in onnxruntime's own runs); the rest of the graph runs in this
    process's one Python thread."""
    conn, payload = _open(fd)
    if payload is None:
        return
    try:
        from onnxruntime.capi import _pybind_state as C
        C.set_global_thread_pool_sizes(int(payload["threads"]), 1)
        R._GLOBAL_POOL = True   # this process only: every session uses the global pool
        w = build(payload)
    except Exception as exc:  # noqa: BLE001 - reported to the caller, which goes on alone
        conn.send(("fail", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            if not conn.ready(None):
                continue
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg[0] == "quit":
            break
        try:
            conn.send(("out", w.run(msg[1])))
        except Exception as exc:  # noqa: BLE001 - the caller raises it, the layer named
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            conn.send(("err", getattr(exc, "layer", None), text))
    w.close()


class NativeHelper:
    """One helper process that runs whole graphs with onnxruntime's process-wide thread
    pool of ``n`` threads (:func:`serve_native`); a mode of ``Options(pool="processes")``
    that calibration keeps when it is the fastest (``CpuWorkers.pool_report()["mode"] ==
    "native"``). The caller sleeps while the helper runs (it would otherwise take a core
    from the helper's threads). Such a pool cannot live in the caller: once it exists,
    onnxruntime refuses every session of the process its own threads, the user's too."""

    def __init__(self, workers, n, _fail_step=None):
        self.note = None
        self.runs = 0               # whole-graph runs it completed
        fail = None if _fail_step is None else workers._steps[_fail_step].name
        payload = dict(qg=_portable(workers.qg), threads=int(n), options=workers.options,
                       features=workers.features, fail_step=fail)
        self.h = _spawn("_native_entry")
        self.proc, self.conn = self.h.proc, self.h.conn
        self._sender = threading.Thread(target=self._send_payload, args=(payload,),
                                        name="dnnfab-native-start", daemon=True)
        self._sender.start()

    @property
    def ready(self):
        return self.h.ready

    @property
    def dead(self):
        return self.h.dead

    def _send_payload(self, payload):
        try:
            self.conn.send_bytes(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
        except (OSError, ValueError, pickle.PicklingError) as exc:
            self.note = f"native helper not started ({type(exc).__name__}: {exc})"
            self.h.dead = True

    def _check_ready(self, timeout=0.0):
        note = _poll_ready(self.h, timeout, "native helper process")
        if note:
            self.note = note

    def wait_ready(self, timeout=120.0):
        end = time.monotonic() + timeout
        while not (self.ready or self.dead) and time.monotonic() < end:
            self._check_ready(0.05)
        return self.ready and not self.dead

    def settled(self):
        """Ready or dead (not still preparing)."""
        self._check_ready()
        return self.ready or self.dead

    def live(self):
        self._check_ready()
        return self.ready and not self.dead

    def _lose(self, why):
        self.note = _drop(self.h, why, "native helper process")

    def run(self, feed_q, timeout=None):
        """The graph's outputs for ``feed_q``, ``("err", layer, text)`` when a layer
        raised in the helper, or None when the helper is gone or gave no answer within
        ``timeout`` seconds (it is then killed; the caller runs the graph itself)."""
        end = None if timeout is None else time.monotonic() + timeout
        try:
            self.conn.send(("run", feed_q))
            while not self.conn.ready(1.0):     # sleeps: the helper's threads get the cores
                if self.proc.poll() is not None:
                    raise EOFError
                if end is not None and time.monotonic() > end:
                    self._lose(f"no answer within {timeout:.0f} s, killed; the run went on "
                               "in the caller")
                    return None
            msg = self.conn.recv()
        except (EOFError, OSError, ValueError):
            self._lose("lost during a run; the run went on in the caller")
            return None
        if msg[0] == "out":
            self.runs += 1
            return msg[1]
        return msg

    def shutdown(self):
        _stop([self.h])


class ProcRun:
    """One whole-graph run: the caller schedules every step, runs slices itself and sends
    the shareable ones of big layers to the ready helpers."""

    def __init__(self, workers, pool, env, steps, progs, remote_ok):
        self.w, self.pool, self.env = workers, pool, env
        self.steps, self.progs = steps, progs
        self.index = {id(s): i for i, s in enumerate(steps)}
        self.remote_ok = remote_ok               # step index -> bool
        self.pending, self.consumers = dependencies(steps)
        self.remaining = len(steps)
        self.ready = []                          # heap of (prio, seq, step, slice)
        self.seq = itertools.count()
        self.bound = {}                          # step -> [tasks, finish, left, rec]
        self.error = None
        self.helpers = pool.live()
        self.sent = self.here = 0

    # -------------------------------------------------------------- steps
    def _start(self, S):
        i = self.index[id(S)]
        prog = self.progs[i]
        remote = self.helpers and self.remote_ok[i]
        env = _RecEnv(self.env) if remote else self.env
        arena = self.env.arena
        arena.context(("bind", i))
        try:
            stages, finish = prog.bind(env)
        except Exception as exc:  # noqa: BLE001
            self._fail(S, exc)
            return
        finally:
            arena.context(None)
        if len(stages) != 1:        # a multi-stage program: all of it here, in order
            def whole(stages=stages):
                for tasks in stages:
                    for fn in tasks:
                        fn()
            tasks, remote = [whole], False
        else:
            tasks = stages[0]
        rec = env.rec if remote and env.ok else None
        self.bound[i] = [tasks, finish, len(tasks), rec]
        prio = self.w._pos[id(S)]
        for j in range(len(tasks)):
            heapq.heappush(self.ready, (prio, next(self.seq), i, j))

    def _slice_done(self, i):
        b = self.bound[i]
        b[2] -= 1
        if b[2] or self.error is not None:
            return
        S = self.steps[i]
        self.env.arena.context(("finish", i))
        try:
            if b[1] is not None:
                b[1]()
        except Exception as exc:  # noqa: BLE001
            self._fail(S, exc)
            return
        finally:
            self.env.arena.context(None)
        self.remaining -= 1
        for c in self.consumers.get(S.output, ()):
            self.pending[id(c)] -= 1
            if self.pending[id(c)] == 0:
                self._start(c)

    def _fail(self, S, exc):
        if self.error is None:
            self.error = (S, exc)

    # -------------------------------------------------------------- helpers
    def _send(self, h, i, j):
        rec = self.bound[i][3]
        if h.recs.get(i) == rec:
            rec = None                  # the helper's binding of an earlier run still holds
        else:
            h.recs[i] = rec
        try:
            h.conn.send(("slice", i, j, rec))
        except OSError:
            self._lost(h, "helper's connection closed")
            self._local(i, j)
            return
        h.inflight.append((i, j))
        self.sent += 1

    def _lost(self, h, why):
        """A helper died: its slices run again here; the pool goes on without it."""
        redo = list(h.inflight)
        h.inflight.clear()
        self.pool._lose(h, f"{why}; its slices ran in the caller")
        self.helpers = [x for x in self.helpers if x is not h]
        for i, j in redo:
            heapq.heappush(self.ready, (-1, next(self.seq), i, j))   # first: others wait on it
            self.bound[i][3] = None

    def _poll(self, wait=False):
        """Take the helpers' completion messages (without blocking unless ``wait``)."""
        got = False
        for h in list(self.helpers):
            while h.inflight:
                try:
                    if not h.conn.ready(0):
                        break
                    msg = h.conn.recv()
                except (EOFError, OSError):
                    self._lost(h, "helper process exited")
                    break
                _, i, j, err = msg
                h.inflight.remove((i, j))
                got = True
                if err is not None:
                    self._fail(self.steps[i], RuntimeError(f"in a helper process: {err}"))
                self._slice_done(i)
        if wait and not got:
            for h in list(self.helpers):
                if h.inflight and h.proc.poll() is not None and not h.conn.ready(0):
                    self._lost(h, f"helper process exited with code {h.proc.returncode}")
        return got

    def _local(self, i, j):
        S = self.steps[i]
        self.here += 1
        if self.error is None:
            try:
                self.bound[i][0][j]()
            except Exception as exc:  # noqa: BLE001
                self._fail(S, exc)
        self._slice_done(i)

    # -------------------------------------------------------------- the loop
    def run(self):
        """Run every step; returns None, or (step, exception) of the first failure (the
        caller raises it, naming the layer)."""
        for h in self.helpers:
            try:
                h.conn.send(("run",))   # wakes a helper that went to sleep
            except OSError:
                self._lost(h, "helper's connection closed")
        for S in self.steps:
            if self.pending[id(S)] == 0:
                self._start(S)
        while True:
            self._poll()
            if self.error is not None:
                break
            # feed the helpers first: the caller takes what is left
            for h in self.helpers:
                # keep one ready slice for the caller: a lone slice is not worth a message
                while len(h.inflight) < HELPER_QUEUE and len(self.ready) >= 2:
                    k = next((k for k, it in enumerate(self.ready)
                              if self.bound[it[2]][3] is not None), None)
                    if k is None:
                        break
                    _, _, i, j = self.ready[k]
                    self.ready[k] = self.ready[-1]
                    self.ready.pop()
                    heapq.heapify(self.ready)
                    self._send(h, i, j)
            if self.ready:
                _, _, i, j = heapq.heappop(self.ready)
                self._local(i, j)
                continue
            if any(h.inflight for h in self.helpers):
                self._poll(wait=True)
                continue
            break
        # drain what the helpers still run (their results must not land in a later run)
        while any(h.inflight for h in self.helpers):
            self._poll(wait=True)
        self.pool.last_run = {"caller_slices": self.here, "helper_slices": self.sent}
        if self.error is not None:
            return self.error
        if self.remaining:
            raise DnnfabError(f"process pool run ended with {self.remaining} steps not run "
                              "(a dependency cycle?); report this as a bug")
