-- gen/parallel/pp_schedule.lua (issue 22): torch 2.15's pipeline schedules
-- against the recording tests/pp/recorded/torch-2.15.json (made by
-- tests/pp/torch_schedule_dump.py --small; tests/pp/check_live.sh runs the
-- whole matrix against a live torch), the input rules, the CSV format and
-- each failure the P2P proof catches.
local H = require("helpers")
local pps = require("gen.parallel.pp_schedule")
local json = require("gen.json")
local util = require("gen.util")
local compare = require("tests.pp.compare")
local T = {}

local function fails(spec, ...)
  local ok, e = pcall(pps.derive, spec)
  if ok then error("expected a refusal", 2) end
  if not util.is_plan_error(e) then error("not a plan error: " .. tostring(e), 2) end
  local msg = tostring(e)
  if msg:find("\n") then error("not one line: " .. msg, 2) end
  for _, pat in ipairs({ ... }) do
    if not msg:find(pat, 1, true) then error(string.format("%q lacks %q", msg, pat), 2) end
  end
end

local function strings(list)
  local out = {}
  for i, a in ipairs(list) do out[i] = pps.format_action(a) end
  return out
end

-- The proof's verdict on `res` with `edit` applied to a copy of its lists.
local function prove_edited(res, edit, opts)
  local lists = {}
  for r, l in ipairs(res.lowered) do
    lists[r] = {}
    for i, a in ipairs(l) do lists[r][i] = a end
  end
  edit(lists)
  return pps.prove_p2p(lists, res.stage_to_rank, res.num_stages, opts)
end

local function find(list, text)
  for i, a in ipairs(list) do if pps.format_action(a) == text then return i end end
  error("no " .. text)
end

function T.recording_matches_every_case()
  local dump = json.decode(H.read("tests/pp/recorded/torch-2.15.json"))
  H.eq(dump.torch, "2.15.0", "recorded torch")
  local counts, order = compare.compare(dump)
  if not counts then error(order) end
  local matched, refused = 0, 0
  for _, name in ipairs(order) do matched, refused = matched + counts[name].matched, counts[name].refused + refused end
  H.eq(#order, 7, "schedules recorded")
  H.eq(matched, 99, "cases that match")
  H.eq(refused, 18, "cases both refuse")
end

function T.small_orders_by_hand()
  -- GPipe, rank 1 of 2: receive each activation, forward all, then backward all.
  local g = pps.derive({ schedule = "GPipe", pp = 2, microbatches = 2 })
  H.list_eq(strings(g.lowered[2]), { "1RECV_F0", "1F0", "1RECV_F1", "1F1", "1B0", "1SEND_B0", "1B1", "1SEND_B1",
    "1WAIT_SEND_B0", "1WAIT_SEND_B1", "1REDUCE_GRAD" }, "GPipe rank 1")
  -- 1F1B fuses the forward send with the next backward receive (one batch).
  local o = pps.derive({ schedule = "1F1B", pp = 2, microbatches = 2 })
  H.list_eq(strings(o.compute[1]), { "0F0", "0F1", "0B0", "0B1" }, "1F1B rank 0 compute")
  H.eq(o.lowered[1][5].batch, o.lowered[1][6].batch, "SEND_F1 and RECV_B0 share a batch")
  H.eq(pps.format_action(o.lowered[1][5]) .. " " .. pps.format_action(o.lowered[1][6]), "0SEND_F1 0RECV_B0", "the batch")
  -- torch's own pipeline_order numbers the last rank's forwards 1..n.
  H.list_eq(strings(o.torch_order[2]), { "1F1", "1B0", "1F2", "1B1", "1REDUCE_GRAD", "1WAIT_REDUCE_GRAD" },
    "1F1B rank 1 torch pipeline_order")
  H.list_eq(strings(o.compute[2]), { "1F0", "1B0", "1F1", "1B1" }, "1F1B rank 1 compute")
  -- V style: stage s and 2pp-1-s on rank s.
  local v = pps.derive({ schedule = "ZBVZeroBubble", pp = 4, microbatches = 8 })
  H.list_eq({ v.stage_to_rank[0], v.stage_to_rank[3], v.stage_to_rank[4], v.stage_to_rank[7] }, { 0, 3, 3, 0 }, "v map")
end

function T.input_rules_are_torch_rules()
  fails({ schedule = "1F1B", pp = 4, microbatches = 3 }, "microbatches = 3 < pp = 4", "schedules.py:1439")
  fails({ schedule = "Interleaved1F1B", pp = 2, microbatches = 5 }, "microbatches = 5", "rounds", "schedules.py:4123",
    "use 4 or 6")
  fails({ schedule = "InterleavedZeroBubble", pp = 4, microbatches = 9 }, "schedules.py:4258")
  fails({ schedule = "DualPipeV", pp = 4, microbatches = 7 }, "microbatches = 7 < 8 stages", "schedules.py:4697")
  fails({ schedule = "ZBVZeroBubble", pp = 2, microbatches = 4, stages_per_rank = 3 }, "stages_per_rank = 3",
    "exactly 2 stages per rank")
  fails({ schedule = "GPipe", pp = 2, microbatches = 4, stages_per_rank = 2 }, "stages_per_rank = 2", "one stage per rank")
  fails({ schedule = "Interleaved1f1b", pp = 2, microbatches = 4 }, "not a torch schedule", "did you mean Interleaved1F1B")
  fails({ schedule = "GPipe", pp = 0, microbatches = 4 }, "pp = 0 must be a positive integer")
  fails({ schedule = "GPipe", pp = 2, microbatches = 2.5 }, "microbatches = 2.5")
  -- What torch refuses is not always unsafe: 1F1B with fewer microbatches
  -- than stages still proves (torch's rule is a policy).
  local r = pps.derive({ schedule = "1F1B", pp = 4, microbatches = 2, unchecked = true })
  assert(pps.prove_p2p(r.lowered, r.stage_to_rank, r.num_stages))
end

function T.proof_passes_every_schedule_at_pp8()
  for _, name in ipairs(pps.SCHEDULES) do
    local r = pps.derive({ schedule = name, pp = 8, microbatches = 16 })
    local ok, why = pps.prove_p2p(r.lowered, r.stage_to_rank, r.num_stages)
    if not ok then error(name .. ": " .. why) end
  end
end

function T.proof_too_few_microbatches()
  -- DualPipeV needs microbatches >= stages: with 2 for 4 stages its order
  -- consumes a gradient no rank ever produces, and lowering says where.
  local ok, e = pcall(pps.derive, { schedule = "DualPipeV", pp = 2, microbatches = 2, unchecked = true })
  assert(not ok)
  H.eq(tostring(e), "pp_schedule: rank 0 cannot place (3F2;0B0)OVERLAP_F_B: its input is never received " ..
    "(_add_send_recv, schedules.py:2403); fix the compute order", "too few microbatches")
end

function T.proof_send_without_receive()
  local r = pps.derive({ schedule = "Interleaved1F1B", pp = 2, microbatches = 2 })
  local ok, why = prove_edited(r, function(l) table.remove(l[2], find(l[2], "1RECV_F1")) end)
  local _
  H.eq(ok, nil, "verdict")
  -- rank 1's F1 is the first to notice: its input was never posted.
  H.eq(why, "rank 1 action 5 (1F1): its input needs 1RECV_F1 first on this rank", "reason")
  -- Rank 1 split the batch differently (it has no microbatch 1): rank 0's send has no receive.
  local g = pps.derive({ schedule = "GPipe", pp = 2, microbatches = 2 })
  _, why = prove_edited(g, function(l)
    table.remove(l[2], find(l[2], "1RECV_F1"))
    table.remove(l[2], find(l[2], "1F1"))
  end)
  H.eq(why, "rank 0 action 3 (0SEND_F1): no 1RECV_F1 on rank 1 matches it", "send without receive")
  _, why = prove_edited(r, function(l) l[1][#l[1] + 1] = { type = "SEND_F", stage = 2, mb = 0 } end)
  H.eq(why, "rank 0 action 34 (2SEND_F0): repeats 2SEND_F0 at action 9", "duplicate send")
  _, why = prove_edited(r, function(l)
    local i = find(l[1], "2SEND_B1")
    table.remove(l[1], i)
    table.remove(l[1], find(l[1], "2WAIT_SEND_B1"))
  end)
  H.eq(why, "rank 1 action 17 (1RECV_B1): no 2SEND_B1 on rank 0 matches it", "receive without send")
end

function T.proof_reordered_receives_deadlock()
  -- Rank 1 posts its receives for microbatches 1 and 0 the other way round:
  -- rank 0 sends 0 then 1 on the same queue, and the heads never meet.
  local r = pps.derive({ schedule = "GPipe", pp = 2, microbatches = 2 })
  local function swap(l)  -- 1RECV_F0 1F0 1RECV_F1 1F1 -> 1RECV_F1 1RECV_F0 1F0 1F1
    local a = l[2]
    a[1], a[2], a[3] = a[3], a[1], a[2]
  end
  local ok, why = prove_edited(r, swap)
  H.eq(ok, nil, "verdict")
  H.eq(why, "deadlock (rank model): rank 0 action 4 (0WAIT_SEND_F0) waits for F0>1:0; rank 1's side is queued " ..
    "behind rank 1 action 0 (1RECV_F1)", "reason")
  -- Without FIFO queues (gloo-like) the same lists complete.
  H.eq(prove_edited(r, swap, { fifo = "none" }), true, "fifo none")
end

function T.proof_unbatched_1f1b_deadlocks()
  -- 1F1B is safe only because torch coalesces SEND_F with RECV_B (and
  -- SEND_B with RECV_F) in one batch_isend_irecv: split the batches and
  -- both ranks send first.
  local r = pps.derive({ schedule = "1F1B", pp = 2, microbatches = 2 })
  assert(pps.prove_p2p(r.lowered, r.stage_to_rank, r.num_stages))
  local ok, why = prove_edited(r, function(l)
    for _, list in ipairs(l) do
      for i, a in ipairs(list) do list[i] = { type = a.type, stage = a.stage, mb = a.mb } end
    end
  end)
  H.eq(ok, nil, "verdict")
  H.eq(why, "deadlock (rank model): rank 0 action 6 (0WAIT_SEND_F1) waits for F0>1:1; rank 1's side is queued " ..
    "behind rank 1 action 3 (1SEND_B0)", "reason")
end

function T.proof_structural_failures()
  local r = pps.derive({ schedule = "GPipe", pp = 2, microbatches = 1 })
  local _, why = prove_edited(r, function(l) l[1][1], l[1][2] = l[1][2], l[1][1] end)
  H.eq(why, "rank 0 action 0 (0SEND_F0): sends before 0F0 computes it", "send before compute")
  _, why = prove_edited(r, function(l) table.insert(l[1], 1, { type = "WAIT_SEND_F", stage = 0, mb = 0 }) end)
  H.eq(why, "rank 0 action 0 (0WAIT_SEND_F0): waits for 0SEND_F0, which this rank has not sent", "wait before send")
  _, why = prove_edited(r, function(l) l[1][#l[1] + 1] = { type = "F", stage = 1, mb = 0 } end)
  H.eq(why, "rank 0 action 6 (1F0): stage 1 lives on rank 1", "wrong rank")
end

function T.defer_pp_recv_deadlocks_under_nccl_fifo()
  -- torch's defer_pp_recv=True (_defer_recv_ops) moves rank 0's receive
  -- behind a send to the same peer while rank 1 sends before receiving:
  -- fine if the transport buffers (fifo "none"), a cycle if each pair's
  -- operations run in order and a send waits for its receive.
  local r = pps.derive({ schedule = "ZBVZeroBubble", pp = 2, microbatches = 4, defer_pp_recv = true })
  H.eq(pps.prove_p2p(r.lowered, r.stage_to_rank, r.num_stages, { fifo = "none" }), true, "none")
  local ok, why = pps.prove_p2p(r.lowered, r.stage_to_rank, r.num_stages, { fifo = "peer" })
  H.eq(ok, nil, "peer")
  H.eq(why, "deadlock (peer model): rank 0 action 9 (3F0) waits for F2>3:0; it is queued behind rank 0 action 5 " ..
    "(0SEND_F1)", "reason")
  local d = pps.derive({ schedule = "ZBVZeroBubble", pp = 2, microbatches = 4 })
  H.eq(pps.prove_p2p(d.lowered, d.stage_to_rank, d.num_stages, { fifo = "rank" }), true, "default lowering")
end

function T.csv_round_trip_and_import()
  local r = pps.derive({ schedule = "DualPipeV", pp = 2, microbatches = 4 })
  local text = pps.to_csv(r.torch_order)
  assert(text:find("%(0F3;3B1%)OVERLAP_F_B"), "OVERLAP_F_B cell")
  assert(text:sub(-2) == "\r\n", "csv.writer's line ending")
  local back = pps.from_csv(text)
  for k = 1, 2 do H.list_eq(strings(back[k]), strings(r.torch_order[k]), "row " .. k) end
  local imp = pps.import_csv(text)
  H.eq(imp.microbatches, 4, "inferred microbatches")
  for k = 1, 2 do H.list_eq(strings(imp.lowered[k]), strings(r.lowered[k]), "imported lowering " .. k) end
  local comms = pps.import_csv(pps.to_csv(r.lowered), { format = "compute_comms" })
  assert(pps.prove_p2p(comms.lowered, comms.stage_to_rank, comms.num_stages))
  -- Quoted cells, empty cells (None) and CRLF or LF.
  local q = pps.from_csv('"0F0",,0B0\n1F0,1B0\n')
  H.list_eq(strings(q[1]), { "0F0", "", "0B0" }, "quoted row")
  -- Refusals, one line each.
  for _, case in ipairs({
    { "0F0,0X1\n", "CSV:1:2: not an action: [stage][type][microbatch]" },
    { "0F0x\n", "CSV:1:1: not an action" },
    { "0F0,0B0\n0F1,0B1\n", "stage 0 is also on rank 0" },
    { "0F0,0B0\n1B0,1F0\n", "1B0 runs before 1F0" },
    { "0F0,0B0,0SEND_F0\n", "0SEND_F0 is not a compute action" },
  }) do
    local ok, e = pcall(pps.import_csv, case[1])
    assert(not ok and util.is_plan_error(e), "refused: " .. case[1])
    if not tostring(e):find(case[2], 1, true) then error(string.format("%q lacks %q", tostring(e), case[2])) end
  end
end

return T
