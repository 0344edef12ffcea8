-- Issue 41: torchtitan 0.3's job-config options as plan fields (docs/plan-files.md's torchtitan table).
-- fsdp.reshard_after_forward_policy is parallelism.fsdp_reshard_after_forward (config/configs.py:136),
-- resolved by distributed/fsdp.py:54-77 and applied to every unit at :183-204.
local H = require("helpers")
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
  H.plan_fails(tiny("llama", 'reshard_after_forward_policy = "always"',
    ', pipeline = { schedule = "1F1B", microbatches = 2 }'):gsub("dp_shard = 4", "dp_shard = 2, pp = 2"),
    "fsdp.reshard_after_forward_policy", "default")
end

return T
