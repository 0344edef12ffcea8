-- Issue 19: generation is linear in units x micro-steps, with no cap on
-- micro-steps short of the generator's memory. The guard counts the Lua
-- VM instructions the generator runs (a debug hook), not seconds: doubling
-- the micro-steps or the layers must no more than double the work.
local H = require("helpers")
local load_plan = require("gen.load")
local plan = require("gen.plan")
local emit = require("gen.emit")
local audit = require("gen.audit")
local rep_mod = require("gen.repeat")
local T = {}

local TP_PLAN = [[
return {
  world_size = 16,
  parallel = { dp_replicate = 2, dp_shard = -1, tp = 2 },
  model = { family = "llama", dim = 64, n_layers = %d, n_heads = 4, n_kv_heads = 2, vocab_size = 256,
            multiple_of = 16, ffn_dim_multiplier = 1.3, seq_len = 128 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", micro_steps = %d },
  training = { activation_checkpointing = "full" },
}
]]

local function read(path)
  local fh = assert(io.open(path, "rb"))
  local s = fh:read("a")
  fh:close()
  return s
end

local templates
-- Every file the CLI writes, from a loaded plan (the sandboxed load runs
-- outside the count: it has its own instruction limit and hook).
local function generate(loaded)
  templates = templates or { ["plan.h.in"] = read("templates/plan.h.in"), ["plan.c.in"] = read("templates/plan.c.in"),
                             ["plan_kernels.cu.in"] = read("templates/plan_kernels.cu.in") }
  local p = plan.from_loaded(loaded)
  p.source_file = "t.lua"
  local fp = audit.fingerprint(p)
  local files = emit.render(p, fp, templates)
  files["plan.json"] = audit.json(p, fp)
  files["SCHEDULE.md"] = audit.schedule_md(p, fp)
  files["trace.json"] = audit.trace_json(p, fp)
  return p, files
end

-- Thousands of VM instructions the generator runs for the plan: the
-- pipeline up to the plan table (schedule, proofs, memory plan: where
-- the quadratic stages were), or with every file rendered too.
local function work(layers, micro, render)
  local loaded = load_plan.source(string.format(TP_PLAN, layers, micro), "t.lua")
  collectgarbage()
  local n = 0
  debug.sethook(function() n = n + 1 end, "", 1000)
  local ok, err = pcall(render and generate or plan.from_loaded, loaded)
  debug.sethook()
  if not ok then error(err, 0) end
  return n
end

local function at_most_double(what, small, big)
  local r = big / small
  if r > 2.1 then error(string.format("%s took %.2fx the work (%d -> %d thousand instructions)", what, r, small, big)) end
end

-- 64 micro-steps (refused before: 19 units x 64 was over the old cap of
-- 1024) generate every file. Micro-steps 3-62 are one repeated row set
-- (gen/repeat.lua): the tables hold micro-steps 0-3 and 63, the executor
-- issues one micro-step's ops 64 times over, in the order and with the
-- figures of the same plan planned in full.
function T.sixty_four_micro_steps_generate()
  local one = generate(load_plan.source(string.format(TP_PLAN, 16, 1), "t.lua"))
  local loaded = load_plan.source(string.format(TP_PLAN, 16, 64), "t.lua")
  local p, files = generate(loaded)
  local per = #one.ops
  H.eq(rep_mod.executed_count(p.ops, p.rep), 64 * per, "ops issued at 64 micro-steps")
  H.eq(#p.ops, 5 * per, "table rows: micro-steps 0-3 and 63")
  H.eq(p.rep.times, 60, "repetitions of micro-step 3's rows")
  H.eq(p.rep.micro_last, 62, "the repeated run's last micro-step")
  H.eq(p.ops[#p.ops].micro_step, 63, "last op's micro-step")
  for _, name in ipairs({ "plan.c", "plan.h", "plan.json", "SCHEDULE.md", "trace.json", "plan_kernels.cu" }) do
    if not files[name] or #files[name] == 0 then error(name .. " missing at 64 micro-steps") end
  end
  local _, invoked = files["plan.c"]:gsub("\n    T_OPS_REPEAT%(%d+%)", "")
  H.eq(invoked, 60, "plan.c invokes the repeated rows once per repetition")
  local full = plan.from_loaded(loaded, { expand = true })
  H.eq(full.rep, nil, "planned in full")
  local i = 0
  rep_mod.each(p.ops, p.rep, function(o, m)
    i = i + 1
    local f = full.ops[i]
    if not (f and f.kind == o.kind and f.unit == o.unit and f.micro_step == m and f.group == o.group
            and f.count == o.count and f.stream == o.stream) then
      error(string.format("issued op %d: %s unit %d micro %d, planned in full %s", i - 1, o.kind, o.unit, m,
        f and (f.kind .. " unit " .. f.unit .. " micro " .. f.micro_step) or "nothing"))
    end
  end)
  H.eq(i, #full.ops, "ops issued")
  local a, b = audit.analysis(p), audit.analysis(full)
  for _, k in ipairs({ "step_us", "compute_us", "exposed_us", "waits_us", "comm_us", "alone_us" }) do
    H.eq(a[k], b[k], k .. " repeated vs in full")
  end
  H.eq(p.memory.peak_bytes, full.memory.peak_bytes, "peak memory")
end

-- Doubling micro-steps, or layers, at most doubles the work. The pairwise
-- arena planner this replaced gave 2.23x from 48 to 96 micro-steps (4
-- layers) and 3.59x from 24 to 48 layers (8 micro-steps); the linear
-- stages give 2.00x and 1.97x. (Instructions, not seconds: the same on
-- any machine and load. Work in C functions, table.insert's shifts and
-- table.sort, is not counted.)
function T.work_is_linear_in_units_and_micro_steps()
  at_most_double("the plan at 2x micro-steps", work(4, 48), work(4, 96))
  at_most_double("the plan at 2x layers", work(24, 8), work(48, 8))
  local base = work(4, 8, true)
  at_most_double("every file at 2x micro-steps", base, work(4, 16, true))
  at_most_double("every file at 2x layers", base, work(8, 8, true))
end

return T
