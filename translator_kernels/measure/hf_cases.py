"""The small Hugging Face models the coverage audit translates (bench.hf_coverage) and the cost-model
tests capture: FAMILIES (one per architecture family), AUDIT (more families, encoders, seq2seq,
vision and audio) and `audit_case`, which builds a case's (model, positional inputs), with an
option after "+" (mask, bf16, b1). Each entry builds its model from the installed transformers
(tiny configs: one or two layers, hidden 64, vocabulary 128), on CPU.
"""

from __future__ import annotations

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
