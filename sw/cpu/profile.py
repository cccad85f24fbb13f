"""The CPU latency profile: measured wall time of each layer signature on this machine, per
thread count of the worker pool, cached on disk.

>>> prof = CpuProfile()                          # ~/.cache/dnnfab/cpu_profile.json
>>> prof.measure(qg, threads=(1, 2))             # times what is not cached yet
>>> prof.latency_ms(layer_signature(qg, L), 2)   # median ms, or None if never measured
>>> prof.remeasure(qg)                           # times everything again

A *layer signature* (:func:`layer_signature`) is what the time depends on: the op, the
shapes, kernel / stride / padding / groups and the engine the selector chose -- not the
weight values -- so layers of the same form in different networks share one entry. Entries
are kept per machine (:func:`machine_key`: CPU model, feature flags, core count): a profile
file copied to another machine is not read for it. Each entry holds, over
:data:`PASSES` x ``repeats`` runs of :meth:`CpuWorkers.run_layer
<dnnfab.sw.cpu.workers.CpuWorkers.run_layer>` with the pool at that thread count, the
fastest run (``ms``, what :meth:`CpuProfile.latency_ms` returns) and the median
(``median_ms``), plus the engine and the reason it was chosen (the metric model reads both).
Writes are atomic (temporary file + rename).

Why the fastest run: it is the layer's time on this machine when nothing else takes the
core, and it repeats. The median also holds whatever the other tenants of a shared machine
did during the measurement, which no profile can predict: measured here (2026-12-02, one
thread, two measurements of every layer a minute apart), a second measurement met the
first within 20 % on 97 / 100 / 99 % of the layers of squeezenet / eeg-seizure / shufflenet
by the fastest run, on 79 / 100 / 61 % by the median. Jitter is the scheduler's business:
a plan for this machine keeps part of each deadline free (``sched.api.LOCAL_MARGIN``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from .engines import CpuFeatures, layer_signature
from .options import Options
from . import reference as R
from .workers import CpuWorkers

__all__ = ["CpuProfile", "layer_signature", "machine_key", "default_profile_path"]

#: 2: ``ms`` is the fastest run (1: the median); a file of another version is re-measured
VERSION = 2

#: rounds over a network's layers when measuring (see :meth:`CpuProfile.measure`)
PASSES = 3


def default_profile_path():
    """``~/.cache/dnnfab/cpu_profile.json``."""
    return Path(os.path.expanduser("~")) / ".cache" / "dnnfab" / "cpu_profile.json"


def machine_key(features=None):
    """CPU model name, architecture, core count and a hash of the feature flags."""
    features = features or CpuFeatures.detect()
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = hashlib.sha1(" ".join(sorted(features.flags)).encode()).hexdigest()[:10]
    return f"{model or 'unknown'}|{features.arch}|{os.cpu_count()}|{flags}"


class CpuProfile:
    """Measured per-layer CPU latencies (see the module docstring). ``path``: the JSON file
    (default :func:`default_profile_path`); ``features``: the CPU (default this one's)."""

    def __init__(self, path=None, features=None):
        self.path = Path(path) if path is not None else default_profile_path()
        self.features = features or CpuFeatures.detect()
        self.machine = machine_key(self.features)
        self._data = self._load()

    def _load(self):
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if data.get("version") != VERSION:
            return {}
        return data.get("machines", {}).get(self.machine, {})

    def save(self):
        """Write the profile (this machine's entries merged into the file's)."""
        try:
            whole = json.loads(self.path.read_text())
            if whole.get("version") != VERSION:
                whole = {}
        except (OSError, ValueError):
            whole = {}
        whole["version"] = VERSION
        whole.setdefault("machines", {})[self.machine] = self._data
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".cpu_profile.")
        with os.fdopen(fd, "w") as f:
            json.dump(whole, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)

    def entry(self, signature, threads):
        """The stored entry {ms, runs, engine, reason} or None."""
        return self._data.get(signature, {}).get(str(int(threads)))

    def latency_ms(self, signature, threads, stat="min"):
        """Wall time in ms of a layer with ``signature`` at ``threads`` worker threads:
        its fastest measured run (``stat="min"``, see the module docstring) or the median
        (``stat="median"``); None when it was never measured on this machine."""
        e = self.entry(signature, threads)
        if e is None:
            return None
        if stat not in ("min", "median"):
            raise ValueError(f"stat={stat!r}: 'min' or 'median'")
        return e["ms"] if stat == "min" else e["median_ms"]

    def signatures(self):
        return sorted(self._data)

    def measure(self, qg, threads=(1, 2), repeats=5, feed_q=None, force=False, options=None):
        """Time every layer of ``qg`` not yet in the profile (all of them with ``force``)
        at each thread count in ``threads``; the fastest and the median of :data:`PASSES` x
        ``repeats`` runs of ``run_layer`` (``repeats`` per layer in each of PASSES rounds over the
        layers) on real activations (the network is run once on ``feed_q``, default
        random int8 inputs). Saves the file; returns {layer name: {threads: ms}}."""
        options = options or Options.from_env()
        if isinstance(threads, int):
            threads = (threads,)
        if feed_q is None:
            rng = np.random.default_rng(0)
            feed_q = {t.name: rng.integers(-128, 128, t.shape).astype(np.int8) for t in qg.inputs}
        result = {}
        for t in threads:
            with CpuWorkers(qg, threads=t, options=options, features=self.features) as w:
                report = w.engine_report()
                env = R.Env(qg)
                for inp in qg.inputs:
                    env.put(inp.name, np.asarray(feed_q[inp.name]), "lg")
                w.run_layers(env, qg.layers)
                todo = []
                for L in qg.layers:
                    rep = report[L.name]
                    sig = layer_signature(qg, L, rep["engine"])
                    have = self.entry(sig, t)
                    if have is not None and not force:
                        result.setdefault(L.name, {})[t] = have["ms"]
                    elif sig not in {s_ for _, s_, _ in todo}:
                        todo.append((L, sig, rep))
                    else:                       # same signature as a layer being timed
                        todo.append((L, sig, None))
                # PASSES rounds over the layers, ``repeats`` runs each per round: the
                # runs span the whole measurement, not one moment of a machine whose
                # speed drifts (shared: 10-20% over seconds, measured)
                times = {sig: [] for _, sig, rep in todo if rep is not None}
                for L, sig, rep in todo:
                    if rep is not None:
                        w.run_layer(env, L)  # warm
                for _ in range(PASSES):
                    for L, sig, rep in todo:
                        if rep is None:
                            continue
                        for _ in range(max(1, repeats)):
                            t0 = time.perf_counter()
                            w.run_layer(env, L)
                            times[sig].append(time.perf_counter() - t0)
                for L, sig, rep in todo:
                    if rep is not None:
                        ts = times[sig]
                        self._data.setdefault(sig, {})[str(int(t))] = {
                            "ms": round(min(ts) * 1e3, 4),
                            "median_ms": round(statistics.median(ts) * 1e3, 4),
                            "runs": len(ts), "engine": rep["engine"],
                            "reason": rep["reason"], "split": rep["split"],
                            "slices": rep["slices"]}
                for L, sig, rep in todo:
                    result.setdefault(L.name, {})[t] = self._data[sig][str(int(t))]["ms"]
        self.save()
        return result

    def remeasure(self, qg, threads=(1, 2), repeats=5, feed_q=None, options=None):
        """:meth:`measure` with ``force=True``: every layer is timed again and replaced."""
        return self.measure(qg, threads, repeats, feed_q, force=True, options=options)

    def clear(self):
        """Forget this machine's entries (saved)."""
        self._data = {}
        self.save()

