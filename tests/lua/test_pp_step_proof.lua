-- gen/parallel/pp_step_proof.lua (issue 22, item 3): the whole step --
-- every global rank's sends, receives and FSDP collectives as
-- gen/parallel/pp_sequence.lua derives them -- matches and cannot deadlock
-- under one queue per rank; and one small failing example per thing it
-- catches, each with its exact reason.
local H = require("helpers")
local pps = require("gen.parallel.pp_schedule")
local stages = require("gen.parallel.pp_stages")
local seq = require("gen.parallel.pp_sequence")
local proof = require("gen.parallel.pp_step_proof")
local util = require("gen.util")
local T = {}

-- A small decoder's FSDP units per stage, torchtitan's split of n_layers
-- (pp_stages.split); elements per rank of each unit, as a stage plan
-- would size them: tok_embeddings 24, a layer 10, norm+lm_head 26.
local COUNT = { tok_embeddings = 24, layer = 10, norm = 26 }
local function stage_fsdp_of(split)
  return function(s)
    local f = { gathers = {}, reduces = {} }
    local units = {}
    for _, m in ipairs(split[s + 1]) do
      if m == "tok_embeddings" then units[#units + 1] = { m, COUNT.tok_embeddings }
      elseif m:match("^layers%.") then units[#units + 1] = { m, COUNT.layer }
      elseif m == "norm" then units[#units + 1] = { "norm+lm_head", COUNT.norm } end
    end
    for _, u in ipairs(units) do f.gathers[#f.gathers + 1] = { unit = u[1], count = u[2], dtype = "bf16" } end
    for k = #units, 1, -1 do f.reduces[#f.reduces + 1] = { unit = units[k][1], count = units[k][2], dtype = "fp32" } end
    return f
  end
end

-- Every global rank's events for schedule `name` on pp x dp_shard, one
-- microbatch's activation of act_numel fp32 (48 unless given).
local function events(name, pp, n, dp, o)
  o = o or {}
  local sched = pps.derive({ schedule = name, pp = pp, microbatches = n, unchecked = o.unchecked })
  local split = o.split or stages.split(nil, sched.num_stages, o.n_layers or 2 * sched.num_stages)
  return seq.expected(sched, { dp_shard = dp, act_numel = o.act_numel or 48, act_dtype = "fp32",
                               stage_fsdp = stage_fsdp_of(split) }), sched, split
end

local function fails(ev, want, what)
  local ok, why = proof.prove(ev)
  H.eq(ok, nil, (what or "") .. " verdict")
  H.eq(why, want, (what or "") .. " reason")
end

local function index_of(list, pred)
  for i = 1, #list do if pred(list[i]) then return i end end
  error("no such event")
end

local function is(op) return function(e) return e.op == op end end

function T.passes_every_schedule()
  -- counts: each message is a send and its receive; each stage's units
  -- are gathered once and reduced once on its FSDP group (pp x dp_shard:
  -- one group per pp rank, both stages of a rank on it).
  for _, name in ipairs(pps.SCHEDULES) do
    for _, c in ipairs({ { 2, 4, 1 }, { 2, 4, 2 }, { 2, 8, 4 }, { 4, 8, 1 }, { 4, 8, 2 }, { 4, 16, 2 }, { 8, 16, 2 } }) do
      local pp, n, dp = c[1], c[2], c[3]
      local ev, sched, split = events(name, pp, n, dp)
      local got, why = proof.prove(ev)
      local what = string.format("%s pp %d microbatches %d dp_shard %d", name, pp, n, dp)
      if not got then error(what .. ": " .. why) end
      local cross = 0  -- stage boundaries between two ranks
      for s = 0, sched.num_stages - 2 do
        if sched.stage_to_rank[s] ~= sched.stage_to_rank[s + 1] then cross = cross + 1 end
      end
      local units = 0
      for s = 0, sched.num_stages - 1 do units = units + #stage_fsdp_of(split)(s).gathers end
      H.eq(got.ranks, pp * dp, what .. " ranks")
      H.eq(got.p2p, dp * cross * n * 2, what .. " messages")
      H.eq(got.collectives, dp > 1 and 2 * units or 0, what .. " collectives")
      H.eq(got.groups, dp > 1 and pp or 0, what .. " groups")
      H.eq(got.events, 2 * got.p2p + dp * got.collectives, what .. " events")
      local batches = 0  -- the lowered lists' coalesced units (1F1B's pairs), once per dp rank
      for _, list in ipairs(sched.lowered) do
        local seen = {}
        for _, a in ipairs(list) do
          if a.batch and not seen[a.batch] then seen[a.batch] = true; batches = batches + 1 end
        end
      end
      H.eq(got.batches, dp * batches, what .. " coalesced batches")
      if name == "1F1B" and pp == 4 and n == 8 then H.eq(batches, 36, "1F1B pp 4 microbatches 8: 36 pairs") end
    end
  end
end

function T.counts_for_llama405b_pp()
  local load = require("gen.load")
  local report = require("gen.pipeline")
  local text = report.text(load.source(H.read("bench/llama405b_pp.lua"), "bench/llama405b_pp.lua"))
  local line = text:match("\n(whole%-step proof[^\n]*)")
  H.eq(line, "whole-step proof (gen/parallel/pp_step_proof.lua), one queue per rank on pp 8 x dp_shard 8 = 64 ranks "
    .. "(TP ranks alike): Interleaved1F1B's 9728 events, 256 FSDP collectives on 8 groups and 3840 sends "
    .. "matched to their receives cannot deadlock; every schedule with a row passed it", "the report's line")
end

function T.report_refuses_a_failing_step()
  -- make pipeline refuses the plan's schedule when the whole-step proof
  -- fails (here a stand-in verdict), in one line naming the file and field.
  local load = require("gen.load")
  local report = require("gen.pipeline")
  local real = proof.prove
  proof.prove = function() return nil, "deadlock (one queue per rank): stand-in" end
  local ok, e = pcall(report.text, load.source(H.read("bench/llama405b_pp.lua"), "bench/llama405b_pp.lua"))
  proof.prove = real
  H.eq(ok, false, "refused")
  H.eq(util.is_plan_error(e), true, "a plan error (exit 2)")
  H.eq(tostring(e), "bench/llama405b_pp.lua:10: pipeline.schedule: Interleaved1F1B refuses this plan: the whole-step "
    .. "proof fails: deadlock (one queue per rank): stand-in; pick another schedule (make pipeline without "
    .. "pipeline.schedule lists the ones that run)", "reason")
end

-- (a) Too few microbatches for a schedule that needs more: derive refuses
-- what torch refuses, naming torch's line; below what DualPipeV's order can
-- run at all, lowering names the action that never gets its input; and
-- make pipeline refuses the plan's schedule in one line naming the field.
function T.too_few_microbatches()
  local function refusal(spec)
    local ok, e = pcall(pps.derive, spec)
    H.eq(ok, false, "refused")
    H.eq(util.is_plan_error(e), true, "a plan error")
    return tostring(e)
  end
  H.eq(refusal({ schedule = "DualPipeV", pp = 2, microbatches = 3 }), "pp_schedule: microbatches = 3 < 4 stages: "
    .. "DualPipeV needs at least as many microbatches as stages (schedules.py:4697); set microbatches >= 4", "DualPipeV")
  H.eq(refusal({ schedule = "1F1B", pp = 4, microbatches = 3 }), "pp_schedule: microbatches = 3 < pp = 4: 1F1B needs "
    .. "at least as many microbatches as stages (schedules.py:1439); set microbatches >= 4 or use GPipe", "1F1B")
  H.eq(refusal({ schedule = "DualPipeV", pp = 2, microbatches = 2, unchecked = true }), "pp_schedule: rank 0 cannot "
    .. "place (3F2;0B0)OVERLAP_F_B: its input is never received (_add_send_recv, schedules.py:2403); fix the compute "
    .. "order", "DualPipeV below what its order runs")
  local load = require("gen.load")
  local report = require("gen.pipeline")
  local src = H.read("bench/llama405b_pp.lua"):gsub("Interleaved1F1B", "DualPipeV"):gsub("microbatches = 16",
    "microbatches = 8"):gsub("local_batch_size = 16", "local_batch_size = 8")
  local ok, e = pcall(report.text, load.source(src, "dpv8.lua"))
  H.eq(ok, false, "make pipeline refuses")
  H.eq(tostring(e), "dpv8.lua:10: pipeline.schedule: DualPipeV refuses this plan: microbatches = 8 < 16 stages: "
    .. "DualPipeV needs at least as many microbatches as stages (schedules.py:4697); set microbatches >= 16; pick "
    .. "another schedule (make pipeline without pipeline.schedule lists the ones that run)", "make pipeline's reason")
  -- torch's rule for 1F1B is policy: with fewer microbatches than stages the step still proves.
  assert(proof.prove((events("1F1B", 4, 2, 2, { unchecked = true }))))
end

-- (b) A mismatched split: the two ranks of stage 0's FSDP group disagree
-- on its layers (dp rank 1 puts 4 of 6 layers on stage 0, dp rank 0 puts
-- 3): their 5th collective on the group is a reduce-scatter on one, an
-- all-gather on the other. And the two ends of a transfer disagree on the
-- microbatch (the receiver splits the batch in 8, the sender in 4).
function T.mismatched_split()
  local a = events("GPipe", 2, 4, 2, { n_layers = 6 })
  local b = events("GPipe", 2, 4, 2, { split = { { "tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3" },
                                                 { "layers.4", "layers.5", "norm", "lm_head" } } })
  a[2], a[4] = b[2], b[4]
  fails(a, "rank 1 event 4 (all_gather ranks 0,1 unit layers.3 in 10 out 20 bf16, 0F0) and rank 0 event 12 "
    .. "(reduce_scatter ranks 0,1 unit layers.2 in 20 out 10 fp32, 0REDUCE_GRAD) are the 5th collective on group 0,1 "
    .. "but differ in op (all_gather vs reduce_scatter)", "layers")
  local c = events("GPipe", 2, 4, 2, { n_layers = 6 })
  local d = events("GPipe", 2, 4, 2, { n_layers = 6, act_numel = 24 })
  c[3], c[4] = d[3], d[4]
  fails(c, "rank 0 event 4 (send to 2 numel 48 fp32, 0F0) and rank 2 event 0 (recv from 0 numel 24 fp32) are the "
    .. "1st message from rank 0 to rank 2 but differ in numel (48 vs 24)", "activations")
end

-- (c) A reordered group.
function T.reordered_group_mismatch()
  -- One FSDP group's two ranks issue its first two all-gathers in opposite
  -- order: NCCL pairs them by order, so they disagree.
  local ev = events("Interleaved1F1B", 2, 4, 2)
  local r1 = ev[2]
  r1[1], r1[2] = r1[2], r1[1]
  fails(ev, "rank 0 event 0 (all_gather ranks 0,1 unit tok_embeddings in 24 out 48 bf16, 0UNSHARD) and rank 1 "
    .. "event 0 (all_gather ranks 0,1 unit layers.0 in 10 out 20 bf16, 0UNSHARD) are the 1st collective on group 0,1 "
    .. "but differ in unit (tok_embeddings vs layers.0)")
end

function T.reordered_group_deadlock()
  -- dp rank 1 (global ranks 1 and 3) moves its stage's all-gathers to the
  -- other side of its first transfer: rank 1 sends before gathering,
  -- rank 3 gathers before receiving. Each collective waits for a rank
  -- blocked in a transfer that waits for the other collective.
  local ev = events("GPipe", 2, 2, 2, { n_layers = 2 })
  local r1, r3 = ev[2], ev[4]
  local send = index_of(r1, is("send"))
  table.insert(r1, 1, table.remove(r1, send))
  local recv = table.remove(r3, index_of(r3, is("recv")))
  local k = 1
  while r3[k].op == "all_gather" do k = k + 1 end
  table.insert(r3, k, recv)
  fails(ev, "deadlock (one queue per rank): rank 0 event 0 (all_gather ranks 0,1 unit tok_embeddings in 24 out 48 "
    .. "bf16, 0F0) waits for rank 1, which waits at event 0 (send to 3 numel 48 fp32, 0F0) for rank 3, which waits "
    .. "at event 0 (all_gather ranks 2,3 unit layers.1 in 10 out 20 bf16, 1F0) for rank 2, which waits at event 0 "
    .. "(recv from 0 numel 48 fp32) for rank 0")
  -- Two collectives on two groups in opposite order (HSDP's reduce-scatter
  -- on the shard group and all-reduce on the replicate group, one replica
  -- reversed): a cycle through all four ranks.
  local function c(op, ranks) return { op = op, ranks = ranks, in_numel = 8, out_numel = 8, dtype = "fp32" } end
  fails({ { c("reduce_scatter", { 0, 1 }), c("all_reduce", { 0, 2 }) },
          { c("all_reduce", { 1, 3 }), c("reduce_scatter", { 0, 1 }) },
          { c("all_reduce", { 0, 2 }), c("reduce_scatter", { 2, 3 }) },
          { c("reduce_scatter", { 2, 3 }), c("all_reduce", { 1, 3 }) } },
    "deadlock (one queue per rank): rank 0 event 0 (reduce_scatter ranks 0,1 in 8 out 8 fp32) waits for rank 1, "
    .. "which waits at event 0 (all_reduce ranks 1,3 in 8 out 8 fp32) for rank 3, which waits at event 0 "
    .. "(reduce_scatter ranks 2,3 in 8 out 8 fp32) for rank 2, which waits at event 0 (all_reduce ranks 0,2 in 8 out "
    .. "8 fp32) for rank 0", "two groups")
end

function T.batches()
  -- 1F1B is safe because torch coalesces each forward send with the next
  -- backward receive (batch_isend_irecv): one unit, its ops in any order.
  local ev = events("1F1B", 2, 4, 2)
  assert(proof.prove(ev))
  local first = index_of(ev[1], function(e) return e.batch ~= nil end)
  ev[1][first], ev[1][first + 1] = ev[1][first + 1], ev[1][first]
  assert(proof.prove(ev), "a batch's order inside it does not matter")
  -- Issued one by one, both ranks of a pair send first.
  ev = events("1F1B", 2, 4, 2)
  for _, list in ipairs(ev) do for _, e in ipairs(list) do e.batch = nil end end
  fails(ev, "deadlock (one queue per rank): rank 0 event 4 (send to 2 numel 48 fp32, 0F1) waits for rank 2, which "
    .. "waits at event 4 (send to 0 numel 48 fp32, 1B0) for rank 0")
end

-- (d) A send with no receive, and a receive with no send.
function T.unmatched_p2p()
  local ev = events("GPipe", 2, 4, 1)
  table.remove(ev[2], index_of(ev[2], is("recv")))
  fails(ev, "rank 0 event 3 (send to 1 numel 48 fp32, 0F3) is the 4th message from rank 0 to rank 1; rank 1 "
    .. "receives only 3 from rank 0: no receive matches it", "send")
  ev = events("GPipe", 2, 4, 1)
  table.remove(ev[2], index_of(ev[2], is("send")))
  fails(ev, "rank 0 event 7 (recv from 1 numel 48 fp32, 0B2) is the 4th message from rank 1 to rank 0; rank 1 "
    .. "sends only 3 to rank 0: no send matches it", "receive")
  -- a collective one member never issues
  ev = events("GPipe", 2, 2, 2)
  table.remove(ev[2], #ev[2])
  fails(ev, "rank 0 event 9 (reduce_scatter ranks 0,1 unit tok_embeddings in 48 out 24 fp32, 0REDUCE_GRAD) is the "
    .. "6th collective on group 0,1; rank 1 issues only 5 there: it never completes", "collective")
end

function T.structural_failures()
  fails({ { { op = "send", peer = 5, numel = 1, dtype = "fp32" } }, {} },
    "rank 0 event 0 (send to 5 numel 1 fp32): its peer is not a rank in 0..1")
  fails({ { { op = "all_gather", ranks = { 1 }, in_numel = 1, out_numel = 1, dtype = "fp32" } }, {} },
    "rank 0 event 0 (all_gather ranks 1 in 1 out 1 fp32): its group does not hold rank 0")
  fails({ { { op = "all_gather", ranks = { 0, 0 }, in_numel = 1, out_numel = 2, dtype = "fp32" } } },
    "rank 0 event 0 (all_gather ranks 0,0 in 1 out 2 fp32): its group holds rank 0 twice")
  fails({ { { op = "all_gather", group = "g", ranks = { 0, 1 }, in_numel = 1, out_numel = 2, dtype = "fp32" } },
          { { op = "all_gather", group = "g", ranks = { 1 }, in_numel = 1, out_numel = 2, dtype = "fp32" } } },
    "rank 0 event 0 (all_gather ranks 0,1 in 1 out 2 fp32) and rank 1 event 0 (all_gather ranks 1 in 1 out 2 fp32) "
    .. "name group g with different ranks")
end

return T
