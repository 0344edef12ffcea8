-- gen/parallel/pp_sequence.lua: each rank's sends, receives and FSDP
-- collectives in one pipeline step, against runs of torch 2.15's
-- torch.distributed.pipelining on gloo recorded by
-- tests/pp/torch_pipeline_record.py (tests/pp/recorded/live/, step events
-- only; tests/pp/check_pipeline_live.sh runs the whole matrix live).
local H = require("helpers")
local json = require("gen.json")
local pps = require("gen.parallel.pp_schedule")
local seq = require("gen.parallel.pp_sequence")
local live = require("tests.pp.compare_pipeline_live")
local T = {}

local DIR = "tests/pp/recorded/live/"
local CASES = { "1F1B-pp2-dp2-mb4", "Interleaved1F1B-pp2-dp2-mb4-mas1", "DualPipeV-pp2-dp1-mb4",
                "ZBVZeroBubble-pp4-dp1-mb8" }

local function load(name) return json.decode(H.read(DIR .. name .. ".json")) end

function T.recorded_runs_equal_the_derivation()
  for _, name in ipairs(CASES) do
    local diff, res = live.check_case(load(name))
    H.eq(diff, nil, name)
    H.eq(res.p2p > 0, true, name .. " has point-to-point ops")
  end
end

function T.a_changed_event_is_a_difference()
  local c = load("1F1B-pp2-dp2-mb4")
  local function first(r, op)
    for _, e in ipairs(c.ranks[r].events) do if e.op == op then return e end end
  end
  local e = first(3, "send")
  e.peer = 1
  local diff = live.check_case(c)
  H.eq(type(diff), "string", "a wrong peer is reported")
  H.eq(diff:find("rank 2", 1, true) ~= nil, true, "naming the rank: " .. tostring(diff))
  e.peer = 0
  c = load("Interleaved1F1B-pp2-dp2-mb4-mas1")
  local ev = c.ranks[1].events
  for i, x in ipairs(ev) do
    if x.op == "all_gather" and x.action:match("UNSHARD") and i > 5 then table.remove(ev, i); break end
  end
  H.eq(type(live.check_case(c)), "string", "a missing re-gather after an eviction is reported")
end

function T.mesh_puts_pp_outermost()
  local s = pps.derive({ schedule = "GPipe", pp = 2, microbatches = 2 })
  local units = { gathers = { { unit = "a", count = 5, dtype = "fp32" } },
                  reduces = { { unit = "a", count = 5, dtype = "fp32" } } }
  local ev = seq.expected(s, { dp_shard = 2, act_numel = 7, act_dtype = "fp32",
                               stage_fsdp = function() return units end })
  -- global rank 1 = (pp 0, dp 1): sends to (pp 1, dp 1) = 3; its FSDP group is {0, 1}
  local sends, gathers, reduces = 0, 0, 0
  for _, e in ipairs(ev[2]) do
    if e.op == "send" then H.eq(e.peer, 3, "peer"); H.eq(e.numel, 7, "numel"); sends = sends + 1 end
    if e.op == "all_gather" then
      H.list_eq(e.ranks, { 0, 1 }, "fsdp group"); H.eq(e.out_numel, 10, "gathered"); H.eq(e.action, "0F0", "at F0")
      gathers = gathers + 1
    end
    if e.op == "reduce_scatter" then H.eq(e.action, "0REDUCE_GRAD", "at REDUCE_GRAD"); reduces = reduces + 1 end
  end
  H.eq(sends, 2, "one send per microbatch"); H.eq(gathers, 1, "gathered once"); H.eq(reduces, 1, "reduced once")
  local f = seq.stage_fsdp_from_plan({ { name = "l", params = { { name = "w", shape = { 5, 3 } } } },
                                       { name = "root", params = {} } }, 2, 4, "fp32")
  H.eq(#f.gathers, 1, "one unit gathered"); H.eq(f.gathers[1].count, 9, "ceil(5/2) rows x 3 per rank")
  H.eq(#f.reduces, 1, "one unit reduced"); H.eq(f.reduces[1].count, 9, "reduce-scatter output per rank")
end

return T
