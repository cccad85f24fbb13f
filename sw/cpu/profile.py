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
file copied to another machine is not read for it. Each entry holds the median (``ms``,
what :meth:`CpuProfile.latency_ms` returns) and the fastest (``min_ms``) of
:meth:`CpuWorkers.run_layer <dnnfab.sw.cpu.workers.CpuWorkers.run_layer>`'s wall times with
the pool at that thread count, plus the engine and the reason it was chosen (the metric
model reads both). Writes are atomic (temporary file + rename).

How a layer is timed: as a run of the network meets it. Each of :data:`PASSES` x
``repeats`` rounds (more for a quick network, to span :data:`MIN_MEASURE_S`) runs every
layer of the network once, in order, and times each; a signature's entry gathers the runs
of all its layers. A layer run back to back with itself
(its input, output and weights still in cache from a moment ago) measured 1.3-1.5x faster
here than in a run of the network, and the medians of such runs repeated poorly (a second
measurement met the first within 20 % on 61-79 % of the layers of squeezenet and
shufflenet; by rounds over the network, on 93-99 % of the 178 layers of four networks;
2026-12-02).
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

__all__ = ["CpuProfile", "layer_signature", "machine_key", "default_profile_path",
           "time_in_rounds"]

#: 2: timed in rounds over the whole network (1: back to back per layer); a file of
#: another version is measured again
VERSION = 2

#: rounds over a network's layers when measuring (see :meth:`CpuProfile.measure`)
PASSES = 3
#: ... and at least this long: a small network's rounds (eeg-seizure: 0.5 ms) are repeated
#: until they span this much time, so one moment of the machine cannot move the medians of
#: its layers (15 rounds of eeg-seizure, 8 ms in all, gave medians 30-60 % apart in two
#: measurements back to back; their fastest runs agreed within 4 %)
MIN_MEASURE_S = 0.5
#: at most this many rounds
MAX_ROUNDS = 2000


def rounds_for(round_s, repeats):
    """How many rounds over a network :meth:`CpuProfile.measure` times, for a round of
    ``round_s`` seconds: PASSES x ``repeats``, more for a network too quick to span
    :data:`MIN_MEASURE_S`."""
    n = PASSES * max(1, repeats)
    if round_s > 0:
        n = max(n, int(MIN_MEASURE_S / round_s) + 1)
    return min(n, MAX_ROUNDS)


def time_in_rounds(w, env, layers, repeats):
    """{layer name: [seconds]}: ``layers`` (in network order, their inputs in ``env``) run
    through the pool ``w`` once as a warm-up, then :func:`rounds_for` rounds of one timed
    ``run_layer`` each, so every layer meets the caches a run of the network leaves it."""
    t_warm = time.perf_counter()
    for L in layers:
        w.run_layer(env, L)
    n_rounds = rounds_for(time.perf_counter() - t_warm, repeats)
    ts = {L.name: [] for L in layers}
    for _ in range(n_rounds):
        for L in layers:
            t0 = time.perf_counter()
            w.run_layer(env, L)
            ts[L.name].append(time.perf_counter() - t0)
    return ts


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

    def latency_ms(self, signature, threads, stat="median"):
        """Wall time in ms of a layer with ``signature`` at ``threads`` worker threads: the
        median of its measured runs (``stat="median"``) or the fastest (``"min"``); None
        when it was never measured on this machine."""
        e = self.entry(signature, threads)
        if e is None:
            return None
        if stat not in ("min", "median"):
            raise ValueError(f"stat={stat!r}: 'median' or 'min'")
        return e["ms"] if stat == "median" else e["min_ms"]

    def signatures(self):
        return sorted(self._data)

    def measure(self, qg, threads=(1, 2), repeats=5, feed_q=None, force=False, options=None):
        """Time every layer of ``qg`` not yet in the profile (all of them with ``force``)
        at each thread count in ``threads``: :data:`PASSES` x ``repeats`` rounds over the
        network's layers in order (more for a network whose rounds would not span
        :data:`MIN_MEASURE_S`: :func:`rounds_for`), each layer run once per round on real activations (the
        network is run once on ``feed_q``, default random int8 inputs); an entry is the
        median and the fastest of its signature's runs. Saves the file; returns
        {layer name: {threads: ms}}."""
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
                sigs = {L.name: layer_signature(qg, L, report[L.name]["engine"]) for L in qg.layers}
                times = {}                      # signature -> runs, for those to measure
                for L in qg.layers:
                    have = self.entry(sigs[L.name], t)
                    if have is not None and not force:
                        result.setdefault(L.name, {})[t] = have["ms"]
                    else:
                        times.setdefault(sigs[L.name], [])
                if times:
                    # every layer runs in every round, timed or not (only the signatures
                    # to measure keep their runs)
                    for name, ts in time_in_rounds(w, env, qg.layers, repeats).items():
                        if sigs[name] in times:
                            times[sigs[name]] += ts
                first = {}
                for L in qg.layers:
                    first.setdefault(sigs[L.name], L)
                for sig, ts in times.items():
                    rep = report[first[sig].name]
                    self._data.setdefault(sig, {})[str(int(t))] = {
                        "ms": round(statistics.median(ts) * 1e3, 4),
                        "min_ms": round(min(ts) * 1e3, 4),
                        "runs": len(ts), "engine": rep["engine"], "reason": rep["reason"],
                        "split": rep["split"], "slices": rep["slices"]}
                for L in qg.layers:
                    if sigs[L.name] in times:
                        result.setdefault(L.name, {})[t] = self._data[sigs[L.name]][str(int(t))]["ms"]
        self.save()
        return result

    def remeasure(self, qg, threads=(1, 2), repeats=5, feed_q=None, options=None):
        """:meth:`measure` with ``force=True``: every layer is timed again and replaced."""
        return self.measure(qg, threads, repeats, feed_q, force=True, options=options)

    def clear(self):
        """Forget this machine's entries (saved)."""
        self._data = {}
        self.save()

