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
                "ZBVZeroBubble-pp4-dp1-mb8", "1F1B-pp2-dr2-dp2-mb4" }

local function load(name) return json.decode(H.read(DIR .. name .. ".json")) end

function T.recorded_runs_equal_the_derivation()
  for _, name in ipairs(CASES) do
    local diff, res = live.check_case(load(name))
    H.eq(diff, nil, name)
    H.eq(res.p2p > 0, true, name .. " has point-to-point ops")
  end
end

-- HSDP x PP (8 ranks): a missing all-reduce, or one on the wrong group,
-- is a difference naming the rank.
function T.hsdp_all_reduce_is_checked()
  local c = load("1F1B-pp2-dr2-dp2-mb4")
  local ev = c.ranks[6].events
  local ar
  for i, e in ipairs(ev) do if e.op == "all_reduce" then ar = i; break end end
  assert(ar, "the recording has HSDP's all-reduces")
  local saved = ev[ar].ranks
  ev[ar].ranks = { 4, 5 }
  local diff = live.check_case(c)
  assert(type(diff) == "string" and diff:find("rank 5", 1, true), "a wrong replicate group: " .. tostring(diff))
  ev[ar].ranks = saved
  table.remove(ev, ar)
  diff = live.check_case(c)
  assert(type(diff) == "string" and diff:find("rank 5", 1, true), "a missing all-reduce: " .. tostring(diff))
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
  local f = require("gen.pipeline").stage_fsdp_from_plan({ { name = "l", params = { { name = "w", shape = { 5, 3 } } } },
                                       { name = "root", params = {} } }, 2, 4, "fp32")
  H.eq(#f.gathers, 1, "one unit gathered"); H.eq(f.gathers[1].count, 9, "ceil(5/2) rows x 3 per rank")
  H.eq(#f.reduces, 1, "one unit reduced"); H.eq(f.reduces[1].count, 9, "reduce-scatter output per rank")
end


-- HSDP under PP: each unit's reduce-scatter over its shard group, then the
-- all-reduce of its output over the replicas (FSDP2's foreach_reduce), at
-- REDUCE_GRAD; the mesh pp x dp_replicate x dp_shard, pp outermost.
function T.hsdp_all_reduces_follow_their_reduce_scatters()
  local s = pps.derive({ schedule = "1F1B", pp = 2, microbatches = 2 })
  local f = require("gen.pipeline").stage_fsdp_from_plan({ { name = "l", params = { { name = "w", shape = { 5, 3 } } } },
                                       { name = "root", params = {} } }, 2, 2, "fp32", 2)
  H.eq(#f.reduces, 2, "a reduce-scatter and an all-reduce")
  H.eq(f.reduces[1].kind, "reduce_scatter", "first the reduce-scatter")
  H.eq(f.reduces[2].kind, "all_reduce", "then the all-reduce")
  H.eq(f.reduces[2].count, 9, "of the reduce-scatter's output")
  local ev = seq.expected(s, { dp_shard = 2, dp_replicate = 2, act_numel = 7, act_dtype = "fp32",
                               stage_fsdp = function() return f end })
  H.eq(#ev, 8, "pp 2 x dp_replicate 2 x dp_shard 2")
  -- global rank 5 = (pp 1, replica 0, shard 1): shard group {4, 5}, replicas {5, 7}, pp peer 1
  local kinds = {}
  for _, e in ipairs(ev[6]) do
    if e.op == "reduce_scatter" then H.list_eq(e.ranks, { 4, 5 }, "shard group") end
    if e.op == "all_reduce" then
      H.list_eq(e.ranks, { 5, 7 }, "replicate group"); H.eq(e.in_numel, 9, "in"); H.eq(e.out_numel, 9, "out")
    end
    if e.op == "recv" then H.eq(e.peer, 1, "pp peer") end
    if e.op ~= "send" and e.op ~= "recv" then kinds[#kinds + 1] = e.op end
  end
  H.list_eq(kinds, { "all_gather", "reduce_scatter", "all_reduce" }, "collectives in order")
end

-- torchtitan's fsdp_reshard_after_forward = "always" under PP (issue 41;
-- tests/pp/torch_pipeline_record.py --reshard-after-forward): every
-- microbatch's forward gathers each unit again and its backward too; a
-- zero-bubble schedule whose last stage ends on I reduces none of that
-- stage's gradients in torch 2.15, which commplan refuses. The mutant
-- (the "default" policy's sequence over the same recording) differs.
function T.always_policy_per_microbatch_gathers()
  local c = load("1F1B-pp2-dp2-mb4-always")
  local diff, res = live.check_case(c)
  H.eq(diff, nil, "1F1B under always")
  -- rank 0 runs stage 0's 4 units as F0 F1 B0 F2 B1 F3 B2 B3: F0, F1 (after a forward resharded them)
  -- and B0, B1, B2 (each after a forward) gather all 4; F2, F3 (after a backward kept them) and B3 none
  local ags = 0
  for _, e in ipairs(c.ranks[1].events) do if e.phase == "step" and e.op == "all_gather" then ags = ags + 1 end end
  H.eq(res.colls > 0, true, "collectives compared")
  c.reshard_after_forward = false
  local mutant = live.check_case(c)
  H.eq(type(mutant), "string", "the default policy's sequence differs from the always run")
  local z = load("ZBVZeroBubble-pp2-dp2-mb4-always")
  local zd, zr = live.check_case(z)
  H.eq(zd, nil, "ZBV under always: refused, as torch drops the last stage's reduction")
  H.eq(zr.dropped, true, "recorded: the last stage without gradients")
  H.eq(ags, 20, "rank 0's all-gathers")
end

return T
