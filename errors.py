"""One exception family for every user-facing problem.

Each error carries a one-line message that names the problem *and* the fix. The CLI maps
any :class:`DnnfabError` to that line on stderr and exit code 2, never a traceback.
"""


class DnnfabError(Exception):
    """Base of all errors caused by the user's input or environment."""

    exit_code = 2


class ConfigError(DnnfabError, ValueError):
    """An accelerator/board configuration is invalid."""


class ModelError(DnnfabError, ValueError):
    """An ONNX model cannot be read, or contains something dnnfab does not support."""


class UnsupportedOpError(ModelError):
    """A node uses an operator that neither the fabric nor the CPU fallback implements."""


class InputError(DnnfabError, ValueError):
    """A tensor handed to ``run`` has the wrong name, shape or dtype."""


class ToolchainError(DnnfabError, RuntimeError):
    """A required external tool (simulator, yosys, nextpnr) is missing or failed."""


class FitError(DnnfabError, ValueError):
    """A design does not fit the chosen board."""


class FabricError(DnnfabError, RuntimeError):
    """The accelerator reported a fault (DMA error, illegal instruction, timeout)."""


class FabricDeadlock(FabricError):
    """A program's dependency tokens can never all be met: the accelerator would hang.

    ``blocked``: engine -> (instruction index, tokens it waits for); ``tokens``: the four
    counts; ``fills``: engine -> instructions queued (FIFO + head register); ``retired``:
    instructions that got their tokens before the hang.
    """

    def __init__(self, msg, blocked=None, tokens=None, fills=None, retired=0):
        super().__init__(msg)
        self.blocked = blocked or {}
        self.tokens = tokens or {}
        self.fills = fills or {}
        self.retired = retired
