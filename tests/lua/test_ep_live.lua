-- tests/ep/compare_ep_live.lua against a recorded run of torchtitan 0.3's
-- expert parallelism on gloo (tests/ep/recorded/dp4_ep2.json: world 4,
-- dp_shard 4, ep 2, efsdp 2, its tiny DeepSeek-V3; trimmed to what the
-- comparison reads; tests/ep/check_ep_live.sh runs the whole matrix live):
-- commplan's tables equal it, and each kind of difference is reported.
local H = require("helpers")
local json = require("gen.json")
local live = require("tests.ep.compare_ep_live")
local T = {}

local function load() return json.decode(H.read("tests/ep/recorded/dp4_ep2.json")) end

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

return T
