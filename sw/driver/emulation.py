"""The fabric as this machine emulates it: measured wall time of each fabric launch on the
model backend, cached on disk.

On this machine there is no board: a real-mode :class:`~dnnfab.sw.runtime.realtime.Runtime`
runs every fabric launch on the model backend and holds it for its modelled duration at
the board clock. When the model computes a launch more slowly than the board would, the
launch lasts what the model takes. A plan for this machine (``host="local"``) must know
that, or it promises deadlines the real run cannot keep; so the metric model takes, per
fabric layer, ``max(board time, emulation time)`` (:class:`~dnnfab.sw.metrics.model.MetricModel`
``emulation=``).

>>> prof = LaunchProfile()                 # ~/.cache/dnnfab/launch_profile.json
>>> prof.launch_s(net)                      # {fabric layer: median seconds}, measured once

The time of a launch is what the runtime's fabric thread spends on it: pack the input
into the device buffer, write the registers, the model's run, read the counters and the
output back and unpack it (:meth:`LaunchProfile.measure`). Each entry is the median of
``repeats`` launches with random input bytes (the time does not depend on the values),
keyed by the machine (:func:`~dnnfab.sw.cpu.profile.machine_key`) and the compiled
network's key (model digest and configuration). Writes are atomic.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ..cpu.profile import machine_key
from . import device as _device

__all__ = ["LaunchProfile", "default_launch_profile_path"]

VERSION = 1


def default_launch_profile_path():
    """``~/.cache/dnnfab/launch_profile.json``."""
    return Path(os.path.expanduser("~")) / ".cache" / "dnnfab" / "launch_profile.json"


_CODE_KEY = []


def code_key():
    """A hash of the sources that decide how fast the model backend runs a launch (the
    driver, the fast model and its kernels): a faster or slower model is measured again."""
    if not _CODE_KEY:
        import hashlib
        here = Path(__file__).resolve().parent
        h = hashlib.sha1()
        for f in sorted([*here.glob("*.py"), here.parent / "cpu" / "kernels.py",
                         here.parent / "compiler" / "network.py"]):
            h.update(f.read_bytes())
        _CODE_KEY.append(h.hexdigest()[:12])
    return _CODE_KEY[0]


class LaunchProfile:
    """See the module docstring. ``path``: the JSON file (None: the default; False: memory
    only); ``repeats``: launches per layer (median kept)."""

    def __init__(self, path=None, repeats=5):
        self.path = None if path is False else Path(path or default_launch_profile_path())
        self.repeats = int(repeats)
        self.machine = machine_key()
        self._data = self._load()

    def _load(self):
        if self.path is None or not self.path.exists():
            return {}
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if raw.get("version") != VERSION:
            return {}
        return raw.get("machines", {}).get(self.machine, {})

    def save(self):
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            raw = json.loads(self.path.read_text()) if self.path.exists() else {}
        except (OSError, ValueError):
            raw = {}
        if raw.get("version") != VERSION:
            raw = {"version": VERSION, "machines": {}}
        raw.setdefault("machines", {})[self.machine] = self._data
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(raw, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)

    def launch_s(self, net, force=False):
        """{fabric layer name: median launch seconds} of a compiled network (measured the
        first time, then read from the cache; an entry is for this version of the model
        backend's code, see :func:`code_key`)."""
        key = f"{net.key}:{code_key()}"
        hit = self._data.get(key)
        if hit is None or force:
            hit = self.measure(net)
            self._data[key] = hit
            self.save()
        return dict(hit)

    def measure(self, net):
        """Time every run of ``net`` (``chain=False``: one layer each) as the runtime's
        fabric thread does it; {layer of the run: seconds} (a chained run's time goes to
        its first layer, the others get 0)."""
        rng = np.random.default_rng(0)
        dev = _device.open("model", net.config, dram_bytes=net.dram_bytes + (1 << 16))
        try:
            mem = dev.allocate(net.dram_bytes, np.uint8)
            base = mem.device_address
            if base != 0:                    # a fresh model device allocates from 0
                raise RuntimeError(f"launch profile: buffer at {base:#x}, expected 0")
            img = np.frombuffer(net.image, np.uint8)
            mem[:len(img)] = img
            mem[:len(img)].sync_to_device()
            out = {}
            for run in net.runs:
                prog = _device.Program(run.prog_addr, run.n_insns, run.out_window[0],
                                       run.out_window[1])
                ins = [net.tensors[b] for b in run.inputs]
                outs = [net.tensors[b] for b in run.outputs]
                data = [rng.integers(-128, 128, t.size, dtype=np.int8) for t in ins]

                def once():
                    t0 = time.perf_counter()
                    for t, d in zip(ins, data):
                        view = mem[t.addr:t.addr + t.size]
                        view.view(np.int8)[:] = d
                        view.sync_to_device()
                    dev.run(prog, timeout_s=dev.backend.launch_timeout(run.cycles))
                    for t in outs:
                        view = mem[t.addr:t.addr + t.size]
                        view.sync_from_device()
                        t.unpack_view(view)
                    return time.perf_counter() - t0

                once()                       # traces the program, warms the caches
                ts = [once() for _ in range(self.repeats)]
                med = statistics.median(ts)
                for i, name in enumerate(run.layers):
                    out[name] = med if i == 0 else 0.0
            return out
        finally:
            dev.close()
