local H = require("helpers")
local plan = require("gen.plan")
local audit = require("gen.audit")
local emit = require("gen.emit")
local json = require("gen.json")
local T = {}

local read = H.read

local function render(path)
  local p = plan.from_file(path)
  local fp = audit.fingerprint(p)
  local files = emit.render(p, fp, { ["plan.h.in"] = read("templates/plan.h.in"), ["plan.c.in"] = read("templates/plan.c.in"),
    ["plan_kernels.cu.in"] = read("templates/plan_kernels.cu.in") })
  files["plan.json"] = audit.json(p, fp)
  files["SCHEDULE.md"] = audit.schedule_md(p, fp)
  return files, fp
end

function T.deterministic()
  local a, fa = render("plans/hsdp2x3_bf16.lua")
  local b, fb = render("plans/hsdp2x3_bf16.lua")
  H.eq(fa, fb, "fingerprint")
  for name, s in pairs(a) do H.eq(s == b[name], true, name .. " byte-identical") end
end

function T.headers_say_generated_without_paths_or_times()
  local files, fp = render("plans/fsdp4.lua")
  for name, s in pairs(files) do
    assert(s:find("do not edit", 1, true), name .. " lacks the do-not-edit header")
    assert(s:find(fp, 1, true), name .. " lacks the fingerprint")
    assert(not s:find("/work/", 1, true) and not s:find("/home/", 1, true), name .. " holds an absolute path")
    assert(not s:find("20%d%d%-%d%d%-%d%d"), name .. " holds a date")
  end
end

function T.fingerprint_changes_with_layout()
  local src = read("plans/fsdp4.lua")
  local a = audit.fingerprint(plan.from_source(src, "plans/fsdp4.lua"))
  local b = audit.fingerprint(plan.from_source((src:gsub("{ 37, 12 }", "{ 38, 12 }", 1)), "plans/fsdp4.lua"))
  assert(a ~= b, "fingerprint must change when a shape changes")
end

function T.plan_json_schema()
  local files = render("plans/hsdp2x2.lua")
  local doc = json.decode(files["plan.json"])
  H.eq(doc.schema, 2); H.eq(doc.world_size, 4)
  H.list_eq(doc.mesh.names, { "dp_replicate", "dp_shard" }, "mesh")
  local fsdp
  for _, g in ipairs(doc.groups) do if g.name == "fsdp" then fsdp = g end end
  -- Closed form: rank = color digits . color strides + key digits . member strides.
  H.list_eq(fsdp.members.sizes, { 2 }, "fsdp member sizes"); H.list_eq(fsdp.members.strides, { 1 }, "member strides")
  H.list_eq(fsdp.colors.sizes, { 2 }, "fsdp color sizes"); H.list_eq(fsdp.colors.strides, { 2 }, "color strides")
  H.list_eq(fsdp.example_ranks.last_group, { 2, 3 }, "second fsdp group")
  local wq = doc.units[2].params[1]
  H.eq(wq.name, "layers.0.p.wq"); H.eq(wq.chunk, 6); H.eq(wq.padded_numel, 72); H.eq(wq.offset, 0)
  H.eq(doc.units[2].slot_numel, 570, "recording's in_numel for a layer on 2 shards")
  H.eq(doc.units[1].slot_numel, 462, "recording's in_numel for the root on 2 shards")
  local ar = 0
  for _, o in ipairs(doc.ops) do if o.kind == "all_reduce" then ar = ar + 1; H.eq(o.reduce_op, "avg") end end
  H.eq(ar, 4, "one HSDP all-reduce per unit")
end

function T.json_roundtrip()
  local v = { a = { 1, 2, 3 }, b = "x\"y", c = { { d = true } }, e = 1.5 }
  local back = json.decode(json.encode(v, " "))
  H.eq(back.b, "x\"y"); H.eq(back.a[3], 3); H.eq(back.c[1].d, true); H.eq(back.e, 1.5)
end

return T
