"""How many ops of a HuggingFace model's forward stay in PyTorch after translation.

    python -m bench.hf_coverage [--families gpt2,llama,...] [--attn eager,sdpa]
    python -m bench.hf_coverage --audit [--cases phi3,bloom+mask,...] [--attn preferred|eager,sdpa] [--backend flysim]

Each family is built from a tiny random config (no download), translated with
backend="reference" (what runs where does not depend on the backend; verification runs too),
and the report's rows are counted: compute ops in FlyDSL ops, compute ops left in PyTorch
(kept by design — conv / pool / batchnorm — counted apart), and which aten ops those are.
Ops folded at specialization (shape-only: masks, position ids) run once per input shape,
not per forward, and are counted apart. Layout ops (views, reshapes) carry no arithmetic and
are not counted. Families the installed
transformers lacks are listed as such.

--audit translates the families and options FAMILIES does not cover (AUDIT: more decoders, encoders,
vision and audio models, MoE; "+mask" a padding attention mask, "+bf16" the model and its float
inputs in bfloat16, "+b1" batch 1) as a new user would (translate(model, inputs), default precision)
and prints one row each: whether translate returned (its seconds; "static shapes" where the capture
kept no batch / sequence dim dynamic) or the error it raised (a TranslatorError is the clear kind,
anything else is a crash), verification against eager (the worst output's max abs
error against its bound), the share of compute ops per forward on FlyDSL kernels (recorded launches
under flysim) and of the FLOPs of our cost model, and the reasons the report gives for what stayed
in PyTorch. docs/hf-audit.md holds a measured table and the command.
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


def _seq2seq(T, cfg_name, model_name, **kw):
    cfg = getattr(T, cfg_name)(vocab_size=V, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, **kw)
    return getattr(T, model_name)(cfg), torch.randint(3, V, (2, 8))


_DEC = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128)
_IMG = dict(image_size=16, patch_size=8, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
            intermediate_size=128)
AUDIT = {  # (model, first input[, the inputs after it]); options (audit_case) add a mask or change dtypes
    "phi3": lambda T: _lm(T, "Phi3Config", "Phi3ForCausalLM", **_DEC, num_key_value_heads=2, pad_token_id=0),
    "gemma2": lambda T: _lm(T, "Gemma2Config", "Gemma2ForCausalLM", **_DEC, num_key_value_heads=2, head_dim=16),
    "gemma3_text": lambda T: _lm(T, "Gemma3TextConfig", "Gemma3ForCausalLM", **_DEC, num_key_value_heads=2,
                                 head_dim=16),
    "stablelm": lambda T: _lm(T, "StableLmConfig", "StableLmForCausalLM", **_DEC, num_key_value_heads=2),
    "falcon": lambda T: _lm(T, "FalconConfig", "FalconForCausalLM", hidden_size=64, num_hidden_layers=1,
                            num_attention_heads=4),
    "falcon_gqa": lambda T: _lm(T, "FalconConfig", "FalconForCausalLM", hidden_size=64, num_hidden_layers=1,
                                num_attention_heads=4, new_decoder_architecture=True, num_kv_heads=2),
    "gptj": lambda T: _lm(T, "GPTJConfig", "GPTJForCausalLM", n_embd=64, n_layer=1, n_head=4, rotary_dim=8,
                          n_positions=64),
    "codegen": lambda T: _lm(T, "CodeGenConfig", "CodeGenForCausalLM", n_embd=64, n_layer=1, n_head=4, rotary_dim=8,
                             n_positions=64, n_ctx=64),
    "gpt_neo": lambda T: _lm(T, "GPTNeoConfig", "GPTNeoForCausalLM", hidden_size=64, num_layers=2, num_heads=4,
                             attention_types=[[["global", "local"], 1]], window_size=4, max_position_embeddings=64),
    "bloom": lambda T: _lm(T, "BloomConfig", "BloomForCausalLM", hidden_size=64, n_layer=1, n_head=4),
    "mpt": lambda T: _lm(T, "MptConfig", "MptForCausalLM", d_model=64, n_layers=1, n_heads=4, expansion_ratio=2,
                         max_seq_len=64),
    "gpt_bigcode": lambda T: _lm(T, "GPTBigCodeConfig", "GPTBigCodeForCausalLM", n_embd=64, n_layer=1, n_head=4,
                                 n_positions=64),
    "starcoder2": lambda T: _lm(T, "Starcoder2Config", "Starcoder2ForCausalLM", **_DEC, num_key_value_heads=2),
    "cohere": lambda T: _lm(T, "CohereConfig", "CohereForCausalLM", **_DEC, num_key_value_heads=2),
    "granite": lambda T: _lm(T, "GraniteConfig", "GraniteForCausalLM", **_DEC, num_key_value_heads=2),
    "mixtral": lambda T: _lm(T, "MixtralConfig", "MixtralForCausalLM", **_DEC, num_key_value_heads=2,
                             num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": lambda T: _lm(T, "Qwen2MoeConfig", "Qwen2MoeForCausalLM", **_DEC, num_key_value_heads=2,
                               num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                               shared_expert_intermediate_size=64),
    "roberta": lambda T: (T.RobertaModel(T.RobertaConfig(vocab_size=V, **_DEC), add_pooling_layer=False),
                          torch.randint(2, V, (2, 8))),
    "xlm_roberta_cls": lambda T: (T.XLMRobertaForSequenceClassification(T.XLMRobertaConfig(vocab_size=V, **_DEC)),
                                  torch.randint(2, V, (2, 8))),
    "distilbert": lambda T: (T.DistilBertModel(T.DistilBertConfig(vocab_size=V, dim=64, n_layers=1, n_heads=4,
                                                                  hidden_dim=128)), torch.randint(0, V, (2, 8))),
    "albert": lambda T: (T.AlbertModel(T.AlbertConfig(vocab_size=V, embedding_size=32, **_DEC),
                                       add_pooling_layer=False), torch.randint(0, V, (2, 8))),
    "electra_mlm": lambda T: (T.ElectraForMaskedLM(T.ElectraConfig(vocab_size=V, embedding_size=32, **_DEC)),
                              torch.randint(0, V, (2, 8))),
    "deberta_v2": lambda T: (T.DebertaV2Model(T.DebertaV2Config(vocab_size=V, **_DEC, max_position_embeddings=64)),
                             torch.randint(0, V, (2, 8))),
    "modernbert": lambda T: (T.ModernBertModel(T.ModernBertConfig(vocab_size=V, pad_token_id=0, bos_token_id=1,
                                                                  eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                                                  **_DEC)), torch.randint(3, V, (2, 8))),
    "mobilebert": lambda T: (T.MobileBertModel(T.MobileBertConfig(vocab_size=V, **_DEC, embedding_size=32,
                                                                  intra_bottleneck_size=32, true_hidden_size=32),
                                               add_pooling_layer=False), torch.randint(0, V, (2, 8))),
    "bart": lambda T: _seq2seq(T, "BartConfig", "BartModel", d_model=64, encoder_layers=1, decoder_layers=1,
                               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                               decoder_ffn_dim=128),
    "t5_seq2seq": lambda T: (T.T5ForConditionalGeneration(T.T5Config(vocab_size=V, d_model=64, d_kv=16, d_ff=128,
                                                                      num_layers=1, num_heads=4)),
                             torch.randint(0, V, (2, 8)), (None, torch.randint(0, V, (2, 5)))),  # decoder_input_ids
    "deit": lambda T: (T.DeiTModel(T.DeiTConfig(**_IMG), add_pooling_layer=False), torch.randn(2, 3, 16, 16)),
    "beit": lambda T: (T.BeitModel(T.BeitConfig(**_IMG, use_relative_position_bias=True), add_pooling_layer=False),
                       torch.randn(2, 3, 16, 16)),
    "dinov2": lambda T: (T.Dinov2Model(T.Dinov2Config(image_size=16, patch_size=8, hidden_size=64, num_hidden_layers=1,
                                                      num_attention_heads=4, mlp_ratio=2)), torch.randn(2, 3, 16, 16)),
    "swin": lambda T: (T.SwinModel(T.SwinConfig(image_size=32, patch_size=4, embed_dim=32, depths=[1, 1],
                                                num_heads=[2, 4], window_size=4)), torch.randn(2, 3, 32, 32)),
    "convnext": lambda T: (T.ConvNextModel(T.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)),
                           torch.randn(2, 3, 32, 32)),
    "clip_text": lambda T: (T.CLIPTextModel(T.CLIPTextConfig(vocab_size=V, **_DEC, max_position_embeddings=64)),
                            torch.randint(0, V, (2, 8))),
    "clip_vision": lambda T: (T.CLIPVisionModel(T.CLIPVisionConfig(**_IMG)), torch.randn(2, 3, 16, 16)),
    "siglip_vision": lambda T: (T.SiglipVisionModel(T.SiglipVisionConfig(**_IMG)), torch.randn(2, 3, 16, 16)),
    "whisper_encoder": lambda T: (T.WhisperModel(T.WhisperConfig(
        vocab_size=V, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, d_model=64,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=8)).get_encoder(),
        torch.randn(2, 16, 16)),
    "wav2vec2": lambda T: (T.Wav2Vec2Model(T.Wav2Vec2Config(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128, conv_dim=(16, 16),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)),
        torch.randn(2, 400)),
}


def _padding_mask(x):
    mask = torch.ones(x.shape[:2], dtype=torch.long)
    mask[0, -3:] = 0  # the first sequence padded (right padding)
    return mask


def audit_case(case: str):
    """(model, positional inputs) of an AUDIT case: `family` or `family+option` (mask, bf16, b1)."""
    import inspect

    import transformers as T

    family, _, option = case.partition("+")
    model, x, *rest = AUDIT[family](T) if family in AUDIT else FAMILIES[family](T)
    if option == "b1":
        x = x[:1]
    if option == "bf16":
        model = model.to(torch.bfloat16)
        x = x.bfloat16() if x.is_floating_point() else x
    inputs = (x, *(rest[0] if rest else ()))
    if option == "mask":  # as a keyword the model takes it; translate() takes positional inputs
        params = list(inspect.signature(model.forward).parameters)
        at = params.index("attention_mask")
        inputs = (x, *([None] * (at - 1)), _padding_mask(x))
    return model, inputs


AUDIT_CASES = [*AUDIT, *(f"{f}+mask" for f in ("phi3", "gemma2", "bloom", "falcon", "roberta", "distilbert", "bart",
                                              "clip_text", "llama", "bert")),
               *(f"{f}+bf16" for f in ("phi3", "gemma2", "roberta", "deit", "llama")), "llama+b1", "gpt2+b1"]


def audit(case: str, attn: str, backend: str = "flysim") -> dict:
    """One audit row: built as a new user would, translated with the defaults, what happened."""
    from translator import TranslatorError, translate

    torch.manual_seed(0)
    model, inputs = audit_case(case)
    if attn == "preferred":  # sdpa where the class has it, else eager
        attn = "sdpa" if type(model)._supports_sdpa else "eager"
    if attn == "sdpa" and not type(model)._supports_sdpa:
        return {"case": case, "attn": attn, "skip": f"transformers has no sdpa attention for {type(model).__name__}"}
    model.config._attn_implementation = attn
    t0 = time.perf_counter()
    try:
        tm = translate(model.eval(), inputs, backend=backend)
    except TranslatorError as e:
        return {"case": case, "attn": attn, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    except Exception as e:  # noqa: BLE001 — a crash is what the audit looks for: a row, not a stack trace
        return {"case": case, "attn": attn, "crash": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    r, v = tm.report, tm.report.verification
    rows = [x for x in r.rows if not x.layout and x.where != "folded"]
    worst = max(v.outputs, key=lambda c: c.max_abs / max(c.atol, 1e-30), default=None)
    s = r.summary()
    reasons = collections.Counter(f"{x.op.removeprefix('aten.')}: {x.detail}" for x in rows if x.where == "pytorch")
    return {"case": case, "attn": attn, "verified": v.passed, "secs": round(time.perf_counter() - t0, 1),
            "dynamic": bool(r.dynamic_dims),
            "max_abs": worst.max_abs if worst else None, "atol": worst.atol if worst else None,
            "on_kernels": sum(x.where == "flydsl-kernel" for x in rows), "compute_ops": len(rows),
            "in_flydsl_ops": sum(x.where.startswith("flydsl") for x in rows),
            "kernel_flop_share": s["flydsl_kernel_flop_share"], "flop_share": s["flydsl_flop_share"],
            "not_launched": [x.node for x in rows if x.where in ("flydsl-reference", "flydsl-op")],
            "reasons": reasons.most_common(),
            "attention_misses": sorted({_attention_miss(x) for x in rows if x.where != "pytorch"} - {None})}


def _attention_miss(row):
    """Why an attention op (or the softmax of a hand-written one) runs outside flydsl.attention, or None."""
    if "not taken by attention: " in row.detail:
        return row.detail.split("not taken by attention: ")[1].split(" — ")[0]
    if row.op in ("aten.softmax", "aten._softmax", "aten.scaled_dot_product_attention") \
            and not row.detail.startswith("flydsl.attention"):
        return f"{row.op} in {row.detail.split(' — ')[0]}"
    return None


def audit_table(cases, attns, backend="flysim"):
    print("| case | attn | translate | verified (max abs err / bound) | compute ops on FlyDSL kernels "
          "| FLOPs on FlyDSL kernels | what stays in PyTorch, and why (the report's words) |")
    print("|---|---|---|---|---|---|---|")
    for case in cases:
        for attn in attns:
            r = audit(case, attn, backend)
            if "skip" in r or "error" in r or "crash" in r:
                what = "n/a" if "skip" in r else "error" if "error" in r else "CRASH"
                print(f"| {case} | {r['attn']} | {what} | — | — | — | {r.get('skip') or r.get('error') or r['crash']} |",
                      flush=True)
                continue
            ver = f"{'yes' if r['verified'] else 'NO'} ({r['max_abs']:.2g} / {r['atol']:.2g})"
            why = "; ".join([*(f"{k}{f' x{n}' if n > 1 else ''}" for k, n in r["reasons"]),
                             *(f"(in FlyDSL ops, attention not fused: {m})" for m in r["attention_misses"])]) or "—"
            kern, share = f"{r['on_kernels']}/{r['compute_ops']}", f"{r['kernel_flop_share']:.1%}"
            if backend == "reference":  # no kernel runs: what the FlyDSL ops took
                kern, share = f"{r['in_flydsl_ops']}/{r['compute_ops']} in FlyDSL ops", f"{r['flop_share']:.1%} (ops)"
            shapes = "" if r["dynamic"] else "; static shapes"
            print(f"| {case} | {r['attn']} | ok ({r['secs']} s{shapes}) | {ver} | {kern} | {share} "
                  f"| {why} |", flush=True)


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
    ap.add_argument("--audit", action="store_true", help="translate the AUDIT cases, one row each")
    ap.add_argument("--cases", default=",".join(AUDIT_CASES))
    ap.add_argument("--backend", default="flysim")
    a = ap.parse_args(argv)
    if a.audit:
        return audit_table(a.cases.split(","), a.attn.split(","), a.backend)
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
