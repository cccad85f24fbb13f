"""Makes tests/presets.py (the shared accelerator configurations CFG_8, CFG_SMALL)
importable by name from every test module: pytest's importlib mode does not put tests/ on
sys.path. Loaded before any test module."""

import pathlib
import sys

_here = str(pathlib.Path(__file__).parent)
if _here not in sys.path:
    sys.path.insert(0, _here)
