-- Stage 1: load a plan file in a sandbox and check its shape against the
-- schema (known keys, types, ranges). Returns a normalized plan table with
-- defaults filled in; semantic checks belong to later stages.
local util = require("gen.util")

local load_plan = {}

local DTYPES = { "fp32", "bf16", "fp16" }

-- Schema: key -> { kind, extra }. kind is one of int, num, string, bool,
-- enum, table, list. "min" bounds ints; "enum" lists allowed strings.
local SCHEMA = {
  top = {
    name = { "string" }, world_size = { "int", min = 1 },
    parallel = { "table" }, model = { "table" }, fsdp = { "table" },
    topology = { "table" },
  },
  parallel = {
    dp_replicate = { "int" }, dp_shard = { "int" }, cp = { "int" }, tp = { "int" },
    pp = { "int" }, ep = { "int" }, etp = { "int" }, ulysses_degree = { "int" },
    dp = { "int" },
  },
  fsdp = {
    reshard_after_forward = { "bool" }, micro_steps = { "int", min = 1 },
    reduce_op = { "enum", enum = { "avg", "sum" } },
    param_dtype = { "enum", enum = DTYPES }, reduce_dtype = { "enum", enum = DTYPES },
  },
  topology = {
    gpus_per_node = { "int", min = 1 }, intra_node_GBps = { "num", min = 0 },
    inter_node_GBps = { "num", min = 0 }, latency_us = { "num", min = 0 },
  },
  model = {
    family = { "enum", enum = { "llama", "generic" } }, size = { "string" },
    dtype = { "enum", enum = DTYPES }, seq_len = { "int", min = 1 },
    dim = { "int", min = 1 }, n_layers = { "int", min = 1 }, n_heads = { "int", min = 1 },
    n_kv_heads = { "int", min = 1 }, vocab_size = { "int", min = 1 },
    ffn_dim_multiplier = { "num", min = 0 }, multiple_of = { "int", min = 1 },
    num_experts = { "int", min = 1 }, units = { "list" },
  },
  unit = { name = { "string" }, params = { "list" } },
  param = { name = { "string" }, shape = { "list" }, dtype = { "enum", enum = DTYPES },
            shard_dim = { "int", min = 0 } },
}
load_plan.SCHEMA = SCHEMA
load_plan.DTYPES = DTYPES

local function type_name(v)
  if math.type(v) then return math.type(v) == "integer" and "integer" or "number" end
  return type(v)
end

local function check_value(ctx, path, spec, v)
  local kind = spec[1]
  local bad = function(want)
    util.field_error(ctx, path, string.format("expected %s, got %s %s; fix the value",
      want, type_name(v), type(v) == "string" and string.format("%q", v) or tostring(v)))
  end
  if kind == "int" then
    if math.type(v) ~= "integer" then
      if type(v) == "number" and v == math.floor(v) and v >= math.mininteger and v <= math.maxinteger then
        v = math.tointeger(v)
      else bad("an integer") end
    end
  elseif kind == "num" then
    if type(v) ~= "number" then bad("a number") end
  elseif kind == "string" then
    if type(v) ~= "string" then bad("a string") end
  elseif kind == "bool" then
    if type(v) ~= "boolean" then bad("true or false") end
  elseif kind == "enum" then
    if type(v) ~= "string" then bad("one of " .. table.concat(spec.enum, ", ")) end
    local ok = false
    for _, e in ipairs(spec.enum) do ok = ok or e == v end
    if not ok then
      local hint = util.did_you_mean(v, spec.enum)
      util.field_error(ctx, path, string.format("%q is not one of %s%s", v,
        table.concat(spec.enum, ", "), hint and ("; did you mean " .. string.format("%q", hint) .. "?") or ""))
    end
  elseif kind == "table" or kind == "list" then
    if type(v) ~= "table" then bad("a table") end
    if kind == "list" then
      for k in pairs(v) do
        if math.type(k) ~= "integer" or k < 1 or k > #v then
          util.field_error(ctx, path, "expected a list { ... } with no named keys; found key " .. tostring(k))
        end
      end
    end
  end
  if spec.min and v < spec.min then
    util.field_error(ctx, path, string.format("%s must be >= %s; fix the value", tostring(v), tostring(spec.min)))
  end
  return v
end

-- Check every key of tbl against SCHEMA[section]; returns a shallow copy with
-- integer-valued numbers normalized.
local function check_table(ctx, path, section, tbl)
  local schema = SCHEMA[section]
  local known = util.sorted_keys(schema)
  local out = {}
  for _, k in ipairs(util.sorted_keys(tbl)) do
    local field = path == "" and tostring(k) or (path .. "." .. tostring(k))
    if type(k) ~= "string" then
      util.field_error(ctx, path == "" and "plan" or path, "unexpected list entry " .. tostring(k) ..
        "; use named fields (" .. table.concat(known, ", ") .. ")")
    end
    local spec = schema[k]
    if not spec then
      local hint = util.did_you_mean(k, known)
      util.field_error(ctx, field, "unknown key" .. (hint and ("; did you mean '" .. hint .. "'?")
        or ("; known keys: " .. table.concat(known, ", "))))
    end
    out[k] = check_value(ctx, field, spec, tbl[k])
  end
  return out
end

local function check_params(ctx, upath, params, default_dtype)
  local out = {}
  for j, p in ipairs(params) do
    local ppath = string.format("%s.params[%d]", upath, j)
    check_value(ctx, ppath, { "table" }, p)
    local q = check_table(ctx, ppath, "param", p)
    if not q.name then util.field_error(ctx, ppath, "missing name; add name = \"...\"") end
    if not q.shape then util.field_error(ctx, ppath .. ".shape", "missing shape; add shape = { d0, d1, ... }") end
    if #q.shape == 0 then
      util.field_error(ctx, ppath .. ".shape", "scalar (0-dim) parameters cannot be sharded by FSDP; use shape = { 1 }")
    end
    local shape = {}
    for i, d in ipairs(q.shape) do
      d = check_value(ctx, string.format("%s.shape[%d]", ppath, i), { "int" }, d)
      if d <= 0 then
        util.field_error(ctx, string.format("%s.shape[%d]", ppath, i),
          string.format("size %d of %s must be positive; fix the shape", d, q.name))
      end
      shape[i] = d
    end
    q.shape = shape
    q.dtype = q.dtype or default_dtype
    q.shard_dim = q.shard_dim or 0
    if q.shard_dim >= #shape then
      util.field_error(ctx, ppath .. ".shard_dim", string.format("shard_dim=%d but %s has %d dims; use 0..%d",
        q.shard_dim, q.name, #shape, #shape - 1))
    end
    out[j] = q
  end
  return out
end

function load_plan.normalize(ctx, raw)
  if type(raw) ~= "table" then
    util.plan_error(ctx.file .. ": the plan file must return a table (return { world_size = ..., ... })")
  end
  local plan = check_table(ctx, "", "top", raw)
  if not plan.world_size then util.field_error(ctx, "world_size", "missing; add world_size = <number of GPUs>") end
  if not plan.model then util.field_error(ctx, "model", "missing; add model = { family = \"llama\", size = \"8b\" } or a generic units list") end
  plan.name = plan.name or ctx.stem
  if not plan.name:match("^[%a_][%w_]*$") then
    util.field_error(ctx, "name", string.format("%q is not a C identifier; use letters, digits and _", plan.name))
  end
  plan.parallel = check_table(ctx, "parallel", "parallel", plan.parallel or {})
  plan.fsdp = check_table(ctx, "fsdp", "fsdp", plan.fsdp or {})
  plan.topology = check_table(ctx, "topology", "topology", plan.topology or {})
  local model = check_table(ctx, "model", "model", plan.model)
  model.family = model.family or (model.units and "generic" or nil)
  if not model.family then util.field_error(ctx, "model.family", "missing; set family = \"llama\" or give units = { ... }") end
  model.dtype = model.dtype or "fp32"
  if model.family == "generic" then
    if not model.units or #model.units == 0 then
      util.field_error(ctx, "model.units", "a generic model needs a non-empty units list (root last)")
    end
    local units = {}
    for i, u in ipairs(model.units) do
      local upath = string.format("model.units[%d]", i)
      check_value(ctx, upath, { "table" }, u)
      local q = check_table(ctx, upath, "unit", u)
      if not q.name then util.field_error(ctx, upath, "missing name; add name = \"layers.0\"") end
      if not q.params or #q.params == 0 then
        util.field_error(ctx, upath .. ".params", "unit " .. q.name .. " has no parameters; give at least one")
      end
      q.params = check_params(ctx, upath, q.params, model.dtype)
      units[i] = q
    end
    model.units = units
  elseif model.units then
    util.field_error(ctx, "model.units", "units are only for family = \"generic\"; remove them or change the family")
  end
  plan.model = model
  local f = plan.fsdp
  if f.reshard_after_forward == nil then f.reshard_after_forward = true end
  f.micro_steps = f.micro_steps or 1
  f.reduce_op = f.reduce_op or "avg"
  local t = plan.topology
  t.gpus_per_node = t.gpus_per_node or 8
  t.intra_node_GBps = t.intra_node_GBps or 360   -- NVLink4 busbw seen by nccl-tests on H100 SXM
  t.inter_node_GBps = t.inter_node_GBps or 45    -- 400 Gb/s NIC per GPU, ~90% efficiency
  t.latency_us = t.latency_us or 10
  return plan
end

-- Names a plan file may use: pure functions only, no io/os/require/load.
local function sandbox_env()
  local env = {}
  for _, k in ipairs({ "ipairs", "pairs", "tostring", "tonumber", "type", "select", "error",
                       "assert", "next", "pcall", "unpack" }) do env[k] = _G[k] end
  env.math = { floor = math.floor, ceil = math.ceil, max = math.max, min = math.min,
               abs = math.abs, tointeger = math.tointeger, huge = math.huge }
  env.string = { format = string.format, rep = string.rep, sub = string.sub,
                 upper = string.upper, lower = string.lower }
  env.table = { insert = table.insert, concat = table.concat, unpack = table.unpack }
  return env
end

-- Load and normalize a plan file. `path` is shown in messages as given.
function load_plan.file(path)
  local fh, err = io.open(path, "rb")
  if not fh then util.plan_error(path .. ": cannot read plan file (" .. tostring(err) .. "); check the path") end
  local source = fh:read("a")
  fh:close()
  return load_plan.source(source, path)
end

function load_plan.source(source, path)
  local stem = path:match("([^/]+)%.lua$") or path:match("([^/]+)$")
  local ctx = { file = path, source = source, stem = stem }
  local chunk, err = load(source, "=" .. path, "t", sandbox_env())
  if not chunk then util.plan_error(err .. " (Lua syntax error; fix the plan file)") end
  local ok, raw = pcall(chunk)
  if not ok then
    util.plan_error(tostring(raw) .. " (error while running the plan file)")
  end
  local plan = load_plan.normalize(ctx, raw)
  plan.source_file = path
  plan.ctx = ctx
  return plan
end

return load_plan
