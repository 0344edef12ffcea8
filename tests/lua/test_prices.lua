-- Issue 42, item 2: every op kind's size, wire bytes and predicted time
-- against hand-computed cases: FSDP's all-gather and reduce-scatter, HSDP's
-- all-reduce, TP's and CP's activation collectives, expert parallel's
-- all-to-alls (counts and tokens, with their member count), and the
-- pipeline's point-to-point sends over the link they cross.
--
-- The formulas, written out here rather than taken from gen/:
--   size (nccl-tests' "size", the larger buffer): all-gather n x count
--     (its output), reduce-scatter n x count (its input), all-reduce count,
--     all-to-all n x the rows each member gets x dim (each member's send
--     buffer: a share for each of the n members), counts n x experts per
--     member as int64; times the dtype's bytes
--   wire bytes per rank (nccl-tests' busbw factor, doc/PERFORMANCE.md):
--     all-gather, reduce-scatter, all-to-all size x (n - 1) / n (a ring
--     pass: every member sends all but its own share), all-reduce
--     size x 2 (n - 1) / n (reduce-scatter + all-gather)
--   alpha-beta time (docs/cost-model.md, topology.collectives =
--     "alpha_beta"): latency_us x ceil(log2 n) + wire / (GB/s x 1e3), GB/s
--     the link's inside one node, else across nodes
--   point-to-point (NCCL's tuning model has no send/recv: one ring/Simple
--     step's latency, NCCL 2.28 src/graph/tuning.cc baseLat[RING][SIMPLE] =
--     8.4 us plus hwLat[NVLINK][RING][SIMPLE] = 3.4 us inside a node,
--     hwLat[NET][RING][SIMPLE] = 14.0 us across, plus bytes over the link:
--     the GPU's NVLinks (H100: 18 x 20.6 GB/s as NCCL counts them) inside
--     a node, one NIC across (min(PCIe 48 GB/s, 400 Gb/s / 8 = 50 GB/s)))
local H = require("helpers")
local plan = require("gen.plan")
local load = require("gen.load")
local nccl_model = require("gen.nccl_model")
local cost = require("gen.cost")

local T = {}

local BYTES = { fp32 = 4, bf16 = 2, fp16 = 2 }

local function cdiv(a, b) return (a + b - 1) // b end

local function variant(path, edit)
  return "local p = (function() " .. H.read(path) .. "\nend)()\n" .. (edit or "") .. "\nreturn p"
end

local function close(got, want, what)
  if math.abs(got - want) > 1e-9 * math.max(1, math.abs(want)) then
    error(string.format("%s: got %.12g, want %.12g", what, got, want), 2)
  end
end

local PASSES = { all_gather = 1, reduce_scatter = 1, all_reduce = 2, tp_all_gather = 1, tp_reduce_scatter = 1,
                 tp_all_reduce = 2, a2a = 1, a2a_counts = 1 }

-- The hand-computed size of op o over a group of n (counts per rank as the
-- op states them; the all-to-all at the uniform share, cross-checked by
-- the caller).
local function size_of(o, n)
  local es = BYTES[o.dtype]
  if o.kind == "a2a_counts" then return n * o.count * 8 end
  if o.kind == "a2a" then return n * o.a2a_uniform * es end
  if PASSES[o.kind] == 2 then return o.count * es end
  return n * o.count * es
end

local function log2ceil(n)
  local k = 0
  while (1 << k) < n do k = k + 1 end
  return k
end

-- Every collective of p: its size, wire bytes, and (alpha-beta) time.
-- sizes: family name -> members; intra: family name -> inside one node.
local function check_ops(name, p, sizes, intra, ab)
  local n_ops, kinds = 0, {}
  for _, o in ipairs(p.ops) do
    if o.group then
      local n = assert(sizes[o.group], name .. ": unexpected family " .. o.group)
      local what = string.format("%s: op %d (%s over %s, n %d)", name, o.seq, o.kind, o.group, n)
      local size = size_of(o, n)
      H.eq(o.size_bytes, size, what .. " size")
      local wire = size * PASSES[o.kind] * (n - 1) / n
      H.eq(o.wire_bytes, math.floor(wire + 0.5), what .. " wire bytes")
      H.eq(o.intra_node, intra[o.group], what .. " inside one node")
      if ab then
        local bw = intra[o.group] and ab.intra or ab.inter
        close(o.predicted_us, ab.lat * log2ceil(n) + wire / (bw * 1e3), what .. " alpha-beta us")
      end
      n_ops = n_ops + 1
      kinds[o.kind] = (kinds[o.kind] or 0) + 1
    end
  end
  assert(n_ops > 0, name .. ": no collectives")
  return kinds
end

local AB = "p.topology = p.topology or {}; p.topology.collectives = 'alpha_beta'; p.topology.latency_us = 7; "
  .. "p.topology.intra_node_GBps = 300; p.topology.inter_node_GBps = 40; "

-- An all-reduce over 3 ranks sends 2 x 2/3 of its buffer: fractional
-- bytes, rounded to the nearest, never truncated (DDP over 3: 25 and 7
-- bf16 elements, 66.67 and 18.67 bytes on the wire; a gather's or
-- scatter's size is n shares, so its wire bytes are whole).
function T.wire_bytes_of_three_rounded()
  local src = "return { world_size = 3, parallel = { dp_replicate = 3 }, topology = { collectives = 'alpha_beta', "
    .. "latency_us = 7, intra_node_GBps = 300, inter_node_GBps = 40 }, model = { family = 'generic', dtype = 'bf16', "
    .. "units = { { name = 'a', params = { { name = 'a.w', shape = { 5, 5 } } } }, "
    .. "{ name = 'root', params = { { name = 'r.w', shape = { 7 } } } } } } }"
  local p = plan.from_source(src, "plans/ddp3.lua")
  check_ops("ddp3", p, { dp_replicate = 3 }, { dp_replicate = true }, { lat = 7, intra = 300, inter = 40 })
  local wires = {}
  for _, o in ipairs(p.ops) do if o.kind == "all_reduce" then wires[#wires + 1] = o.wire_bytes end end
  table.sort(wires)
  H.eq(table.concat(wires, ","), "19,67", "2 x 2/3 of 14 and 50 bytes, to the nearest byte")
end

-- FSDP all-gathers and reduce-scatters over 4 (bf16 / fp32), one node.
function T.fsdp_collectives()
  local p = plan.from_source(variant("plans/llama_tiny.lua", AB), "plans/llama_tiny.lua")
  local k = check_ops("llama_tiny", p, { fsdp = 4 }, { fsdp = true }, { lat = 7, intra = 300, inter = 40 })
  assert(k.all_gather > 0 and k.reduce_scatter > 0, "all-gathers and reduce-scatters priced")
  -- one by hand: layers.0's all-gather: its 13856-element bf16 slot from 4 ranks
  for _, o in ipairs(p.ops) do
    if o.kind == "all_gather" and o.unit == 2 then
      H.eq(o.size_bytes, 4 * 13856 * 2, "layers.0 all-gather size")
      H.eq(o.wire_bytes, 3 * 13856 * 2, "layers.0 all-gather wire: 3 of the 4 shares")
      close(o.predicted_us, 7 * 2 + 3 * 13856 * 2 / 300e3, "layers.0 all-gather alpha-beta")
      break
    end
  end
end

-- HSDP and TP (llama_tiny_tp: replicate 2 x shard 2 x tp 2, sequence
-- parallel) on nodes of 2 GPUs: tp inside a node, fsdp and dp_replicate
-- across (ranks fill nodes in mesh order, tp innermost); TP's activation
-- collectives move each rank's sequence shard (tokens / tp x dim).
function T.hsdp_and_tp_collectives()
  local path = "plans/llama_tiny_tp.lua"
  local p = plan.from_source(variant(path, AB .. "p.topology.gpus_per_node = 2"), path)
  local k = check_ops("llama_tiny_tp", p, { fsdp = 2, dp_replicate = 2, tp = 2 },
    { fsdp = false, dp_replicate = false, tp = true }, { lat = 7, intra = 300, inter = 40 })
  for _, kind in ipairs({ "all_gather", "reduce_scatter", "all_reduce", "tp_all_gather", "tp_reduce_scatter",
                          "tp_all_reduce" }) do
    assert((k[kind] or 0) > 0, "llama_tiny_tp prices a " .. kind)
  end
  local tokens, d = 2 * 32, 64
  for _, o in ipairs(p.ops) do
    if o.kind == "tp_all_gather" or o.kind == "tp_reduce_scatter" then
      H.eq(o.count, tokens // 2 * d, "a TP activation collective: a rank's sequence shard")
      H.eq(o.size_bytes, tokens * d * 2, "its size: the whole sequence's activation, bf16")
      H.eq(o.wire_bytes, tokens * d * 2 // 2, "its wire bytes: the other rank's half")
    elseif o.kind == "tp_all_reduce" then
      H.eq(o.dtype, "fp32", "TP-replicated norm grads reduce in reduce_dtype")
      H.eq(o.wire_bytes, o.size_bytes, "an all-reduce over 2 sends 2 x 1/2 of its buffer")
    elseif o.kind == "all_reduce" then
      H.eq(o.group, "dp_replicate", "HSDP's all-reduce")
      close(o.predicted_us, 7 + o.size_bytes / 40e3, "an all-reduce across 2 nodes, alpha-beta")
    end
  end
end

-- CP: each block's K and V all-gathered over cp = 2 (a rank's seq / cp
-- tokens of each of its 2 sequences x the kv width), their gradients
-- reduce-scattered back.
function T.cp_collectives()
  local path = "tests/plans/llama_tiny_cp.lua"
  local p = plan.from_source(variant(path, AB), path)
  local k = check_ops("llama_tiny_cp", p, { fsdp = 4, cp = 2 }, { fsdp = true, cp = true },
    { lat = 7, intra = 300, inter = 40 })
  assert((k.tp_all_gather or 0) > 0 and (k.tp_reduce_scatter or 0) > 0, "CP's K/V collectives priced")
  local local_tokens, kv = 2 * 512 // 2, 2 * 16
  for _, o in ipairs(p.ops) do
    if o.group == "cp" then
      H.eq(o.count, local_tokens * kv, "a K or V shard: the rank's tokens x kv")
      H.eq(o.size_bytes, 2 * local_tokens * kv * 2, "gathered over 2, bf16")
    end
  end
end

-- Expert parallel: counts (int64, a row of experts per member) and tokens
-- priced at the uniform routing's share per member, n of them: a tiny
-- Mixtral on 8 ranks, ep 4, 8 tokens x top 2 = 16 rows, 4 per member.
local function ep_plan(edit)
  return plan.from_source(variant("tests/plans/moe_mixtral_hsdp.lua",
    "p.parallel = { dp_shard = -1, ep = 4 }; p.model.seq_len = 8; p.world_size = 8; "
    .. "p.expert_parallel = { capacity_factor = 1.3 }; " .. (edit or "")), "tests/plans/moe_mixtral_hsdp.lua")
end

function T.expert_all_to_alls()
  local p = ep_plan(AB)
  local k = check_ops("mixtral ep4", p, { fsdp = 8, ep = 4, efsdp = 2 }, { fsdp = true, ep = true, efsdp = true },
    { lat = 7, intra = 300, inter = 40 })
  assert(k.a2a > 0 and k.a2a_counts > 0, "all-to-alls priced")
  local dim, ep, rows = 12, 4, 8 * 2
  for _, o in ipairs(p.ops) do
    if o.kind == "a2a" then
      H.eq(o.a2a_uniform, cdiv(rows, ep) * dim, "the uniform share: ceil(rows / ep) rows x dim per member")
      H.eq(o.size_bytes, ep * 4 * dim * 4, "a token exchange: 4 members x 4 rows x 12 x fp32")
      H.eq(o.wire_bytes, 3 * 4 * dim * 4, "3 of its 4 shares leave the rank")
      close(o.predicted_us, 7 * 2 + 3 * 4 * dim * 4 / 300e3, "a token exchange, alpha-beta")
      H.eq(o.count, 6 * dim, "the buffer holds capacity ceil(1.3 x 16 / 4) = 6 rows per member")
    elseif o.kind == "a2a_counts" then
      H.eq(o.size_bytes, ep * 1 * 8, "counts: one expert per member per member, int64")
      H.eq(o.wire_bytes, 3 * 8)
    end
  end
  -- under NCCL's model a token exchange is priced as the all-gather of its
  -- whole size (every member's share), not of one member's share
  local q = ep_plan()
  for _, o in ipairs(q.ops) do
    if o.kind == "a2a" then
      local want = nccl_model.predict({ kind = "all_gather", bytes = ep * 4 * dim * 4, dtype = "fp32", nodes = 1,
                                        gpus_per_node = 4 }, nccl_model.topology("h100"))
      close(o.predicted_us, want.us, "a token exchange under NCCL's model")
      local share = nccl_model.predict({ kind = "all_gather", bytes = 4 * dim * 4, dtype = "fp32", nodes = 1,
                                         gpus_per_node = 4 }, nccl_model.topology("h100"))
      assert(want.us > share.us, "the whole exchange costs more than one member's share")
      break
    end
  end
end

-- A pipeline's point-to-point transfer, by hand (the header's constants).
function T.p2p_by_hand()
  local topo = { gpus_per_node = 8 }
  local bytes = 1 << 20
  close(cost.p2p_us(bytes, true, topo), 8.4 + 3.4 + bytes / (18 * 20.6 * 1e3), "NVLink inside a node")
  close(cost.p2p_us(bytes, false, topo), 8.4 + 14.0 + bytes / (48 * 1e3), "one NIC across nodes (its PCIe path)")
  -- a slower NIC than its PCIe path: the NIC's line rate
  close(cost.p2p_us(bytes, false, { gpus_per_node = 8, nic_Gbps = 200 }), 8.4 + 14.0 + bytes / (25 * 1e3),
    "a 200 Gb/s NIC")
  close(cost.p2p_us(bytes, false, { gpus_per_node = 8, net_latency_us = 2 }), 8.4 + 14.0 + 2 + bytes / 48e3,
    "the network's own latency added")
  local ab = { collectives = "alpha_beta", latency_us = 7, intra_node_GBps = 300, inter_node_GBps = 40 }
  close(cost.p2p_us(bytes, true, ab), 7 + bytes / 300e3, "alpha-beta inside a node")
  close(cost.p2p_us(bytes, false, ab), 7 + bytes / 40e3, "alpha-beta across nodes")
end

-- The pipeline plan's own transfer: one microbatch's activation (16
-- tokens x dim 64, bf16) to the next stage, over NVLink while the whole
-- job fits one node (world 4 <= 8 GPUs), over a NIC once it does not.
function T.pipeline_p2p_link()
  local path = "tests/pp/plans/pp_tiny.lua"
  local report = require("gen.pipeline")
  local act = 16 * 64 * 2
  local one = report.plan_row(load.source(H.read(path), path))
  H.eq(one.act, act, "a microbatch's activation bytes")
  close(one.p2p_us, 8.4 + 3.4 + act / (18 * 20.6 * 1e3), "pp_tiny on one node: NVLink")
  local two = report.plan_row(load.source(variant(path, "p.topology = { gpus_per_node = 2 }"), path))
  close(two.p2p_us, 8.4 + 14.0 + act / 48e3, "pp_tiny on nodes of 2: stages a node apart, a NIC")
  local ab = report.plan_row(load.source(variant(path, AB), path))
  close(ab.p2p_us, 7 + act / 300e3, "pp_tiny, alpha-beta, one node")
end

return T
