-- tests/ep/compare_ep_live.lua against a recorded run of torchtitan 0.3's
-- expert parallelism on gloo (tests/ep/recorded/dp4_ep2.json: world 4,
-- dp_shard 4, ep 2, efsdp 2, its tiny DeepSeek-V3; trimmed to what the
-- comparison reads; tests/ep/check_ep_live.sh runs the whole matrix live):
-- commplan's tables equal it, and each kind of difference is reported.
-- The reduced gradients: the recording's grads_local (every unsharded
-- gradient commplan's oracle pattern; a dense parameter over dp_shard, one
-- over its one-element-per-rank shards, an expert weight over efsdp) against
-- the plan's --simulate --pattern oracle --dump of them
-- (tests/ep/recorded/dp4_ep2.dump.json), and a wrong gradient caught. And
-- the same mesh under selective activation checkpointing
-- (tests/ep/recorded/dp4_ep2_sel.json): the recompute's all-to-alls.
local H = require("helpers")
local json = require("gen.json")
local live = require("tests.ep.compare_ep_live")
local T = {}

local function load() return json.decode(H.read("tests/ep/recorded/dp4_ep2.json")) end
local function dumps()
  local by_rank = {}
  for _, d in ipairs(json.decode(H.read("tests/ep/recorded/dp4_ep2.dump.json")).ranks) do by_rank[d.rank] = d end
  return by_rank
end

local function first(r, pred)
  for i, e in ipairs(r.events) do if pred(e) then return i, e end end
end

function T.recorded_run_equals_the_tables()
  local diff, res = live.check_case(load())
  H.eq(diff, nil, "dp4_ep2")
  H.eq(res.ranks, 4, "every rank")
  assert(res.colls > 0 and res.a2a > 0, "FSDP collectives and all-to-alls compared")
end

function T.each_difference_is_reported()
  local function expect(mutate, want)
    local c = load()
    mutate(c)
    local diff = live.check_case(c)
    assert(type(diff) == "string" and diff:find(want, 1, true), "want '" .. want .. "', got " .. tostring(diff))
  end
  -- the experts' all-gather on the dense group
  expect(function(c)
    local _, e = first(c.ranks[2], function(x) return x.group == "efsdp" end)
    e.ranks = { 0, 1, 2, 3 }
  end, "rank 1 event")
  -- a layer's dense and expert all-gathers swapped
  expect(function(c)
    local ev = c.ranks[1].events
    local i = first(c.ranks[1], function(x) return x.group == "efsdp" end)
    ev[i], ev[i - 1] = ev[i - 1], ev[i]
  end, "rank 0 event")
  -- the dispatch and the combine swapped
  expect(function(c)
    local ev = c.ranks[3].events
    local i = first(c.ranks[3], function(x) return x.ep == "layers.1 dispatch" end)
    ev[i], ev[i + 1] = ev[i + 1], ev[i]
  end, "rank 2 event")
  -- a member's share past the plan's capacity
  expect(function(c)
    local _, e = first(c.ranks[1], function(x) return x.ep == "layers.2 dispatch" end)
    e.in_splits[1] = 1000
  end, "past the plan's capacity")
  -- a missing reduce-scatter
  expect(function(c)
    local ev = c.ranks[4].events
    local i = first(c.ranks[4], function(x) return x.kind == "reduce_scatter" end)
    table.remove(ev, i)
  end, "rank 3 event")
  -- an expert weight's local shard
  expect(function(c)
    for _, p in ipairs(c.ranks[1].params) do
      if p.name:find("inner_experts", 1, true) then p["local"][1] = p["local"][1] + 1; break end
    end
  end, "local shape")
end

-- Under torchtitan's selective activation checkpointing (tests/ep/recorded/dp4_ep2_sel.json, the same
-- mesh; events and shapes only): the recompute's counts, dispatch and combine in backward, marked by the
-- recorder, equal the plan's; without them, or unmarked, or from a plan without checkpointing, a difference.
local function load_sel() return json.decode(H.read("tests/ep/recorded/dp4_ep2_sel.json")) end

function T.recompute_all_to_alls_equal_the_tables()
  local c = load_sel()
  H.eq(c.ac, "selective")
  local diff, res = live.check_case(c)
  H.eq(diff, nil, "dp4_ep2_sel")
  H.eq(res.recomputed, 4 * 2 * 3, "4 ranks x 2 MoE layers x counts, dispatch, combine")
  H.eq(res.a2a, 4 * 2 * 8)
  assert(live.plan_source(c):find('activation_checkpointing = "selective"', 1, true))
  local function expect(mutate, want)
    local x = load_sel()
    mutate(x)
    local d = live.check_case(x)
    assert(type(d) == "string" and d:find(want, 1, true), "want '" .. want .. "', got " .. tostring(d))
  end
  -- the recompute's counts exchange left out
  expect(function(x)
    local i = first(x.ranks[1], function(e) return e.recompute == "layers.2" and e.ep == "layers.2 counts" end)
    table.remove(x.ranks[1].events, i)
  end, "rank 0 event")
  -- issued, but not by a recompute
  expect(function(x)
    local _, e = first(x.ranks[2], function(y) return y.recompute == "layers.1" and y.ep == "layers.1 dispatch" end)
    e.recompute = ""
  end, "rank 1 event")
  -- the plan without checkpointing has none
  expect(function(x) x.ac = nil end, "rank 0 event")
end

function T.recorded_reduced_gradients_equal_the_simulation()
  local c = load()
  local diff, res = live.check_case(c, dumps())
  H.eq(diff, nil, "dp4_ep2 with its gradients")
  H.eq(res.grads.ranks, 4, "every rank's gradients")
  H.eq(res.grads.params, 4 * #c.grads_subset, "every kept parameter on every rank")
  -- kv_norm (8) and norm (16) over dp_shard 4, w2 (4 experts of 16 x 8 on each ep rank) over efsdp 2
  H.eq(res.grads.elements, 8 + 16 + 2 * 4 * 16 * 8, "every element")
end

function T.a_wrong_gradient_is_caught()
  local function expect(mutate, want)
    local c, d = load(), dumps()
    mutate(c, d)
    local diff = live.check_case(c, d)
    assert(type(diff) == "string" and diff:find(want, 1, true), "want '" .. want .. "', got " .. tostring(diff))
  end
  local w2 = "layers.2.moe.routed_experts.inner_experts.w2_EDF"
  -- one element of an expert weight's reduced shard on rank 2 (its efsdp group's sum 4 for 10)
  expect(function(c) c.ranks[3].grads_local[w2].values[18] = 10 end,
    "rank 2: " .. w2 .. " reduced gradient element 17: torchtitan 10, commplan ")
  -- one float32 ulp off, in commplan's dump
  expect(function(_, d)
    local v = d[0].grads_local["norm.weight"].values
    v[1] = v[1] + 2 ^ -20
  end, "rank 0: norm.weight reduced gradient element 0: torchtitan 10, commplan 10.000001")
  -- a shard one element short
  expect(function(c) table.remove(c.ranks[2].grads_local["layers.1.attention.kv_norm.weight"].values) end,
    "rank 1: layers.1.attention.kv_norm.weight reduced gradient shard has 1 elements live, 2 in commplan's dump")
  -- a parameter commplan's dump lacks
  expect(function(_, d) d[3].grads_local[w2] = nil end, "rank 3: " .. w2 .. " has no gradient in commplan's dump")
  -- a recording without gradients (the recorder run without --plans)
  expect(function(c) c.ranks[1].grads_local = nil end, "rank 0: no reduced gradients recorded")
  -- every parameter is compared unless the recording says which it kept
  expect(function(c) c.grads_subset = nil end, "rank 0: commplan's dump has 3 parameters' gradients, torchtitan 41")
end

-- torchtitan's TP plan of the MoE (tests/ep/recorded/dp2_tp2.json: dp_shard 2 x tp 2, ep 1, the experts
-- split over TP; dp2_tp2_ep2.json: ep 2 over the TP ranks, efsdp = dp_shard; events and shapes only):
-- every TP collective equals the tables, and a missing or misplaced one is a difference.
local function load_tp(name) return json.decode(H.read("tests/ep/recorded/" .. name .. ".json")) end

function T.tp_recordings_equal_the_tables()
  for _, name in ipairs({ "dp2_tp2", "dp2_tp2_ep2" }) do
    local diff, res = live.check_case(load_tp(name))
    H.eq(diff, nil, name)
    assert(res.tp > 0 and res.colls > 0, name .. ": TP and FSDP collectives compared")
    H.eq(res.a2a, name == "dp2_tp2" and 0 or 4 * 2 * 5, name .. ": all-to-alls")
  end
  assert(live.plan_source(load_tp("dp2_tp2_ep2")):find("ep = 2, tp = 2", 1, true))
  local function expect(name, mutate, want)
    local c = load_tp(name)
    mutate(c)
    local d = live.check_case(c)
    assert(type(d) == "string" and d:find(want, 1, true), "want '" .. want .. "', got " .. tostring(d))
  end
  -- the router gate's Partial gradient all-reduce left out
  expect("dp2_tp2", function(c)
    local ev = c.ranks[2].events
    for i, e in ipairs(ev) do
      if e.kind == "all_reduce" and e.in_numel == 128 then table.remove(ev, i); break end
    end
  end, "rank 1 event")
  -- the shared experts' gather before the combine
  expect("dp2_tp2_ep2", function(c)
    local ev = c.ranks[1].events
    local i = first(c.ranks[1], function(e) return e.ep == "layers.1 combine" end)
    ev[i], ev[i + 1] = ev[i + 1], ev[i]
  end, "rank 0 event")
  -- a loss-parallel MAX as a SUM
  expect("dp2_tp2_ep2", function(c)
    local _, e = first(c.ranks[3], function(x) return x.reduce_op == "max" end)
    e.reduce_op = "sum"
  end, "rank 2 event")
end

-- torchtitan's Qwen3 MoE TP plan on its qwen3_moe decoder (tests/ep/recorded/q3m_dp2_tp2.json: dp_shard 2
-- x tp 2, ep 1, the experts split over TP on their hidden dim) and without q/k norms, commplan's mixtral
-- (mix_dp2_tp2_ep2.json: ep 2 over the TP ranks, the experts not TP-split; events and shapes only): every
-- collective equals the tables; a wrong plan or a missing collective is a difference.
function T.moe_tp_recordings_equal_the_tables()
  for _, c in ipairs({ { "q3m_dp2_tp2", 136, 0 }, { "mix_dp2_tp2_ep2", 88, 4 * 2 * 5 } }) do
    local diff, res = live.check_case(load_tp(c[1]))
    H.eq(diff, nil, c[1])
    H.eq(res.tp, c[2], c[1] .. ": TP collectives")
    H.eq(res.a2a, c[3], c[1] .. ": all-to-alls")
  end
  assert(live.plan_source(load_tp("q3m_dp2_tp2")):find('family = "qwen3_moe"', 1, true))
  local function differs(name, mutate, want)
    local c = load_tp(name)
    mutate(c)
    local d = live.check_case(c)
    assert(type(d) == "string" and d:find(want, 1, true), "want '" .. want .. "', got " .. tostring(d))
  end
  -- the router gate's Partial gradient all-reduce (8 experts x dim 16) left out
  differs("q3m_dp2_tp2", function(c)
    local ev = c.ranks[1].events
    for i, e in ipairs(ev) do
      if e.kind == "all_reduce" and e.in_numel == 128 then table.remove(ev, i); break end
    end
  end, "rank 0 event")
  -- the MoE input's all-gather at ep 1 left out
  differs("q3m_dp2_tp2", function(c)
    local ev, n = c.ranks[2].events, 0
    for i, e in ipairs(ev) do
      if e.kind == "all_gather" and e.phase == "forward" and #e.ranks == 2 and e.ranks[2] - e.ranks[1] == 1 then
        n = n + 1
        if n == 2 then table.remove(ev, i); break end
      end
    end
  end, "rank 1 event")
  -- the experts TP-split at ep 2 (a shard of half the hidden rows): a shape difference
  differs("mix_dp2_tp2_ep2", function(c)
    for _, prm in ipairs(c.ranks[1].params) do
      if prm.name:find("w1_EFD", 1, true) then prm["local"][2] = prm["local"][2] // 2 end
    end
  end, "w1_EFD local shape")
end

-- torchtitan's gpt-oss TP plan (tests/ep/recorded/gpt_dp2_tp2.json: dp_shard 2 x tp 2, ep 1, sequence and
-- loss parallel; parallelize_gptoss on gloo; events and shapes only): every collective equals the tables,
-- the Partial bias gradients' all-reduces (wo.bias, attention_norm, ffn_norm, mlp2_bias_ED, the gate's
-- weight and bias) among them; the two wrong plans of them (wo.bias's dropped, the order reversed) differ,
-- and so does the recording without wo.bias's all-reduce.
function T.gpt_oss_tp_recording_equals_the_tables()
  local diff, res = live.check_case(load_tp("gpt_dp2_tp2"))
  H.eq(diff, nil, "gpt_dp2_tp2")
  H.eq(res.tp, 144, "gpt_dp2_tp2: TP collectives")
  H.eq(res.colls, 44, "gpt_dp2_tp2: FSDP collectives")
  local matched, differ = live.gpt_oss_mutants(load_tp("gpt_dp2_tp2"))
  H.eq(matched, nil, "no wrong plan matches")
  H.eq(differ, 2, "both wrong plans differ")
  local c = load_tp("gpt_dp2_tp2")
  local ev, n = c.ranks[1].events, 0
  -- layers.1's post-backward all-reduces: wo.bias's is the first of 16 elements
  for i, e in ipairs(ev) do
    if e.kind == "all_reduce" and e.in_numel == 16 and e.fsdp == "layers.1 [dp_shard] post_backward" then table.remove(ev, i); n = 1; break end
  end
  H.eq(n, 1, "wo.bias's all-reduce found")
  local d = live.check_case(c)
  assert(type(d) == "string" and d:find("rank 0 event", 1, true), tostring(d))
end

return T
