-- Issue 37, item 1: every model's audit complete. MoE plans' model FLOPs
-- per token (torchtitan 0.3's get_moe_model_nparams_and_flops, models/utils.py:
-- active parameters), tokens/s and MFU.
local H = require("helpers")
local plan = require("gen.plan")
local audit = require("gen.audit")
local compute = require("gen.compute")

local T = {}

local function read(path)
  local fh = assert(io.open(path, "rb"))
  local s = fh:read("a")
  fh:close()
  return s
end

local function load(path) return plan.from_source(read(path), path) end

-- Mixtral 8x7B by hand from its config (dim 4096, 32 layers, 32 heads of
-- 128, 8 KV heads, 8 experts of 14336, top_k 2, vocab 32000): torchtitan's
-- active non-embedding parameters and attention term.
function T.mixtral_flops_are_torchtitans_active_parameters()
  local p = load("plans/mixtral8x7b.lua")
  local s = compute.settings(p)
  local D, L, F, E, V = 4096, 32, 14336, 8, 32000
  local per_layer_dense = (32 + 2 * 8) * 128 * D + D * D + 2 * D -- wqkv, wo, the two norms
  local router = E * D
  local experts = 3 * F * D * E
  local dense = L * per_layer_dense + D + V * D -- + norm, lm_head (tok_embeddings left out)
  local active = L * router + L * experts * 2 // E
  local want = 6 * (dense + active) + 6 * L * 32 * (2 * 128) * 4096
  H.eq(compute.model_flops_per_token(p, s), want, "model FLOPs per token")
  local th = audit.analysis(p).throughput
  H.eq(th.model_flops_per_token, want, "the audit's")
  assert(th.tokens_per_s_per_gpu and th.mfu, "tokens/s and MFU")
  -- (the MFU is the figure torchtitan's metrics compute from them)
  local s2 = audit.analysis(p).settings
  assert(math.abs(th.mfu - want * th.tokens_per_s_per_gpu / (s2.gpu_TFLOPS * 1e12)) < 1e-4, "MFU = FLOPs x tps / peak")
  local md = audit.schedule_md(p, "fp")
  assert(md:find("| throughput | [%d,]+ tokens/s per GPU, MFU [%d.]+%% %([%d.e+]+ model FLOPs per token: 6 x active "
    .. "non%-embedding parameters %(top_k 2 of 8 routed experts%)"), "SCHEDULE.md's throughput line")
end

-- Every shipped MoE plan, pipeline included: tokens/s and MFU present.
function T.moe_plans_print_tokens_and_mfu()
  for _, name in ipairs({ "mixtral8x7b", "deepseek_v3", "deepseek_v3_pp" }) do
    local p = load("plans/" .. name .. ".lua")
    local th = audit.analysis(p).throughput
    assert(th.tokens_per_s_per_gpu and th.mfu and th.model_flops_per_token, name .. ": throughput")
    assert(audit.schedule_md(p, "fp"):find("| throughput |", 1, true), name .. ": SCHEDULE.md's throughput line")
  end
  -- DeepSeek V3: head_dims = qk_nope + qk_rope + v (models/deepseek_v3/model.py), active = top_k / num_experts
  local p = load("plans/deepseek_v3.lua")
  local cfg = p.model_config
  local s = compute.settings(p)
  local attn = 6 * cfg.n_layers * cfg.n_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim)
    * s.seq_len
  local nonattn = compute.model_flops_per_token(p, s) - attn
  -- ~37B active parameters (DeepSeek-V3's report: 37B activated of 671B), less the 0.93B embedding
  assert(nonattn / 6 > 35e9 and nonattn / 6 < 38e9, string.format("active non-embedding parameters %.4g", nonattn / 6))
end

-- A generic model: its attention shape given (model.n_heads, head_dim,
-- n_layers), torchtitan's dense formula; not given, the summary's first row
-- says which figures are missing, and no memory verdict is printed without
-- the activations.
function T.generic_models_say_what_is_missing()
  local src = read("plans/fsdp4.lua")
  local p = plan.from_source(src, "plans/fsdp4.lua")
  local md = audit.schedule_md(p, "fp")
  local first = md:match("|%-%-%-|%-%-%-|\n(| [^\n]*)")
  assert(first:find("^| %*%*incomplete%*%* | activations per rank not computed"), first)
  assert(first:find("give model.n_heads, head_dim and n_layers", 1, true), first)
  local mem = md:match("\n| memory | ([^\n]*)")
  assert(mem:find("no verdict", 1, true) and not mem:find("fits", 1, true), mem)
  H.eq(audit.analysis(p).throughput.mfu, nil, "no MFU without the attention shape")
  -- with it: 6 x (params - embedding) + 6 x layers x heads x 2 x head_dim x seq_len
  local shaped = plan.from_source(src:gsub('family = "generic",', 'family = "generic", n_heads = 3, head_dim = 4, '
    .. "n_layers = 3,", 1), "plans/fsdp4.lua")
  local s = compute.settings(shaped)
  local n = 0
  for _, q in ipairs(compute.param_counts(shaped)) do n = n + q[2] end
  H.eq(compute.model_flops_per_token(shaped, s), 6 * (n - 37 * 12) + 6 * 3 * 3 * 8 * s.seq_len,
    "generic FLOPs (root.tok_embeddings, 37 x 12, left out as torchtitan leaves the embedding out)")
  local th = audit.analysis(shaped).throughput
  assert(th.mfu and th.tokens_per_s_per_gpu, "tokens/s and MFU")
  local f2 = audit.schedule_md(shaped, "fp"):match("|%-%-%-|%-%-%-|\n(| [^\n]*)")
  assert(f2:find("activations per rank not computed", 1, true) and not f2:find("MFU not computed", 1, true), f2)
  -- make advise: a generic mesh's "fits" says it counts no activations
  local adv = require("gen.advisor").report(src, "plans/fsdp4.lua")
  assert(adv:find("| yes without activations (the plan's mesh) |", 1, true), adv)
  -- A generic model under TP: its activation collectives have no shape, said so.
  local tp = audit.schedule_md(plan.from_source(read("plans/tp3_uneven.lua"), "plans/tp3_uneven.lua"), "fp")
  assert(tp:match("| %*%*incomplete%*%* | [^\n]*TP's activation collectives not planned: tp = 3"), "tp3_uneven")
end

-- A generic model whose units are decoder blocks of its given attention
-- shape (compute.generic_blocks): priced as the llama family -- each
-- block's bytes llama_acts.block's, the output unit's llama_acts.head's, the
-- blocks' attention FLOPs -- so its memory verdict is said; one weight of
-- another shape, or tp > 1, and it is not (said why in the first row).
local function blocks_src(w2_rows, extra)
  local function layer(b)
    local pre = "layers." .. b .. "."
    local function q(name, shape) return string.format("{ name = %q, shape = { %s } }", pre .. name, shape) end
    return string.format("{ name = %q, params = { %s } }", "layers." .. b, table.concat({
      q("attention.wq.weight", "12, 16"), q("attention.wq.bias", "12"), q("attention.wk.weight", "4, 16"),
      q("attention.wv.weight", "4, 16"), q("attention.wo.weight", "16, 12"), q("feed_forward.w1.weight", "40, 16"),
      q("feed_forward.w2.weight", w2_rows), q("feed_forward.w3.weight", "40, 16"), q("attention_norm.weight", "16"),
      q("ffn_norm.weight", "16") }, ", "))
  end
  return "return { world_size = 4, parallel = { dp_shard = -1 " .. (extra or "") .. " },\n"
    .. "  model = { family = \"generic\", dtype = \"fp32\", seq_len = 64, n_heads = 3, n_kv_heads = 1, head_dim = 4, "
    .. "n_layers = 2, units = {\n"
    .. '    { name = "tok_embeddings", params = { { name = "tok_embeddings.weight", shape = { 40, 16 } } } },\n'
    .. "    " .. layer(0) .. ",\n    " .. layer(1) .. ",\n"
    .. '    { name = "norm_output", params = { { name = "norm.weight", shape = { 16 } }, '
    .. '{ name = "output.weight", shape = { 40, 16 } } } },\n'
    .. '    { name = "root", params = {} } } },\n'
    .. '  training = { activation_checkpointing = "selective", loss_chunks = 1 } }\n'
end

function T.generic_decoder_blocks_are_priced_as_llama()
  local acts = require("gen.models.llama_acts")
  local p = plan.from_source(blocks_src("16, 40"), "blocks.lua")
  local g = compute.generic_blocks(p)
  assert(g, "two decoder blocks found")
  H.eq(g.cfg.dim, 16, "d"); H.eq(g.cfg.hidden, 40, "f"); H.eq(g.cfg.vocab_size, 40, "vocab")
  H.eq(g.head_weight, "output.weight", "the output projection (the embedding a lookup)")
  local s = compute.settings(p)
  local per = compute.units(p, s)
  local e = require("gen.util").DTYPE_BYTES[p.layout.units[1].ag_dtype] -- the compute dtype's bytes
  local b = acts.block(g.cfg, e, 64, "selective", false, 1)
  local h = acts.head(64, e, 16, 40, 1, 1)
  local saved = 0
  for _, r in pairs(per) do saved = saved + r.saved end
  H.eq(saved, 2 * b.saved + h.saved, "two blocks' and the head's saved bytes")
  local m = audit.analysis(p).memory
  assert(m.activations_modeled, "modeled")
  local md = audit.schedule_md(p, "fp")
  assert(not md:find("**incomplete**", 1, true), "complete")
  assert(md:match("\n| memory | [^\n]*: fits, "), "the verdict")
  -- a block's FLOPs: its matmuls and the attention (4 x T x seq x heads x head_dim forward)
  local by = {}
  for _, u in ipairs(p.layout.units) do by[u.name] = per[u.index] end
  local blk = by["layers.0"]
  H.eq(blk.fwd, 2 * (12 * 16 + 2 * 4 * 16 + 16 * 12 + 3 * 40 * 16) * 64 + 4 * 64 * 64 * 3 * 4, "block forward FLOPs")
  H.eq(by.tok_embeddings.fwd, 0, "the embedding: a lookup")
  -- selective: SAC's wk, wo and w3 again, by shape (any names)
  H.eq(blk.recompute, 2 * (4 * 16 + 16 * 12 + 40 * 16) * 64, "selective recompute FLOPs")
  local renamed = plan.from_source(blocks_src("16, 40"):gsub("attention%.w(%a)%.", "self_attn.%1_proj."), "hf.lua")
  local rg = assert(compute.generic_blocks(renamed), "Hugging Face's names: blocks by shape")
  local rper = compute.units(renamed, compute.settings(renamed))
  for _, u in ipairs(renamed.layout.units) do
    if rg.block[u] then
      H.eq(rper[u.index].recompute, blk.recompute, "the same recompute under other names")
      H.eq(rper[u.index].recompute_us, blk.recompute_us, "and its time")
    end
  end
  H.eq(by.norm_output.fwd, 2 * 40 * 16 * 64, "the output projection")
  -- w2 transposed: no longer a Llama block's shapes, so not modeled, and said why
  local bad = plan.from_source(blocks_src("40, 16"), "bad.lua")
  assert(not compute.generic_blocks(bad), "a wrong shape")
  local first = audit.schedule_md(bad, "fp"):match("|%-%-%-|%-%-%-|\n(| [^\n]*)")
  assert(first:find("its units are not 2 decoder blocks", 1, true), first)
  -- torchtitan's fused wqkv [Q + 2kv, d]: found too, with its selective-AC bytes (llama_acts' fused)
  local fsrc = blocks_src("16, 40"):gsub('{ name = "layers%.(%d)%.attention%.wq%.weight", shape = { 12, 16 } }, '
    .. '{ name = "layers%.%d%.attention%.wq%.bias", shape = { 12 } }, { name = "layers%.%d%.attention%.wk%.weight", '
    .. 'shape = { 4, 16 } }, { name = "layers%.%d%.attention%.wv%.weight", shape = { 4, 16 } }',
    '{ name = "layers.%1.attention.qkv_linear.wqkv.weight", shape = { 20, 16 } }')
  local fp = plan.from_source(fsrc, "fused.lua")
  local fg = assert(compute.generic_blocks(fp), "fused blocks found")
  assert(fg.fused, "fused")
  local fb = acts.block(fg.cfg, e, 64, "selective", true, 1)
  local fsaved = 0
  for _, r in pairs(compute.units(fp, compute.settings(fp))) do fsaved = fsaved + r.saved end
  H.eq(fsaved, 2 * fb.saved + h.saved, "fused blocks' selective bytes")
  assert(fb.saved > b.saved, "fused keeps more under selective")
  -- tp > 1 (issue 37): a decoder under torchtitan's Llama names is placed by its Llama plan (biases
  -- as torch's styles place them) and gets its TP collectives and activations; under other names,
  -- with the plan's own placements, where TP shards its activations is not known (said first)
  local function tp_src(names)
    local src = blocks_src("16, 40", ", tp = 2"):gsub('shape = { 12, 16 }', 'shape = { 16, 16 }')
      :gsub('shape = { 12 }', 'shape = { 16 }'):gsub('shape = { 4, 16 }', 'shape = { 8, 16 }')
      :gsub('shape = { 16, 12 }', 'shape = { 16, 16 }')
      :gsub("n_heads = 3, n_kv_heads = 1, head_dim = 4", "n_heads = 4, n_kv_heads = 2, head_dim = 4", 1)
    if names then
      src = src:gsub("attention%.w(%a)%.", "self_attn.%1_proj."):gsub('shape = { 40, 16 } } } },\n    { name = "root"',
        'shape = { 40, 16 }, tp = "colwise" } } },\n    { name = "root"', 1)
    end
    return src
  end
  local tp = plan.from_source(tp_src(false), "tp.lua")
  local tg = assert(compute.generic_blocks(tp), "tp 2 under Llama's names: decoder blocks")
  H.eq(tg.cfg.dim, 16, "full shapes")
  local place, tp_ops = {}, 0
  for _, u in ipairs(tp.layout.units) do
    for _, q in ipairs(u.params) do place[q.name] = q.tp_dim or "R" end
  end
  for _, o in ipairs(tp.ops) do if o.group == "tp" then tp_ops = tp_ops + 1 end end
  H.eq(place["layers.0.attention.wq.weight"], 0, "wq colwise")
  H.eq(place["layers.0.attention.wq.bias"], 0, "its bias Shard(0)")
  H.eq(place["layers.0.attention.wo.weight"], 1, "wo rowwise")
  H.eq(place["layers.0.attention_norm.weight"], "R", "norms replicated")
  H.eq(place["tok_embeddings.weight"], 0, "the embedding on its vocab rows")
  assert(tp_ops > 0, "TP activation collectives")
  assert(audit.analysis(tp).memory.activations_modeled, "activations at tp 2")
  assert(not audit.schedule_md(tp, "fp"):find("**incomplete**", 1, true), "complete at tp 2")
  local other = plan.from_source(tp_src(true), "tp_hf.lua")
  assert(not compute.generic_blocks(other), "tp > 1 under other names")
  first = audit.schedule_md(other, "fp"):match("|%-%-%-|%-%-%-|\n(| [^\n]*)")
  assert(first:find("tp > 1 and its blocks' weights are not named as torchtitan's Llama's", 1, true), first)
  assert(first:find("TP's activation collectives not planned", 1, true), first)
  -- and a setting naming those collectives is refused there, not ignored
  H.plan_fails(tp_src(true):gsub("tp = 2", "tp = 2, sequence_parallel = false", 1), "parallel.sequence_parallel",
    "not a decoder under torchtitan's Llama names")
  -- context parallel likewise: a Llama-named decoder gets its K/V exchange, another generic model is
  -- refused by name
  local function with_cp(src) return src:gsub("tp = 2", "tp = 2, cp = 2", 1):gsub("world_size = 4", "world_size = 8", 1)
    :gsub("seq_len = 64", "seq_len = 256", 1) end
  H.plan_fails(with_cp(tp_src(true)), "parallel.cp", "not a decoder under torchtitan's Llama or decoder names")
  local cpp = plan.from_source(with_cp(tp_src(false)), "ctx.lua")
  local kv = 0
  for _, o in ipairs(cpp.ops) do if o.group == "cp" then kv = kv + 1 end end
  H.eq(kv, 2 * 6, "two blocks: K and V gathered, recomputed (selective) and their gradients reduce-scattered")
  -- under Llama's names it is planned: without sequence parallelism, all-reduces only
  local nosp = plan.from_source(tp_src(false):gsub("tp = 2", "tp = 2, sequence_parallel = false", 1), "nosp.lua")
  for _, o in ipairs(nosp.ops) do
    if o.group == "tp" then assert(o.kind == "tp_all_reduce", "no sequence shards: " .. o.kind) end
  end
end

return T
