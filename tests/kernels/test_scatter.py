"""The scatter kernel (translator_kernels.layout.scatter) on the session's executor (tests/executors.py:
flysim, or rocm on an AMD GPU): a state write in place.

`write(dst, values, dim, ids)` stores values into the destination's own storage, one launch, no
allocation of a result: a KV cache slot written as `cache[:, :, pos] = k` (index_put_), HF's
`index_copy_(2, pos, k)`, and `copy_` into a slice of a buffer. Bit-exact against eager's in-place
op on a clone; the elements outside the written region are untouched (the kernel never writes
them); values broadcast; transposed values (RoPE's output read as [B, H, S, D]) are read in place;
an id out of range raises IndexError and writes nothing of its row."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator_kernels.errors import KernelInputError
from translator_kernels.layout import scatter as S


def _run(call, arch="gfx942"):
    """call(put) on the session's executor (put: a tensor to where it reads them); the launched kernels."""
    with executors.current().run(arch) as ex:
        out = call(ex.put)
    assert out is None
    return [r.kernel.split("_kernel")[0] for r in ex.launches]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_cache_slot_write_matches_index_put(dtype):
    cache = torch.randn(1, 2, 16, 8).to(dtype)
    k = torch.randn(1, 3, 2, 8).to(dtype).transpose(1, 2)  # [B, H, S, D] view of [B, S, H, D]
    pos = torch.tensor([4, 5, 6])
    want = cache.clone()
    want[:, :, pos] = k
    cache = executors.current().put(cache)
    ptr = cache.data_ptr()
    assert _run(lambda put: S.write(cache, put(k), 2, put(pos))) == ["scatter"]
    assert cache.data_ptr() == ptr and torch.equal(cache.cpu(), want)


def test_index_copy_with_broadcast_values_and_negative_id():
    cache = torch.randn(2, 2, 10, 4)
    v = torch.randn(2, 1, 4)  # broadcast over the batch dim as index_put_ allows
    pos = torch.tensor([-1])
    want = cache.clone()
    want[:, :, pos] = v
    cache = executors.current().put(cache)
    assert _run(lambda put: S.write(cache, put(v), 2, put(pos)), "gfx950") == ["scatter"]
    assert torch.equal(cache.cpu(), want)


def test_copy_into_a_slice_of_a_buffer():
    buf = torch.randn(3, 12, 8)
    src = torch.randn(3, 4, 8)
    want = buf.clone()
    want[:, 5:9].copy_(src)
    buf = executors.current().put(buf)
    view = buf[:, 5:9]
    assert _run(lambda put: S.write(view, put(src))) == ["scatter"]
    assert torch.equal(buf.cpu(), want)


def test_out_of_range_id_raises_and_writes_no_row():
    with pytest.raises(IndexError, match="index 7 is out of range for a dim of size 4"):
        with executors.current().run("gfx942") as ex:
            cache = ex.put(torch.zeros(1, 1, 4, 4))
            S.write(cache, ex.put(torch.ones(1, 1, 2, 4)), 2, ex.put(torch.tensor([1, 7])))
    cache = cache.cpu()
    assert float(cache[0, 0, 1].sum()) == 4 and float(cache[0, 0, [0, 2, 3]].abs().sum()) == 0


def test_bad_values_are_refused():
    with pytest.raises(KernelInputError, match="cast them first"):
        S.write(torch.zeros(4, 4), torch.zeros(4, 4, dtype=torch.float16))
    with pytest.raises(KernelInputError, match="do not broadcast"):
        S.write(torch.zeros(4, 4), torch.zeros(3, 4))


def test_planned_replays_follow_each_calls_storage_offset():
    """One plan serves a call signature (shapes, strides, alignment; not the storage offset): here a
    value that is a whole tensor (offset 0, RoPE's k output) and one that is a column slice of a wider
    one (offset 48, v of a QKV output) with equal strides after export's view. The flat views are taken before the dtype
    view, so a replay addresses each call's own offset (before: the recorded call's, which overran
    the smaller storage)."""
    want = torch.zeros(1, 2, 8, 4)
    with executors.current().run("gfx942") as ex:
        cache = ex.put(want.clone())
        for step in range(4):
            qkv = ex.put(torch.randn(1, 1, 56))  # sliced where the executor reads it: the offset stays
            k = qkv[..., 48:] if step % 2 else ex.put(torch.randn(1, 1, 8))
            k = k.view(1, 1, 2, 4).transpose(1, 2).view(2, 1, 4)  # as export writes it: strides (4, 4, 1) both
            pos = torch.tensor([step])
            want[:, :, pos] = k.cpu()
            S.write(cache, k, 2, ex.put(pos))
    assert len(ex.launches) == 4 and torch.equal(cache.cpu(), want)
