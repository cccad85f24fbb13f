"""tests/hw is not a package (pytest's importlib mode): its shared helpers module
``retimed_lib`` is made importable by name here, before the test modules load."""

import pathlib
import sys

_here = str(pathlib.Path(__file__).parent)
if _here not in sys.path:
    sys.path.insert(0, _here)
