"""How many ops of a HuggingFace model's forward stay in PyTorch after translation.

    python -m bench.hf_coverage [--families gpt2,llama,...] [--attn eager,sdpa]

Each family is built from a tiny random config (no download), translated with
backend="reference" (what runs where does not depend on the backend; verification runs too),
and the report's rows are counted: compute ops in FlyDSL ops, compute ops left in PyTorch
(kept by design — conv / pool / batchnorm — counted apart), and which aten ops those are.
Ops folded at specialization (shape-only: masks, position ids) run once per input shape,
not per forward, and are counted apart. Layout ops (views, reshapes) carry no arithmetic and
are not counted. Families the installed
transformers lacks are listed as such.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch

V = 128


def _lm(T, cfg_name, model_name, **kw):
    cfg = getattr(T, cfg_name)(vocab_size=V, **kw)
    return getattr(T, model_name)(cfg), torch.randint(0, V, (2, 8))


FAMILIES = {
    "bert": lambda T: (T.BertModel(T.BertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=1,
                                                num_attention_heads=2, intermediate_size=128),
                                   add_pooling_layer=False), torch.randint(0, V, (2, 8))),
    "gpt2": lambda T: _lm(T, "GPT2Config", "GPT2LMHeadModel", n_embd=64, n_layer=1, n_head=2, n_positions=64,
                          bos_token_id=0, eos_token_id=0),
    "llama": lambda T: _lm(T, "LlamaConfig", "LlamaForCausalLM", hidden_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=128),
    "mistral": lambda T: _lm(T, "MistralConfig", "MistralForCausalLM", hidden_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=128),
    "qwen2": lambda T: _lm(T, "Qwen2Config", "Qwen2ForCausalLM", hidden_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=128),
    "qwen3": lambda T: _lm(T, "Qwen3Config", "Qwen3ForCausalLM", hidden_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, head_dim=16),
    "phi": lambda T: _lm(T, "PhiConfig", "PhiForCausalLM", hidden_size=64, num_hidden_layers=1,
                         num_attention_heads=4, intermediate_size=128),
    "gemma": lambda T: _lm(T, "GemmaConfig", "GemmaForCausalLM", hidden_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, head_dim=16),
    "olmo2": lambda T: _lm(T, "Olmo2Config", "Olmo2ForCausalLM", hidden_size=64, num_hidden_layers=1,
                           num_attention_heads=4, intermediate_size=128),
    "gpt_neox": lambda T: _lm(T, "GPTNeoXConfig", "GPTNeoXForCausalLM", hidden_size=64, num_hidden_layers=1,
                              num_attention_heads=4, intermediate_size=128),
    "opt": lambda T: _lm(T, "OPTConfig", "OPTForCausalLM", hidden_size=64, num_hidden_layers=1,
                         num_attention_heads=4, ffn_dim=128, word_embed_proj_dim=64),
    "t5": lambda T: (T.T5EncoderModel(T.T5Config(vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=1,
                                                 num_heads=4)), torch.randint(0, V, (2, 8))),
    "vit": lambda T: (T.ViTModel(T.ViTConfig(image_size=16, patch_size=8, hidden_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=128),
                                 add_pooling_layer=False), torch.randn(2, 3, 16, 16)),
}


def measure(family: str, attn: str, backend: str = "reference") -> dict:
    """One family's counts. On a kernel backend (flysim), `not_launched` lists the rows of FlyDSL ops
    that ran no recorded kernel launch in verification (the report's "flydsl-reference" / "flydsl-op")."""
    import transformers as T

    import translator

    torch.manual_seed(0)
    try:
        model, x = FAMILIES[family](T)
    except AttributeError as e:
        return {"family": family, "attn": attn, "error": f"not in transformers {T.__version__} ({e})"}
    model.config._attn_implementation = attn
    t0 = time.perf_counter()
    tm = translator.translate(model.eval(), (x,), backend=backend)
    secs = time.perf_counter() - t0
    rows = [r for r in tm.report.rows if not r.layout]
    folded = [r for r in rows if r.where == "folded"]
    torch_rows = [r for r in rows if r.where == "pytorch" and "by design" not in r.detail and r not in folded]
    return {"family": family, "attn": attn, "compute_ops": len(rows),
            "in_flydsl": sum(r.where.startswith("flydsl") for r in rows),
            "in_pytorch": len(torch_rows), "folded": len(folded), "by_design": sum("by design" in r.detail for r in rows),
            "verified": tm.report.verification.passed, "translate_s": round(secs, 1),
            "not_launched": [f"{r.node} ({r.where})" for r in rows if r.where in ("flydsl-reference", "flydsl-op")],
            "left": collections.Counter(r.op.removeprefix("aten.") for r in torch_rows).most_common()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--attn", default="eager,sdpa")
    a = ap.parse_args(argv)
    print("| family | attn | compute ops | in FlyDSL ops | in PyTorch per forward | folded (once per shape) "
          "| by design | verified | ops left in PyTorch per forward |")
    print("|---|---|---|---|---|---|---|---|---|")
    for fam in a.families.split(","):
        for attn in a.attn.split(","):
            try:
                r = measure(fam, attn)
            except Exception as e:  # noqa: BLE001 — a table row, not a crash: say what failed
                r = {"family": fam, "attn": attn, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
            if "error" in r:
                print(f"| {fam} | {attn} | — | — | — | — | — | — | {r['error']} |")
                continue
            left = ", ".join(f"{op} x{n}" for op, n in r["left"])
            print(f"| {fam} | {attn} | {r['compute_ops']} | {r['in_flydsl']} | {r['in_pytorch']} | {r['folded']} "
                  f"| {r['by_design']} "
                  f"| {r['verified']} | {left} |", flush=True)


if __name__ == "__main__":
    main()
