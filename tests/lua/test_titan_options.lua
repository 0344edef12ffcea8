-- Issue 41: torchtitan 0.3's job-config options as plan fields (docs/plan-files.md's torchtitan table).
-- fsdp.reshard_after_forward_policy is parallelism.fsdp_reshard_after_forward (config/configs.py:136),
-- resolved by distributed/fsdp.py:54-77 and applied to every unit at :183-204.
local H = require("helpers")
local function audit_text(p)
  local audit = require("gen.audit")
  return audit.schedule_md(p, audit.fingerprint(p))
end
local plan = require("gen.plan")
local T = {}

local function tiny(family, fsdp, extra)
  local model = ({
    llama = 'family = "llama", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 250, '
      .. 'multiple_of = 16, seq_len = 128',
    qwen3 = 'family = "qwen3", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 256, '
      .. 'head_dim = 16, hidden_dim = 96, seq_len = 128',
    qwen3_tied = 'family = "qwen3", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 256, '
      .. 'head_dim = 16, hidden_dim = 96, seq_len = 128, enable_weight_tying = true',
    mixtral = 'family = "mixtral", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 256, '
      .. 'moe_hidden_dim = 32, num_experts = 4, top_k = 2, seq_len = 128',
    deepseek_v3 = 'family = "deepseek_v3", dim = 32, n_layers = 3, n_dense_layers = 1, n_heads = 2, '
      .. 'vocab_size = 40, q_lora_rank = 8, kv_lora_rank = 8, qk_nope_head_dim = 4, qk_rope_head_dim = 4, '
      .. 'v_head_dim = 4, dense_hidden_dim = 24, moe_hidden_dim = 8, num_experts = 2, num_shared_experts = 1, '
      .. 'top_k = 1, seq_len = 64',
  })[family]
  return string.format('return { world_size = 4, parallel = { dp_shard = 4 }, model = { %s }, '
    .. 'fsdp = { %s }, training = { loss_chunks = 1 }%s }', model, fsdp, extra or "")
end

-- per unit name: reshard_after_forward as laid out; and the step's all-gathers per phase
local function facts(src)
  local p = plan.from_source(src, "t.lua")
  local raf, ag = {}, { forward = {}, backward = {} }
  for _, u in ipairs(p.layout.units) do raf[u.name] = u.reshard_after_forward end
  for _, o in ipairs(p.ops) do
    if o.kind == "all_gather" then
      local n = p.layout.units[o.unit + 1].name
      ag[o.phase][n] = (ag[o.phase][n] or 0) + 1
    end
  end
  return raf, ag, p
end

local HEAD = { llama = "norm_output", qwen3 = "norm_lm_head", qwen3_tied = "tok_embeddings_norm_lm_head",
               mixtral = "norm_lm_head", deepseek_v3 = "norm_lm_head" }

-- Every family: "default" keeps [norm, lm_head] through the forward (distributed/fsdp.py:196-204:
-- reshard_after_forward = policy == "always"), so its backward gathers nothing; "always" reshards it
-- and the backward gathers it again (before any block's); "never" keeps every unit.
function T.policy_in_every_family()
  for fam, head in pairs(HEAD) do
    local raf, ag = facts(tiny(fam, ""))
    H.eq(raf[head], false, fam .. " default keeps " .. head)
    H.eq(ag.backward[head], nil, fam .. " default: no backward gather of " .. head)
    H.eq(raf["layers.0"], true, fam .. " default reshards the blocks")
    local raf_default_step = ag
    raf, ag = facts(tiny(fam, 'reshard_after_forward_policy = "always"'))
    H.eq(raf[head], true, fam .. " always reshards " .. head)
    H.eq(ag.backward[head], 1, fam .. " always: the backward gathers " .. head .. " again")
    H.eq(ag.backward["layers.0"], raf_default_step.backward["layers.0"], fam .. " blocks as default")
    raf, ag = facts(tiny(fam, 'reshard_after_forward_policy = "never"'))
    for n, v in pairs(raf) do H.eq(v, false, fam .. " never keeps " .. n) end
    H.eq(next(ag.backward), nil, fam .. " never: the backward gathers nothing")
    -- "default" given is the plan without it, byte for byte in the step
    local _, _, p1 = facts(tiny(fam, ""))
    local _, _, p2 = facts(tiny(fam, 'reshard_after_forward_policy = "default"'))
    H.eq(#p1.ops, #p2.ops, fam .. " default as given")
  end
end

-- The backward's order under "always" (torch 2.15 FSDP2: the head's pre-backward gathers it first,
-- then prefetches the last block): the head's all-gather is the backward's first collective.
function T.always_orders_the_head_gather_first_in_backward()
  local _, _, p = facts(tiny("llama", 'reshard_after_forward_policy = "always"'))
  local first
  for _, o in ipairs(p.ops) do
    if o.phase == "backward" and o.kind == "all_gather" then first = p.layout.units[o.unit + 1].name; break end
  end
  H.eq(first, "norm_output")
end

-- plan.json names the policy where it is not "default" and matches the schema; the memory verdict's fix
-- for a plan that keeps everything names the policy
function T.policy_in_plan_json()
  local json = require("gen.json")
  local audit = require("gen.audit")
  local jsonschema = require("gen.jsonschema")
  local schema = json.decode(H.read("docs/plan-json.schema.json"))
  for pol, want in pairs({ always = "always", never = "never", default = json.null }) do
    local p = plan.from_source(tiny("llama", string.format("reshard_after_forward_policy = %q", pol)), "t.lua")
    local doc = json.decode(audit.json(p, audit.fingerprint(p)))
    H.eq(doc.fsdp.reshard_after_forward_policy or json.null, want, pol)
    H.eq(doc.fsdp.reshard_after_forward, pol == "always" or (pol == "default" and true) or false, pol)
    local err = jsonschema.validate(doc, schema)
    if err then error(pol .. ": " .. err) end
  end
end

function T.policy_refusals()
  H.plan_fails(tiny("llama", 'reshard_after_forward_policy = "always", reshard_after_forward = true'),
    "fsdp.reshard_after_forward", "reshard_after_forward_policy", "remove one")
  H.plan_fails(tiny("llama", 'reshard_after_forward_policy = "sometimes"'), "fsdp.reshard_after_forward_policy")
  local src = H.generic(2, "{ dp_shard = 2 }", { { "l0", { { "a", { 4 } } } }, { "root", { { "c", { 4 } } } } },
    '{ reshard_after_forward_policy = "always" }')
  src = src:gsub('{ name = "l0",', '{ name = "l0", reshard_after_forward = false,')
  H.plan_fails(src, "model.units[1].reshard_after_forward", "fsdp.py:183-204")
  -- under PP "always" plans (gen/parallel/pp_sequence.lua; tests/lua/test_pp_tables.lua), a bare
  -- reshard_after_forward = true is pointed at the policy
  local pp2 = ', pipeline = { schedule = "1F1B", microbatches = 2 }'
  local function pp(s) return (s:gsub("dp_shard = 4", "dp_shard = 2, pp = 2")
    :gsub("loss_chunks = 1", "loss_chunks = 1, local_batch_size = 2")) end
  plan.from_source(pp(tiny("llama", 'reshard_after_forward_policy = "always"', pp2)), "t.lua")
  H.plan_fails(pp(tiny("llama", 'reshard_after_forward = true', pp2)),
    "fsdp.reshard_after_forward", "reshard_after_forward_policy = \"always\"")
end

-- training.optimizer_implementation = "fused_opt_states_bf16" (torchtitan's optimizer.implementation,
-- components/optimizer/optimizer.py:332-371): AdamW's two moments in bf16 whatever the parameters' dtype.
-- Memory per rank: fp32 parameters' moments 8 -> 4 bytes an element; the wire: nothing (the same ops).
local function doc_of(src)
  local json = require("gen.json")
  local audit = require("gen.audit")
  local p = plan.from_source(src, "t.lua")
  return p, json.decode(audit.json(p, audit.fingerprint(p)))
end

function T.bf16_optimizer_states()
  local base = tiny("llama", 'param_dtype = "bf16", reduce_dtype = "fp32"')
  local with = base:gsub("training = { loss_chunks = 1 }",
    'training = { loss_chunks = 1, optimizer_implementation = "fused_opt_states_bf16" }')
  local p0, d0 = doc_of(base)
  local p1, d1 = doc_of(with)
  local sharded = 0 -- elements per rank, sharded (llama_tiny's fp32 parameters)
  for _, u in ipairs(p1.layout.units) do sharded = sharded + u.total end
  H.eq(d0.audit.memory.optimizer_bytes, 2 * 4 * sharded, "fp32 moments")
  H.eq(d1.audit.memory.optimizer_bytes, 2 * 2 * sharded, "bf16 moments")
  H.eq(d1.audit.memory.total_bytes, d0.audit.memory.total_bytes - 4 * sharded + (d1.memory.arena_bytes
    - d0.memory.arena_bytes), "total drops by the moments' halves")
  H.eq(d1.audit.memory.params_bytes, d0.audit.memory.params_bytes, "parameters unchanged")
  -- nothing on the wire: the same collectives, op for op
  H.eq(#p1.ops, #p0.ops, "ops")
  for i, o in ipairs(p0.ops) do
    H.eq(p1.ops[i].kind .. ":" .. tostring(p1.ops[i].count), o.kind .. ":" .. tostring(o.count), "op " .. i)
  end
  -- the optimizer step reads and writes half the moment bytes (the fused kernel at HBM speed)
  local compute = require("gen.compute")
  local s0 = compute.settings({ training = { optimizer = "adamw" }, topology = {}, model = {} })
  local s1 = compute.settings({ training = { optimizer = "adamw", optimizer_implementation = "fused_opt_states_bf16" },
    topology = {}, model = {} })
  H.eq(compute.moment_bytes(s0, 4), 4)
  H.eq(compute.moment_bytes(s1, 4), 2)
  H.eq(compute.optimizer_state_bytes(s1, 400, 100), 400, "100 elements: 2 moments x 2 bytes")
  H.eq(compute.optimizer_state_bytes(s0, 400, 100), 800, "100 fp32 elements: 2 moments x 4 bytes")
  -- SCHEDULE.md's settings line names it
  assert(audit_text(p1):find("moments in bf16", 1, true), "SCHEDULE.md names bf16 moments")
  -- the memory verdict: Llama 3 8B on 8 ranks and a 32 GB GPU fits with bf16 moments (30.7 GB) and not with
  -- fp32 ones (34.7 GB; no smaller than 33.8 GB even with the arena at its reuse layout)
  local function fits(bf16)
    local src = 'return { world_size = 8, parallel = { dp_shard = 8 }, model = { family = "llama", size = "8b", '
      .. 'seq_len = 2048 }, fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" }, topology = { gpu_memory_GB = 32 }, '
      .. 'training = { loss_chunks = 1' .. (bf16 and ', optimizer_implementation = "fused_opt_states_bf16"' or '')
      .. ' } }'
    return require("gen.audit").analysis(plan.from_source(src, "t.lua")).memory.fits
  end
  H.eq(fits(true), true, "bf16 states fit")
  H.eq(fits(false), false, "fp32 states do not")
  -- refused where it changes nothing (torchtitan hooks Adam/AdamW alone, optimizer.py:369-371)
  H.plan_fails(with:gsub("optimizer_implementation", 'optimizer = "sgd", optimizer_implementation'),
    "training.optimizer_implementation", "changes nothing", "optimizer.py:369-371")
  -- the other implementations change nothing planned
  local _, d2 = doc_of(base:gsub("training = { loss_chunks = 1 }",
    'training = { loss_chunks = 1, optimizer_implementation = "foreach" }'))
  H.eq(d2.audit.memory.optimizer_bytes, d0.audit.memory.optimizer_bytes, "foreach: as fused")
end

-- The same under a pipeline (CP x PP): pp_report's per-rank memory and figures' parts count the
-- optimizer state as gen/memory.lua does (memory.unit_state), so bf16 moments lower the total, not
-- the activations.
function T.bf16_optimizer_states_under_pp()
  local base = H.read("tests/plans/llama_tiny_cppp.lua")
  local with = base:gsub("training = { local_batch_size = 2, loss_chunks = 1 }",
    'training = { local_batch_size = 2, loss_chunks = 1, optimizer_implementation = "fused_opt_states_bf16" }')
  assert(with ~= base, "plan edited")
  local _, d0 = doc_of(base)
  local _, d1 = doc_of(with)
  local m0, m1 = d0.audit.memory, d1.audit.memory
  assert(m1.optimizer_bytes < m0.optimizer_bytes, "bf16 moments: less optimizer state")
  H.eq(m1.activation_bytes, m0.activation_bytes, "activations unchanged")
  H.eq(m1.total_bytes, m0.total_bytes - (m0.optimizer_bytes - m1.optimizer_bytes), "total drops by the saving")
end

-- pipeline.schedule = "PipelineScheduleMulti" with pipeline.csv: torchtitan's pipeline_parallel_schedule
-- = "PipelineScheduleMulti" with pipeline_parallel_schedule_csv (distributed/pipeline_parallel.py:290-298,
-- 351-361): 2 stages per rank (:257-261), the actions the CSV's alone (_PipelineScheduleRuntime._load_csv,
-- lowered with its sends and receives), here an order no named class has.
local MULTI_CSV = "0F0,0F1,2F0,2B0,2F1,2B1,0B0,0B1\r\n,1F0,1F1,3F0,3B0,3F1,3B1,1B0,1B1\r\n"

function T.pipeline_schedule_multi_from_a_csv()
  local load = require("gen.load")
  local report = require("gen.pipeline")
  local dir = H.tmpdir()
  local src = H.read("tests/pp/plans/pp_tiny.lua"):gsub('schedule = "1F1B", microbatches = 4',
    'schedule = "PipelineScheduleMulti", csv = "m.csv", microbatches = 2'):gsub("local_batch_size = 4",
    "local_batch_size = 2")
  H.write(dir .. "/m.csv", MULTI_CSV)
  local path = dir .. "/p.lua"
  local t = report.tables(load.source(src, path))
  H.eq(t.sched.schedule, "PipelineScheduleMulti (CSV)")
  H.eq(t.sched.num_stages, 4, "2 stages per rank (the multi-stage default)")
  -- rank 0's compute in the CSV's order, each unit's forward before its backward as written
  local order = {}
  for _, a in ipairs(t.sched.torch_order[1]) do
    if a then order[#order + 1] = string.format("%d%s%d", a.stage, a.type, a.mb) end
  end
  H.eq(table.concat(order, ","), "0F0,0F1,2F0,2B0,2F1,2B1,0B0,0B1", "rank 0's actions as the CSV gives them")
  assert(#t.classes == 2, "a class per pipeline rank")
  -- not a named class's order: Interleaved1F1B's tables (the same stages) run rank 0's events otherwise
  local tables, seq = require("gen.parallel.pp_tables"), require("gen.parallel.pp_sequence")
  local named = report.tables(load.source(src:gsub('"PipelineScheduleMulti", csv = "m.csv"', '"Interleaved1F1B"'), path))
  local function ops(tt)
    local out = {}
    for _, e in ipairs(tables.events(tt.classes, seq.mesh(2, 2), 2)[1]) do out[#out + 1] = e.op .. tostring(e.peer) end
    return table.concat(out, " ")
  end
  assert(ops(named) ~= ops(t), "the CSV's order differs from Interleaved1F1B's")
  -- the whole plan generates (proofs, tables); make pipeline's text names the CSV's row
  local p = plan.from_source(src, path)
  assert(#p.tp_classes >= 2, "pipeline classes")
  local text = report.text(load.source(src, path))
  assert(text:find("PipelineScheduleMulti", 1, true) and text:find("actions from m.csv", 1, true), text)
  -- refusals: no CSV; a CSV whose stages sit elsewhere than torchtitan's loop placement
  H.plan_fails(src:gsub('csv = "m.csv", ', ""), "pipeline.csv", "PipelineScheduleMulti",
    "pipeline_parallel.py:290-298")
  H.write(dir .. "/v.csv", "0F0,0F1,3F0,3B0,3F1,3B1,0B0,0B1\r\n,1F0,1F1,2F0,2B0,2F1,2B1,1B0,1B1\r\n")
  H.plan_fails_with(function() report.tables(load.source(src:gsub('"m.csv"', '"v.csv"'), path)) end,
    "pipeline.csv", "stage 2 on pipeline rank 1", "places it on rank 0")
end

-- docs/plan-files.md's torchtitan table: every plan field it names (`section.key` in its second column)
-- is a field gen/load.lua takes, and every option this lane made a field has its row
function T.torchtitan_table_names_real_fields()
  local schema = require("gen.load").SCHEMA
  local doc = H.read("docs/plan-files.md")
  local tbl = doc:match("## torchtitan 0%.3's job config, option by option\n(.-)\n## ")
  assert(tbl, "the section")
  local n = 0
  for line in tbl:gmatch("[^\n]+") do
    local col = line:match("^| [^|]+ | ([^|]+) |")
    for sec, key in (col or ""):gmatch("`(%l[%w_]*)%.([%w_]+)`") do
      assert(schema[sec] and schema[sec][key], "docs names " .. sec .. "." .. key .. ", which gen/load.lua does not take")
      n = n + 1
    end
  end
  assert(n >= 20, "fields named: " .. n)
  for _, opt in ipairs({ "fsdp_reshard_after_forward", "pipeline_parallel_schedule_csv", "optimizer.implementation",
                         "enable_fsdp_symm_mem", "LoRA", "gpt-oss", "multi-token prediction" }) do
    assert(tbl:find(opt, 1, true), "a row for " .. opt)
  end
end

return T
