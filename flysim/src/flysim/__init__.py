"""flysim: run FlyDSL kernels without an AMD GPU.

``with flysim.simulate(arch="gfx942") as sim: launcher(a, b, c)`` (or ``flyc.compile(launcher, ...)``,
which returns a `SimulatedFunction` with FlyDSL's CompiledFunction calling convention) compiles the
launcher for the arch (pipeline cut after convert-fly-to-rocdl), interprets the
kernel's MLIR on the argument tensors (all lanes of all workgroups at once),
writes results into them and appends a LaunchRecord to ``sim.launches``.
The distribution's README.md (flysim/README.md in the repository): the execution model, what it detects, the counters, limits.
"""

from .errors import LDSRaceError, OutOfBoundsError, SimulationError, UnsupportedOpError
from .hook import SimulatedFunction, Simulation, last_launch, simulate
from .launch import LaunchRecord
from . import toolchain

__all__ = [
    "simulate", "last_launch", "Simulation", "SimulatedFunction", "LaunchRecord", "toolchain",
    "SimulationError", "OutOfBoundsError", "LDSRaceError", "UnsupportedOpError",
]
