"""The ``dnnfab`` command line.

Sub-commands live next to the code they drive; each of these modules exposes
``register(subparsers)`` which adds its commands with ``set_defaults(func=...)``:

* :mod:`dnnfab.gencli`             -- ``generate``
* :mod:`dnnfab.cosim.cli`          -- ``cosim``
* :mod:`dnnfab.boards.cli`         -- ``boards``, ``synth``
* :mod:`dnnfab.sw.runtime.cli`     -- ``models``, ``inspect``
* :mod:`dnnfab.sw.runtime.runcli`  -- ``run`` (the main job)
* :mod:`dnnfab.sw.runtime.schedcli` -- ``schedule``

Any :class:`~dnnfab.errors.DnnfabError` becomes one line on stderr and exit code 2.
"""

import argparse
import importlib
import sys

from .errors import DnnfabError

COMMAND_MODULES = (
    "dnnfab.gencli",
    "dnnfab.cosim.cli",
    "dnnfab.boards.cli",
    "dnnfab.sw.runtime.cli",
    "dnnfab.sw.runtime.runcli",
    "dnnfab.sw.runtime.schedcli",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse already exits 2; keep its one-line style
        self.print_usage(sys.stderr)
        self.exit(2, f"dnnfab: error: {message}\n")


def build_parser():
    parser = _Parser(prog="dnnfab", description="Neural network to FPGA accelerator toolkit.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"dnnfab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that command group is not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except DnnfabError as exc:
        print(f"dnnfab: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("dnnfab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
