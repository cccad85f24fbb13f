"""The import rules of docs/architecture.md, read from the source (ast), every import counted
-- also the ones inside functions, which hide a dependency but do not remove it:

* sw/ is layered: ir -> frontend -> quant -> ref -> cpu -> compiler -> metrics -> driver ->
  sched -> runtime; a module may import its own layer and the layers before it, never a
  later one, and every module of sw/ lives in one of these rooms;
* hw/ never imports sw/ (nor boards/, cosim/ or the command-line glue above it);
* sw/ imports from hw/ only the pure spec (hw/spec.py), the config (hw/config.py) and the
  register map (hw/regmap.py, built from hw/regdesc.py);
* those import no HDL (nothing outside the standard library, dnnfab.errors and each
  other);
* no import cycle anywhere in the package;
* sw/ imports no module by a computed name (``importlib.import_module``, ``__import__``)
  except the driver's backend plugins (``sw/driver/device.py: PLUGINS``), which name only
  backends above sw/ (cosim/) -- a plugin is found by name at ``driver.open``, not imported;
* and, run for real: the runtime, the compiler and the fast model import and work with
  ``amaranth`` blocked from import.
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import dnnfab

ROOT = Path(__file__).resolve().parent.parent
PKG = "dnnfab"
PACKAGES = ("hw", "sw", "boards", "cosim", "models")
SW_LAYERS = ("ir", "frontend", "quant", "ref", "cpu", "compiler", "metrics", "driver", "sched",
             "runtime")
SW_FROM_HW = ("dnnfab.hw.spec", "dnnfab.hw.config", "dnnfab.hw.regmap", "dnnfab.hw.regdesc")
PURE_HW = SW_FROM_HW


def _module_name(path, root):
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([PKG] + parts)


def package_files(root=ROOT):
    """{module name: path} of every module of the package (the repository root is the
    package; tests/, scripts/ and benchmarks/ are not part of it)."""
    files = sorted(root.glob("*.py"))
    for pkg in PACKAGES:
        files += sorted((root / pkg).rglob("*.py"))
    return {_module_name(p, root): p for p in files}


def imports_of(name, path, modules):
    """The package modules ``name`` (at ``path``) imports, as [(module, line)]: ``from X
    import y`` counts X.y when that is a module, else X."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == PKG or a.name.startswith(PKG + "."):
                    out.append((a.name, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not (target == PKG or target.startswith(PKG + ".")):
                continue
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
            if subs:
                out += [(s, node.lineno) for s in subs]
                if len(subs) < len(node.names):
                    out.append((target, node.lineno))
            else:
                out.append((target, node.lineno))
    return out


def import_graph(root=ROOT):
    modules = package_files(root)
    return {m: imports_of(m, p, modules) for m, p in modules.items()}, modules


def _sw_layer(mod):
    """Index of ``mod``'s room in SW_LAYERS (None: not in sw/ or sw/__init__ itself)."""
    parts = mod.split(".")
    if len(parts) < 3 or parts[1] != "sw":
        return None
    return SW_LAYERS.index(parts[2]) if parts[2] in SW_LAYERS else -1


def layer_violations(graph):
    """Every import that breaks a rule, as readable strings."""
    bad = []
    for mod, deps in graph.items():
        in_sw = mod.startswith("dnnfab.sw.")
        in_hw = mod == "dnnfab.hw" or mod.startswith("dnnfab.hw.")
        me = _sw_layer(mod)
        if me == -1:
            bad.append(f"{mod}: not in a room of sw/ ({', '.join(SW_LAYERS)})")
        for dep, line in deps:
            where = f"{mod} (line {line}) imports {dep}"
            if in_sw and me is not None and me >= 0:
                other = _sw_layer(dep)
                if other is not None and other > me:
                    bad.append(f"{where}: sw/{SW_LAYERS[me]} may not import the later layer "
                               f"sw/{SW_LAYERS[other]}")
                if dep.startswith("dnnfab.hw") and dep not in SW_FROM_HW:
                    bad.append(f"{where}: sw/ imports from hw/ only {', '.join(SW_FROM_HW)}")
            if in_hw:
                for up in ("dnnfab.sw", "dnnfab.boards", "dnnfab.cosim", "dnnfab.gencli",
                           "dnnfab.cli"):
                    if dep == up or dep.startswith(up + "."):
                        bad.append(f"{where}: hw/ never imports {up}")
    for mod in PURE_HW:
        for dep, line in graph[mod]:
            if dep != "dnnfab.errors" and dep not in PURE_HW:
                bad.append(f"{mod} (line {line}) imports {dep}: it must stay pure")
    return bad


def import_cycles(graph):
    """The strongly connected components (more than one module, or a self-import) of the
    module import graph (Tarjan)."""
    index, low, stack, on, sccs = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w, _ in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or any(d == v for d, _ in graph.get(v, ())):
                sccs.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sccs


def test_the_package_is_where_the_test_looks():
    """The analysed files are the imported package (not some other checkout)."""
    assert Path(dnnfab.__file__).resolve().parent == ROOT
    graph, modules = import_graph()
    assert "dnnfab.sw.compiler.program" in modules and "dnnfab.hw.spec" in modules
    # the analysis sees a lazy import inside a function body (QuantizedNetwork.run_int)
    assert "dnnfab.sw.cpu.reference" in [d for d, _ in graph["dnnfab.sw.runtime.api"]]


def test_every_package_is_installed():
    """pyproject.toml lists every package (setuptools installs only the listed ones)."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = set(text.split("packages = [", 1)[1].split("]", 1)[0].replace('"', "").replace(",", " ").split())
    _, modules = import_graph()
    pkgs = {m for m, p in modules.items() if p.name == "__init__.py"}
    assert pkgs == listed


def test_sw_layers_and_hw_boundaries():
    graph, _ = import_graph()
    assert layer_violations(graph) == []


def test_no_import_cycle():
    graph, _ = import_graph()
    assert import_cycles(graph) == []


def _dynamic_imports(path):
    """[(line, call)] of calls importing by a computed name in the file at ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("import_module", "__import__"):
                out.append((node.lineno, name))
    return out


def test_sw_imports_by_name_only_its_backend_plugins():
    """The one dynamic import of sw/ is the driver's plugin table; it names backends
    above sw/ that exist and are Backends (so ``driver.open("rtl")`` works without sw/
    importing cosim/, which imports the driver: no cycle, docs/architecture.md)."""
    import importlib
    from dnnfab.sw.driver import device
    from dnnfab.sw.driver.backend import Backend
    _, modules = import_graph()
    found = {m: _dynamic_imports(p) for m, p in modules.items() if m.startswith("dnnfab.sw.")}
    found = {m: v for m, v in found.items() if v}
    assert list(found) == ["dnnfab.sw.driver.device"], found
    assert len(found["dnnfab.sw.driver.device"]) == 1
    assert set(device.PLUGINS) <= set(device.BACKENDS)
    for name, target in device.PLUGINS.items():
        mod, _, attr = target.partition(":")
        assert mod in modules and not mod.startswith("dnnfab.sw.") and not mod.startswith("dnnfab.hw"), target
        assert mod.startswith("dnnfab.cosim."), target
        assert callable(getattr(importlib.import_module(mod), attr))
        backend_cls = [v for v in vars(importlib.import_module(mod)).values()
                       if isinstance(v, type) and issubclass(v, Backend) and v is not Backend]
        assert any(c.name == name for c in backend_cls), target


def test_rules_catch_a_violation(tmp_path):
    """The checks are not vacuous: a copy of the package with one upward import added to
    the compiler fails them."""
    import shutil
    copy = tmp_path / "pkg"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("tests", "scripts", "benchmarks",
                                                              "docs", "*.npz", "*.onnx", "*.v",
                                                              "__pycache__", ".git*"))
    prog = copy / "sw" / "compiler" / "program.py"
    prog.write_text(prog.read_text() + "\n\ndef _late():\n    from ..runtime import network\n")
    graph, _ = import_graph(copy)
    bad = layer_violations(graph)
    assert len(bad) == 1 and "sw/compiler may not import the later layer sw/runtime" in bad[0]
    assert any("dnnfab.sw.compiler.program" in c for c in import_cycles(graph))


_BLOCKED = r"""
import json, sys

class _NoAmaranth:
    def find_spec(self, name, path=None, target=None):
        if name == "amaranth" or name.startswith("amaranth.") or name.startswith("amaranth_"):
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, _NoAmaranth())

import numpy as np
import dnnfab
import dnnfab.sw.runtime
import dnnfab.sw.runtime.api
from dnnfab.hw.config import AcceleratorConfig
from dnnfab.hw.spec import Compute, decode
from dnnfab.sw.compiler.layer import random_layer
from dnnfab.sw.compiler.program import compile_layer
from dnnfab.sw.compiler.fastmodel import estimate_cycles
from dnnfab.sw.driver.fastmodel import FastModel

cfg = AcceleratorConfig.from_dict(json.loads(sys.argv[1]))
rng = np.random.default_rng(3)
layer = random_layer(rng, 5, 6, k=3, pad=1, in_hw=(6, 6))
prog = compile_layer(layer, cfg)
x = layer.random_input(rng)
y = FastModel(cfg).run_layer(prog, x)
insn = Compute(kh_n=3, kw_n=3, zx=-5)
print(json.dumps({
    "file": dnnfab.__file__,
    "amaranth": sorted(m for m in sys.modules if m.startswith("amaranth")),
    "bit_exact": bool(np.array_equal(y, layer.reference(x))),
    "cycles": estimate_cycles(prog).cycles,
    "roundtrip": decode(int.from_bytes(insn.to_bytes(), "little")) == insn,
}))
"""


def test_host_side_imports_and_runs_without_amaranth():
    """The same compile + fast-model run as a host program on a board's CPU would do: bit
    exact, and the same cycle count as with the HDL toolchain importable."""
    import numpy as np
    from presets import CFG_SMALL as cfg
    from dnnfab.sw.compiler.layer import random_layer
    from dnnfab.sw.compiler.program import compile_layer
    from dnnfab.sw.compiler.fastmodel import estimate_cycles
    want = estimate_cycles(compile_layer(random_layer(np.random.default_rng(3), 5, 6, k=3, pad=1,
                                                      in_hw=(6, 6)), cfg)).cycles
    res = subprocess.run([sys.executable, "-c", _BLOCKED, json.dumps(cfg.to_dict())],
                         capture_output=True, text=True,
                         env=dict(os.environ), timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert Path(out["file"]).resolve() == Path(dnnfab.__file__).resolve()
    assert out["amaranth"] == []
    assert out["bit_exact"] is True and out["roundtrip"] is True
    assert out["cycles"] == want
