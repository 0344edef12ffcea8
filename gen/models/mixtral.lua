-- Mixtral-like family: grouped-query attention and an MoE of num_experts
-- routed experts (top_k per token, no shared experts) in every block, with
-- torchtitan 0.3's names, order and wrapping (gen/models/moe.lua: its
-- Qwen3 MoE decoder without q/k norms; torchtitan has no Mixtral model).
local moe = require("gen.models.moe")

-- Mistral AI's published Mixtral configs (config.json of
-- mistralai/Mixtral-8x7B-v0.1 and Mixtral-8x22B-v0.1): intermediate_size is
-- each expert's hidden size.
return moe.gqa_family({
  name = "mixtral", label = "Mixtral", qk_norm = false,
  sizes = {
    ["8x7b"] = { dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 8, vocab_size = 32000, moe_hidden_dim = 14336,
                 num_experts = 8, top_k = 2 },
    ["8x22b"] = { dim = 6144, n_layers = 56, n_heads = 48, n_kv_heads = 8, vocab_size = 32000, moe_hidden_dim = 16384,
                  num_experts = 8, top_k = 2 },
  },
})
