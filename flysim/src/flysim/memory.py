"""Global memory (the argument tensors, by real address) and per-workgroup LDS.

Global: every argument tensor's storage is viewed as bytes; an access at
address ``a`` of ``n`` bytes must fall inside one argument tensor's extent,
else it is an OutOfBoundsError (``strict``) or a counted warning. Aligned
accesses gather whole elements from a same-width view of the storage.

LDS: one byte array of ``nwg * size``; lane address = ``wg * size + ptr``. A lane
whose access passes the end of the workgroup's LDS does nothing (loads read 0), as
the hardware does past a workgroup's allocation; counted (``oob_lds_accesses``).
Race detection keeps, per LDS byte, the wave that last wrote it and the wave
that last read it in the current barrier interval (-1 none, -2 several); a
barrier clears both (a workgroup's own bytes only, for a barrier that a
scalar branch lets only some workgroups reach). A race is an outcome that
depends on the order of the waves, so a store of the value a byte already
holds (no wave changed it in the interval) counts as a read of it, and one
instruction whose lanes in several waves store different values to one byte
is a race.

Bank conflicts. AMD's documentation (ROCm Composable Kernel, "Understanding
AMD GPU LDS and Bank Conflicts"; ROCm blog "Avoiding LDS Bank Conflicts on AMD
GPUs Using CK-Tile") states the rule for CDNA3: 32 banks of 4 bytes, bank =
(byte address / 4) mod 32; the hardware serves a wave's LDS instruction in
phases whose lanes depend on the access width (for ds_write_b128, eight phases
of 8 consecutive lanes: 0-7, 8-15, ...); lanes of one phase that hit different
dwords of one bank serialize, the same dword is broadcast. flysim counts, per
phase of ``128 / width`` consecutive lanes (32 lanes for <= 4-byte accesses,
16 for 8-byte, 8 for 12- and 16-byte; 12-byte is our assumption, the page does
not cover it), max over banks of the distinct dwords minus one. Not modelled:
the 64-bank LDS that the same page says some architectures have (gfx950 is
counted with 32), and any non-consecutive lane grouping the hardware may use
for reads (AMD's page documents the write grouping only).
"""

from __future__ import annotations

import torch

from .errors import LDSRaceError, OutOfBoundsError
from .types import INT_OF


def _bytes_view(storage, device):
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)


def _typed(u8, esize):
    n = u8.numel() // esize * esize
    return u8[:n].view(INT_OF[esize])


def _aligned(off, n):
    """Every offset is a multiple of n (a bit test for powers of two: cheaper than %)."""
    if n & (n - 1) == 0:
        return not bool((off & (n - 1)).any())
    return bool((off % n == 0).all())


def _div(off, n):
    return off >> (n.bit_length() - 1) if n & (n - 1) == 0 else off // n


def _rows(u8, off, esize, count):
    """u8 viewed as rows of ``count`` esize-byte elements, and each lane's row, when every
    access is one whole aligned row (the common vector access); else None."""
    nb = esize * count
    if esize not in INT_OF or not _aligned(off, nb):
        return None
    base = _typed(u8, esize)
    return base[: base.numel() // count * count].view(-1, count), _div(off, nb)


def _gather(u8, off, esize, count, mask):
    """Read count elements of esize bytes at byte offsets off [n] -> int tensor [n, count]."""
    rows = _rows(u8, off, esize, count)
    if rows is not None:
        return rows[0].index_select(0, rows[1])
    if esize in INT_OF and _aligned(off, esize):
        base = _typed(u8, esize)
        idx = _div(off, esize).unsqueeze(1) + torch.arange(count, device=off.device)
        return base[idx]
    nb = esize * count
    idx = off.unsqueeze(1) + torch.arange(nb, device=off.device)
    b = u8[idx]
    return b.view(INT_OF[esize])


def _scatter(u8, off, esize, count, vals):
    rows = _rows(u8, off, esize, count)
    if rows is not None:
        base, r = rows
        base.index_copy_(0, r, vals if vals.dtype == base.dtype else vals.view(base.dtype))
        return
    if esize in INT_OF and _aligned(off, esize):
        base = _typed(u8, esize)
        idx = _div(off, esize).unsqueeze(1) + torch.arange(count, device=off.device)
        base[idx] = vals if vals.dtype == base.dtype else vals.view(base.dtype)
        return
    nb = esize * count
    idx = off.unsqueeze(1) + torch.arange(nb, device=off.device)
    u8[idx] = vals.contiguous().view(torch.uint8).reshape(idx.shape)


class GlobalMemory:
    def __init__(self, tensors, device, strict=True, n_args=None):
        self.regions = []
        self.labels = []  # per region, for OutOfBoundsError: "argument i (dtype shape, bytes at address)"
        seen = set()
        n_args = len(tensors) if n_args is None else n_args
        for i, t in enumerate(tensors):
            if t.numel() == 0:
                continue
            es = t.element_size()
            span = (sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1) * es
            key = (t.data_ptr(), span)
            if key in seen:
                continue
            seen.add(key)
            st = t.untyped_storage()
            self.regions.append((t.data_ptr(), t.data_ptr() + span, _bytes_view(st, t.device), st.data_ptr()))
            what = f"argument {i} ({str(t.dtype).replace('torch.', '')} {tuple(t.shape)}" if i < n_args else "live tensor ("
            self.labels.append((i < n_args, f"{what}, {span} bytes at {t.data_ptr():#x})"))
        self.strict = strict
        self.bytes_read = 0
        self.bytes_written = 0
        self.warnings = []

    def _locate(self, addr, nbytes, mask, what, loc_hint="", leftover=None):
        """Split active lanes by region: list of (lane index tensor, region)."""
        act = torch.ones_like(addr, dtype=torch.bool) if mask is None else mask.expand_as(addr)
        out = []
        left = act.clone()
        for r in self.regions:
            lo, hi = r[0], r[1]
            inr = left & (addr >= lo) & (addr + nbytes <= hi)
            if bool(inr.any()):
                out.append((inr.nonzero().squeeze(1), r))
                left &= ~inr
                if not bool(left.any()):
                    break
        if bool(left.any()):
            bad = left.nonzero()[0].item()
            a = int(addr[bad])
            msg = f"{what} of {nbytes} bytes at address {a:#x} (lane {bad}) is outside every argument tensor"
            if self.strict:
                regions = [(lo, hi, lab) for (lo, hi, _u, _b), (_a, lab) in zip(self.regions, self.labels)]
                raise OutOfBoundsError(msg, regions=regions, nearest=self._nearest(a, nbytes), lanes=int(left.sum()))
            self.warnings.append(msg)
            if leftover is not None:
                leftover.append(left)
        return out

    def _nearest(self, a, nbytes):
        """The argument tensor an out-of-bounds access most likely derives from (the one starting
        closest below it), and how far past its end the access reaches."""
        cands = [(r[0], r[1], lab) for r, (is_arg, lab) in zip(self.regions, self.labels) if is_arg]
        cands = cands or [(r[0], r[1], lab) for r, (_x, lab) in zip(self.regions, self.labels)]
        below = [c for c in cands if c[0] <= a]
        if below:
            lo, hi, lab = max(below, key=lambda c: c[0])
            return f"it ends {a + nbytes - hi} bytes past the end of {lab}"
        if cands:
            lo, hi, lab = min(cands, key=lambda c: c[0])
            return f"it starts {lo - a} bytes before {lab}"
        return ""

    def _single(self, addr, nbytes, mask):
        """The region holding every active lane's access, or None (then take the per-lane path)."""
        if mask is None:
            lo, hi = (int(v) for v in torch.aminmax(addr))
        else:
            if not bool(mask.any()):
                return None
            big = torch.iinfo(torch.int64).max
            lo = int(torch.where(mask, addr, big).min())
            hi = int(torch.where(mask, addr, -big).max())
        for r in self.regions:
            if lo >= r[0] and hi + nbytes <= r[1]:
                return r
        return None

    def load(self, addr, dtype, esize, count, mask, N):
        addr = addr.expand(N) if addr.dim() == 0 else addr
        r = self._single(addr, esize * count, mask)
        if r is not None:  # fast path: one tensor holds every active access
            off = addr - r[3] if mask is None else torch.where(mask, addr - r[3], r[0] - r[3])
            vals = _gather(r[2], off, esize, count, None)
            n = N if mask is None else int(mask.sum())
            self.bytes_read += n * esize * count
            return vals if mask is None else vals * mask.unsqueeze(1).to(vals.dtype)
        out = torch.zeros(N, count, dtype=INT_OF.get(esize, torch.uint8), device=addr.device)
        left = []
        for lanes, (lo, hi, u8, base) in self._locate(addr, esize * count, mask, "load", leftover=left):
            out[lanes] = _gather(u8, addr[lanes] - base, esize, count, None)
            self.bytes_read += lanes.numel() * esize * count
        if left and count > 1:  # lax mode: a straddling access still reads its in-bounds elements
            nw = len(self.warnings)
            for j in range(count):
                out[:, j] = torch.where(left[0], self.load(addr + j * esize, dtype, esize, 1, left[0], N)[:, 0], out[:, j])
            del self.warnings[nw:]
        return out

    def store(self, addr, vals, esize, count, mask, N):
        addr = addr.expand(N) if addr.dim() == 0 else addr
        vals = vals.expand(N, count) if vals.dim() < 2 or vals.shape[0] != N else vals
        r = self._single(addr, esize * count, mask) if mask is None else None
        if r is not None:
            _scatter(r[2], addr - r[3], esize, count, vals)
            self.bytes_written += N * esize * count
            return
        for lanes, (lo, hi, u8, base) in self._locate(addr, esize * count, mask, "store"):
            _scatter(u8, addr[lanes] - base, esize, count, vals[lanes])
            self.bytes_written += lanes.numel() * esize * count


class LDS:
    def __init__(self, nwg, size, device, check_races=True, waves_per_wg=1, check_waits=False):
        self.size = (size + 15) // 16 * 16
        self.nwg = nwg
        self.mem = torch.zeros(nwg * self.size, dtype=torch.uint8, device=device) if size else None
        self.check = check_races and size > 0
        # check_waits: True, "vmcnt", "lgkmcnt" (or a tuple of them): the counters to check
        kinds = ("vmcnt", "lgkmcnt") if check_waits is True else (check_waits,) if isinstance(check_waits, str) \
            else tuple(check_waits or ())
        if set(kinds) - {"vmcnt", "lgkmcnt"}:
            raise ValueError(f"check_waits: True, False, 'vmcnt' or 'lgkmcnt', not {check_waits!r}")
        self.waits = self.check and "vmcnt" in kinds
        self.lgkm = self.check and "lgkmcnt" in kinds
        self.bytes_read = 0
        self.bytes_written = 0
        self.bank_conflicts = 0
        self.warnings = []
        self._warned = set()
        self.oob = 0  # lanes whose access passed the end of the LDS (see _lanes)
        self._stamp = None  # scratch of _same_op_writes
        if self.check:
            self.writer = torch.full((nwg * self.size,), -1, dtype=torch.int32, device=device)
            self.reader = torch.full_like(self.writer, -1)
            self.wloc = torch.zeros_like(self.writer)
            self.rloc = torch.zeros_like(self.writer)
            self.written = torch.zeros(nwg * self.size, dtype=torch.bool, device=device)
            # s_waitcnt vmcnt: per wave, VMEM loads issued and those a wait has retired; per LDS
            # byte, the wave and issue number of the LDS DMA (buffer load to LDS) that wrote it
            self.vm_issued = torch.zeros(nwg * waves_per_wg, dtype=torch.int64, device=device)
            self.vm_retired = torch.zeros_like(self.vm_issued)
            self.dma_wave = torch.full((nwg * self.size,), -1, dtype=torch.int32, device=device)
            self.dma_seq = torch.zeros(nwg * self.size, dtype=torch.int64, device=device)
            self.dma_loc = torch.zeros_like(self.writer)
        if self.lgkm:
            # s_waitcnt lgkmcnt: per wave, LDS instructions issued, those a wait retired, and those
            # retired when it last arrived at a barrier; per byte, the wave and number of the
            # store that wrote it (-1: none, or LDS DMA, which vmcnt tracks)
            self.lgkm_issued = torch.zeros(nwg * waves_per_wg, dtype=torch.int64, device=device)
            self.lgkm_retired = torch.zeros_like(self.lgkm_issued)
            self.lgkm_fenced = torch.zeros_like(self.lgkm_issued)
            self.st_wave = torch.full((nwg * self.size,), -1, dtype=torch.int32, device=device)
            self.st_seq = torch.zeros(nwg * self.size, dtype=torch.int64, device=device)
        self.locs = []

    def _lanes(self, ex, ptr, nbytes, what, loc=None):
        """(active lanes or None for all, their byte offsets in ``mem``). A lane whose access
        passes the end of the workgroup's LDS does nothing (a load reads 0, an atomic returns 0),
        as the hardware treats addresses past the workgroup's allocation; it is counted in
        ``oob`` and warned once per line. A kernel without LDS that accesses it is an error."""
        N = ex.N
        ptr = ptr.expand(N) if ptr.dim() == 0 else ptr
        m = ex.mask
        lanes = None if m is None else m.nonzero().squeeze(1)
        p = ptr if lanes is None else ptr[lanes]
        if self.mem is None:
            raise OutOfBoundsError(f"LDS {what} of {nbytes} bytes at offset {int(p[0]) if p.numel() else 0}: "
                                   f"the kernel allocates no LDS")
        bad = (p < 0) | (p + nbytes > self.size)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            self.oob += int(bad.sum())
            if (what, loc) not in self._warned:
                self._warned.add((what, loc))
                self.warnings.append(
                    f"LDS {what} of {nbytes} bytes at offset {int(p[i])} past the {self.size}-byte LDS at {loc}: "
                    f"{'reads 0' if what != 'store' else 'dropped'} (the hardware's allocation granule and "
                    f"layout differ: the value must not matter)")
            keep = ~bad
            lanes = (torch.arange(N, device=p.device) if lanes is None else lanes)[keep]
            p = p[keep]
        wg = ex.wg if lanes is None else ex.wg[lanes]
        return lanes, wg * self.size + p

    def _loc_id(self, loc):
        try:
            return self.locs.index(loc)
        except ValueError:
            self.locs.append(loc)
            return len(self.locs) - 1

    def _waves(self, ex):
        """Global ids of the waves with an active lane."""
        w = ex.wave.view(-1, 64)[:, 0]
        return w if ex.mask is None else w[ex.mask.view(-1, 64).any(1)]

    def vm_issue(self, ex):
        """A VMEM load issued by the active waves (vmcnt counts it until a wait retires it)."""
        if self.waits:
            self.vm_issued[self._waves(ex)] += 1

    def vm_wait(self, ex, vmcnt=0):
        """s_waitcnt vmcnt(n): all but the last n VMEM loads of each active wave have completed."""
        if self.waits:
            w = self._waves(ex)
            self.vm_retired[w] = torch.maximum(self.vm_retired[w], self.vm_issued[w] - vmcnt)

    def lgkm_issue(self, ex, retire=False):
        """An LDS instruction of the active waves (lgkmcnt counts it). ``retire``: a load, whose
        result the compiler waits for before its use: counted as retired with every earlier one
        (in-order LDS; lenient where the use comes only after a barrier)."""
        w = self._waves(ex)
        self.lgkm_issued[w] += 1
        if retire:
            self.lgkm_retired[w] = self.lgkm_issued[w]

    def lgkm_wait(self, ex, lgkmcnt=0):
        """s_waitcnt lgkmcnt(n): all but the last n LDS instructions of each active wave are done."""
        if self.lgkm:
            w = self._waves(ex)
            self.lgkm_retired[w] = torch.maximum(self.lgkm_retired[w], self.lgkm_issued[w] - lgkmcnt)

    def lgkm_fence(self, ex, fenced):
        """The active waves arrive at a barrier: a fenced one (gpu.barrier: its release fence
        waits for every LDS access) or a bare s_barrier, which orders only the LDS stores that
        an s_waitcnt lgkmcnt already retired (gfx942 / gfx950 insert no wait before it)."""
        if self.lgkm:
            w = self._waves(ex)
            self.lgkm_fenced[w] = self.lgkm_issued[w] if fenced else self.lgkm_retired[w]

    def _unordered(self, idx, w, by_wave, seq, done):
        """The first byte read by wave w that another wave (``by_wave``) wrote with its access
        number ``seq`` past ``done`` of that wave: (position, byte, where, writer) or None."""
        pw = by_wave[idx]
        other = (pw >= 0) & (pw != w)
        if not bool(other.any()):
            return None
        late = other & (seq[idx] > done[pw.clamp(min=0).long()])
        if not bool(late.any()):
            return None
        j, b, where = self._first(late, idx)
        return j, b, where, int(pw[j])

    def _check_lgkm(self, idx, w, loc):
        """A read of bytes that another wave stored before a barrier without retiring the store
        (s_waitcnt lgkmcnt) first: the barrier does not order it."""
        hit = self._unordered(idx, w, self.st_wave, self.st_seq, self.lgkm_fenced)
        if hit:
            j, b, where, p = hit
            raise LDSRaceError(
                f"LDS race (missing s_waitcnt lgkmcnt): wave {int(w[j])} reads {where} that wave {p} stored at "
                f"{self.locs[int(self.wloc[b])]} before an s_barrier without waiting for the store; this read at "
                f"{loc}. A bare s_barrier (rocdl.s.barrier, inline asm) orders only completed LDS accesses: "
                f"put s_waitcnt lgkmcnt(0) before it, or use gpu.barrier (LDS instruction {int(self.st_seq[b])} of "
                f"wave {p}; {int(self.lgkm_fenced[p])} retired at its last barrier).")

    def _check_dma(self, idx, w, loc):
        """A read of bytes that another wave's LDS DMA may not have written yet (no vmcnt wait by
        that wave retired it). The reading wave's own DMA is covered: the compiler waits for it."""
        hit = self._unordered(idx, w, self.dma_wave, self.dma_seq, self.vm_retired)
        if hit:
            j, b, where, p = hit
            raise LDSRaceError(
                f"LDS race (missing s_waitcnt vmcnt): wave {int(w[j])} reads {where} that a buffer load to LDS by "
                f"wave {p} at {self.locs[int(self.dma_loc[b])]} may not have written yet; this read at {loc}. Wave {p} "
                f"must wait (s_waitcnt vmcnt) for that load before the barrier that orders it (load "
                f"{int(self.dma_seq[b])} of that wave; {int(self.vm_issued[p])} issued, {int(self.vm_retired[p])} "
                f"retired by its waits).")

    def _first(self, hit, idx):
        """(position, byte, 'LDS byte .. of workgroup ..') of the first True in hit."""
        j = int(hit.nonzero()[0])
        b = int(idx[j])
        return j, b, f"LDS byte {b % self.size} of workgroup {b // self.size}"

    def _track(self, ex, lanes, off, nbytes, write, loc, dma=False, new=None):
        """Race bookkeeping of one LDS access. ``new`` [n * nbytes] (writes): the bytes stored.
        A byte written with the value it already holds, where no wave has changed it in this
        barrier interval, is a silent store: whatever the order of the waves, every access sees
        the same value, so it counts as a read (a wave changing the byte later still races)."""
        waves = ex.wave if lanes is None else ex.wave[lanes]
        idx = (off.unsqueeze(1) + torch.arange(nbytes, device=off.device)).reshape(-1)
        w = waves.to(torch.int32).unsqueeze(1).expand(-1, nbytes).reshape(-1)
        lid = self._loc_id(loc)
        if not write:
            if self.waits:
                self._check_dma(idx, w, loc)
            self._read(idx, w, lid, loc)  # same barrier interval: the plain race first
            if self.lgkm:
                self._check_lgkm(idx, w, loc)
            return
        if new is not None:
            self._same_op_writes(idx, w, new, loc)
            silent = (self.writer[idx] == -1) & (self.mem[idx] == new)
            if bool(silent.any()):
                self._silent(idx[silent], w[silent], lid, loc)
                keep = ~silent
                idx, w = idx[keep], w[keep]
        self._write(idx, w, lid, loc, dma)

    def _race(self, kind, w, other_wave, where, other_loc, loc):
        raise LDSRaceError(
            f"LDS race ({kind}): wave {w} touches {where} that "
            f"{'several waves' if other_wave == -2 else f'wave {other_wave}'} accessed in the same "
            f"barrier interval at {self.locs[other_loc]}; this access at {loc}. Add a barrier "
            f"(gpu.barrier) between them.")

    def _read(self, idx, w, lid, loc):
        prev_w = self.writer[idx]
        clash = (prev_w >= 0) & (prev_w != w)
        if bool(clash.any()):
            j, b, where = self._first(clash, idx)
            self._race("read after write", int(w[j]), int(self.writer[b]), where, int(self.wloc[b]), loc)
        if loc not in self._warned and not bool(self.written[idx].all()):
            self._warned.add(loc)
            self.warnings.append(f"read of never-written LDS at {loc}")
        self._note_reader(idx, w, lid)

    def _note_reader(self, idx, w, lid):
        prev_r = self.reader[idx]
        self.reader[idx] = torch.where((prev_r == -1) | (prev_r == w), w, -2)
        self.rloc[idx] = lid

    def _silent(self, idx, w, lid, loc):
        """Same-value stores: a read for race purposes; noted once per line when another wave's
        access of the byte in this interval makes it a (benign) race under the plain rule."""
        prev_r = self.reader[idx]
        if loc not in self._warned and bool(((prev_r == -2) | ((prev_r >= 0) & (prev_r != w))).any()):
            self._warned.add(loc)
            self.warnings.append(
                f"benign LDS race at {loc}: a store of the value the byte already holds, in the barrier "
                f"interval where another wave accesses it (order-independent)")
        self.written[idx] = True
        self._note_reader(idx, w, lid)

    def _same_op_writes(self, idx, w, new, loc):
        """Lanes of different waves storing different values to one byte in one instruction: the
        result depends on the order of the waves."""
        if idx.numel() < 2 or bool((w == w[0]).all()):
            return
        if self._stamp is None:
            self._stamp = torch.empty_like(self.writer)
        pos = torch.arange(idx.numel(), dtype=torch.int32, device=idx.device)
        self._stamp[idx] = pos  # one lane wins each byte: all win iff the bytes are distinct
        if bool((self._stamp[idx] == pos).all()):
            return
        u, inv = torch.unique(idx, return_inverse=True)
        lo_w = torch.full(u.shape, 1 << 30, dtype=torch.int32, device=idx.device).scatter_reduce(0, inv, w, "amin")
        hi_w = torch.full_like(lo_w, -1).scatter_reduce(0, inv, w, "amax")
        nv = new.to(torch.int32)
        lo_v = torch.full_like(lo_w, 256).scatter_reduce(0, inv, nv, "amin")
        hi_v = torch.full_like(lo_w, -1).scatter_reduce(0, inv, nv, "amax")
        bad = (lo_w != hi_w) & (lo_v != hi_v)
        if bool(bad.any()):
            b = int(u[bad.nonzero()[0]])
            raise LDSRaceError(
                f"LDS race (write after write): waves {int(lo_w[inv][idx == b].min())} and "
                f"{int(hi_w[inv][idx == b].max())} store different values to LDS byte {b % self.size} of "
                f"workgroup {b // self.size} in one instruction at {loc}; the result depends on the order of "
                f"the waves.")

    def _write(self, idx, w, lid, loc, dma):
        prev_w = self.writer[idx]
        clash = (prev_w >= 0) & (prev_w != w)
        if bool(clash.any()):
            j, b, where = self._first(clash, idx)
            self._race("write after write", int(w[j]), int(self.writer[b]), where, int(self.wloc[b]), loc)
        prev_r = self.reader[idx]
        clash = (prev_r == -2) | ((prev_r >= 0) & (prev_r != w))
        if bool(clash.any()):
            j, b, where = self._first(clash, idx)
            self._race("write after read", int(w[j]), int(self.reader[b]), where, int(self.rloc[b]), loc)
        self.writer[idx] = w
        self.wloc[idx] = lid
        self.written[idx] = True
        if self.lgkm:
            self.st_wave[idx] = -1 if dma else w
            self.st_seq[idx] = self.lgkm_issued[w.long()]
        if dma and self.waits:
            self.dma_wave[idx] = w
            self.dma_seq[idx] = self.vm_issued[w.long()]
            self.dma_loc[idx] = lid
        elif self.waits:
            self.dma_wave[idx] = -1

    def barrier(self, wgs=None):
        """Close the barrier interval of every workgroup, or of those where ``wgs`` [nwg] is True."""
        if not self.check:
            return
        if wgs is None:
            self.writer.fill_(-1)
            self.reader.fill_(-1)
        else:
            self.writer.view(self.nwg, self.size)[wgs] = -1
            self.reader.view(self.nwg, self.size)[wgs] = -1

    def _conflicts(self, ex, lanes, off, nbytes):
        ndw = max(1, nbytes // 4)
        group = 128 // (1 << (max(4, nbytes) - 1).bit_length())  # 12-byte accesses phase like 16-byte ones
        dw = (off >> 2).unsqueeze(1) + torch.arange(ndw, device=off.device)
        if lanes is None:
            full = dw
        else:  # only the waves that have an active lane
            full = torch.full((ex.N, ndw), -1, dtype=torch.int64, device=off.device)
            full[lanes] = dw
            waves = torch.unique(lanes // 64)
            full = full.view(-1, 64, ndw)[waves].reshape(-1, ndw)
        x = full.reshape(-1, group * ndw).sort(1).values
        keep = x >= 0
        keep[:, 1:] &= x[:, 1:] != x[:, :-1]  # distinct dwords only: a broadcast is free
        bank = torch.where(keep, x & 31, torch.full_like(x, 32))
        cnt = torch.zeros(x.shape[0], 33, dtype=torch.int64, device=x.device).scatter_add_(1, bank, torch.ones_like(bank))
        self.bank_conflicts += int((cnt[:, :32].amax(1) - 1).clamp(min=0).sum())

    def load(self, ex, ptr, esize, count, loc):
        nbytes = esize * count
        lanes, off = self._lanes(ex, ptr, nbytes, "load", loc)
        if self.check:
            if self.lgkm:
                self.lgkm_issue(ex, retire=True)
            self._track(ex, lanes, off, nbytes, False, loc)
        self._conflicts(ex, lanes, off, nbytes)
        vals = _gather(self.mem, off, esize, count, None)
        self.bytes_read += off.numel() * nbytes
        if lanes is None:
            return vals
        out = torch.zeros(ex.N, count, dtype=vals.dtype, device=vals.device)
        out[lanes] = vals
        return out

    def store(self, ex, ptr, vals, esize, count, loc, dma=False):
        nbytes = esize * count
        lanes, off = self._lanes(ex, ptr, nbytes, "store", loc)
        vals = vals.expand(ex.N, count) if vals.dim() < 2 or vals.shape[0] != ex.N else vals
        if self.check:
            mine = vals if lanes is None else vals[lanes]
            new = mine.contiguous().view(torch.uint8).reshape(-1)
            if self.lgkm and not dma:
                self.lgkm_issue(ex)
            self._track(ex, lanes, off, nbytes, True, loc, dma, new)
        self._conflicts(ex, lanes, off, nbytes)
        _scatter(self.mem, off, esize, count, vals if lanes is None else vals[lanes])
        self.bytes_written += off.numel() * nbytes
