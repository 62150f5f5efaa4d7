"""flysim's exception hierarchy: every message names the kernel and the Python source line."""


class SimulationError(RuntimeError):
    """Base class: a kernel could not be simulated or misbehaved under simulation."""

    def __init__(self, message, *, kernel=None, loc=None):
        self.kernel = kernel
        self.loc = loc
        where = []
        if kernel:
            where.append(f"kernel {kernel}")
        if loc:
            where.append(f"at {loc}")
        super().__init__(f"{message}" + (f" ({', '.join(where)})" if where else ""))


class UnsupportedOpError(SimulationError):
    """The kernel uses an MLIR op flysim does not implement."""


class OutOfBoundsError(SimulationError):
    """A raw-pointer access fell outside every argument tensor (or outside LDS)."""


class LDSRaceError(SimulationError):
    """Two waves touched one LDS byte inside a barrier interval (or a barrier was divergent)."""
