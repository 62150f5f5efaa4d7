"""OutOfBoundsError's message: the op, the descriptor's num_records, the nearest argument and how far
past its end the access reaches; the live regions only as a count (the full list on the exception).
The kernel: repro_row_scale.py's unbounded per-row scale read (a vec4 past a 17-float tensor)."""

import pytest
import torch

import flysim
from flysim.errors import OutOfBoundsError

from repro_row_scale import N, build_row_scale


def test_oob_message_names_op_descriptor_and_nearest_argument():
    m = 17
    x, scale, out = torch.randn(m, N), torch.rand(m) + 0.5, torch.zeros(m, N)
    extra = [torch.zeros(8) for _ in range(40)]  # registered memory: regions the message must not list
    with pytest.raises(OutOfBoundsError) as ei:
        with flysim.simulate("gfx950") as sim:
            sim.register(*extra)
            build_row_scale(bounded=False)(x.view(-1), scale, out.view(-1), m)
    e, msg = ei.value, str(ei.value)
    # block 1's first vec4 of scales covers rows 16..19 of a 17-row tensor: bytes 64..80 of 68
    assert f"load of 16 bytes at address {scale.data_ptr() + 64:#x} (lane 64)" in msg, msg
    assert f"it ends 12 bytes past the end of argument 1 (float32 (17,), 68 bytes at {scale.data_ptr():#x})" in msg, msg
    assert "buffer descriptor num_records 0xffffffff (unbounded)" in msg, msg
    assert "op rocdl.raw.ptr.buffer.load" in msg and "kernel row_scale_kernel" in msg and "repro_row_scale.py:" in msg, msg
    assert e.op == "rocdl.raw.ptr.buffer.load" and e.num_records == 0xFFFFFFFF
    # the region list stays behind a count; the exception keeps it
    assert f"{len(e.regions)} live tensor regions" in msg and len(e.regions) >= 3, msg
    assert msg.count("0x") < 6 and len(msg) < 600, msg
    assert any(lo == scale.data_ptr() and hi == lo + 68 for lo, hi, _lab in e.regions)
    assert sum(lab.startswith("argument") for _lo, _hi, lab in e.regions) == 3  # X, Scale, Out; not the registered 40
