-- gen/nccl_model.lua (NCCL 2.28's tuning model, re-derived) against the
-- published H100 timings in bench/calibration/h100_nccl.tsv, and its sanity:
-- bigger is never faster, more nodes never faster at one size, and so on.
local H = require("helpers")
local nccl = require("gen.nccl_model")
local cal = require("bench.calibration")
local T = {}

-- Tolerance on predicted / published time. 25%: run-to-run and
-- cluster-to-cluster spread of published nccl-tests numbers for one shape is
-- already ~10% (the same 1 GiB single-node rows here give 350 and 360 GB/s;
-- nccl issue 1221 reports 320-430 GB/s for one 2-4 node shape by NVLS on/off),
-- and a plan's choices (sharding degree, overlap) turn on factors of 2, not
-- of 1.25. It is not widened for the rows below: they are listed instead.
local TOL = 0.25
local MIN_BYTES = 1 << 20

-- Every row held to the tolerance (column `held` = yes: H100 SXM over
-- NVLink and InfiniBand, NCCL choosing) must be within it; each row is priced
-- under its own measurement setup (columns launch_floor_us and algo:
-- bench/calibration.lua cal.after).
local function key(r)
  return string.format("%s %dx%d %d %s", r.collective, r.nodes, r.gpus_per_node, r.bytes, r.source:match("^%S+"))
end
local function rows() return cal.read("bench/calibration/h100_nccl.tsv") end

function T.calibration_rows_within_tolerance()
  local bad, held = {}, 0
  for _, r in ipairs(rows()) do
    if r.bytes >= MIN_BYTES and r.held == "yes" then
      held = held + 1
      local ratio = cal.after(r, "h100").us / r.time_us
      if math.abs(ratio - 1) > TOL then bad[#bad + 1] = string.format("%s ratio %.2f", key(r), ratio) end
    end
  end
  assert(#bad == 0, "outside +-25%: " .. table.concat(bad, "; "))
  assert(held >= 45, "rows held to the tolerance: " .. held)
end

-- The full-width acceptance rule, decided by the rows themselves, not by the
-- model: the presets model rails that each carry their line rate however many
-- run at once (NCCL's own model: a ring's bandwidth is its channels x the
-- per-NIC speed, whatever k). Where a run measured its fabric at one GPU per
-- node (one rail) and at k GPUs per node, a shape whose largest all_gather
-- reaches under FULL_WIDTH x k x the one-rail bus bandwidth is not that
-- hardware, and its rows are not held (held = "no: full width ..."); a shape
-- that reaches it is held. 0.9: a healthy fabric reaches k x one rail to the
-- percent (this run's 10 x 2 and 10 x 4: 101%); xxrjun's 10 x 8 reaches 84%.
local FULL_WIDTH = 0.9

-- One run: a source's directory (xxrjun's logs nccl_N10_G1.log .. G8.log are one run's).
local function run_of(r) return r.source:match("^(.*)/[^/]*$") or r.source end

function T.held_rows_follow_the_full_width_rule()
  local largest = {}   -- source|nodes|k -> the largest all_gather row
  for _, r in ipairs(rows()) do
    if r.collective == "all_gather" then
      local id = table.concat({ run_of(r), r.nodes, r.gpus_per_node }, "|")
      if not largest[id] or r.bytes > largest[id].bytes then largest[id] = r end
    end
  end
  local judged, failing = 0, 0
  for _, r in ipairs(rows()) do
    local one = largest[table.concat({ run_of(r), r.nodes, 1 }, "|")]
    local full = largest[table.concat({ run_of(r), r.nodes, r.gpus_per_node }, "|")]
    if r.gpus_per_node > 1 and one and full then
      judged = judged + 1
      local reach = full.busbw_GBps / (r.gpus_per_node * one.busbw_GBps)
      local fails = reach < FULL_WIDTH
      local excluded = r.held:match("^no: full width") ~= nil
      if fails then failing = failing + 1 end
      assert(fails == excluded, string.format("%s: full width reaches %.0f%% of %d x one rail, held = %q", key(r),
        100 * reach, r.gpus_per_node, r.held))
      if not fails then H.eq(r.held, "yes", key(r) .. " reaches full width") end
    end
  end
  assert(judged >= 30 and failing >= 1, "judged " .. judged .. ", failing " .. failing)
end

-- What is calibrated is what plans use: every row priced through
-- gen/cost.lua with a plan's default topology gets NCCL's model's time and
-- choice exactly.
function T.plans_price_collectives_with_the_calibrated_model()
  for _, r in ipairs(rows()) do
    local m = cal.plan_model(r, "h100")
    local us, algo = cal.through_cost(r, cal.plan_topology("h100"))
    if math.abs(us - m.us) > 1e-9 * m.us or algo ~= m.algorithm .. "/" .. m.protocol then
      error(string.format("%s: gen/cost.lua %.3f us %s, gen/nccl_model.lua %.3f us %s/%s", key(r), us, algo,
        m.us, m.algorithm, m.protocol))
    end
  end
  -- a plan file with no topology gets that model
  local p = require("gen.plan").from_source("return { world_size = 16, parallel = { dp_shard = -1 }, model = { "
    .. "family = \"generic\", units = { { name = \"root\", params = { { name = \"w\", shape = { 1024, 1024 } } } } } } }",
    "plans/t.lua")
  H.eq(p.topology.collectives, "nccl", "default collectives")
  H.eq(p.topology.preset, "h100", "default preset")
  local seen
  for _, o in ipairs(p.ops) do
    if o.kind == "all_gather" then
      local m = nccl.predict({ kind = "all_gather", bytes = o.size_bytes, dtype = o.dtype, nodes = 2, gpus_per_node = 8 },
        "h100")
      H.eq(o.predicted_us, m.us, "the plan's all-gather on 2 x 8")
      seen = true
    end
  end
  assert(seen, "the plan has an all-gather")
end

-- A row runs the NCCL its source names: NCCL 2.20.5 (PyTorch 2.3, the nebius rows) prices NVLSTree's
-- network hop at 14 us (v2.20.5-1 tuning.cc:77), 2.28.9 at 20.9 (tuning.cc:165), so at 2 x 8 and 1 MiB
-- 2.20.5 runs NVLSTree where 2.28.9 runs tree/LL128; 2.28.9's model prices what ran. Plans pass no
-- version and keep 2.28.9's choice.
function T.an_older_nccl_chooses_by_its_own_table()
  local op = { kind = "all_reduce", bytes = 1 << 20, dtype = "fp32", nodes = 2, gpus_per_node = 8 }
  local now = nccl.predict(op, "h100")
  H.eq(now.algorithm .. "/" .. now.protocol, "tree/LL128", "2.28.9's choice")
  op.nccl_version = "2.20.5"
  local old = nccl.predict(op, "h100")
  H.eq(old.algorithm .. "/" .. old.protocol, "nvls_tree/Simple", "2.20.5's choice")
  local forced = nccl.predict({ kind = "all_reduce", bytes = 1 << 20, dtype = "fp32", nodes = 2, gpus_per_node = 8,
                                algorithm = "nvls_tree" }, "h100")
  H.eq(old.us, forced.us, "priced by 2.28.9's model")
  -- 2.20.5's own table: NVLSTree 23 + 2 x 14 us, min(40, 48) x 8 channels x 5/6
  local topo = nccl.topology("h100")
  local m20 = nccl.tune_v2_20(topo, nccl.tune(topo, { nodes = 2, gpus_per_node = 8 }))
  assert(math.abs(m20.latencies.all_reduce[6][3] - 51) < 1e-9, m20.latencies.all_reduce[6][3])
  assert(math.abs(m20.bandwidths.all_reduce[6][3] - 320 * 5 / 6) < 1e-9, m20.bandwidths.all_reduce[6][3])
  -- versions without a table (2.29.2: the same Hopper table as 2.28.9) choose as 2.28.9
  op.nccl_version = "2.29.2"
  H.eq(nccl.predict(op, "h100").us, now.us, "2.29.2")
  for _, r in ipairs(rows()) do
    assert(r.nccl == nil or r.nccl:match("^%d+%.%d+%.%d+$"), key(r) .. ": nccl = " .. tostring(r.nccl))
  end
end

-- Every row says whether it is held to the tolerance, and why not.
function T.every_row_is_held_or_says_why()
  for _, r in ipairs(rows()) do
    assert(r.held == "yes" or (r.held or ""):match("^no: ..."), key(r) .. ": held = " .. tostring(r.held))
  end
end

function T.calibration_has_sources()
  local n = 0
  for _, r in ipairs(rows()) do
    n = n + 1
    assert(r.source and #r.source > 0, key(r) .. " has no source")
    assert(r.time_us > 0 and r.busbw_GBps > 0, key(r))
  end
  assert(n >= 12, "calibration rows: " .. n)
end

local KINDS = { "all_gather", "reduce_scatter", "all_reduce" }
local PRESETS = { "h100", "h200", "b200", "a100" }
local SHAPES = { { 1, 2 }, { 1, 8 }, { 2, 1 }, { 2, 8 }, { 4, 8 }, { 16, 1 }, { 32, 8 } }

local function t(kind, bytes, nodes, k, preset, dtype)
  return nccl.predict({ kind = kind, bytes = bytes, dtype = dtype or "bf16", nodes = nodes, gpus_per_node = k }, preset)
end

function T.bigger_is_never_faster()
  for _, p in ipairs(PRESETS) do
    for _, kind in ipairs(KINDS) do
      for _, s in ipairs(SHAPES) do
        local prev = 0
        for e = 10, 34 do
          for _, b in ipairs({ 1 << e, 3 << (e - 1) }) do
            local us = t(kind, b, s[1], s[2], p).us
            assert(us >= prev, string.format("%s %s %dx%d: %d B %.2f us < %.2f", p, kind, s[1], s[2], b, us, prev))
            prev = us
          end
        end
      end
    end
  end
end

-- NCCL's own model (nccl_us, no pipeline fill): the fill follows the chosen
-- algorithm's latency, and where NCCL keeps a ring whose latency grows with
-- the nodes (b200, 1 MiB, 8 nodes: ring/LL128) over a tree it picks at 16,
-- the filled time can drop by a few percent with more nodes, as NCCL's real
-- mis-picks do.
function T.more_nodes_never_faster_at_one_size()
  for _, p in ipairs(PRESETS) do
    for _, kind in ipairs(KINDS) do
      for _, k in ipairs({ 1, 8 }) do
        for _, b in ipairs({ 1 << 20, 1 << 26, 1 << 30 }) do
          local prev = 0
          for _, nodes in ipairs({ 1, 2, 4, 8, 16, 32, 64 }) do
            if nodes * k > 1 then
              local us = t(kind, b, nodes, k, p).nccl_us
              assert(us >= prev * (1 - 1e-9),
                string.format("%s %s k=%d %d B: %d nodes %.1f us < %.1f", p, kind, k, b, nodes, us, prev))
              prev = us
            end
          end
        end
      end
    end
  end
end

-- A row's setup: the -g 8 host floor is a floor, a forced algorithm is used.
function T.setup_floor_and_forced_algorithm()
  local op = { kind = "all_gather", bytes = 1 << 20, dtype = "fp32", nodes = 1, gpus_per_node = 8 }
  local free = nccl.predict(op, "h100")
  op.launch_floor_us = 35
  H.eq(nccl.predict(op, "h100").us, math.max(35, free.us), "floor")
  op.launch_floor_us, op.algorithm = nil, "ring"
  op.kind, op.bytes = "all_reduce", 1 << 30
  H.eq(nccl.predict(op, "h100").algorithm, "ring", "forced ring")
  -- rings pay no fill; NVLS all_reduce on one node pays two loop steps
  assert(nccl.predict(op, "h100").fill_us == 0)
  op.algorithm = nil
  local r = nccl.predict(op, "h100")
  assert(r.algorithm == "nvls" and r.fill_us > 0, r.algorithm)
end

function T.single_rank_costs_nothing()
  assert(t("all_reduce", 1 << 30, 1, 1, "h100").us == 0)
end

-- Bandwidth-bound sizes only: at 1 MiB on 4+ nodes NCCL's own model prices a
-- tree/LL128 all_reduce (log2 nodes latency) below a ring all_gather (nodes - 1
-- network steps; PAT needs one GPU per node, tuning.cc:206), and so do real runs.
function T.all_reduce_costs_at_least_all_gather()
  for _, p in ipairs(PRESETS) do
    for _, s in ipairs(SHAPES) do
      for _, b in ipairs({ 1 << 28, 1 << 30 }) do
        assert(t("all_reduce", b, s[1], s[2], p).us >= t("all_gather", b, s[1], s[2], p).us * 0.99, p)
      end
    end
  end
end

-- Large transfers: the chosen algorithm's bus bandwidth is what NCCL's
-- graphs give: H100 single-node ring 12 channels x 30 GB/s = 360 GB/s.
function T.large_busbw_as_nccl_logs()
  local r = t("all_gather", 1 << 32, 1, 8, "h100")
  assert(r.algorithm == "ring" and r.protocol == "Simple", r.algorithm)
  assert(math.abs(r.busbw_GBps - 360) < 5, r.busbw_GBps)
  local m = nccl.tune(nccl.topology("h100"), { nodes = 1, gpus_per_node = 8 })
  assert(m.ring.n == 12 and m.ring.intra == 30, m.ring.n .. " x " .. m.ring.intra)
  assert(m.nvls.n == 8, m.nvls.n)
  -- one NIC per GPU, ~48 GB/s busbw for a 1-GPU-per-node ring (nccl-tests issue 290: 46-48)
  local one = t("all_reduce", 1 << 30, 2, 1, "h100")
  assert(one.busbw_GBps > 44 and one.busbw_GBps < 50, one.busbw_GBps)
end

function T.newer_fabric_is_faster()
  for _, s in ipairs({ { 1, 8 }, { 2, 8 }, { 8, 8 } }) do
    for _, kind in ipairs(KINDS) do
      local a, h, b = t(kind, 1 << 30, s[1], s[2], "a100").us, t(kind, 1 << 30, s[1], s[2], "h100").us,
        t(kind, 1 << 30, s[1], s[2], "b200").us
      assert(a > h and h > b, string.format("%s %dx%d: a100 %.0f h100 %.0f b200 %.0f", kind, s[1], s[2], a, h, b))
    end
  end
  -- H200 shares H100's fabric
  assert(t("all_reduce", 1 << 30, 2, 8, "h200").us == t("all_reduce", 1 << 30, 2, 8, "h100").us)
end

function T.a100_has_no_nvls_and_fp8_no_nvls()
  local r = t("all_reduce", 1 << 30, 1, 8, "a100")
  assert(not r.algorithm:find("nvls"), r.algorithm)
  assert(t("all_reduce", 1 << 30, 1, 8, "h100").algorithm == "nvls")
  assert(t("all_reduce", 1 << 30, 1, 8, "h100", "fp8_e4m3").algorithm ~= "nvls")
end

function T.overrides_take_effect()
  local slow = nccl.topology("h100", { nic_Gbps = 200 })
  assert(t("all_gather", 1 << 30, 4, 8, slow).us > t("all_gather", 1 << 30, 4, 8, "h100").us * 1.5)
  local fewer = nccl.topology("h100", { nvlinks = 9 })
  assert(t("all_gather", 1 << 30, 1, 8, fewer).us > t("all_gather", 1 << 30, 1, 8, "h100").us * 1.5)
end

function T.rejects_bad_input()
  assert(not pcall(nccl.predict, { kind = "broadcast", bytes = 1, nodes = 1, gpus_per_node = 8 }, "h100"))
  assert(not pcall(nccl.predict, { kind = "all_gather", bytes = 1, nodes = 1, gpus_per_node = 8 }, "tpu"))
end

return T
