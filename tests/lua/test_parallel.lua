-- The parallelisms as modules (gen/parallel/init.lua): the contract's
-- shape, the groups each module declares, and that an unused one leaves no
-- trace.
local H = require("helpers")
local plan = require("gen.plan")
local parallel = require("gen.parallel.init")
local T = {}

local HOOKS = { "used", "check_dims", "rules", "inner_plan", "prepare", "settings", "apply_units", "classes", "buffers",
                "on_layout", "step", "unit_ops", "prove_class", "prove", "describe", "mesh_label" }

function T.every_module_keeps_the_contract()
  local seen = {}
  for _, m in ipairs(parallel.MODULES) do
    H.eq(type(m.name), "string", "name")
    H.eq(seen[m.name], nil, "module " .. m.name .. " listed once")
    seen[m.name] = true
    H.eq(type(m.label), "string", m.name .. ".label")
    H.eq(type(m.dims), "table", m.name .. ".dims")
    H.eq(type(m.groups), "table", m.name .. ".groups")
    for _, h in ipairs(HOOKS) do
      if m[h] ~= nil then H.eq(type(m[h]), "function", m.name .. "." .. h) end
    end
  end
  -- torchtitan's order: the pipeline split first (pipeline_llm), then TP
  -- and EP on each part's modules (model.parallelize) before fully_shard
  -- wraps them.
  local order = {}
  for i, m in ipairs(parallel.MODULES) do order[i] = m.name end
  H.list_eq(order, { "pp", "tp", "cp", "ep", "fsdp" }, "application order")
end

-- The audit's mesh line names every parallelism the plan runs, each by
-- its module (parallel.mesh_kind): HSDP / FSDP over dp_shard x cp, then
-- EP, CP, TP (async where run), PP; nothing but one rank says so.
function T.mesh_kind_names_every_parallelism()
  local function kind(d, async)
    local full = { pp = 1, dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1, ep = 1 }
    for k, v in pairs(d) do full[k] = v end
    return parallel.mesh_kind({ dims = full, async_tp = async })
  end
  H.eq(kind({}), "one rank", "one rank")
  H.eq(kind({ dp_replicate = 2 }), "replicate", "replicas alone")
  H.eq(kind({ dp_shard = 4, cp = 2, tp = 2 }), "FSDP + CP + TP", "dp_shard 4 x cp 2 x tp 2")
  H.eq(kind({ cp = 2 }), "FSDP + CP", "FSDP shards over cp alone")
  H.eq(kind({ tp = 2 }), "TP", "TP alone")
  H.eq(kind({ dp_replicate = 2, dp_shard = 2, tp = 2 }), "HSDP + TP", "HSDP x TP")
  H.eq(kind({ pp = 2, dp_replicate = 2, dp_shard = 2, cp = 2, tp = 2, ep = 4 }, true),
    "HSDP + EP + CP + async TP + PP", "all five")
end

-- Every op's group is one a module the plan uses declares.
-- One pipeline for every plan (issue 34): gen/plan.lua names no
-- parallelism and no module of gen/parallel/ reaches back up to the
-- generator or the audit (the verbs plan a pipeline's stage mesh through
-- gen/pipeline.lua). Read from the sources, as a reviewer would check it.
function T.no_fork_and_no_back_edge()
  local function read(path)
    local fh = assert(io.open(path, "rb"))
    local s = fh:read("a")
    fh:close()
    return s
  end
  local src = read("gen/plan.lua"):gsub("%-%-[^\n]*", "")
  for _, m in ipairs(parallel.MODULES) do
    for _, n in ipairs(m.dims) do
      -- d.pp, p.dims.pp, p.parallel.pp, d["pp"], m.name == "pp": any test of a degree or a module by name
      assert(not src:find("%." .. n .. "%f[^%w_]"), "gen/plan.lua reads the degree " .. n)
      assert(not src:find("[\"']" .. n .. "[\"']"), "gen/plan.lua names " .. n .. " in a string")
    end
    assert(not src:find("[\"']" .. m.name .. "[\"']"), "gen/plan.lua names module " .. m.name)
  end
  for _, word in ipairs({ "pp_build", "async_tp", "pipeline" }) do
    assert(not src:find(word, 1, true), "gen/plan.lua names " .. word)
  end
  -- what a module may require: its siblings and the generator's lower stages, never the stages above it
  local ALLOWED = { ["gen.util"] = true, ["gen.dims"] = true, ["gen.groups"] = true, ["gen.compute"] = true,
                    ["gen.cost"] = true, ["gen.hardware"] = true, ["gen.opkinds"] = true, ["gen.repeat"] = true,
                    ["gen.verify"] = true, ["gen.timeline"] = true, ["gen.fsio"] = true, ["gen.fold"] = true,
                    ["gen.json"] = true, ["gen.nccl_model"] = true, ["gen.memplan"] = true, ["gen.memory"] = true }
  local ph = assert(io.popen("ls gen/parallel/*.lua"))
  local n = 0
  for path in ph:lines() do
    for name in read(path):gmatch("require%s*%(?%s*[\"']([%w_.]+)[\"']") do
      assert(ALLOWED[name] or name:match("^gen%.parallel%.") or name:match("^gen%.models%."),
        path .. " requires " .. name .. ", a stage above the modules")
    end
    n = n + 1
  end
  ph:close()
  assert(n >= 10, "read the modules")
end

function T.ops_name_only_declared_groups()
  for _, f in ipairs({ "plans/fsdp4.lua", "plans/hsdp2x2.lua", "plans/llama_tiny_tp.lua", "plans/tp3_uneven.lua",
                       "plans/hsdp3x2_arlast.lua", "tests/plans/llama_tiny_cp.lua" }) do
    local p = plan.from_file(f)
    local declared = {}
    for _, m in ipairs(parallel.used(p.dims)) do
      for _, g in ipairs(m.groups) do declared[g] = m.name end
    end
    for _, cls in ipairs(p.tp_classes) do
      for _, o in ipairs(cls.ops) do
        if o.group then H.eq(declared[o.group] ~= nil, true, string.format("%s: op %d's group %s", f, o.seq, o.group)) end
      end
    end
  end
end

-- A plan without TP runs none of TP's hooks: no TP facts on its layout, no
-- TP ops, one class of ranks.
function T.unused_module_leaves_no_trace()
  local p = plan.from_file("plans/llama_tiny.lua")
  H.eq(p.dims.tp, 1, "llama_tiny has no TP")
  H.list_eq(parallel.used(p.dims), { parallel.MODULES[#parallel.MODULES] }, "modules used")
  H.eq(parallel.MODULES[#parallel.MODULES].name, "fsdp", "FSDP is the last module")
  H.eq(#p.tp_classes, 1, "one class")
  H.eq(p.class_of[0], 1, "rank's class")
  for _, u in ipairs(p.layout.units) do
    H.eq(u.tp_acts, nil, u.name .. " TP activation collectives")
    for _, q in ipairs(u.params) do
      H.eq(q.tp, nil, q.name .. " TP placement")
      H.eq(q.full_shape, nil, q.name .. " TP full shape")
    end
  end
  for _, o in ipairs(p.ops) do H.eq(o.group ~= "tp", true, "op " .. o.seq .. " on a TP group") end
end

-- Every degree has a module now; a combination a module does not plan is
-- refused by its check_dims (in check_supported, before the mesh), in one
-- line naming the field and the fix.
function T.unplanned_combination_is_refused()
  local dims = require("gen.dims")
  parallel.check_supported(nil, dims.infer(nil, { dp_shard = 2, cp = 2 }, 4)) -- (no degree wants a module)
  -- every composition torchtitan runs is planned (issue 35): CP x TP, CP x PP, EP x CP, the 5-D mesh
  parallel.check_supported(nil, dims.infer(nil, { dp_shard = 2, cp = 2, tp = 2 }, 8))
  parallel.check_supported(nil, dims.infer(nil, { dp_shard = 2, cp = 2, pp = 2 }, 8))
  parallel.check_supported(nil, dims.infer(nil, { dp_shard = 2, cp = 2, ep = 4 }, 4))
  parallel.check_supported(nil, dims.infer(nil, { dp_replicate = 2, dp_shard = 2, cp = 2, tp = 2, pp = 2, ep = 2 }, 32))
  -- what is left: an ep whose groups cut across cp groups without nesting (the runtime's refined mesh)
  H.plan_fails_with(function() parallel.check_supported(nil, dims.infer(nil, { dp_shard = 3, cp = 2, ep = 3 }, 6)) end,
    "parallel.cp", "cp=2 x tp=1 with ep=3", "pick ep a multiple or a divisor of 2")
end

return T
