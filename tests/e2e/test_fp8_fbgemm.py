"""HF transformers' FbgemmFp8Linear (FbgemmFp8Config: per-channel fp8 W, dynamic per-token activations) on flysim.

fbgemm_gpu is not installed here (no downloads), so the child process registers stand-ins for its two ops
before importing the translator, with fbgemm's schema and its reference math re-typed (per-row scale
factor min(FMAX / amax, 512 * FMAX), amax clamped at scale_ub, the inverse scale returned; the rowwise
GEMM as fp32 matmul of the fp8 values times both scales, bf16 out). A tiny HF Llama gets
FbgemmFp8Linear in place of its linears (not lm_head, as FbgemmFp8Config does), with weights quantized
by that stand-in, and is translated: every f8f8bf16_rowwise becomes flydsl.gemm_fp8 (launches recorded,
output within translate's verification), quantize_fp8_per_row stays fbgemm's with its reason. On gfx942
HF's e4m3fn weights are not the MFMA's format: the GEMMs stay in PyTorch with that reason.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import json, sys
from pathlib import Path
from typing import Optional

root, arch = Path(sys.argv[1]), sys.argv[2]
sys.path[:0] = [str(root), str(root / "flysim" / "src")]
import torch

F8 = torch.float8_e4m3fn  # HF FbgemmFp8Linear's default weight dtype
FMAX = torch.finfo(F8).max


@torch.library.custom_op("fbgemm::quantize_fp8_per_row", mutates_args=())
def quantize_fp8_per_row(input: torch.Tensor, bs: Optional[torch.Tensor] = None,
                         scale_ub: Optional[torch.Tensor] = None) -> list[torch.Tensor]:
    amax = input.float().abs().amax(-1)
    if scale_ub is not None:
        amax = torch.minimum(amax, scale_ub.float())
    sf = (FMAX / amax).clamp(max=FMAX * 512.0)
    return [(input.float() * sf[:, None]).clamp(-FMAX, FMAX).to(F8), sf.reciprocal()]


@quantize_fp8_per_row.register_fake
def _(input, bs=None, scale_ub=None):
    return [input.new_empty(input.shape, dtype=F8), input.new_empty(input.shape[:-1], dtype=torch.float32)]


@torch.library.custom_op("fbgemm::f8f8bf16_rowwise", mutates_args=())
def f8f8bf16_rowwise(XQ: torch.Tensor, WQ: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                     bias: Optional[torch.Tensor] = None, use_fast_accum: bool = True,
                     output: Optional[torch.Tensor] = None) -> torch.Tensor:
    y = (XQ.float() @ WQ.float().t()) * x_scale.float().reshape(-1, 1) * w_scale.float().reshape(1, -1)
    return (y if bias is None else y + bias.float()).to(torch.bfloat16)


@f8f8bf16_rowwise.register_fake
def _(XQ, WQ, x_scale, w_scale, bias=None, use_fast_accum=True, output=None):
    return XQ.new_empty((XQ.shape[0], WQ.shape[0]), dtype=torch.bfloat16)


import transformers as T
from transformers.integrations import fbgemm_fp8 as hf

from translator import translate

hf.quantize_fp8_per_row = torch.ops.fbgemm.quantize_fp8_per_row  # what replace_with_fbgemm_fp8_linear sets
torch.manual_seed(0)
cfg = T.LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                    intermediate_size=128, max_position_embeddings=32)
model = T.LlamaForCausalLM(cfg).eval().to(torch.bfloat16)  # FbgemmFp8 models are served in bf16
model.config._attn_implementation = "sdpa"
for name, mod in list(model.named_modules()):
    for child, lin in list(mod.named_children()):
        if isinstance(lin, torch.nn.Linear) and child != "lm_head":
            new = hf.FbgemmFp8Linear(lin.in_features, lin.out_features, lin.bias is not None)
            wq, inv = torch.ops.fbgemm.quantize_fp8_per_row(lin.weight.detach())
            new.weight = torch.nn.Parameter(wq, requires_grad=False)
            new.weight_scale = torch.nn.Parameter(inv.reshape(-1, 1), requires_grad=False)
            new.input_scale_ub.fill_(1200.0)  # FbgemmFp8Config's activation_scale_ub
            setattr(mod, child, new)
ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
tm = translate(model, (ids,), arch=arch, backend="flysim")
tm(ids)
c = tm.report.counters
print(json.dumps({"counters": c, "passed": tm.report.verification.passed, "message": tm.report.verification.message,
                  "launches": sum(len(x.launches) for x in tm.last_calls if x.family == "gemm_fp8"),
                  "reasons": [r.detail for r in tm.report.rows if "fbgemm" in str(r.detail)]}))
'''


def _child(arch):
    proc = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), arch], capture_output=True, text=True, timeout=900,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", ["gfx950", pytest.param("gfx942", marks=pytest.mark.slow)])
def test_fbgemm_fp8_linear_becomes_gemm_fp8(arch):
    got = _child(arch)
    c = got["counters"]
    if arch == "gfx950":  # OCP e4m3fn: the MFMA's format
        assert c.get("fbgemm_rowwise") == 7, c  # q, k, v, o, gate, up, down
        assert got["launches"] == 7 and got["passed"], got["message"]
    else:  # HF's e4m3fn weights are not gfx942's fnuz
        assert not c.get("fbgemm_rowwise") and any("not an 8-bit float format of gfx942" in r for r in got["reasons"])
    assert any("fbgemm's per-row quantization" in r for r in got["reasons"]), got["reasons"]
