-- CPUOffloadPolicy (fsdp.cpu_offload, a unit's cpu_offload / pin_memory):
-- the H2D copy before each offloading unit's copy-in, the D2H after each
-- reduction's view-out (d2h, then d2h_add on a later reduction of the
-- step), their device copies in the arena, the host's bytes out of the
-- GPU's figures, the copies priced at host_GBps, the refusals.
local H = require("helpers")
local plan = require("gen.plan")
local verify = require("gen.verify")
local memory = require("gen.memory")
local compute = require("gen.compute")
local T = {}

local function src(fsdp, extra_unit, topo)
  return string.format([[return {
  world_size = 4, parallel = { dp_replicate = 2, dp_shard = 2 },
  fsdp = %s,
  topology = %s,
  model = { family = "generic", units = {
    { name = "a", params = { { name = "a.w", shape = { 8, 6 } }, { name = "a.b", shape = { 5 } } } },
    { name = "b", params = { { name = "b.w", shape = { 6, 6 } } }%s },
    { name = "root", params = { { name = "r.w", shape = { 3, 4 } } } },
  } },
}]], fsdp, topo or "{}", extra_unit or "")
end

local OFF = '{ cpu_offload = true, micro_steps = 2, param_dtype = "bf16", reduce_dtype = "fp32" }'
local PLAIN = '{ micro_steps = 2, param_dtype = "bf16", reduce_dtype = "fp32" }'

local function kinds_of(p, unit)
  local out = {}
  for _, o in ipairs(p.ops) do
    if o.unit == unit then out[#out + 1] = o.kind end
  end
  return table.concat(out, " ")
end

function T.schedule_places_the_copies()
  local p = plan.from_source(src(OFF, ", cpu_offload = false"), "plans/t.lua")
  local a, b = p.layout.units[1], p.layout.units[2] -- forward order: root first
  H.eq(a.name, "root", "forward order")
  H.eq(a.offload and a.pin_memory, true, "root offloads, pinned")
  H.eq(b.name, "a", "second unit")
  local ks = kinds_of(p, a.index)
  -- every unshard starts with its H2D and a copy-in (never from the host shards directly)
  local h2d, copy_in = select(2, ks:gsub("h2d", "")), select(2, ks:gsub("copy_in", ""))
  H.eq(h2d, copy_in, "one h2d per copy-in")
  H.eq(select(2, ks:gsub("h2d copy_in all_gather", "")), h2d, "h2d, copy-in, all-gather")
  -- each reduction: view_out then d2h (first) or d2h_add (the second micro-step's)
  H.eq(select(2, ks:gsub("view_out d2h_add", "")), 1, "the second reduction adds on the host")
  H.eq(select(2, ks:gsub("view_out d2h ", "")) + select(2, ks:gsub("view_out d2h$", "")), 1, "the first assigns")
  H.eq(select(2, ks:gsub("view_out_add", "")), 0, "no device view_out_add on an offloading unit")
  -- the unit that keeps its shards on the device issues no host copy
  local u_b
  for _, u in ipairs(p.layout.units) do if u.name == "b" then u_b = u end end
  H.eq(u_b.offload, nil, "b does not offload")
  H.eq(kinds_of(p, u_b.index):find("h2d") or kinds_of(p, u_b.index):find("d2h"), nil, "b: no host copies")
  -- streams as FSDP2's: H2D on the copy-in stream, D2H on the post-reduce (HSDP: all-reduce) stream
  for _, o in ipairs(p.ops) do
    if o.kind == "h2d" then H.eq(o.stream, "copy_in", "h2d stream") end
    if o.kind == "d2h" or o.kind == "d2h_add" then H.eq(o.stream, "all_reduce", o.kind .. " stream") end
  end
end

-- Without a cast (the stored dtype is the all-gather's) a unit that does
-- not offload all-gathers its shards directly (zero copy-in); one that
-- offloads still copies in from the H2D's device copy (FSDP2's
-- use_foreach_copy is False for it, _fsdp_collectives.py:414-419).
function T.no_zero_copy_in_from_host_memory()
  local p = plan.from_source(src('{ cpu_offload = true }', ", cpu_offload = false"), "plans/t.lua")
  for _, u in ipairs(p.layout.units) do
    local ks = kinds_of(p, u.index)
    if u.offload then
      H.eq(select(2, ks:gsub("h2d copy_in all_gather", "")), select(2, ks:gsub("all_gather", "")),
        u.name .. ": every all-gather after an h2d and a copy-in")
    else
      H.eq(ks:find("copy_in"), nil, u.name .. ": zero copy-in")
    end
  end
end

-- The proof refuses a step that drops an H2D or adds on the first reduction.
function T.proof_catches_mutants()
  local p = plan.from_source(src(OFF), "plans/t.lua")
  local function mutated(fn)
    local ops = {}
    for i, o in ipairs(p.ops) do
      local c = {}
      for k, v in pairs(o) do c[k] = v end
      ops[i] = c
    end
    fn(ops)
    for i, o in ipairs(ops) do o.seq = i - 1 end
    return ops
  end
  verify.schedule(p.layout, mutated(function() end), p.fsdp) -- unmutated: holds
  local dropped = mutated(function(ops)
    for i, o in ipairs(ops) do if o.kind == "h2d" then table.remove(ops, i); return end end
  end)
  local ok, err = pcall(verify.schedule, p.layout, dropped, p.fsdp)
  H.eq(ok, false, "a dropped h2d is refused")
  assert(tostring(err):find("copy_in of .* while sharded"), err)
  local swapped = mutated(function(ops)
    for _, o in ipairs(ops) do if o.kind == "d2h" then o.kind = "d2h_add"; return end end
  end)
  ok, err = pcall(verify.schedule, p.layout, swapped, p.fsdp)
  H.eq(ok, false, "a first reduction that adds is refused")
  assert(tostring(err):find("d2h_add of .* after 0 copies"), err)
end

-- The arena holds the device copies only from the H2D to its copy-in and
-- from the view-out to its D2H; the host's bytes leave the GPU's figures.
function T.memory_plan_and_host_bytes()
  local p = plan.from_source(src(OFF, ", pin_memory = false"), "plans/t.lua")
  local q = plan.from_source(src(PLAIN), "plans/t.lua")
  for _, u in ipairs(p.layout.units) do
    local b = p.arena.by_unit[u.index]
    H.eq(b.h2d.bytes, u.total * 4, u.name .. ": h2d bytes (fp32 shard)")
    for _, iv in ipairs(b.h2d.lives) do
      H.eq(p.ops[iv.first + 1].kind .. ">" .. p.ops[iv.last + 1].kind, "h2d>copy_in", u.name .. " h2d life")
    end
    for _, iv in ipairs(b.d2h.lives) do
      local last = p.ops[iv.last + 1].kind
      H.eq(p.ops[iv.first + 1].kind, "view_out", u.name .. " d2h life opens at the view-out")
      assert(last == "d2h" or last == "d2h_add", last)
    end
    H.eq(#b.h2d.lives, u.reshard_after_forward and 4 or 2, u.name .. ": an h2d per unshard")
  end
  local s = compute.settings(p)
  local m, mq = memory.whole_rank(p, s, compute.units(p, s)), memory.whole_rank(q, s, compute.units(q, s))
  H.eq(m.params_bytes, 0, "every unit offloads: no sharded parameters on the GPU")
  H.eq(m.optimizer_bytes, 0, "nor optimizer state")
  H.eq(m.host_bytes, mq.params_bytes * 2 + mq.optimizer_bytes, "the host holds what the GPU held")
  local b_bytes
  for _, u in ipairs(p.layout.units) do if u.name == "b" then b_bytes = u.total * 4 end end
  H.eq(m.host_pinned_bytes, 2 * (mq.params_bytes - b_bytes), "b's shards are pageable (pin_memory = false)")
  H.eq(mq.host_bytes, 0, "no offload: no host bytes")
end

-- Under a pipeline (torchtitan passes cpu_offload to every stage's
-- fully_shard): every stage's units offload, the step's copies come with
-- FSDP's pieces, and the pipeline's memory row leaves the sharded state out.
function T.pipeline_stages_offload()
  local figures = require("gen.figures")
  local text = H.read("tests/pp/plans/pp_tiny.lua")
  local off = text:gsub('fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" }',
    'fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", cpu_offload = true }')
  assert(off ~= text, "pp_tiny's fsdp line changed: update this test")
  local a, b = plan.from_source(text, "tests/pp/plans/pp_tiny.lua"), plan.from_source(off, "tests/pp/plans/pp_tiny.lua")
  local n = 0
  for _, o in ipairs(b.ops) do if o.kind == "h2d" or o.kind == "d2h" then n = n + 1 end end
  assert(n > 0, "pipeline rank 0's tables hold the host copies")
  local fa, fb = figures.of(a).memory, figures.of(b).memory
  assert(fa.params_bytes > 0, "pp_tiny holds its shards on the GPU")
  H.eq(fb.params_bytes, 0, "offloaded: none on the GPU")
  H.eq(fb.optimizer_bytes, 0, "nor optimizer state")
end

-- The copies cost bytes / host_GBps.
function T.host_link_prices_the_copies()
  local p = plan.from_source(src(OFF, nil, "{ host_GBps = 10 }"), "plans/t.lua")
  local s = compute.settings(p)
  local per = compute.units(p, s)
  for _, o in ipairs(p.ops) do
    if o.kind == "h2d" then
      local u = p.layout.units[o.unit + 1]
      H.eq(compute.op_us(p, s, per, o), u.total * 4 / 10e3, "h2d at 10 GB/s")
    end
  end
  local md = H.read("plans/hsdp2x2_offload/SCHEDULE.md")
  assert(md:find("| host memory (CPU offload, 3 units", 1, true), "SCHEDULE.md names the host memory")
  assert(md:find("| host link per step: H2D ", 1, true), "and the host link's time")
end

-- SCHEDULE.md's host link line: a D2H copies the sharded gradients (the trainable shards, rs_total, as
-- gen/memplan.lua sizes its buffer), an H2D the whole shard: a frozen a.w (48 of a's 53 elements) leaves
-- the H2D as it was and shrinks the D2H.
function T.host_link_d2h_counts_trainable_shards()
  local audit = require("gen.audit")
  local function link(text)
    local p = plan.from_source(text, "plans/t.lua")
    local s = compute.settings(p)
    local m = memory.whole_rank(p, s, compute.units(p, s))
    local lines = {}
    audit.md_host(p, s, m, function(fmt, ...) lines[#lines + 1] = string.format(fmt, ...) end)
    local l = table.concat(lines, "\n")
    return l:match("H2D (%S+ %S+) before"), l:match("D2H (%S+ %S+) after")
  end
  local base = src(OFF)
  local frozen = base:gsub('shape = { 8, 6 } }', 'shape = { 8, 6 }, frozen = true }')
  assert(frozen ~= base, "a.w frozen")
  local h0, d0 = link(base)
  local h1, d1 = link(frozen)
  assert(h0 and d0, "the host link line")
  H.eq(h1, h0, "H2D: the whole shard, frozen parameters included")
  assert(d1 ~= d0, "D2H: the trainable shards alone (" .. tostring(d1) .. " vs " .. tostring(d0) .. ")")
end

function T.refusals()
  H.plan_fails(src('{ pin_memory = false }'), "fsdp.pin_memory", "no unit offloads", "cpu_offload = true")
  H.plan_fails(src('{}', ", pin_memory = true"), "model.units[2].pin_memory", "does not offload")
  H.plan_fails(src(OFF, ", cpu_offload = false, pin_memory = false"), "model.units[2].pin_memory")
  H.plan_fails(src(PLAIN, nil, "{ host_GBps = 20 }"), "topology.host_GBps", "no unit offloads")
  H.plan_fails([[return { world_size = 2, parallel = { dp_shard = 2 }, model = { family = "generic", units = {
    { name = "a", params = { { name = "a.w", shape = { 4, 4 } } } },
    { name = "root", params = {}, cpu_offload = true } } } }]], "model.units[2].cpu_offload", "no parameters")
end



-- Where no mesh fits, the advisor plans the smallest again with
-- fsdp.cpu_offload = true and says what it then needs (GPU and host).
function T.advisor_tries_cpu_offload()
  local advisor = require("gen.advisor")
  local load = require("gen.load")
  local text = src(PLAIN, nil, "{ gpu_memory_GB = 0.000001 }")
  local res = advisor.rank(load.source(text, "plans/t.lua"), { no_pipeline = true })
  local top = res.results[1]
  H.eq(top.fits, false, "nothing fits in 1 kB")
  local o = res.offload
  assert(o and o.mesh == top.mesh and o.ac == top.ac, "the smallest mesh tried with cpu_offload")
  assert(o.host_bytes > 0, "its sharded state in host memory")
  local out = {}
  advisor.explain(top, res, out)
  local all = table.concat(out, "\n")
  assert(all:find("With fsdp.cpu_offload = true (FSDP2's CPUOffloadPolicy", 1, true), all)
  -- a plan that offloads already gets no such line
  local res2 = advisor.rank(load.source(src(OFF, nil, "{ gpu_memory_GB = 0.000001 }"), "plans/t.lua"),
    { no_pipeline = true })
  H.eq(res2.offload, nil, "already offloading")
end
return T
