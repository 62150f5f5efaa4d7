"""Every host entry point of the kernel library refuses bad input with KernelInputError (a
ValueError subclass, so callers catching ValueError keep working), naming the problem and the fix.
Validation happens before any compile or launch: no flysim session is needed."""

import pytest
import torch

import translator_kernels.gemm as G
from translator_kernels.attention import attention
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.preshuffle import shuffle_weight
from translator_kernels.codegen.elementwise import fused_elementwise
from translator_kernels.codegen.reduce import fused_reduce
from translator_kernels.codegen.scan import scan
from translator_kernels.program import Program
from translator_kernels.rows.norm import group_norm, layer_norm

IDENT = Program(1, (), ((0, "f32"),)).text()
CASES = {  # name -> (call, words the message must hold)
    "elementwise dtype": (lambda: fused_elementwise([torch.arange(4, dtype=torch.int16)], IDENT), "use float32"),
    "elementwise program": (lambda: fused_elementwise([torch.randn(4)], '{"n":1,"ops":[["cosh",[0],[]]],'
                                                      '"out":[[1,"f32"]]}'), "unknown op 'cosh'"),
    "reduce kind": (lambda: fused_reduce([torch.randn(4)], IDENT, "median", [0], False), "unknown reduction kind"),
    "scan dim": (lambda: scan([torch.randn(4)], IDENT, "cumsum", 3), "out of range"),
    "gemm dtype": (lambda: G.gemm(torch.randn(4, 64, dtype=torch.float64), shuffle_weight(torch.randn(64, 64)),
                                  64, 64), "float64"),
    "gemm epilogue": (lambda: G.gemm(torch.randn(4, 64), shuffle_weight(torch.randn(64, 64)), 64, 64,
                                     activation="gelu;cosh"), "known steps"),
    "layer_norm dtype": (lambda: layer_norm(torch.arange(8).reshape(2, 4)), "not supported"),
    "group_norm groups": (lambda: group_norm(torch.randn(2, 6, 4), 4, None, None, 1e-5), "not divisible"),
    "attention head_dim": (lambda: attention(*[torch.randn(1, 2, 8, 4)] * 3), "head_dim"),  # 8..256 are served
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_raises_kernel_input_error(name):
    call, words = CASES[name]
    with pytest.raises(KernelInputError, match=words) as e:
        call()
    assert isinstance(e.value, ValueError)
