-- The composition matrix's commplan side (tests/matrix/test_matrix.py):
-- every combination of degrees 1 and 2 over (dp_replicate, dp_shard, cp,
-- tp, pp, ep) for each family, on that family's tiny model, planned by the
-- generator in one process (gen/plan.lua with every proof it runs).
--
--   lua5.4 tests/matrix/matrix_plans.lua [OUTDIR] <cases.txt
--
-- stdin: one case a line, "id family dp_replicate dp_shard cp tp pp ep".
-- stdout: one JSON object a line, in input order: { id, ok, msg (the plan
-- error, one line), field (the field it names) }. With OUTDIR, the plan file
-- of every case the generator plans is written to OUTDIR/<id>.lua (the
-- simulation sample builds and runs them).
local script_dir = arg and arg[0] and arg[0]:match("^(.*)/tests/matrix/[^/]*$") or "."
package.path = script_dir .. "/?.lua;" .. package.path

local plan = require("gen.plan")
local json = require("gen.json")
local util = require("gen.util")

-- The tiny models, as tests/matrix/test_matrix.py builds them in torchtitan
-- (same numbers): each divisible by 2 wherever a degree of 2 splits it
-- (heads, kv heads, experts, vocab), two or more layers for two stages.
local MODELS = {
  llama = 'family = "llama", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 256, '
    .. 'multiple_of = 16, ffn_dim_multiplier = 1.3',
  qwen3 = 'family = "qwen3", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, head_dim = 16, '
    .. 'hidden_dim = 96, vocab_size = 256',
  mixtral = 'family = "mixtral", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 256, '
    .. 'moe_hidden_dim = 48, num_experts = 4, top_k = 2',
  qwen3_moe = 'family = "qwen3_moe", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, head_dim = 16, '
    .. 'vocab_size = 256, moe_hidden_dim = 48, num_experts = 4, top_k = 2',
  deepseek_v3 = 'family = "deepseek_v3", dim = 64, n_layers = 3, n_dense_layers = 1, n_heads = 4, '
    .. 'vocab_size = 256, q_lora_rank = 16, kv_lora_rank = 32, qk_nope_head_dim = 8, qk_rope_head_dim = 8, '
    .. 'v_head_dim = 8, dense_hidden_dim = 96, moe_hidden_dim = 32, num_experts = 4, num_shared_experts = 1, '
    .. 'top_k = 2',
}
-- Sequence length: 2 x cp chunks for CP's head-tail balancer and cp x 128
-- for flex's CP block mask; two sequences per rank (two microbatches of
-- one under PP).
local SEQ, BATCH = 256, 2

local DEGREES = { "dp_replicate", "dp_shard", "cp", "tp", "pp", "ep" }

local function source(family, deg)
  local world = deg.dp_replicate * deg.dp_shard * deg.cp * deg.tp * deg.pp
  local par = {}
  for _, k in ipairs(DEGREES) do par[#par + 1] = string.format("%s = %d", k, deg[k]) end
  return string.format("-- composition matrix: %s at %s\nreturn {\n  world_size = %d,\n  parallel = { %s },\n"
    .. "  model = { %s, seq_len = %d },\n  fsdp = { param_dtype = \"bf16\", reduce_dtype = \"fp32\" },\n"
    .. "  training = { local_batch_size = %d, loss_chunks = 1 },\n}\n",
    family, table.concat(par, ", "), world, table.concat(par, ", "), MODELS[family], SEQ, BATCH)
end

local function main()
  local outdir = arg[1]
  for line in io.lines() do
    local f = {}
    for w in line:gmatch("%S+") do f[#f + 1] = w end
    local id, family = f[1], f[2]
    if not MODELS[family] then error("matrix_plans.lua: unknown family " .. tostring(family), 0) end
    local deg = {}
    for i, k in ipairs(DEGREES) do deg[k] = assert(math.tointeger(tonumber(f[i + 2])), line) end
    local src = source(family, deg)
    local path = string.format("matrix_%s.lua", id)
    local ok, err = pcall(plan.from_source, src, path)
    local out = { "id", id, "ok", ok }
    if not ok then
      local msg = util.is_plan_error(err) and err.msg or ("internal: " .. tostring(err))
      out[#out + 1] = "msg"; out[#out + 1] = msg
      out[#out + 1] = "field"; out[#out + 1] = msg:match("^[^:]*:%d+: ([%w_%.%[%]]+):") or ""
    elseif outdir then
      local fh = assert(io.open(string.format("%s/%s.lua", outdir, id), "w"))
      fh:write(src)
      fh:close()
    end
    io.write(json.encode(json.object(out)), "\n")
    io.flush()
  end
end

main()
