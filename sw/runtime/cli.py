"""``dnnfab inspect`` (layer table of a model) and ``dnnfab models`` (the bundled zoo).

``dnnfab inspect MODEL.onnx|zoo-name [--batch N] [--input-shape NAME=D0,D1,..] [--rows R
--cols C ...] [--json]`` prints one row per IR layer: name, op, input and output shapes,
MACs, parameter count, where ``dnnfab run`` runs it on that accelerator configuration
(``fabric`` or ``cpu``) and, for every CPU layer, why not on the fabric. The decision is
the runtime's own (:func:`dnnfab.sw.runtime.place_layer`). ``--json`` prints the same
rows plus totals as a JSON document.

``dnnfab models [--json]`` lists the zoo: name, source, input, input shape, outputs and
accuracy (``--json`` prints every field of ``dnnfab.models.list_models()``).
"""

from __future__ import annotations

import json
import sys

from ...errors import DnnfabError


def register(subparsers):
    p = subparsers.add_parser("inspect", help="show the layers of an ONNX model",
                              description=__doc__.split("\n\n")[1])
    p.add_argument("model", help="path to an .onnx file or a zoo model name")
    p.add_argument("--batch", type=int, default=1, help="batch size for a dynamic batch dim")
    add_input_shape_arg(p)
    from ...gencli import add_config_args
    add_config_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_inspect)

    p = subparsers.add_parser("models", help="list the bundled models")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_models)


def add_input_shape_arg(p):
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,..",
                   help="static shape of an input with dynamic dimensions (repeatable; "
                        "NAME= may be left out for a one-input model)")


def parse_input_shapes(specs):
    """``["x=1,3,224,224", ...]`` -> ``{"x": (1, 3, 224, 224)}`` (``None`` key: no name)."""
    out = {}
    for spec in specs or ():
        name, sep, dims = spec.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.split(","))
        except ValueError:
            shape = ()
        if not shape or any(d < 1 for d in shape):
            raise DnnfabError(f"--input-shape {spec!r}: expected NAME=D0,D1,... with positive "
                              "integers, e.g. --input-shape input=1,3,224,224")
        key = name if sep else None
        if key in out:
            raise DnnfabError(f"--input-shape given twice for {key or 'the input'}; give each "
                              "input once")
        out[key] = shape
    return out


def load_for_cli(model, batch=1, input_shape_specs=()):
    """``dnnfab.load`` for the CLI: a missing file is "file not found", and a dynamic
    dimension asks for ``--input-shape`` (the CLI's way to give ``input_shapes``)."""
    import os
    from .api import load, check_model_path
    from ..frontend.onnx_import import read_model
    from ...errors import ModelError
    check_model_path(model)
    shapes = parse_input_shapes(input_shape_specs)
    proto = read_model(model)
    inits = {t.name for t in proto.graph.initializer}
    data_inputs = [i for i in proto.graph.input if i.name not in inits]
    names = [i.name for i in data_inputs]
    if None in shapes:
        if len(names) != 1:
            raise DnnfabError(f"the model has inputs {names}; name the input: "
                              f"--input-shape {names[0]}=D0,D1,...")
        shapes[names[0]] = shapes.pop(None)
    for k in shapes:
        if k not in names:
            raise DnnfabError(f"--input-shape {k}=...: the model has no input {k!r}; its inputs "
                              f"are {', '.join(names)}")
    for vi in data_inputs:
        if vi.name in shapes:
            continue
        for ax, d in enumerate(vi.type.tensor_type.shape.dim):
            if ax > 0 and not (d.HasField("dim_value") and d.dim_value > 0):
                raise ModelError(f"input {vi.name!r} has dynamic dimension {ax} "
                                 f"({d.dim_param or '?'}); give its shape with --input-shape "
                                 f"{vi.name}=D0,D1,...")
    name = None
    if isinstance(model, str):
        name = os.path.splitext(os.path.basename(model))[0]
    return load(proto, batch=batch, input_shapes=shapes or None, name=name)


def inspect_rows(model, batch=1, cfg=None, input_shapes=()):
    """(graph, rows, totals) for ``dnnfab inspect``: the graph's layer summary with
    ``target`` and ``reason`` from the runtime's placement on ``cfg``."""
    from ...hw.config import AcceleratorConfig
    from .network import plan_network, check_run_config
    cfg = cfg or AcceleratorConfig()
    check_run_config(cfg)
    g = load_for_cli(model, batch=batch, input_shape_specs=input_shapes)
    plan = plan_network(g, cfg)
    rows = g.summary()
    for r in rows:
        r["target"] = plan[r["name"]].where
        r["reason"] = plan[r["name"]].reason
    totals = dict(layers=len(rows), macs=sum(r["macs"] for r in rows),
                  params=sum(r["params"] for r in rows),
                  fabric_macs=sum(r["macs"] for r in rows if r["target"] == "fabric"),
                  cpu_layers=sum(1 for r in rows if r["target"] == "cpu"))
    return g, rows, totals


def _print_table(t):
    from ...console import print_table
    print_table(t)


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
    from ...gencli import config_from_args
    from .network import check_run_config
    cfg = config_from_args(args)
    check_run_config(cfg, cli=True)
    g, rows, totals = inspect_rows(args.model, args.batch, cfg, args.input_shape)
    if args.json:
        doc = dict(model=g.name, config=cfg.to_dict(),
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
                                                     for i in g.inputs)
                    + f"; targets for a {cfg.rows}x{cfg.cols} accelerator")
    for col, just in (("layer", "left"), ("op", "left"), ("input", "right"),
                      ("output", "right"), ("MACs", "right"), ("params", "right"),
                      ("target", "left"), ("why not fabric", "left")):
        t.add_column(col, justify=just)
    for r in rows:
        t.add_row(r["name"], r["op"], ", ".join(_fmt_shape(s) for s in r["inputs"]),
                  _fmt_shape(r["output"]), _si(r["macs"]), _si(r["params"]), r["target"],
                  r["reason"])
    t.add_section()
    t.add_row("total", f"{totals['layers']} layers", "", "", _si(totals["macs"]),
              _si(totals["params"]), f"{totals['cpu_layers']} on cpu", "")
    _print_table(t)
    return 0


def cmd_models(args):
    try:
        from ... import models
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
    _print_table(t)
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
