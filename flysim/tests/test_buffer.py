"""Buffer accesses at non-zero offsets: soffset, voffset + immediate, num_records bounds, LDS DMA.

A buffer access reads byte voffset + soffset + imm of its descriptor; every test here puts a
different non-zero value in each term, so dropping any one of them changes the output.
"""

import pytest
import torch

import flysim
from flysim.errors import LDSRaceError

import flysim_kernels as K


def test_buffer_load_and_store_add_soffset():
    X = torch.arange(1000, 1200, dtype=torch.int32)
    out = torch.full((200,), -1, dtype=torch.int32)
    with flysim.simulate() as sim:
        K.build_buffer_offsets()(X, out, 12, 8)  # load at 4 t + 12, store at 4 t + 8
    ref = torch.full_like(out, -1)
    ref[2:66] = X[3:67]
    assert torch.equal(out, ref)
    c = sim.launches[-1].counters
    assert c["global_bytes_read"] == c["global_bytes_written"] == 64 * 4
    assert c["oob_buffer_accesses"] == 0


def test_buffer_bounds_check_excludes_soffset():
    """A 100-byte descriptor, soffset 12: the check compares voffset + 4 <= 100 (lanes 0..24 read),
    while the data comes from byte 12 + voffset. LLVM's AMDGPU buffer intrinsics: soffset is
    "excluded from bounds checking", voffset and the immediate offset are included."""
    X = torch.arange(1000, 1200, dtype=torch.int32)
    out = torch.full((200,), -1, dtype=torch.int32)
    with flysim.simulate() as sim:
        K.build_buffer_offsets(nbytes=100)(X, out, 12, 0)
    ref = torch.full_like(out, -1)
    ref[:64] = 0
    ref[:25] = X[3:28]
    assert torch.equal(out, ref)
    assert sim.launches[-1].counters["oob_buffer_accesses"] == 64 - 25


@pytest.mark.parametrize("arch,size,imm,asynchronous", [
    ("gfx942", 4, 0, False),
    ("gfx942", 4, 16, False),
    ("gfx950", 16, 32, False),
    ("gfx950", 12, 48, True),
    ("gfx950", 16, 32, True),
])
def test_buffer_load_into_lds(arch, size, imm, asynchronous):
    """rocdl.raw.ptr.buffer.load[.async].lds: global at t*size + soff + imm, LDS at wave base + imm + lane*size."""
    soff, dw = 8, size // 4
    X = torch.arange(5000, 5000 + 2 * 64 * dw + 64, dtype=torch.int32)
    out = torch.zeros(2 * 64 * dw, dtype=torch.int32)
    with flysim.simulate(arch=arch) as sim:
        K.build_buffer_to_lds(size, imm, asynchronous)(X, out, soff)
    first = (soff + imm) // 4
    assert torch.equal(out, X[first:first + out.numel()])
    rec = sim.launches[-1]
    op = "rocdl.raw.ptr.buffer.load.async.lds" if asynchronous else "rocdl.raw.ptr.buffer.load.lds"
    assert rec.counters["ops_by_kind"][op] == 1
    assert rec.counters["lds_bytes_written"] == 128 * size
    assert rec.counters["global_bytes_read"] == 128 * size


@pytest.mark.parametrize("vmcnt", [None, 1, 0])
def test_lds_dma_read_by_another_wave_needs_vmcnt_wait(vmcnt):
    """A buffer load to LDS read by another wave after a barrier: only s_waitcnt vmcnt(0) by the loading
    wave orders it (vmcnt(1) leaves this wave's last load in flight); a missing wait is a race
    (simulate(check_waits=True))."""
    X = torch.arange(5000, 5000 + 2 * 64 + 64, dtype=torch.int32)
    out = torch.zeros(2 * 64, dtype=torch.int32)
    run = K.build_buffer_to_lds(4, 0, cross=True, vmcnt=vmcnt)
    if vmcnt != 0:
        with pytest.raises(LDSRaceError, match="missing s_waitcnt vmcnt"):
            with flysim.simulate("gfx942", check_waits=True):
                run(X, out, 0)
        return
    with flysim.simulate("gfx942", check_waits=True):
        run(X, out, 0)
    assert torch.equal(out, X[:128].roll(-64))
