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


class DmaError(FabricError):
    """The DMA reported an error: ``code`` (STATUS.ERROR_CODE: 1 AXI read, 2 AXI write,
    5 write outside the window, 6 instruction fetch) and the faulting byte ``address``
    (ERROR_INFO)."""

    def __init__(self, msg, code, address, status=0, counters=None):
        super().__init__(msg)
        self.code, self.address, self.status = code, address, status
        self.counters = counters or {}


class IllegalInstruction(FabricError):
    """The controller decoded an instruction it does not know (error 3): ``index`` in the
    program, ``address`` its byte address."""

    def __init__(self, msg, index, address, status=0, counters=None):
        super().__init__(msg)
        self.index, self.address, self.status = index, address, status
        self.counters = counters or {}


class ScratchpadError(FabricError):
    """An instruction addressed a scratchpad row out of range (error 4); ``address`` is
    ERROR_INFO (the instruction's byte address)."""

    def __init__(self, msg, address, status=0, counters=None):
        super().__init__(msg)
        self.code, self.address, self.status = 4, address, status
        self.counters = counters or {}


class FabricTimeout(FabricError):
    """No interrupt within the timeout: ``status`` (STATUS register) and ``counters`` (the
    performance counters) as read after the wait; ``diagnosis``: what the backend knows
    about why (the model backend: the token machine's deadlock report)."""

    def __init__(self, msg, status, counters, diagnosis=""):
        super().__init__(msg)
        self.status, self.counters, self.diagnosis = status, counters, diagnosis
