-- Predicted vs published NCCL collective times, for the alpha-beta model
-- ("before", topology.collectives = "alpha_beta") and NCCL's own tuning
-- model re-derived in gen/nccl_model.lua ("after", the default), side by
-- side, each priced through gen/cost.lua as a plan's collective is. Run from the repo root:
--   lua5.4 bench/calibration.lua [TSV] [PRESET]
-- TSV defaults to bench/calibration/h100_nccl.tsv (see its README.md),
-- PRESET to h100. Prints a Markdown table (docs/cost-model.md carries it).
package.path = "./?.lua;" .. package.path
local nccl_model = require("gen.nccl_model")
local cost = require("gen.cost")
local groups = require("gen.groups")

local cal = {}

-- The alpha-beta model every plan used before issue 21 (topology.collectives
-- = "alpha_beta" with gen/load.lua's defaults).
cal.ALPHA_BETA = { gpus_per_node = 8, collectives = "alpha_beta", intra_node_GBps = 360, inter_node_GBps = 45,
                   latency_us = 10 }

-- float64 rows are priced as fp32 of the same bytes: NCCL treats both alike (NVLS reduces either,
-- device.h ncclNvlsSupported), and plans have no float64.
local DTYPE = { bfloat16 = "bf16", float16 = "fp16", float32 = "fp32", bf16 = "bf16", fp16 = "fp16", fp32 = "fp32",
                float64 = "fp32" }
local ES = { bf16 = 2, fp16 = 2, fp32 = 4 }

function cal.read(path)
  local rows, header = {}, nil
  for line in io.lines(path) do
    local f = {}
    for x in (line .. "\t"):gmatch("([^\t]*)\t") do f[#f + 1] = x end
    if not header then header = f
    elseif #f >= #header then
      local r = {}
      for i, h in ipairs(header) do r[h] = f[i] end
      r.nodes, r.gpus_per_node, r.bytes = tonumber(r.nodes), tonumber(r.gpus_per_node), tonumber(r.bytes)
      r.time_us, r.busbw_GBps = tonumber(r.time_us), tonumber(r.busbw_GBps)
      r.launch_floor_us = tonumber(r.launch_floor_us)          -- "-" or absent: nil
      if r.algo == "-" or r.algo == "" then r.algo = nil end
      if r.nccl == "-" or r.nccl == "" then r.nccl = nil end     -- the NCCL version the run used, from its source
      rows[#rows + 1] = r
    end
  end
  return rows
end

local function bus_factor(kind, n)
  return (kind == "all_reduce" and 2 or 1) * (n - 1) / n
end

-- A row priced the way a plan prices it, through gen/cost.lua itself: one
-- synthetic op on a one-family mesh laid out as torchrun lays ranks (rank //
-- gpus_per_node is the node), the group taking `k` GPUs of each of `nodes`
-- nodes. Returns the microseconds and, under the nccl model, NCCL's
-- algorithm/protocol.
function cal.through_cost(row, topo)
  local g, k, nodes = topo.gpus_per_node, row.gpus_per_node, row.nodes
  assert(g % k == 0, "gpus_per_node of the group must divide the node's")
  -- axes: node (stride g), rest (g/k groups per node, stride k), local (k GPUs, stride 1)
  local mesh = { names = { "node", "rest", "local" }, index = { node = 1, rest = 2, ["local"] = 3 },
                 sizes = { nodes, g // k, k }, strides = { g, k, 1 }, world_size = nodes * g,
                 aliases = { grp = { "node", "local" } }, alias_order = { "grp" } }
  if k == 1 then mesh.strides = { g, 1, 1 } end
  local fams = groups.build(mesh)
  local n = nodes * k
  local dt = assert(DTYPE[row.dtype], "dtype " .. tostring(row.dtype))
  local elems = row.bytes // ES[dt]
  local count = row.collective == "all_reduce" and elems or elems // n
  local op = { kind = row.collective, count = count, dtype = dt, group = "grp" }
  cost.predict({ op }, fams, topo)
  return op.predicted_us, op.algorithm
end

-- Before: the alpha-beta model. After: NCCL's model as plans use it
-- (topology.preset = preset, collectives = "nccl").
function cal.before(row) return (cal.through_cost(row, cal.ALPHA_BETA)) end
function cal.plan_topology(preset) return { gpus_per_node = 8, preset = preset or "h100", collectives = "nccl" } end

-- NCCL's model as a plan prices the op: one process per GPU, NCCL choosing.
function cal.plan_model(row, topo)
  return nccl_model.predict({ kind = row.collective, bytes = row.bytes, dtype = row.dtype, nodes = row.nodes,
                              gpus_per_node = row.gpus_per_node }, topo or "h100")
end

-- The same model under the row's own measurement setup (its source says
-- which): `algo` = the NCCL_ALGO the run forced ("-": NCCL chose), and
-- `launch_floor_us` = the launching host's per-iteration floor where one
-- thread drove all the node's GPUs (nccl-tests -g 8), measured in the same
-- run at its smallest sizes ("-": one process per GPU, no floor), and
-- `nccl` = the NCCL version it ran: where gen/nccl_model.lua has that
-- version's tuning table (M.CHOICE_TABLES: 2.20), that table chooses the
-- algorithm and protocol and 2.28.9's model prices them.
function cal.after(row, topo)
  return nccl_model.predict({ kind = row.collective, bytes = row.bytes, dtype = row.dtype, nodes = row.nodes,
                              gpus_per_node = row.gpus_per_node, launch_floor_us = row.launch_floor_us,
                              algorithm = row.algo, nccl_version = row.nccl }, topo or "h100")
end

function cal.busbw(row, us)
  return row.bytes * bus_factor(row.collective, row.nodes * row.gpus_per_node) / (us * 1e3)
end

local function human(b)
  if b >= 1 << 30 and b % (1 << 30) == 0 then return string.format("%d GiB", b >> 30) end
  if b >= 1 << 20 and b % (1 << 20) == 0 then return string.format("%d MiB", b >> 20) end
  -- nccl-tests rounds a size to whole elements per rank: 1073740800 is "~1 GiB"
  if b >= 1 << 20 then
    local mib = b / (1 << 20)
    return mib >= 1024 and string.format("~%g GiB", math.floor(mib / 1024 + 0.5))
      or string.format("~%g MiB", math.floor(mib + 0.5))
  end
  if b >= 1e6 and b % 1e6 == 0 then return string.format("%g MB", b / 1e6) end
  return tostring(b)
end

function cal.table(rows, preset)
  local out = {
    "| collective | nodes x GPUs | size | published us (busbw) | before us (busbw) | before ratio"
      .. " | after us (busbw) | after algo/proto | after ratio | held | source |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  }
  for _, r in ipairs(rows) do
    local b = cal.before(r)
    local a = cal.after(r, preset)
    out[#out + 1] = string.format("| %s | %d x %d | %s | %.1f (%.0f) | %.1f (%.0f) | %.2f | %.1f (%.0f) | %s/%s | %.2f "
      .. "| %s | %s |", r.collective, r.nodes, r.gpus_per_node, human(r.bytes), r.time_us, cal.busbw(r, r.time_us),
      b, cal.busbw(r, b), b / r.time_us, a.us, a.busbw_GBps, a.algorithm, a.protocol, a.us / r.time_us,
      r.held == "yes" and "yes" or "no", (r.source or ""):match("^%S+") or "")
  end
  return table.concat(out, "\n")
end

if arg and arg[0] and arg[0]:match("calibration%.lua$") then
  local path = arg[1] or "bench/calibration/h100_nccl.tsv"
  local preset = arg[2] or "h100"
  print(cal.table(cal.read(path), preset))
  print("\nratio = predicted / published time (1.00 is exact; < 1 predicts too fast).")
  print("before: topology.collectives = \"alpha_beta\" (latency 10 us x ceil(log2 n) + size x busbw factor / "
    .. "(360 GB/s in a node, 45 across)), the model every plan used before issue 21.")
  print("after: topology.collectives = \"nccl\" (the default): gen/nccl_model.lua, NCCL " .. nccl_model.NCCL_VERSION
    .. " tuning model, preset " .. preset .. ".")
end

return cal
