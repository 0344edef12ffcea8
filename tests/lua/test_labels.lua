-- Issue 37, item 5: every collective on the compute stream named as what it
-- is (gen/timeline.lua's labels) in SCHEDULE.md, timeline.svg and
-- trace.json: the expert all-to-alls never "TP collectives", context
-- parallel's K/V exchange never TP's.
local H = require("helpers")
local plan = require("gen.plan")
local audit = require("gen.audit")
local json = require("gen.json")
local timeline = require("gen.timeline")

local T = {}

local function read(path)
  local fh = assert(io.open(path, "rb"))
  local s = fh:read("a")
  fh:close()
  return s
end

local function load(path, edit)
  local src = read(path)
  if edit then src = edit(src) end
  return plan.from_source(src, path)
end

local function outputs(p)
  return audit.schedule_md(p, "fp"), audit.timeline_svg(p, "fp"), json.decode(audit.trace_json(p, "fp"))
end

-- The step line's critical path (SCHEDULE.md's summary).
local function step_line(md) return md:match("\n| step | ([^\n]*)") end

function T.labels_in_one_place()
  H.eq(timeline.inline_labels({ ep = true }), "expert all-to-alls", "ep")
  H.eq(timeline.inline_labels({ cp = true, tp = true }), "TP collectives and CP K/V collectives", "tp + cp")
  H.eq(timeline.inline_labels({ ep = true, tp = true, cp = true }),
    "TP collectives, CP K/V collectives and expert all-to-alls", "all three, in order")
  H.eq(timeline.inline_labels({}), "collectives", "none")
end

-- EP without TP (plans/mixtral8x7b's shape): the all-to-alls on the
-- critical path are expert all-to-alls everywhere.
function T.expert_all_to_alls_are_not_tp_collectives()
  local p = load("tests/ep/plans/ep2_mixtral.lua")
  H.eq(p.dims.tp, 1, "no TP")
  local md, svg, tr = outputs(p)
  local line = step_line(md)
  assert(line:find("compute %+ [%d.]+ [mu]?s expert all%-to%-alls"), line)
  assert(not md:find("TP collectives", 1, true), "SCHEDULE.md names no TP collectives")
  assert(not md:find("(TP group)", 1, true), "no TP group without TP")
  assert(svg:find("expert all-to-alls", 1, true) and not svg:find("TP collectives", 1, true), "timeline.svg")
  local n = 0
  for _, e in ipairs(tr.traceEvents) do
    if e.ph == "X" and e.args.group == "ep" then
      H.eq(e.args.label, "expert all-to-alls", e.name)
      n = n + 1
    end
    assert(not (e.args and e.args.label == "TP collectives"), "a TP label in an EP-only trace: " .. tostring(e.name))
  end
  assert(n > 0, "the trace has the all-to-alls")
end

-- CP's K/V exchange (the TP op kinds on the cp group) and TP's under full
-- checkpointing: the rerun inside backward by group.
function T.cp_and_tp_named_apart()
  local p = load("tests/plans/llama_tiny_cp.lua")
  local md, svg, tr = outputs(p)
  assert(step_line(md):find("CP K/V collectives", 1, true) and not step_line(md):find("TP collectives", 1, true),
    step_line(md))
  assert(not svg:find("TP collectives", 1, true), "timeline.svg: CP's are not TP's")
  for _, e in ipairs(tr.traceEvents) do
    if e.ph == "X" and e.args.group == "cp" then H.eq(e.args.label, "CP K/V collectives", e.name) end
  end
  local tp = load("plans/llama_tiny_tp.lua", function(s)
    return s:gsub("training = {", 'training = { activation_checkpointing = "full",', 1)
  end)
  local tmd, _, ttr = outputs(tp)
  assert(tmd:find("full checkpointing reruns the forward, its TP collectives included", 1, true)
    or step_line(tmd):find("TP collectives", 1, true), "TP's named")
  local reruns = 0
  for _, e in ipairs(ttr.traceEvents) do
    local by = e.args and e.args.recompute_by_group
    if by then
      reruns = reruns + 1
      H.eq(e.args.recompute_comm_us, by.tp, e.name .. ": the rerun is TP's")
    end
  end
  assert(reruns > 0, "full checkpointing reruns TP's collectives inside backward")
end

-- diff-plan: tokens/s and MFU before and after, so doubling micro_steps
-- (twice the tokens, about twice the step) reads as the same throughput.
function T.diff_plan_prints_throughput()
  local base = os.tmpname()
  local tmp = base .. ".lua"
  local fh = assert(io.open(tmp, "wb"))
  fh:write((read("plans/llama8b.lua"):gsub('reduce_dtype = "fp32" }', 'reduce_dtype = "fp32", micro_steps = 2 }', 1)))
  fh:close()
  local ph = assert(io.popen(string.format("lua5.4 gen/verbs.lua diff plans/llama8b.lua '%s' 2>&1", tmp)))
  local out = ph:read("a")
  ph:close()
  os.remove(tmp)
  os.remove(base)
  local step = out:match("\n  step: [^\n]*%(%+(%d+)%.%d%%%)")
  assert(step and tonumber(step) >= 90, "the step about doubles: " .. out)
  local x, _, d = out:match("\n  tokens/s per GPU: ([%d,]+) %-> ([%d,]+) %(([%+%-][%d.]+)%%%)")
  assert(x and math.abs(tonumber(d)) < 2, "tokens/s per GPU about the same: " .. out)
  local m1, m2 = out:match("\n  MFU: ([%d.]+)%% %-> ([%d.]+)%%")
  assert(m1 and math.abs(m1 - m2) < 1, "MFU before and after: " .. out)
  -- the figures are plan.json's (gen/figures.lua), as SCHEDULE.md prints them
  local doc = require("gen.json").decode(read("plans/llama8b/plan.json"))
  H.eq(x, require("gen.plandiff").commas(doc.audit.throughput.tokens_per_s_per_gpu), "before = plan.json's")
end

return T
