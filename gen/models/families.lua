-- The model families by plan name (model.family): each module's
-- units(ctx, model, d) gives the fully_shard units in forward order, the
-- root last (d: the plan's dims, which the MoE families' expert placement
-- reads); the decoder families also config(ctx, model) (their numbers:
-- n_layers, enable_weight_tying, ...), which the pipeline's stage split
-- reads (gen/parallel/pp_report.lua). gen/plan.lua builds from it.
return { llama = require("gen.models.llama"), generic = require("gen.models.generic"),
         qwen3 = require("gen.models.qwen3"),
         mixtral = require("gen.models.mixtral"), qwen3_moe = require("gen.models.qwen3_moe"),
         deepseek_v3 = require("gen.models.deepseek_v3"), gpt_oss = require("gen.models.gpt_oss") }
