-- Qwen3-MoE family: torchtitan 0.3's Qwen3 MoE flavours (models/qwen3):
-- grouped-query attention with q/k RMSNorms over head_dim and an MoE of
-- routed experts in every block, no shared experts (gen/models/moe.lua).
local moe = require("gen.models.moe")

-- torchtitan's qwen3 registry ("30B-A3B", "235B-A22B"; models/qwen3/__init__.py).
return moe.gqa_family({
  name = "qwen3_moe", label = "Qwen3-MoE", qk_norm = true,
  sizes = {
    ["30b-a3b"] = { dim = 2048, n_layers = 48, n_heads = 32, n_kv_heads = 4, head_dim = 128, vocab_size = 151936,
                    moe_hidden_dim = 768, num_experts = 128, top_k = 8 },
    ["235b-a22b"] = { dim = 4096, n_layers = 94, n_heads = 64, n_kv_heads = 4, head_dim = 128, vocab_size = 151936,
                      moe_hidden_dim = 1536, num_experts = 128, top_k = 8 },
  },
})
