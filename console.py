"""Tables on the terminal or in a pipe, never cut.

On a terminal rich fits a table to the window. Piped or redirected (``dnnfab run | tee
log``, a CI log), rich would assume 80 columns and squeeze or elide cells; here the
console is made exactly as wide as the table needs instead, so every column is printed in
full (and no colour codes are written).
"""

import sys

__all__ = ["print_table"]


def print_table(table, file=None):
    """Print a ``rich.table.Table`` on ``file`` (default stdout) without cutting columns."""
    from rich.console import Console
    file = file or sys.stdout
    if file.isatty():
        Console(file=file).print(table)
        return
    probe = Console(file=file, width=100_000, color_system=None)
    width = max(40, probe.measure(table).maximum)
    Console(file=file, width=width, color_system=None).print(table)
