"""Published config.json files of the 2026 model families (issue 38), as the hub serves them: the fields that size
the model and those transformers reads to build it. Sources: huggingface.co/openai/gpt-oss-120b (and -20b),
deepseek-ai/DeepSeek-R1 (the same architecture as DeepSeek-V3), meta-llama/Llama-4-Scout-17B-16E (its text_config,
model_type llama4_text), Qwen/Qwen3-8B, Qwen/Qwen3-30B-A3B."""

from __future__ import annotations

GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "eos_token_id": 200002,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
    "initializer_range": 0.02, "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 36, "num_key_value_heads": 8, "num_local_experts": 128, "output_router_logits": False,
    "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                            "original_max_position_embeddings": 4096, "rope_type": "yarn",
                                            "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088}
GPT_OSS_20B = {**GPT_OSS_120B, "num_hidden_layers": 24, "num_local_experts": 32,
               "layer_types": ["sliding_attention", "full_attention"] * 12}
DEEPSEEK_R1 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0,
    "eos_token_id": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
    "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                            "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
    "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "transformers_version": "4.46.3",
    "use_cache": True, "v_head_dim": 128, "vocab_size": 129280}
LLAMA4_SCOUT = {
    "architectures": ["Llama4ForCausalLM"], "attention_bias": False, "attention_chunk_size": 8192,
    "attention_dropout": 0.0, "attn_scale": 0.1, "attn_temperature_tuning": 4, "bos_token_id": 200000,
    "eos_token_id": [200001, 200007, 200008], "floor_scale": 8192, "for_llm_compressor": False, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02, "interleave_moe_layer_step": 1,
    "intermediate_size": 8192, "intermediate_size_mlp": 16384, "max_position_embeddings": 262144,
    "model_type": "llama4_text", "moe_layers": list(range(48)), "no_rope_layers": [1, 1, 1, 0] * 12,
    "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
    "num_local_experts": 16, "output_router_logits": False, "pad_token_id": 200018, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "torch_dtype": "bfloat16",
    "use_cache": True, "use_qk_norm": True, "vocab_size": 202048, "tie_word_embeddings": False}
# Llama 4 Maverick (meta-llama/Llama-4-Maverick-17B-128E-Instruct's text_config, as NVIDIA/TensorRT-LLM's tests hold it:
# LLAMA_4_MAVERICK_TWO_LAYER_CONFIG, "Llama4 Maverick config but with only 2 layers" of 48): Scout's attention, 128
# experts in every other layer (interleave_moe_layer_step 2: transformers makes layers 1, 3, ... 47 MoE, the others
# dense MLPs of intermediate_size_mlp), no QK norm, no rope scaling, 1M positions
LLAMA4_MAVERICK = {**{k: v for k, v in LLAMA4_SCOUT.items() if k != "moe_layers"}, "interleave_moe_layer_step": 2,
                   "num_local_experts": 128, "use_qk_norm": False, "max_position_embeddings": 1048576,
                   "rope_scaling": None}
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936}
FAMILIES = {"gpt_oss": GPT_OSS_120B, "deepseek_v3": DEEPSEEK_R1, "llama4_text": LLAMA4_SCOUT, "qwen3": QWEN3_8B,
            "qwen3_moe": QWEN3_30B_A3B, "llama4_maverick": LLAMA4_MAVERICK}


def shallow(d: dict, layers: int) -> dict:
    """``d`` with its first ``layers`` layers (the per-layer lists cut to match); the widths kept."""
    out = {**d, "num_hidden_layers": layers}
    for k in ("layer_types", "moe_layers", "no_rope_layers"):
        if k in d:
            out[k] = [x for x in d[k] if x < layers] if k == "moe_layers" else d[k][:layers]
    if "first_k_dense_replace" in d:
        out["first_k_dense_replace"] = 1  # one dense layer, then MoE layers
    return out
