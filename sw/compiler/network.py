"""Whole-network compiler: a quantized graph in, one :class:`CompiledNetwork` out.

The compiled network holds everything a host needs to run the network on a fabric, and
nothing it has to recompute:

* **one DRAM plan.** One image holds every run's instruction stream and every fabric
  layer's weight and aux blocks; after it comes an *activation arena* where every tensor a
  fabric layer reads or writes has a buffer in the fabric layout (NHWC, channels padded to
  :func:`~dnnfab.sw.compiler.program.channel_pad`; a GEMM's rows x padded K). Buffers
  share addresses when their lifetimes do not overlap (greedy first fit, largest first).
  A layer reads its producer's output where the producer stored it, so data crosses to the
  host only where a CPU layer (or the caller) needs it.
* **runs.** Consecutive fabric layers form one *run*: one program, one START, one
  interrupt. Inside a run a layer that reads a tensor stored earlier in the run waits for
  those stores through a barrier (see :class:`~dnnfab.sw.compiler.program.ProgramBuilder`),
  and its first weight loads are issued before that barrier, so they overlap the previous
  layer's tail. ``chain=False`` compiles every fabric layer as a run of its own (the
  single-layer programs of :func:`~dnnfab.sw.compiler.program.compile_layer`), the
  baseline the benchmark compares against.
* **per layer**: target, MACs, array MACs, modelled cycles, DRAM bytes moved, scratchpad
  occupancy; per run the modelled cycles of the whole program.

A compiled network is content-addressed: :attr:`CompiledNetwork.key` hashes the model's
integers, the accelerator configuration and the compiler version, :meth:`to_bytes` is a
deterministic serialization (compiling twice gives the same bytes), and
:func:`compile_network` caches it on disk under that key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, asdict, fields, is_dataclass
import hashlib
import math
import json
import os
import struct

import numpy as np

from ...errors import DnnfabError
from ...hw.config import AcceleratorConfig
from ...hw.spec import INSN_BYTES, Load, Store, Compute
from .placement import Placement, place_layer, op_label
from .split import split_target
from .program import ProgramBuilder, channel_pad, _ru
from .fastmodel import estimate_cycles

__all__ = ["CompiledNetwork", "TensorBuf", "FabricRun", "LayerInfo", "compile_network",
           "graph_digest", "COMPILER_VERSION", "default_cache_dir"]

#: bump when the compiler's output for the same input changes (invalidates caches)
COMPILER_VERSION = 2
MAGIC = b"DNNFABCN"
IMAGE_ALIGN = 4096
BUF_ALIGN = 64


def default_cache_dir():
    """Where compiled networks are cached: ``~/.cache/dnnfab/compiled``."""
    return os.path.join(os.path.expanduser("~"), ".cache", "dnnfab", "compiled")


# ------------------------------------------------------------------ content hashing
def _feed(h, obj, depth=0):
    if depth > 12:
        raise DnnfabError("graph_digest: object nesting too deep")
    if isinstance(obj, np.ndarray):
        h.update(b"A" + str(obj.dtype).encode() + repr(obj.shape).encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, (np.generic,)):
        h.update(b"S" + str(obj.dtype).encode() + obj.tobytes())
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        h.update(b"P" + repr(obj).encode())
    elif isinstance(obj, (list, tuple)):
        h.update(b"L%d" % len(obj))
        for v in obj:
            _feed(h, v, depth + 1)
    elif isinstance(obj, dict):
        h.update(b"D%d" % len(obj))
        for k in sorted(obj, key=repr):
            _feed(h, k, depth + 1)
            _feed(h, obj[k], depth + 1)
    elif is_dataclass(obj):
        h.update(b"C" + type(obj).__name__.encode())
        for f in fields(obj):
            if f.name != "cache":
                _feed(h, f.name, depth + 1)
                _feed(h, getattr(obj, f.name), depth + 1)
    elif hasattr(obj, "__dict__"):
        h.update(b"O" + type(obj).__name__.encode())
        d = {k: v for k, v in vars(obj).items() if not k.startswith("_") and k != "cache"}
        _feed(h, d, depth + 1)
    else:
        h.update(b"R" + repr(obj).encode())


def graph_digest(qg) -> str:
    """SHA-256 of a quantized graph's integers, shapes and tensor quantization."""
    h = hashlib.sha256()
    _feed(h, [(t.name, tuple(t.shape)) for t in qg.inputs])
    _feed(h, [t.name for t in qg.outputs])
    _feed(h, {k: tuple(v) for k, v in qg.shapes.items()})
    _feed(h, {k: (float(v.scale), int(v.zero_point)) for k, v in qg.qtensors.items()})
    _feed(h, list(qg.layers))
    return h.hexdigest()


# ------------------------------------------------------------------ the compiled form
@dataclass
class TensorBuf:
    """A tensor in the activation arena, in the fabric layout.

    ``kind`` ``"conv"``: the reference's channel-last array [N, H, W, C] (or [N, W, C] of a
    1-D conv) stored as N x H x W pixels of ``cp`` channels; ``"gemm"``: the logical array
    [..., K] stored as ``rows`` x ``cp``."""
    name: str
    kind: str
    addr: int
    shape: list               # the host-side array shape (channel-last for "conv")
    channels: int
    cp: int
    live: list = field(default_factory=list)   # [first, last] layer position

    @property
    def pixels(self):
        return math.prod(int(v) for v in self.shape[:-1])

    @property
    def size(self):
        return self.pixels * self.cp

    def pack(self, arr) -> bytes:
        buf = np.empty(self.size, np.int8)
        self.pack_into(arr, buf)
        return buf.tobytes()

    def pack_into(self, arr, dst) -> None:
        """:meth:`pack` straight into ``dst`` (uint8 or int8, ``size`` bytes)."""
        d = np.asarray(dst).view(np.int8).reshape(self.pixels, self.cp)
        d[:, :self.channels] = np.asarray(arr, np.int8).reshape(self.pixels, self.channels)
        if self.cp != self.channels:
            d[:, self.channels:] = 0

    def unpack(self, raw) -> np.ndarray:
        return self.unpack_view(np.frombuffer(raw, np.int8, count=self.size))

    def unpack_view(self, buf) -> np.ndarray:
        """:meth:`unpack` of an array of ``size`` bytes (a copy: ``buf`` may be reused)."""
        a = np.asarray(buf).view(np.int8).reshape(self.pixels, self.cp)
        return np.array(a[:, :self.channels], order="C").reshape(self.shape)   # always a copy


@dataclass
class LayerInfo:
    """Per-layer record of the compiled network."""
    name: str
    op: str
    target: str                   # "fabric" | "cpu"
    reason: str = ""              # why not on the fabric
    macs: int = 0                 # the layer's MACs (whole batch)
    hw_macs: int = 0              # MACs the array performs (padding, zero weights)
    cycles: int = 0               # modelled cycles attributed to the layer in its run
    dram_rd_bytes: int = 0
    dram_wr_bytes: int = 0
    occupancy: dict = field(default_factory=dict)   # scratchpad -> fraction in use
    run: int = -1
    first_insn: int = 0
    end_insn: int = 0


@dataclass
class FabricRun:
    """One program launch: consecutive fabric layers."""
    index: int
    layers: list                  # layer names, in order
    prog_addr: int
    n_insns: int
    inputs: list                  # buffer names the host writes before START
    outputs: list                 # buffer names the host reads after DONE
    out_window: list              # [lo, hi): the DMA may write only here
    cycles: int = 0
    macs: int = 0


@dataclass
class CompiledNetwork:
    """See the module docstring. ``steps``: [["cpu", layer name] | ["fabric", run index]]
    in execution order."""
    key: str
    model_digest: str
    cfg: dict
    steps: list
    runs: list
    layers: dict                  # name -> LayerInfo
    tensors: dict                 # buffer name -> TensorBuf
    consumes: dict                # fabric layer name -> buffer name of its input
    produces: dict                # fabric layer name -> buffer name of its output
    image: bytes = b""            # programs, weights, aux, loaded at device address origin
    arena: list = field(default_factory=lambda: [0, 0])
    chain: bool = True
    origin: int = 0               # the device address the image is compiled for

    @property
    def config(self) -> AcceleratorConfig:
        return AcceleratorConfig.from_dict(self.cfg)

    @property
    def dram_bytes(self):
        """Peak DRAM the plan needs: the image plus the activation arena."""
        return self.arena[1] - self.origin

    @property
    def arena_bytes(self):
        return self.arena[1] - self.arena[0]

    @property
    def fabric_layers(self):
        return [L for L in self.layers.values() if L.target == "fabric"]

    def efficiency(self):
        """Sum of fabric MACs / (sum of run cycles x R x C)."""
        c = self.config
        cyc = sum(r.cycles for r in self.runs)
        macs = sum(L.macs for L in self.fabric_layers)
        return macs / (cyc * c.rows * c.cols) if cyc else 0.0

    # -- serialization -------------------------------------------------------------
    def _meta(self):
        return {"key": self.key, "model_digest": self.model_digest, "cfg": self.cfg,
                "steps": self.steps, "runs": [asdict(r) for r in self.runs],
                "layers": [asdict(v) for v in self.layers.values()],
                "tensors": [asdict(v) for v in self.tensors.values()],
                "consumes": self.consumes, "produces": self.produces,
                "arena": self.arena, "chain": self.chain, "origin": self.origin,
                "version": COMPILER_VERSION}

    def to_bytes(self) -> bytes:
        meta = json.dumps(self._meta(), sort_keys=True, separators=(",", ":")).encode()
        return MAGIC + struct.pack("<IQ", COMPILER_VERSION, len(meta)) + meta + self.image

    @classmethod
    def from_bytes(cls, raw: bytes) -> "CompiledNetwork":
        if raw[:8] != MAGIC:
            raise DnnfabError("not a compiled dnnfab network (bad magic); recompile the model")
        ver, n = struct.unpack_from("<IQ", raw, 8)
        if ver != COMPILER_VERSION:
            raise DnnfabError(f"compiled network of compiler version {ver}, this is "
                              f"{COMPILER_VERSION}; recompile the model")
        off = 8 + struct.calcsize("<IQ")
        meta = json.loads(raw[off:off + n])
        return cls(key=meta["key"], model_digest=meta["model_digest"], cfg=meta["cfg"],
                   steps=meta["steps"], runs=[FabricRun(**r) for r in meta["runs"]],
                   layers={d["name"]: LayerInfo(**d) for d in meta["layers"]},
                   tensors={d["name"]: TensorBuf(**d) for d in meta["tensors"]},
                   consumes=meta["consumes"], produces=meta["produces"],
                   image=bytes(raw[off + n:]), arena=meta["arena"], chain=meta["chain"],
                   origin=int(meta.get("origin", 0)))

    def save(self, path):
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(self.to_bytes())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path) -> "CompiledNetwork":
        with open(path, "rb") as f:
            return cls.from_bytes(f.read())


# ------------------------------------------------------------------ compiling
def network_key(digest, cfg: AcceleratorConfig, chain=True, cpu_layers=(), origin=0):
    d = {"model": digest, "cfg": cfg.to_dict(), "chain": bool(chain), "version": COMPILER_VERSION}
    if cpu_layers:
        d["cpu_layers"] = sorted(cpu_layers)
    if origin:
        d["origin"] = int(origin)
    blob = json.dumps(d, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def compile_network(qg, cfg: AcceleratorConfig = None, chain=True, cache_dir=None,
                    use_cache=True, digest=None, cpu_layers=(), origin=0) -> CompiledNetwork:
    """Compile ``qg`` for ``cfg``; cached on disk under :func:`network_key` (``cache_dir``,
    default :func:`default_cache_dir`; ``use_cache=False`` neither reads nor writes).

    ``cpu_layers``: names of layers to run on the CPU even where the fabric could (a
    scheduler's plan); the CPU halves of :func:`~dnnfab.sw.compiler.split.apply_splits`
    always stay on the CPU. ``origin``: the device address the image will be loaded at
    (every address in the programs, runs and tensors is absolute; 64-byte aligned)."""
    cfg = cfg or AcceleratorConfig()
    origin = int(origin)
    if origin < 0 or origin % IMAGE_ALIGN:
        raise DnnfabError(f"image origin {origin:#x} is not a multiple of {IMAGE_ALIGN}; "
                          "allocate the network's buffer aligned")
    digest = digest or graph_digest(qg)
    names = {L.name for L in qg.layers}
    cpu_layers = {n for n in cpu_layers if n in names} | \
        {n for n in names if split_target(n) == "cpu"}
    key = network_key(digest, cfg, chain, cpu_layers, origin)
    path = None
    if use_cache:
        cache_dir = cache_dir or default_cache_dir()
        path = os.path.join(cache_dir, f"{key}.dnnc")
        if os.path.exists(path):
            try:
                net = CompiledNetwork.load(path)
                if net.key == key:
                    return net
            except (DnnfabError, ValueError, KeyError, TypeError, struct.error):
                pass                      # a stale or damaged entry: compile again
    net = _compile(qg, cfg, chain, digest, key, cpu_layers, origin)
    if path is not None:
        os.makedirs(cache_dir, exist_ok=True)
        net.save(path)
    return net


class _Prog:
    def __init__(self, cfg, insns):
        self.cfg, self.insns = cfg, insns


def _occupancy(plan, cfg):
    """Fraction of each scratchpad the layer's tiling uses."""
    L = plan.layer
    _, ow = L.out_hw
    act = max((plan.in_rows(oh0, rows)[1] - plan.in_rows(oh0, rows)[0]) * L.in_hw[1] * plan.in_cp
              for oh0, rows in plan.bands)
    outb = max(rows for _, rows in plan.bands) * ow * plan.out_cp
    nblk = sum(len(c) for c in plan.chunks) * len(plan.bands)
    return {"act": round(min(plan.n_act, len(plan.bands)) * act / (cfg.act_kib * 1024), 4),
            "wgt": round(min(plan.n_wslots, nblk) * plan.slot_w / (cfg.wgt_kib * 1024), 4),
            "out": round(min(plan.n_out, len(plan.bands)) * outb / (cfg.out_kib * 1024), 4),
            "acc": round(max(rows for _, rows in plan.bands) * ow / cfg.sp_depth("acc_kib"), 4),
            "aux": round(min(plan.n_auxslots, nblk) * plan.slot_aux / (cfg.aux_kib * 1024), 4)}


def _compile(qg, cfg, chain, digest, key, cpu_layers=frozenset(), origin=0) -> CompiledNetwork:
    cp = channel_pad(cfg)
    consumers = {}
    for i, L in enumerate(qg.layers):
        for t in L.inputs:
            consumers.setdefault(t, []).append(i)
    graph_out = {t.name for t in qg.outputs}
    layers, steps = {}, []
    place = {}
    for i, L in enumerate(qg.layers):
        in_shape = tuple(qg.shape(L.inputs[0])) if L.inputs else ()
        p = place_layer(L, in_shape, cfg)
        if L.name in cpu_layers and p.where == "fabric":
            p = Placement("cpu", "placed on the CPU by the plan", p.conv)
        info = LayerInfo(name=L.name, op=op_label(L), target=p.where, reason=p.reason)
        if p.conv is not None:
            batch = int(in_shape[0]) if L.op == "conv" else 1
            info.macs = p.conv.macs * batch
        layers[L.name] = info
        place[L.name] = (p, in_shape)

    # ---- buffers and runs
    kind_of = lambda L: "conv" if L.op == "conv" else "gemm"
    tensors = {}
    consumes, produces = {}, {}

    def buf_for(tname, kind):
        bname = tname if kind != "gemm" else f"{tname}@gemm"
        if bname not in tensors:
            shp = tuple(int(v) for v in qg.shape(tname))
            if kind == "conv":
                host = (shp[0],) + shp[2:] + (shp[1],)        # channel-last
            else:
                host = shp
            ch = host[-1]
            tensors[bname] = TensorBuf(name=bname, kind=kind, addr=0, shape=list(host),
                                       channels=ch, cp=_ru(ch, cp))
        return bname

    runs_layers = []              # [[layer index, ...]]
    cur, produced_in_run = [], set()
    for i, L in enumerate(qg.layers):
        p, _ = place[L.name]
        if p.where != "fabric":
            if cur:
                runs_layers.append(cur)
                cur, produced_in_run = [], set()
            steps.append(["cpu", L.name])
            continue
        bin_ = buf_for(L.inputs[0], kind_of(L))
        bout = buf_for(L.output, kind_of(L))
        # the input was produced in this run in another layout: the host converts it
        if cur and bin_ not in produced_in_run and L.inputs[0] in {qg.layers[j].output for j in cur}:
            runs_layers.append(cur)
            cur, produced_in_run = [], set()
        if not chain and cur:
            runs_layers.append(cur)
            cur, produced_in_run = [], set()
        if not cur:
            steps.append(["fabric", len(runs_layers)])
        cur.append(i)
        consumes[L.name], produces[L.name] = bin_, bout
        produced_in_run.add(bout)
    if cur:
        runs_layers.append(cur)

    # ---- liveness (layer positions) and which buffers cross to the host
    producer_of = {produces[qg.layers[j].name]: j for r in runs_layers for j in r}
    run_of = {j: r for r, idx in enumerate(runs_layers) for j in idx}
    run_inputs = [[] for _ in runs_layers]
    run_outputs = [[] for _ in runs_layers]
    host_written = set()
    for r, idx in enumerate(runs_layers):
        for j in idx:
            b = consumes[qg.layers[j].name]
            # not made by a fabric layer in this layout: the host writes it before the
            # first run that reads it; it stays in place for later runs
            if b not in producer_of and b not in host_written:
                host_written.add(b)
                run_inputs[r].append(b)
    for b, pj in producer_of.items():
        tname = qg.layers[pj].output
        need_host = tname in graph_out
        for c in consumers.get(tname, []):
            Lc = qg.layers[c]
            if layers[Lc.name].target != "fabric" or consumes[Lc.name] != b:
                need_host = True
        if need_host:
            run_outputs[run_of[pj]].append(b)
    for b, t in tensors.items():
        pos = []
        pj = producer_of.get(b)
        if pj is not None:
            pos.append(pj)
        for r, ins in enumerate(run_inputs):
            if b in ins:
                pos.append(runs_layers[r][0])
        for r, idx in enumerate(runs_layers):
            for j in idx:
                if consumes[qg.layers[j].name] == b:
                    pos.append(j)
        if pj is not None and b in run_outputs[run_of[pj]]:
            pos.append(runs_layers[run_of[pj]][-1])
        t.live = [min(pos), max(pos)]

    # ---- the image: weights and aux blocks (programs go in front, sized after emission)
    wpos, apos = {}, {}
    blob = bytearray()
    for idx in runs_layers:
        for j in idx:
            plan = place[qg.layers[j].name][0].plan
            off = _ru(len(blob), 64)
            blob += bytes(off - len(blob)) + plan.wimg
            wpos[qg.layers[j].name] = off
            off = _ru(len(blob), 64)
            blob += bytes(off - len(blob)) + plan.aimg
            apos[qg.layers[j].name] = off
    data_size = _ru(len(blob), IMAGE_ALIGN)

    # ---- the arena: first fit, largest first
    placed = []
    for t in sorted(tensors.values(), key=lambda t: (-t.size, t.live[0], t.name)):
        addr = 0
        clash = sorted((a, a + s) for a, s, lo, hi in placed if lo <= t.live[1] and t.live[0] <= hi)
        for a, b in clash:
            if addr + t.size <= a:
                break
            addr = max(addr, _ru(b, BUF_ALIGN))
        t.addr = addr
        placed.append((addr, t.size, t.live[0], t.live[1]))
    arena_size = _ru(max((a + s for a, s, _, _ in placed), default=0), IMAGE_ALIGN)

    # ---- emit every run (data at provisional base 0: weights/aux, then the arena)
    builders = []
    for r, idx in enumerate(runs_layers):
        b = ProgramBuilder(cfg)
        stored = set()
        for j in idx:
            L = qg.layers[j]
            p, in_shape = place[L.name]
            plan = p.plan
            tin, tout = tensors[consumes[L.name]], tensors[produces[L.name]]
            batch = int(in_shape[0]) if L.op == "conv" else 1
            first = len(b.ops)
            for e in range(batch):
                b.add(plan, data_size + tin.addr + e * plan.in_bytes,
                      data_size + tout.addr + e * plan.out_bytes, wpos[L.name], apos[L.name],
                      after_stores=(e == 0 and tin.name in stored), name=L.name)
            stored.add(tout.name)
            info = layers[L.name]
            info.run, info.first_insn, info.end_insn = r, first, len(b.ops)
            info.hw_macs = plan.hw_macs * batch
            info.occupancy = _occupancy(plan, cfg)
        builders.append(b)
    prog_sizes = [len(b.ops) * INSN_BYTES for b in builders]
    prog_addr, cursor = [], 0
    for s in prog_sizes:
        prog_addr.append(cursor)
        cursor = _ru(cursor + s, IMAGE_ALIGN)
    base = _ru(cursor, IMAGE_ALIGN)
    image = bytearray(base)
    for b, a in zip(builders, prog_addr):
        b.relocate(base + origin)
    runs = []
    arena_lo = base + data_size
    for r, (b, a) in enumerate(zip(builders, prog_addr)):
        insns = b.finish()
        raw = b"".join(i.to_bytes() for i in insns)
        image[a:a + len(raw)] = raw
        rep = estimate_cycles(_Prog(cfg, insns))
        prev = 0
        for j in runs_layers[r]:
            info = layers[qg.layers[j].name]
            end = max(rep.insn_end[info.first_insn:info.end_insn])
            info.cycles = max(0, end - prev)
            prev = max(prev, end)
            rd = wr = 0
            for ins in insns[info.first_insn:info.end_insn]:
                if isinstance(ins, Load):
                    rd += ins.beats * cfg.bus_bytes
                elif isinstance(ins, Store):
                    wr += ins.beats * cfg.bus_bytes
            info.dram_rd_bytes, info.dram_wr_bytes = rd, wr
        if runs_layers[r]:
            layers[qg.layers[runs_layers[r][-1]].name].cycles += rep.cycles - prev
        names = [qg.layers[j].name for j in runs_layers[r]]
        runs.append(FabricRun(index=r, layers=names, prog_addr=origin + a, n_insns=len(insns),
                              inputs=run_inputs[r], outputs=run_outputs[r],
                              out_window=[origin + arena_lo, origin + arena_lo + arena_size],
                              cycles=rep.cycles,
                              macs=sum(layers[n].macs for n in names)))
    image += blob
    image += bytes(base + data_size - len(image))
    for t in tensors.values():
        t.addr += origin + arena_lo
    if origin + arena_lo + arena_size > 1 << 32:
        raise DnnfabError(f"the network needs DRAM up to {origin + arena_lo + arena_size:#x}, "
                          "beyond the accelerator's 32-bit addresses; allocate it lower")
    return CompiledNetwork(key=key, model_digest=digest, cfg=cfg.to_dict(), steps=steps,
                           runs=runs, layers=layers, tensors=tensors, consumes=consumes,
                           produces=produces, image=bytes(image),
                           arena=[origin + arena_lo, origin + arena_lo + arena_size], chain=chain,
                           origin=origin)
