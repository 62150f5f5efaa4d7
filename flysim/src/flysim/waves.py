"""Workgroup barriers as CDNA has them, and the per-wave scheduler they need.

On CDNA an ``s_barrier`` completes when every wave of the workgroup that has
not ended has arrived at *an* ``s_barrier``, whichever one: the hardware
counts arrivals, it does not compare program points. Wave-specialized
kernels use this: one wave group executes an extra barrier so that its
phase is shifted against the other group's (FlyDSL's 8-wave gfx950 GEMM,
the dual-wave flash attention). All lanes of one wave share one program
counter, so a barrier that only some lanes of a wave reach cannot be
expressed on the hardware and stays an error.

flysim runs a launch in lockstep (every lane of every workgroup as one row
of the same tensors) as long as each barrier is reached by all the waves of
a workgroup or by none of them. A barrier that some waves of a workgroup
reach and others do not raises ``PhaseSplit``; the launch then restores
global memory from the copy taken before it started and runs again split:
one cooperative thread per wave slot (wave ``j`` of every workgroup, lanes
still vectorized over workgroups). A thread runs until its waves arrive at a
barrier, then hands over to the next runnable thread. A workgroup's barrier
completes when each of its waves has arrived or ended; only then do the
arrived waves run on. Exactly one thread runs at a time, in a fixed order,
so a run is deterministic and the interleaving is one the hardware allows:
the waves of a workgroup are always in the same barrier epoch.

LDS race detection (memory.LDS) tracks, per byte, the wave that wrote and
the waves that read it in the workgroup's current epoch; a completed barrier
opens the next epoch of that workgroup. Because the scheduler keeps every
wave of a workgroup in one epoch, a phase-shifted pair of wave groups is
judged by what the hardware orders, not by program points.

Deadlock: a wave slot waits on every workgroup whose wave it parked at a
barrier. If no thread can run and some have not ended, the waves of some
workgroup are waiting on a barrier that the others never reach (on the
hardware: a hang); that is reported as a SimulationError.
"""

from __future__ import annotations

import threading

import torch

from .errors import LDSRaceError, SimulationError

WAVE = 64


class PhaseSplit(BaseException):
    """Internal: some waves of a workgroup reached a barrier that others did not.

    A BaseException so that Exec.run passes it through instead of naming it an op failure."""


def arrive(ex, what="barrier"):
    """Barrier for the active lanes of ``ex``: check per-wave uniformity, then synchronize."""
    m = ex.mask
    if m is not None and ex.base_mask is not None:
        m = m | ~ex.base_mask
    if m is None:
        if ex.sched is None:
            ex.lds.barrier()
        else:
            ex.sched.wait(ex, torch.ones(ex.nwg, dtype=torch.bool, device=ex.device))
        return
    per_wave = m.reshape(-1, WAVE)
    partial = per_wave.any(1) & ~per_wave.all(1)
    if bool(partial.any()):
        w = int(partial.nonzero()[0])
        wg = int(ex.wg[w * WAVE])
        wave_in_wg = int(ex.t[w * WAVE]) // WAVE
        raise LDSRaceError(
            f"{what} reached under divergent control flow within a wave: only {int(per_wave[w].sum())} of the 64 "
            f"lanes of wave {wave_in_wg} of workgroup {wg} arrive (the lanes of one wave share one program counter; "
            f"make the branch around the barrier uniform per wave)")
    arrived = per_wave.any(1)  # [waves of this exec]
    if ex.sched is not None:  # split run: one wave per workgroup here
        ex.sched.wait(ex, arrived)
        return
    per_wg = arrived.reshape(ex.nwg, ex.bp // WAVE)
    if bool((per_wg.any(1) & ~per_wg.all(1)).any()):
        raise PhaseSplit()
    ex.lds.barrier(per_wg.all(1))


class WaveScheduler:
    """Cooperative threads, one per wave slot; see the module docstring."""

    def __init__(self, nslots, nwg, lds, device):
        self.n = nslots
        self.lds = lds
        self.cv = threading.Condition()
        self.turn = 0
        self.arrived = torch.zeros(nwg, nslots, dtype=torch.bool, device=device)
        self.done = [False] * nslots
        self.waiting = [None] * nslots  # slot -> bool [nwg] of the workgroups it waits on
        self.error = None
        self.barriers = 0  # completed workgroup barriers

    # called by the thread that holds the turn
    def wait(self, ex, arrived_wg):
        j = ex.slot
        if not bool(arrived_wg.any()):
            return
        self.arrived[:, j] |= arrived_wg
        self.waiting[j] = arrived_wg.clone()
        self._complete()
        self._hand_over(j)

    def _complete(self):
        done = torch.tensor(self.done, dtype=torch.bool, device=self.arrived.device)
        ready = (self.arrived | done).all(1) & self.arrived.any(1)
        if bool(ready.any()):
            self.barriers += int(ready.sum())
            self.arrived[ready] = False
            self.lds.barrier(ready)
            for k, w in enumerate(self.waiting):
                if w is not None:
                    w &= ~ready
                    if not bool(w.any()):
                        self.waiting[k] = None

    def _next(self, j):
        for k in list(range(j + 1, self.n)) + list(range(0, j + 1)):
            if not self.done[k] and self.waiting[k] is None:
                return k
        if not all(self.done):
            stuck = [k for k in range(self.n) if not self.done[k]]
            raise SimulationError(
                f"barrier deadlock: wave slots {stuck} wait at barriers that the other waves of their workgroups "
                f"never reach (the hardware would hang)")
        return None

    def _hand_over(self, j):
        with self.cv:
            try:
                nxt = self._next(j)
            except SimulationError as e:
                self.error = self.error or e
                nxt = None
            self.turn = nxt
            self.cv.notify_all()
            while self.turn != j:
                if self.error is not None:
                    raise _Abort()
                self.cv.wait()
            if self.error is not None:
                raise _Abort()

    def finish(self, j):
        with self.cv:
            self.done[j] = True
            self._complete()
            try:
                self.turn = self._next(j)
            except SimulationError as e:
                self.error = self.error or e
                self.turn = None
            self.cv.notify_all()

    def fail(self, e):
        with self.cv:
            self.error = self.error or e
            self.turn = None
            self.cv.notify_all()

    def run(self, bodies):
        """Run body(j) for every slot j in its own thread; re-raise the first error."""

        def main(j):
            try:
                with self.cv:
                    while self.turn != j and self.error is None:
                        self.cv.wait()
                    if self.error is not None:
                        return
                bodies[j]()
                self.finish(j)
            except _Abort:
                pass
            except BaseException as e:  # noqa: BLE001 - handed to the launching thread
                self.fail(e)

        threads = [threading.Thread(target=main, args=(j,), name=f"flysim-wave{j}", daemon=True) for j in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.error is not None:
            raise self.error


class _Abort(BaseException):
    """Unwinds a parked wave thread after another thread failed."""
