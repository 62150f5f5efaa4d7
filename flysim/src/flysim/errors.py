"""flysim's exception hierarchy: every message names the kernel and the Python source line."""


class SimulationError(RuntimeError):
    """Base class: a kernel could not be simulated or misbehaved under simulation."""

    def __init__(self, message, *, kernel=None, loc=None, op=None):
        self.message, self.kernel, self.loc, self.op = message, kernel, loc, op
        super().__init__(self.render())

    def render(self):
        """The message: what happened, then (kernel, MLIR op, Python source line) where known."""
        where = [w for w in (self.kernel and f"kernel {self.kernel}", self.op and f"op {self.op}",
                             self.loc and f"at {self.loc}") if w]
        return f"{self.message}" + (f" ({', '.join(where)})" if where else "")

    def place(self, kernel, op, loc):
        """Name the op that raised (flysim.program does, once) and rebuild the message."""
        self.kernel, self.op, self.loc = self.kernel or kernel, op, loc
        self.args = (self.render(),)


class UnsupportedOpError(SimulationError):
    """The kernel uses an MLIR op flysim does not implement."""


class OutOfBoundsError(SimulationError):
    """A raw-pointer access fell outside every argument tensor (or outside LDS).

    A global access: the message names the access (kind, bytes, address, first bad lane), the
    argument tensor nearest to it and how many bytes past its end the access reaches, the buffer
    descriptor's num_records when the access went through one (flysim.program adds it, with the
    op), and only the count of live regions; ``regions`` holds them all as (lo, hi, label)."""

    def __init__(self, message, *, regions=(), nearest="", lanes=0, kernel=None, loc=None):
        self.regions, self.nearest, self.lanes, self.num_records = list(regions), nearest, lanes, None
        super().__init__(message, kernel=kernel, loc=loc)

    def render(self):
        if not self.regions:
            return super().render()
        base, msg = self.message, [self.message]
        if self.nearest:
            msg.append(self.nearest)
        if self.num_records is not None:
            nrec = int(self.num_records)
            msg.append(f"buffer descriptor num_records {nrec:#x}" + (" (unbounded)" if nrec == 0xFFFFFFFF else ""))
        msg.append(f"{self.lanes} lanes affected; {len(self.regions)} live tensor regions (OutOfBoundsError.regions)")
        self.message = "; ".join(msg)
        try:
            return super().render()
        finally:
            self.message = base


class LDSRaceError(SimulationError):
    """Two waves touched one LDS byte inside a barrier interval (or a barrier was divergent)."""
