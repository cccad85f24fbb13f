"""``dnnfab inspect`` (layer table of a model) and ``dnnfab models`` (the bundled zoo).

``dnnfab inspect MODEL.onnx|zoo-name [--batch N] [--json]`` prints one row per IR layer:
name, op, input and output shapes, MACs, parameter count and where the integer network
runs it (``fabric`` for the ops of the integer contract, ``cpu`` for the float fallback).
``--json`` prints the same rows plus totals as a JSON document.

``dnnfab models [--json]`` lists the zoo: name, source, input, input shape, outputs and
accuracy (``--json`` prints every field of ``dnnfab.models.list_models()``).
"""

from __future__ import annotations

import json
import sys

from ..errors import DnnfabError


def register(subparsers):
    p = subparsers.add_parser("inspect", help="show the layers of an ONNX model",
                              description=__doc__.split("\n\n")[1])
    p.add_argument("model", help="path to an .onnx file or a zoo model name")
    p.add_argument("--batch", type=int, default=1, help="batch size for a dynamic batch dim")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_inspect)

    p = subparsers.add_parser("models", help="list the bundled models")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_models)


def inspect_rows(model, batch=1):
    """(graph, rows, totals) for ``dnnfab inspect``."""
    from .api import load
    g = load(model, batch=batch)
    rows = g.summary()
    totals = dict(layers=len(rows), macs=sum(r["macs"] for r in rows),
                  params=sum(r["params"] for r in rows),
                  fabric_macs=sum(r["macs"] for r in rows if r["target"] == "fabric"),
                  cpu_layers=sum(1 for r in rows if r["target"] == "cpu"))
    return g, rows, totals


def _console():
    from rich.console import Console
    return Console() if sys.stdout.isatty() else Console(width=200)


def _fmt_shape(s):
    return "x".join(str(d) for d in s)


def _si(v):
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= div:
            return f"{v / div:.2f}{unit}"
    return str(v)


def cmd_inspect(args):
    if args.batch < 1:
        raise DnnfabError(f"--batch must be >= 1, got {args.batch}")
    g, rows, totals = inspect_rows(args.model, args.batch)
    if args.json:
        doc = dict(model=g.name,
                   inputs=[dict(name=t.name, shape=list(t.shape)) for t in g.inputs],
                   outputs=[dict(name=t.name, shape=list(t.shape)) for t in g.outputs],
                   layers=[dict(r, inputs=[list(s) for s in r["inputs"]],
                                output=list(r["output"])) for r in rows],
                   totals=totals)
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    from rich.table import Table
    t = Table(title=f"{g.name}: inputs " + ", ".join(f"{i.name} {_fmt_shape(i.shape)}"
                                                     for i in g.inputs))
    for col, just in (("layer", "left"), ("op", "left"), ("input", "right"),
                      ("output", "right"), ("MACs", "right"), ("params", "right"),
                      ("target", "left")):
        t.add_column(col, justify=just)
    for r in rows:
        t.add_row(r["name"], r["op"], ", ".join(_fmt_shape(s) for s in r["inputs"]),
                  _fmt_shape(r["output"]), _si(r["macs"]), _si(r["params"]), r["target"])
    t.add_section()
    t.add_row("total", f"{totals['layers']} layers", "", "", _si(totals["macs"]),
              _si(totals["params"]), f"{totals['cpu_layers']} on cpu")
    _console().print(t)
    return 0


def cmd_models(args):
    try:
        from .. import models
    except ImportError:
        models = None
    lister = getattr(models, "list_models", None) if models else None
    if lister is None:
        raise DnnfabError("the model zoo (dnnfab.models.list_models) is not available in "
                          "this checkout; inspect an .onnx path instead")
    entries = list(lister())
    if args.json:
        json.dump(entries, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        return 0
    from rich.table import Table
    t = Table(title="dnnfab model zoo (--json for every field)")
    for k in MODEL_COLUMNS:
        t.add_column(k)
    for e in entries:
        t.add_row(*(_fmt_cell(k, e.get(k, "")) for k in MODEL_COLUMNS))
    _console().print(t)
    return 0


#: the columns of the ``dnnfab models`` table (``--json`` prints every key)
MODEL_COLUMNS = ("name", "source", "input", "input_shape", "outputs", "accuracy")


def _fmt_cell(key, v):
    if v is None:
        return ""
    if key == "input_shape" and isinstance(v, (list, tuple)):
        return _fmt_shape(v)
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v)
    return str(v)
