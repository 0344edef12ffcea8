-- Issue 39: mixed all-gather dtypes inside one fully_shard unit (a
-- parameter's own param_dtype: torch 2.15 MixedPrecisionPolicy's
-- param_dtype_override_fn), which FSDP2 all-gathers as raw bytes (uint8).
local H = require("helpers")
local plan = require("gen.plan")
local T = {}

-- A generic plan source: units = { { name, { { pname, shape, param_dtype|nil, dtype|nil }, ... }, extra }, ... }
local function src(world, units, fsdp)
  local lines = { "return {", "  world_size = " .. world .. ",", "  parallel = { dp_shard = " .. world .. " },",
                  "  model = { family = 'generic', dtype = 'fp32', units = {" }
  for _, u in ipairs(units) do
    local ps = {}
    for _, p in ipairs(u[2]) do
      ps[#ps + 1] = string.format("{ name = %q, shape = { %s }%s%s }", p[1], table.concat(p[2], ", "),
        p[3] and string.format(", param_dtype = %q", p[3]) or "", p[4] and string.format(", dtype = %q", p[4]) or "")
    end
    lines[#lines + 1] = string.format("    { name = %q, params = { %s }%s },", u[1], table.concat(ps, ", "), u[3] or "")
  end
  lines[#lines + 1] = "  } },"
  lines[#lines + 1] = "  fsdp = " .. (fsdp or "{ param_dtype = 'bf16' }") .. ","
  lines[#lines + 1] = "}"
  return table.concat(lines, "\n")
end

local MIXED = { { "l0", { { "norm", { 6 }, "fp32" }, { "wq", { 3, 3 } }, { "bias", { 5 }, "fp32" }, { "w1", { 7, 6 } } } },
                { "root", { { "emb", { 11, 6 } } } } }

-- FSDP2's uint8 all-gather input (_fsdp_collectives.py:369-379): every
-- parameter's padded shard in its own dtype, back to back, no alignment.
function T.byte_layout_is_fsdp2s()
  local p = plan.from_source(src(4, MIXED), "t.lua")
  local u = p.layout.units[2]
  H.eq(u.name, "l0")
  -- norm 2 x fp32 = 8 B, wq 3 x bf16 = 6 B, bias 2 x fp32 = 8 B, w1 12 x bf16 = 24 B
  local want, at = { { "fp32", 0 }, { "bf16", 8 }, { "fp32", 14 }, { "bf16", 22 } }, {}
  for j, q in ipairs(u.params) do at[j] = { q.ag_dtype, q.ag_offset } end
  for j = 1, 4 do H.list_eq(at[j], want[j], "param " .. j) end
  H.eq(u.ag_bytes, 46, "slot bytes per rank")
  H.eq(u.total, 19, "the reduce-scatter slot stays in elements")
  H.eq(u.grad_dtype, "fp32", "every gradient held in reduce_dtype")
  H.eq(u.vec_ok, false)
  -- the unsharded tensors: 16-byte aligned starts (W x padded x its dtype)
  local uo = {}
  for j, q in ipairs(u.params) do uo[j] = q.unsharded_offset end
  H.list_eq(uo, { 0, 32, 64, 96 }, "unsharded offsets")
  H.eq(u.unsharded_bytes, 192)
  -- the root has one dtype: no raw bytes
  H.eq(p.layout.units[1].ag_bytes, nil, "a uniform unit")
end

function T.all_gather_is_uint8_of_the_slot_bytes()
  local p = plan.from_source(src(4, MIXED), "t.lua")
  local n = 0
  for _, o in ipairs(p.ops) do
    if o.kind == "all_gather" and o.unit == 1 then
      n = n + 1
      H.eq(o.dtype, "u8"); H.eq(o.count, 46); H.eq(o.from_sharded, nil, "a copy-in casts first")
    elseif o.kind == "reduce_scatter" and o.unit == 1 then
      H.eq(o.dtype, "fp32"); H.eq(o.count, 19)
    end
  end
  H.eq(n >= 2, true, "forward and backward gathers")
  -- the arena holds W x slot bytes for the gather and the aligned unsharded buffer
  local b = p.arena.by_unit[1]
  H.eq(b.ag.bytes, 4 * 46); H.eq(b.unsharded.bytes, 192)
end

-- A parameter kept at the unit's own param_dtype (or without one) is not mixed.
function T.override_equal_to_the_unit_is_uniform()
  local p = plan.from_source(src(4, { { "root", { { "a", { 8 }, "bf16" }, { "b", { 8 } } } } }), "t.lua")
  H.eq(p.layout.units[1].ag_bytes, nil)
  H.eq(p.layout.units[1].ag_dtype, "bf16")
  local q = plan.from_source(src(4, { { "root", { { "a", { 8 }, "fp32" }, { "b", { 8 } } } } }, "{}"), "t.lua")
  H.eq(q.layout.units[1].ag_bytes, nil, "no param_dtype: fp32 everywhere")
end

-- MixedPrecisionPolicy._resolve_for_param (torch 2.15 _fsdp_api.py:98-104) refuses any other dtype.
function T.other_override_refused()
  H.plan_fails(src(4, { { "root", { { "a", { 8 }, "fp16" }, { "b", { 8 } } } } }),
    "model.units[1].params[1].param_dtype", "_fsdp_api.py:98-104", "use bf16 or fp32")
end

-- Trainable parameters of different dtypes in one unit: FSDP2's lazy init refuses them.
function T.mixed_parameter_dtypes_refused()
  H.plan_fails(src(4, { { "root", { { "a", { 8 } }, { "b", { 8 }, nil, "bf16" } } } }, "{}"),
    "model.units[1].params[2].dtype", "_fsdp_param_group.py:344-348", "param_dtype")
end

-- plan.json names each parameter's dtype and byte offset (the live peer reads them).
function T.plan_json_names_them()
  local dir = H.tmpdir()
  H.write(dir .. "/m.lua", src(4, MIXED))
  local ok = os.execute(string.format("lua5.4 gen/commplan.lua %s/m.lua %s/out >/dev/null 2>&1", dir, dir))
  H.eq(ok, true, "generates")
  local json = require("gen.json")
  local j = json.decode(H.read(dir .. "/out/plan.json"))
  local err = require("gen.jsonschema").validate(j, json.decode(H.read("docs/plan-json.schema.json")))
  H.eq(err, nil, "plan.json matches docs/plan-json.schema.json")
  local u = j.units[2]
  H.eq(u.ag_bytes, 46)
  H.eq(u.params[3].ag_dtype, "fp32"); H.eq(u.params[3].ag_offset, 14)
  H.eq(j.units[1].ag_bytes, nil)
  local c = H.read(dir .. "/out/plan.c")
  H.eq(c:find(".ag_dtype = CP_FP32, .ag_offset = 14, .unsharded_offset = 64", 1, true) ~= nil, true, "plan.c row")
  H.eq(c:find(".ag_bytes = 46, .unsharded_bytes = 192", 1, true) ~= nil, true, "plan.c unit")
  os.execute("rm -rf " .. dir)
end

return T
