-- fsdp.symm_mem (torchtitan's enable_fsdp_symm_mem): the all-gather output
-- and the reduce-scatter input and output in one symmetric window at the
-- arena's start (gen/memplan.lua), the proof that every rank of a
-- communicator places them alike (gen/symm.lua) and its mutants, the
-- refusal, the tables (gen/emit.lua).
local H = require("helpers")
local plan = require("gen.plan")
local symm = require("gen.symm")
local T = {}

local function read(path) return assert(H.read(path)) end

-- plans/fsdp4.lua with fsdp.symm_mem (and more fsdp fields where given).
local function fsdp4(extra)
  local s = read("plans/fsdp4.lua")
  local out = s:gsub("fsdp = { reshard_after_forward = true }",
    "fsdp = { reshard_after_forward = true, symm_mem = true" .. (extra or "") .. " }")
  return out
end

local function live(b) return #b.lives > 0 and b.size > 0 end

function T.window_holds_exactly_the_collective_buffers()
  local p = plan.from_source(fsdp4(), "plans/t.lua")
  local ar = p.arena
  assert(ar.symm and ar.symm.window_bytes > 0, "a window")
  local n = 0
  for _, b in ipairs(ar.buffers) do
    if live(b) then
      local want = b.kind == "ag" or b.kind == "rs_in" or b.kind == "rs_out"
      H.eq(b.symm == true, want, b.unit_name .. " " .. b.kind .. " symmetric")
      if want then
        assert(b.offset + b.size <= ar.symm.window_bytes, b.unit_name .. " " .. b.kind .. " inside the window")
        n = n + 1
      else
        assert(b.offset >= ar.symm.window_bytes, b.unit_name .. " " .. b.kind .. " after the window")
      end
    end
  end
  H.eq(#ar.symm.buffers, n, "the window's list")
  H.list_eq(p.symm.families, { "fsdp" }, "families")
  -- torchtitan's enable_fsdp_symm_mem forces sum reductions (distributed/fsdp.py:50)
  for _, u in ipairs(p.layout.units) do H.eq(u.rs_op, "sum", u.name .. " rs_op") end
  -- the plain plan has no window and its offsets from 0
  local q = plan.from_file("plans/fsdp4.lua")
  H.eq(q.arena.symm, nil, "no window")
  H.eq(q.symm, nil, "no proof facts")
end

-- A unit that does not force sum reductions keeps its reduce-scatter out of
-- symmetric memory (torch 2.15 _fsdp_param_group.py:419-422): only its all-gather's.
function T.reduce_scatter_symmetric_only_with_forced_sums()
  local p = plan.from_source(fsdp4(", force_sum_reduction_for_comms = false"), "plans/t.lua")
  for _, b in ipairs(p.arena.buffers) do
    if live(b) then H.eq(b.symm == true, b.kind == "ag", b.unit_name .. " " .. b.kind) end
  end
end

-- TP classes of different shapes: each class its own window, each FSDP group
-- inside one class; the proof holds, and fails where a member is mapped to
-- another class (a rank-dependent offset).
function T.proof_over_tp_classes_and_its_mutant()
  local src = read("plans/tp3_uneven.lua"):gsub("\nreturn {\n", "\nreturn {\n  fsdp = { symm_mem = true },\n", 1)
  local p = plan.from_source(src, "plans/t.lua")
  H.eq(#p.tp_classes, 2, "classes (TP ranks 0, 1 and rank 2's shorter shards)")
  local w = p.symm.classes
  assert(w[1] ~= w[2], "the classes' windows differ")
  -- rank 2 (tp 2) shares its fsdp group with rank 5 (tp 2): map rank 5 to tp 0's class
  local real = function(r) return p.class_of[r % 3] end
  assert(real(2) ~= real(0), "tp 2 has a class of its own")
  local ok, err = pcall(symm.prove, p, function(r) if r == 5 then return real(0) end return real(r) end)
  assert(not ok, "the mutant passed")
  assert(tostring(err):find("group fsdp", 1, true) and tostring(err):find("rank 5", 1, true), tostring(err))
end

-- One buffer moved on one rank's tables: the proof names the buffer.
function T.shifted_offset_mutant_fails()
  local p = plan.from_source(fsdp4(), "plans/t.lua")
  local cls = p.tp_classes[1]
  local copy = {}
  for k, v in pairs(cls) do copy[k] = v end
  local ar = {}
  for k, v in pairs(cls.arena) do ar[k] = v end
  ar.by_unit, ar.buffers = {}, {}
  for i, b in ipairs(cls.arena.buffers) do
    local c = {}
    for k, v in pairs(b) do c[k] = v end
    ar.buffers[i] = c
    ar.by_unit[c.unit] = ar.by_unit[c.unit] or {}
    ar.by_unit[c.unit][c.kind] = c
  end
  copy.arena = ar
  -- layers.1's all-gather output 256 bytes later on rank 2 (still inside the window)
  local moved
  for _, b in ipairs(ar.buffers) do
    if b.unit_name == "layers.1" and b.kind == "ag" then b.offset = b.offset + 256; moved = b end
  end
  assert(moved.offset + moved.size <= ar.symm.window_bytes, "still inside")
  p.tp_classes[2] = copy
  local ok, err = pcall(symm.prove, p, function(r) return r == 2 and 2 or 1 end)
  assert(not ok, "the mutant passed")
  assert(tostring(err):find("layers.1 ag " .. moved.offset, 1, true), tostring(err))
  -- and unmoved, the same two classes pass
  moved.offset = moved.offset - 256
  symm.prove(p, function(r) return r == 2 and 2 or 1 end)
  -- a window of another size on one rank
  ar.symm = { window_bytes = ar.symm.window_bytes + 256, buffers = ar.symm.buffers }
  ok, err = pcall(symm.prove, p, function(r) return r == 2 and 2 or 1 end)
  assert(not ok and tostring(err):find("window", 1, true), tostring(err))
end

-- Pipeline stages (a class per pp rank, each its own window) and expert
-- parallelism (the window registered on both the fsdp and efsdp groups).
function T.pipeline_and_expert_windows()
  local pp = read("tests/pp/plans/pp_tiny.lua"):gsub('fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" }',
    'fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", symm_mem = true }', 1)
  local p = plan.from_source(pp, "plans/t.lua")
  H.eq(#p.tp_classes, 2, "a class per pipeline rank")
  for c, cls in ipairs(p.tp_classes) do assert(cls.arena.symm.window_bytes > 0, "class " .. c .. "'s window") end
  H.list_eq(p.symm.families, { "fsdp" }, "pipeline families")
  local ep = read("tests/ep/plans/ep2_mixtral.lua"):gsub('fsdp = { reduce_op = "sum" }',
    'fsdp = { reduce_op = "sum", symm_mem = true }', 1)
  local q = plan.from_source(ep, "plans/t.lua")
  H.list_eq(q.symm.families, { "efsdp", "fsdp" }, "expert families")
  local experts = 0
  for _, b in ipairs(q.arena.symm.buffers) do
    if b.unit_name:find("experts", 1, true) then experts = experts + 1 end
  end
  assert(experts > 0, "the experts' buffers in the window")
end

-- A non-symmetric buffer inside the window, or a symmetric one outside, is refused.
function T.class_layout_checked()
  local p = plan.from_source(fsdp4(), "plans/t.lua")
  local ar = p.arena
  for _, b in ipairs(ar.buffers) do
    if b.kind == "grads" and live(b) then b.offset = 0; break end
  end
  local ok, err = pcall(symm.prove, p)
  assert(not ok and tostring(err):find("inside the", 1, true), tostring(err))
end

function T.refused_below_compute_capability_9()
  H.plan_fails(fsdp4():gsub("\nreturn {\n", '\nreturn {\n  topology = { preset = "a100" },\n', 1),
    "fsdp.symm_mem", "config/configs.py:267-278", "a100")
end

-- The outputs: plan.c's window (class and plan), plan.json's symmetric
-- buffers and window (schema-valid), SCHEDULE.md's row; none without it.
function T.outputs_say_the_window()
  local dir = H.tmpdir()
  H.write(dir .. "/s.lua", fsdp4())
  H.eq(os.execute(string.format("lua5.4 gen/commplan.lua %s/s.lua %s/out >/dev/null 2>&1", dir, dir)), true, "generates")
  local p = plan.from_source(fsdp4(), "plans/t.lua")
  local W = p.arena.symm.window_bytes
  local c = H.read(dir .. "/out/plan.c")
  assert(c:find(".symm_bytes = " .. W .. " }", 1, true), "the class row's window")
  assert(c:find("\n    .symm_bytes = " .. W .. ",\n", 1, true), "the plan's window")
  local json = require("gen.json")
  local j = json.decode(H.read(dir .. "/out/plan.json"))
  H.eq(require("gen.jsonschema").validate(j, json.decode(H.read("docs/plan-json.schema.json"))), nil, "schema")
  H.eq(j.memory.symm_window_bytes, W, "plan.json's window")
  H.eq(j.fsdp.symm_mem, true, "plan.json's fsdp.symm_mem")
  local n = 0
  for _, u in ipairs(j.units) do
    for _, kind in ipairs({ "ag", "rs_in", "rs_out" }) do
      if u.arena[kind] and u.arena[kind].symmetric then n = n + 1 end
    end
    H.eq(u.arena.unsharded.symmetric, nil, u.name .. " unsharded")
  end
  H.eq(n, #p.arena.symm.buffers, "symmetric buffers in plan.json")
  local md = H.read(dir .. "/out/SCHEDULE.md")
  assert(md:find("of which the symmetric window (fsdp.symm_mem: 4 all-gather buffers, 4 reduce-scatter inputs, "
    .. "4 reduce-scatter outputs; ncclMemAlloc'd, registered on the fsdp communicator", 1, true), "SCHEDULE.md's row")
  for _, f in ipairs({ "plans/fsdp4/plan.c", "plans/fsdp4/SCHEDULE.md" }) do
    assert(not H.read(f):find("symm", 1, true), f .. " says nothing of a window")
  end
end

return T
