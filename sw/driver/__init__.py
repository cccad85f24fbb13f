"""Layer 8: the host driver (:mod:`.device`: ``open``, ``Device``, ``DeviceBuffer``,
``Program``), written against the backend interface (:mod:`.backend`); the ``model``
backend (:mod:`.model`) is the fast model (:mod:`.fastmodel`) acting as the device; the
RTL and board backends come here (docs/architecture.md, docs/driver.md)."""

from .device import open, Device, DeviceBuffer, Program, BACKENDS  # noqa: F401,A004
from .backend import Backend  # noqa: F401
