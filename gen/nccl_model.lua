-- NCCL's own cost model, re-derived: predicted time of one all_gather,
-- reduce_scatter or all_reduce the way NCCL 2.28 picks its algorithm and
-- protocol (ncclTopoTuneModel + ncclTopoGetAlgoTime), on an idealised
-- rail-optimised HGX node. A pure module: no I/O, no state; not yet used by
-- gen/cost.lua (docs/cost-model.md says what wiring it in takes).
--
-- Sources, all at tag v2.28.9-1 of github.com/NVIDIA/nccl (cited "file:line"):
--   T = src/graph/tuning.cc   S = src/graph/search.cc   TH = src/graph/topo.h
--   TC = src/graph/topo.cc    D = src/include/device.h  E = src/enqueue.cc
--   I = src/init.cc           N = src/transport/nvls.cc IB = src/transport/net_ib.cc
--
-- What is NCCL's and what is ours:
--   * the tuning tables, latency and bandwidth formulas, the enable/disable
--     rules and the time formula are NCCL's, transcribed (T:133-600, E:1784-1830);
--   * the graph search (S:991-1190) is emulated, not run: NCCL searches a real
--     topology graph for channels; here the node is idealised (every GPU on one
--     NVSwitch with `nvlinks` links, every GPU with its own NIC behind one PCIe
--     switch), the search walks NCCL's own speed arrays with NCCL's pass 1 /
--     duplication / pass 2 rules and asks `fits` (below) whether n channels at a
--     speed fit the links. For one H100 node this gives ring 12 x 30, tree
--     12 x 30, NVLS 8 x 40/60 GB/s, the graphs NCCL printed in nccl issue 1197
--     (2.19.4); maxBw 48 / totalBw 370.8 match nccl issue 1189's dump. The
--     multi-node graphs (e.g. 2 x 8 H100: ring 8 x 48) are not yet checked
--     against a log.
local M = {}

M.NCCL_VERSION = "2.28.9-1"

local LL, LL128, SIMPLE = 1, 2, 3
M.PROTOCOLS = { "LL", "LL128", "Simple" }                      -- D: NCCL_PROTO_LL/LL128/SIMPLE = 0/1/2
M.ALGORITHMS = { "tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat" }  -- D: NCCL_ALGO_*
local TREE, RING, CND, CNC, NVLS, NVLST, PAT = 1, 2, 3, 4, 5, 6, 7
local VOLTA, AMPERE, HOPPER, BLACKWELL = 1, 2, 3, 4              -- NCCL_*_COMPCAP_IDX
local HW_NVLINK, HW_NET = 1, 3                 -- (2 = PCI: GPUs without NVLink; no preset here)

-- ---- NCCL's tuning constants (T:133-199) --------------------------------
M.NVLS_EFFICIENCY = { 0.0, 0.0, 0.85, 0.74 }                   -- T:134-139
M.BASE_LAT = {                                                 -- T:143-147, [algo][proto] us
  { 6.8, 14.0, 8.4 }, { 6.6, 14.0, 8.4 }, { 0, 0, 0 }, { 0, 0, 0 }, { 0, 0, 0 }, { 0, 0, 0 }, { 8.0, 8.0, 8.0 } }
M.HW_LAT = {                                                   -- T:149-167, [hw][algo][proto] us
  { { .6, 1.25, 4.0 }, { .6, 1.9, 3.4 }, { 0, 0, 3.7 }, { 0, 0, 2.8 }, { 0, 0, 25 }, { 0, 0, 25 }, { 0, 0, 4.0 } },
  { { 1.0, 1.9, 4.0 }, { 1.0, 2.5, 5.7 }, { 0, 0, 3.7 }, { 0, 0, 2.8 }, { 0, 0, 0 }, { 0, 0, 0 }, { 0, 0, 4.0 } },
  { { 5.0, 8.5, 14 }, { 2.7, 4.0, 14.0 }, { 0, 0, 31 }, { 0, 0, 30 }, { 0, 0, 18 }, { 0, 0, 20.9 }, { 0, 0, 14 } },
}
M.LL_MAX_BW = { { 39.0, 39.0, 20.4 }, { 87.7, 22.5, 19.0 }, { 141.0, 45.0, 35.0 }, { 282.0, 90.0, 70.0 } }  -- T:169-174
M.PER_CH_MAX_RING_LL128_BW = { { 20, 20, 20 }, { 20, 20, 20 }, { 36.7, 36.7, 36.7 }, { 73.4, 34.6, 73.4 } } -- T:175-180
M.PER_CH_MAX_TREE_LL128_BW = { { 20, 20, 20 }, { 20, 20, 20 }, { 36.7, 36.7, 29.0 }, { 55.6, 31.67, 20.0 } } -- T:181-186
M.PER_CH_MAX_TREE_BW = { { 26.5, 18.5, 10.0 }, { 24.0, 23.6, 17.8 }, { 38.7, 41.4, 36.0 }, { 70.0, 42.8, 24.0 } } -- T:187-192
M.PER_CH_MAX_NVLS_TREE_BW = { { 26.5, 18.5, 10.0 }, { 24.0, 23.6, 17.8 }, { 0.0, 57.7, 45.5 }, { 0.0, 96.0, 43.8 } } -- T:193-198
-- T:578-582: tree all_reduce bandwidth correction, by log2(bytes/64), 64 B .. 256 MiB
M.TREE_CORRECTION = {
  { 1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0 },
  { 1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0 },
  { .9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9 },
}
-- S:976-989: the speeds (GB/s per channel) the graph search tries, best first.
M.SPEEDS = {
  intra = { [0] = { 40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0 },
            [90] = { 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0 },
            [100] = { 90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0 } },
  inter = { [0] = { 48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12 },
            [90] = { 48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12 },
            [100] = { 96.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12 } },
}
local MAXCHANNELS = 64                 -- D:86
local NCCL_MAX_NVLS_ARITY = 32         -- D:207
local NCCL_MAX_DEV_WORK_BATCH_COLLS = 32  -- D (batching only matters for numPipeOps > 1)

-- ---- topology presets ----------------------------------------------------
-- Every field can be overridden: M.topology("h100", { nic_Gbps = 200 }).
--   cc            compute capability x10 (picks NCCL's tables and speed arrays)
--   nvlink_GBps   NCCL's per-link NVLink figure (TH:16-21), not the marketing one
--   nvlinks       NVLinks from each GPU to the NVSwitches (TC:601-604 multiplies them)
--   nvls          NVLink SHARP (multicast) usable (N:148-199; needs cc >= 90 and NVSwitch, S:1036)
--   nic_Gbps      one NIC's line rate; NCCL's NET bw = Mb/s / 8000 (TC:373)
--   nics_per_node NICs per node, one per GPU (rail-optimised)
--   pci_GBps      GPU<->NIC PCIe path, NCCL's width*speed/80 (TC:423-425,491): Gen4 x16 24, Gen5 x16 48, Gen6 x16 96
--   net_latency_us the net plugin's reported latency: IB reports 0 (IB:945), graph latencyInter (S:685)
--   cpu           "intel" | "amd": LL bandwidth cap row (T:252-254) and net overhead (T:214-219)
--   tree_pattern_balanced  NCCL's tree graph is BALANCED_TREE (else TREE, x.85 at T:309)
--   collnet       CollNet/SHARP network enabled (default off, as NCCL's collnetEnable; T:468-471)
M.PRESETS = {
  -- H100 SXM (HGX/DGX H100): NVLink4, 18 links x 25 GB/s/dir = 900 GB/s bidirectional per GPU
  -- (NVIDIA H100 datasheet); NCCL counts 18 x 20.6 = 370.8 GB/s (TH:19) -- nccl issue 1189 logs
  -- "NVL[370.8] - NVS/0". 8 x ConnectX-7 400 Gb/s, PCIe Gen5 x16 (DGX H100 user guide).
  h100 = { name = "H100 SXM", cc = 90, nvlink_GBps = 20.6, nvlinks = 18, nvls = true,
           nic_Gbps = 400, nics_per_node = 8, pci_GBps = 48, net_latency_us = 0, cpu = "intel" },
  -- H200 SXM: the H100's NVLink4 / NVSwitch fabric and NICs (HGX H200 datasheet); only HBM differs.
  h200 = { name = "H200 SXM", cc = 90, nvlink_GBps = 20.6, nvlinks = 18, nvls = true,
           nic_Gbps = 400, nics_per_node = 8, pci_GBps = 48, net_latency_us = 0, cpu = "intel" },
  -- H100 96 GB HBM2e (Grand Teton, gen/hardware.lua): the H100 SXM's NVLink4 fabric and a 400 Gb/s
  -- RDMA NIC per GPU (torchtitan's benchmarks/llama3_h100_202412_torchtitan.md, "Hardware").
  h100_hbm2e = { name = "H100 96GB HBM2e 500W", cc = 90, nvlink_GBps = 20.6, nvlinks = 18, nvls = true,
                 nic_Gbps = 400, nics_per_node = 8, pci_GBps = 48, net_latency_us = 0, cpu = "intel" },
  -- B200: NVLink5, 18 links x 50 GB/s/dir = 1.8 TB/s bidirectional (B200 datasheet); NCCL counts
  -- 18 x 40.1 (TH:21). 8 x 800 Gb/s NICs (ConnectX-8) on PCIe Gen6 x16 = 96 GB/s in NCCL's units
  -- (TC:425 "64.0 GT/s PCIe" = 480 -> 16*480/80); a DGX B200 with 400 Gb/s ConnectX-7 wants
  -- { nic_Gbps = 400, pci_GBps = 48 }.
  b200 = { name = "B200", cc = 100, nvlink_GBps = 40.1, nvlinks = 18, nvls = true,
           nic_Gbps = 800, nics_per_node = 8, pci_GBps = 96, net_latency_us = 0, cpu = "intel" },
  -- A100 SXM (HGX A100): NVLink3, 12 links x 25 GB/s/dir = 600 GB/s bidirectional; NCCL counts
  -- 12 x 20.0 (TH:18). No NVLS (cc 80 < 90, S:1036). 8 x 200 Gb/s HDR NICs, PCIe Gen4 x16.
  a100 = { name = "A100 SXM", cc = 80, nvlink_GBps = 20.0, nvlinks = 12, nvls = false,
           nic_Gbps = 200, nics_per_node = 8, pci_GBps = 24, net_latency_us = 0, cpu = "amd" },
}

-- The network figures' documented bounds, checked where they enter: a
-- plan's topology fields (gen/load.lua's schema takes these, so a plan
-- gets one line naming the field) and every topology made here, presets
-- and overrides alike. Lower bounds: the slowest links NCCL's graph search
-- has speeds for (S:976-989); with them every predicted time stays finite
-- (bytes are at most 2^53) and every output renders it.
M.BOUNDS = {
  nvlink_GBps = { min = 5, max = 1e6 }, nvlinks = { min = 1, max = 64, int = true },
  nic_Gbps = { min = 10, max = 1e6 }, nics_per_node = { min = 1, max = 64, int = true },
  pci_GBps = { min = 1, max = 1e6 }, net_latency_us = { min = 0, max = 1e6 },
}

-- A figure within its bound: nil, or why not ("nic_Gbps = 0.1 is outside 10..1e+06").
function M.out_of_bounds(field, v)
  local b = M.BOUNDS[field]
  if not b then return nil end
  if type(v) ~= "number" or v ~= v or v < b.min or v > b.max or (b.int and math.tointeger(v) == nil) then
    return string.format("%s = %s is outside %s..%s%s", field, tostring(v), tostring(b.min), tostring(b.max),
      b.int and " (an integer)" or "")
  end
  return nil
end

function M.topology(preset, overrides)
  local base = type(preset) == "table" and preset or assert(M.PRESETS[preset], "unknown topology preset " .. tostring(preset))
  local t = {}
  for k, v in pairs(base) do t[k] = v end
  for k, v in pairs(overrides or {}) do t[k] = v end
  if t.tree_pattern_balanced == nil then t.tree_pattern_balanced = true end
  -- (a plan's fields were refused at load with their names; here a caller's own table)
  for _, field in ipairs({ "nvlink_GBps", "nvlinks", "nic_Gbps", "nics_per_node", "pci_GBps", "net_latency_us" }) do
    local why = M.out_of_bounds(field, t[field])
    if why then error("internal error: gen/nccl_model.lua topology: " .. why .. " (M.BOUNDS)", 0) end
  end
  return t
end

-- ---- collectives and dtypes ---------------------------------------------
local COLL = { all_gather = true, reduce_scatter = true, all_reduce = true }
-- D:544-559 ncclNvlsSupported (sum): which types NVLS reduces.
local NVLS_TYPES = { int32 = true, uint32 = true, int64 = true, uint64 = true, float16 = true, bfloat16 = true,
                     float32 = true, float64 = true }
local DTYPE_ALIAS = { bf16 = "bfloat16", fp16 = "float16", half = "float16", fp32 = "float32", float = "float32",
                      fp64 = "float64", double = "float64", fp8 = "float8e4m3", fp8_e4m3 = "float8e4m3",
                      fp8_e5m2 = "float8e5m2" }
local function canon_dtype(d)
  d = d or "bfloat16"
  return DTYPE_ALIAS[d] or d
end

local function log2i(n)             -- NCCL's log2i: floor(log2 n), n >= 1
  local r = 0
  while n >= 2 do n = n // 2; r = r + 1 end
  return r
end

-- ---- graph search emulation (S:991-1190) ---------------------------------
-- Derived link figures of the idealised node.
local function links(topo, k)
  local nvl = topo.nvlinks * topo.nvlink_GBps          -- GPU<->NVSwitch, each direction
  local nic = math.min(topo.pci_GBps, topo.nic_Gbps / 8000 * 1000)  -- GPU->NET path: min over its links
  local nics = math.min(k, topo.nics_per_node)          -- rail-optimised: a group of k GPUs/node uses k NICs
  return nvl, nic, nics
end

-- Do n channels of `pattern` at (sIntra, sInter) GB/s each fit the links?
-- ring/tree: every channel crosses each GPU's NVLink once per direction (single
-- node), or (k-1)/k of the time with the node's entry/exit on the NIC
-- (multi-node); each channel holds one NIC (both directions), channels spread
-- over the NICs. nvls: channel h pulls from every GPU and twice from its head h
-- (S:386-415, mult 2 on the head), heads need a local NIC when multi-node (S:632).
local function fits(g, n, sIntra, sInter)
  if g.multi then
    if math.ceil(n / g.nics) * sInter > g.nic + 1e-9 then return false end
    if g.pattern == "nvls" then
      if n > g.nics then return false end
      return (n + math.ceil(n / g.k)) * sIntra <= g.nvl + 1e-9
    end
    if g.k == 1 then return true end
    return n * sIntra * (g.k - 1) / g.k <= g.nvl + 1e-9
  end
  if g.pattern == "nvls" then return (n + math.ceil(n / g.k)) * sIntra <= g.nvl + 1e-9 end
  return n * sIntra <= g.nvl + 1e-9
end

local function most_channels(g, sIntra, sInter)
  local best = 0
  for n = 1, g.maxCh do
    if fits(g, n, sIntra, sInter) then best = n else break end
  end
  return best >= g.minCh and best or 0
end

-- S:419-438 ncclTopoCompareGraphs
local function better(g, cand, ref)
  if cand.n < g.minCh or cand.n == 0 then return false end
  if not ref then return true end
  if g.pattern == "nvls" then
    return (cand.n > ref.n and cand.n <= g.k) or cand.n * cand.inter > ref.n * ref.inter
  end
  return cand.n * cand.intra > ref.n * ref.intra
end

-- Returns { n = nChannels, intra = bwIntra, inter = bwInter } or n = 0.
function M.search(topo, pattern, nodes, k, minCh, maxCh)
  local nvl, nic, nics = links(topo, k)
  local multi = nodes > 1
  local g = { pattern = pattern, multi = multi, k = k, nvl = nvl, nic = nic, nics = nics,
              minCh = minCh or 1, maxCh = maxCh or MAXCHANNELS // 2 }   -- I:1018-1019 ring 1..32
  if pattern == "nvls" then
    if not topo.nvls or topo.cc < 90 then return { n = 0, intra = 0, inter = 0 } end   -- S:1036
    g.maxCh = math.min(NCCL_MAX_NVLS_ARITY, k)                                       -- S:1038
    if not multi then g.minCh = g.maxCh end                                          -- S:1043-1046
  end
  local cc = topo.cc >= 100 and 100 or topo.cc >= 90 and 90 or 0
  local speeds = multi and M.SPEEDS.inter[cc] or M.SPEEDS.intra[cc]                 -- S:1061-1069
  -- S:38-52: maxBw is the best GPU->GPU (single node) or GPU->NET path; totalBw the NVLink total.
  local maxBw = multi and nic or nvl
  local totalBw = k > 1 and nvl or math.max(nvl, topo.pci_GBps)
  if k > 1 and pattern ~= "ring" then totalBw = totalBw * k / (k - 1) end           -- S:1074
  local i = 1
  while (speeds[i] > maxBw or speeds[i] * g.minCh > totalBw) and i < #speeds do i = i + 1 end  -- S:1075
  -- pass 1 (S:1095-1153): walk down the speeds, keep the best graph
  local best
  while true do
    local s = speeds[i]
    local n = most_channels(g, s, s)
    local cand = { n = n, intra = s, inter = s }
    if better(g, cand, best) then best = cand end
    if best and (best.n == g.maxCh or best.n * best.inter >= totalBw) then break end   -- S:588, S:1098-1099
    if i < #speeds and (not best or speeds[i + 1] / best.inter > .49) then i = i + 1 else break end  -- S:1145-1148
  end
  if not best then return { n = 0, intra = 0, inter = 0 } end
  -- S:961-973 ncclTopoDupChannels
  if pattern ~= "nvls" and best.intra >= 25.0 and not (topo.cc > 80 and best.intra < 50.0 and best.n > 4) then
    local dup = math.min(best.n * 2, g.maxCh)
    local div = math.ceil(dup / best.n)
    best = { n = dup, intra = best.intra / div, inter = best.inter / div }
  end
  -- pass 2 (S:1155-1186): try higher speeds with at least as many channels
  g.minCh = best.n
  i = 1
  while speeds[i] > best.inter and i < #speeds do i = i + 1 end
  local tmp = { intra = speeds[i], inter = speeds[i] }
  while i > 1 do
    if pattern == "ring" then
      tmp.intra, tmp.inter = speeds[i - 1], speeds[i - 1]
    elseif pattern == "nvls" and tmp.inter == best.inter and tmp.inter < tmp.intra * 2 then
      g.maxCh = best.n
      tmp.inter = speeds[i - 1]
    elseif pattern ~= "nvls" and tmp.intra == best.intra and tmp.intra < tmp.inter * 2 then
      tmp.intra = speeds[i - 1]
    else
      break
    end
    i = i - 1
    local n = most_channels(g, tmp.intra, tmp.inter)
    local cand = { n = n, intra = tmp.intra, inter = tmp.inter }
    if better(g, cand, best) then best = cand end
  end
  return best
end

-- ---- NCCL's tuning (T:230-404) -------------------------------------------
-- shape = { nodes = N, gpus_per_node = k }. Returns the model NCCL would build
-- for a communicator of that shape: bandwidths[coll][algo][proto] (GB/s,
-- algorithm bandwidth) and latencies[coll][algo][proto] (us).
function M.tune(topo, shape)
  local nNodes, k = shape.nodes, shape.gpus_per_node
  local nRanks = nNodes * k
  assert(nNodes >= 1 and k >= 1, "nodes and gpus_per_node must be >= 1")
  local ring = M.search(topo, "ring", nNodes, k)
  -- I:1026-1027 tree channels = ring channels; I:854 PAT uses the tree graph.
  local tree = M.search(topo, "tree", nNodes, k, ring.n, ring.n)
  local nvls = M.search(topo, "nvls", nNodes, k)
  local graphs = { tree, ring, { n = 0, intra = 0, inter = 0 }, { n = 0, intra = 0, inter = 0 }, nvls, nvls, tree }
  local cci = topo.cc >= 100 and BLACKWELL or topo.cc >= 90 and HOPPER or topo.cc >= 80 and AMPERE or VOLTA  -- T:249
  local index2 = nNodes <= 2 and nNodes or 3                                         -- T:250 (1-based)
  local index1 = nNodes == 1 and cci or (topo.cpu == "amd" and 2 or 1)              -- T:252-253
  local llMaxBw = M.LL_MAX_BW[index1][index2]
  local perChMaxTreeBw = M.PER_CH_MAX_TREE_BW[cci][index2]
  local perChMaxRingLL128Bw = M.PER_CH_MAX_RING_LL128_BW[cci][index2]
  local perChMaxTreeLL128Bw = M.PER_CH_MAX_TREE_LL128_BW[cci][index2]
  local perChMaxNVLSTreeBw = M.PER_CH_MAX_NVLS_TREE_BW[cci][index2]
  local ppn = nRanks / nNodes
  local intraHw = HW_NVLINK                                                          -- T:264: NVLink intra-node
  -- T:201-209: PAT only with one GPU per node
  local patEnable = nNodes == nRanks
  local netOverheadBase = topo.cpu == "amd" and 2.0 or 1.0                           -- T:214-219
  local treePattern = topo.tree_pattern_balanced and k > 1                           -- S:1041: 1 GPU -> TREE
  local bws, lats = {}, {}
  for _, coll in ipairs({ "all_gather", "reduce_scatter", "all_reduce" }) do
    local ar = coll == "all_reduce"
    local nsteps = ar and 2 * (nRanks - 1) or nRanks - 1                             -- T:268-270
    bws[coll], lats[coll] = {}, {}
    for a = 1, #M.ALGORITHMS do
      bws[coll][a], lats[coll][a] = { 0, 0, 0 }, { 0, 0, 0 }
      local skip = (not ar and a ~= PAT and a ~= RING and a ~= NVLS and a ~= CND)   -- T:274-276
                   or (ar and a == PAT)                                              -- T:277
      for p = 1, 3 do
        if skip then break end
        local gr = graphs[a]
        local busBw, ok = 0, true
        if (a == NVLS or a == NVLST) and p ~= SIMPLE then ok = false end             -- T:280
        if a == PAT and (p ~= SIMPLE or not patEnable) then ok = false end           -- T:281-282
        local collnet = a == CND or a == CNC
        local bw = (nNodes <= 2 or collnet) and gr.intra or gr.inter                -- T:284
        if ok and (a == NVLS or a == NVLST) then
          if gr.n < 2 then ok = false                                                -- T:288
          else
            local intraBw = gr.intra * M.NVLS_EFFICIENCY[cci] * (gr.n - 1) / gr.n    -- T:290
            if ar then intraBw = intraBw * 2 else intraBw = intraBw * (ppn - 1) / ppn end  -- T:292-296
            local interBw = gr.inter * ((nNodes <= 2 and a == NVLST) and 2 or 1)     -- T:298
            bw = math.min(intraBw, interBw, a == NVLST and perChMaxNVLSTreeBw or math.huge)  -- T:299
          end
        end
        if ok then
          busBw = gr.n * bw                                                          -- T:301
          if a == RING and p == LL then busBw = math.min(llMaxBw, busBw * .5) end    -- T:304
          if a == RING and p == LL128 then busBw = math.min(busBw * 0.92, gr.n * perChMaxRingLL128Bw) end  -- T:305
          if a == TREE and ar then busBw = math.min(busBw * .92, gr.n * perChMaxTreeBw) end  -- T:306
          if a == TREE and p == LL then busBw = math.min(busBw * 1.0 / 3.8, llMaxBw) end     -- T:307
          if a == TREE and p == LL128 then
            busBw = math.min(busBw * (nNodes == 1 and 7.0 / 9.0 or 120.0 / 128.0), gr.n * perChMaxTreeLL128Bw)  -- T:308
          end
          if a == TREE and not treePattern then busBw = busBw * .85 end              -- T:309
          if a == PAT then busBw = busBw * .75 end                                   -- T:310
          if collnet then busBw = 0 end        -- CollNet not modelled (needs SHARP; off by default, T:468-471)
          -- T:326-343: NVLS all_gather/reduce_scatter across nodes needs CollNet
          if a == NVLS and not ar and nNodes > 1 and not topo.collnet then busBw = 0 end
          -- T:346-351: bus -> algorithm bandwidth
          if not (a ~= RING and not ar) then
            local ratio = (a == RING or a == NVLS or a == NVLST) and nRanks / nsteps or .5
            busBw = busBw * ratio
          end
        end
        bws[coll][a][p] = busBw
        -- latencies, T:353-401
        local lat = M.BASE_LAT[a][p]
        local intraLat = M.HW_LAT[intraHw][a][p]
        local interLat = (ppn == 1 and M.HW_LAT[HW_NET][TREE][p] or M.HW_LAT[HW_NET][a][p]) + topo.net_latency_us  -- T:356-357
        if p == SIMPLE then interLat = interLat + topo.net_latency_us end            -- T:359
        if a == RING then
          local netOverhead = 0.0
          if nNodes > 1 then
            netOverhead = netOverheadBase
            if p == SIMPLE then netOverhead = netOverhead * 3 end                    -- T:373-376
          end
          intraLat = math.max(intraLat, netOverhead)
          local nInterSteps = nNodes == 1 and 0 or (ar and 2 * (nNodes - 1) or nNodes - 1)  -- T:378
          lat = lat + (nsteps - nInterSteps) * intraLat + nInterSteps * interLat     -- T:379
        elseif a == TREE then
          if ar then lat = lat + 2 * ((nRanks // nNodes - 1) * intraLat + log2i(nNodes) * interLat) end  -- T:382-385
        elseif a == CND then
          lat = lat + 2 * (math.min(1, nRanks // nNodes - 1) * intraLat + (nRanks // nNodes - 1) * 0.4) + interLat  -- T:387-388
        elseif a == CNC then
          lat = lat + 2 * (nRanks // nNodes - 1) * intraLat + interLat               -- T:390
        elseif a == NVLS then
          lat = intraLat                                                             -- T:392
          if nNodes > 1 then lat = lat + interLat end                                -- T:393
        elseif a == NVLST then
          lat = lat + intraLat + 2 * log2i(nNodes) * interLat                        -- T:395
        elseif a == PAT and not ar then
          lat = lat + log2i(nNodes) * (interLat / 3.5) + nRanks * 2.8                -- T:398-399
        end
        lats[coll][a][p] = lat
      end
      -- T:462-476: NVLSTree off on one node; CollNet and multi-node NVLS off without CollNet
      if (nNodes == 1 and a == NVLST) or ((a == CND or a == CNC or (a == NVLS and nNodes > 1)) and not topo.collnet) then
        bws[coll][a] = { 0, 0, 0 }
      end
    end
  end
  -- T:478-497: LL128 is enabled by default on this hardware: Hopper/Blackwell up to PXN,
  -- Ampere up to PXB (GPU and NIC share a PCIe switch here), NVLink intra-node, one cc.
  return { bandwidths = bws, latencies = lats, nRanks = nRanks, nNodes = nNodes, ring = ring, tree = tree,
           nvls = nvls, nChannels = math.min(ring.n, tree.n) }
end

-- ---- an older NCCL's choice (calibration rows only) ---------------------
-- A measurement ran the NCCL its source names, and that NCCL picks its
-- algorithm and protocol by its own tuning table. Where that table differs
-- from 2.28.9's, the run may have used another algorithm than 2.28.9 would:
-- op.nccl_version makes the choice by that version's table, and the chosen
-- algorithm/protocol is then priced by 2.28.9's model (NCCL's latest
-- calibration of what each algorithm costs on this hardware). Plans pass no
-- version: they are chosen and priced by 2.28.9.
--
-- NCCL v2.20.5-1 (PyTorch 2.3's bundled NCCL), src/graph/tuning.cc cited
-- "T20:line" (v2.20.3-1 has the same table). It differs from 2.28.9 (on
-- Hopper, x86) in: the latency tables (T20:56-77; NVLSTree's network step
-- 14 us, raised to 20.9 in 2.28.9, T:165; NVLink NVLS / NVLSTree 23 us, 25
-- from 2.21; Tree/Simple 28 us per hop, 4 / 14 from 2.23); ring LL at 1/4 of
-- the channels' bandwidth across nodes (T20:181; 1/2 from 2.21); ring LL128
-- x .7 at one GPU per node (T20:182); NVLS / NVLSTree bandwidth min(intra,
-- inter) x 5/6 (T20:176-177, 217; 2.28.3 brought the NVLS efficiency and
-- nRanks / nsteps, T:290-299, 348); a ring all-reduce's network steps 2 x
-- nNodes (T20:162; 2 x (nNodes - 1) from 2.23); the Hopper LL cap 87.7 on
-- one node (T20:86-90); no PAT. The graphs are the emulated 2.28.9 ones (the
-- inter-node speed arrays are the same, v2.20.5-1 src/graph/search.cc:840-845).
M.CHOICE_TABLES = {
  ["2.20"] = {
    source = "v2.20.5-1",
    BASE_LAT = { { 6.8, 14.0, 0 }, { 6.6, 14.0, 8.4 }, { 0, 0, 0 }, { 0, 0, 0 }, { 0, 0, 0 }, { 0, 0, 0 } },  -- T20:56-59
    HW_LAT = {                                                                                              -- T20:64-77
      { { .6, 1.25, 28 }, { .6, 1.9, 3.4 }, { 0, 0, 3.7 }, { 0, 0, 2.8 }, { 0, 0, 23 }, { 0, 0, 23 } },
      { { 1.0, 1.9, 28 }, { 1.0, 2.5, 5.7 }, { 0, 0, 3.7 }, { 0, 0, 2.8 }, { 0, 0, 0 }, { 0, 0, 0 } },
      { { 5.0, 8.5, 28 }, { 2.7, 4.0, 14.0 }, { 0, 0, 31 }, { 0, 0, 30 }, { 0, 0, 18 }, { 0, 0, 14 } },
    },
    LL_MAX_BW = { { 39.0, 39.0, 20.4 }, { 87.7, 22.5, 19.0 }, { 87.7, 22.5, 19.0 } },                      -- T20:86-90
  },
}

-- The version's choice table, or nil where 2.28.9's choice stands: NCCL 2.20.x
-- has one; any other version is chosen by 2.28.9's table (not transcribed:
-- docs/cost-model.md says which rows that concerns).
function M.choice_table(version)
  if not version then return nil end
  return M.CHOICE_TABLES[tostring(version):match("^(%d+%.%d+)")]
end

-- NCCL 2.20's tuning model (T20:130-265) on 2.28.9's graphs: bandwidths and
-- latencies laid out as M.tune's, for the choice only.
function M.tune_v2_20(topo, model)
  assert(topo.cc < 100, "nccl_model: NCCL 2.20 has no Blackwell tuning tables")
  local C = M.CHOICE_TABLES["2.20"]
  local nNodes, nRanks = model.nNodes, model.nRanks
  local k = nRanks // nNodes
  local graphs = { model.tree, model.ring, { n = 0, intra = 0, inter = 0 }, { n = 0, intra = 0, inter = 0 },
                   model.nvls, model.nvls }
  local cci = topo.cc >= 90 and 3 or topo.cc >= 80 and 2 or 1                       -- T20:140 (Volta/Ampere/Hopper)
  local index2 = nNodes <= 2 and nNodes or 3                                         -- T20:143
  local index1 = nNodes == 1 and cci or (topo.cpu == "amd" and 2 or 1)              -- T20:145
  local llMaxBw = C.LL_MAX_BW[index1][index2]
  local perChMaxTreeBw = M.PER_CH_MAX_TREE_BW[cci][index2]                          -- T20:102-106 (same values)
  local perChMaxRingLL128Bw = M.PER_CH_MAX_RING_LL128_BW[cci][index2]               -- T20:92-96
  local perChMaxTreeLL128Bw = M.PER_CH_MAX_TREE_LL128_BW[cci][index2]               -- T20:97-101
  local ppn = nRanks / nNodes
  local netOverheadBase = topo.cpu == "amd" and 2.0 or 1.0                           -- T20:111-119
  local treePattern = topo.tree_pattern_balanced and k > 1
  local bws, lats = {}, {}
  for _, coll in ipairs({ "all_gather", "reduce_scatter", "all_reduce" }) do
    local ar = coll == "all_reduce"
    local nsteps = ar and 2 * (nRanks - 1) or nRanks - 1                             -- T20:159-161
    local nInterSteps = ar and (nNodes > 1 and 2 * nNodes or 0) or nNodes - 1        -- T20:162-164
    bws[coll], lats[coll] = {}, {}
    for a = 1, #M.ALGORITHMS do
      bws[coll][a], lats[coll][a] = { 0, 0, 0 }, { 0, 0, 0 }
      local skip = a == PAT or (not ar and a ~= RING and a ~= NVLS and a ~= CND)    -- T20:167-170
      for p = 1, 3 do
        if skip then break end
        if (a == NVLS or a == NVLST) and p ~= SIMPLE then goto next_proto end        -- T20:173
        local gr = graphs[a]
        local collnet = a == CND or a == CNC
        local bw = (nNodes <= 2 or collnet) and gr.intra or gr.inter                -- T20:175
        if a == NVLS then bw = math.min(gr.intra, gr.inter) end                      -- T20:176
        if a == NVLST then bw = math.min(gr.intra, nNodes <= 2 and gr.inter or gr.inter / 2) end  -- T20:177
        local busBw = gr.n * bw                                                      -- T20:178
        if a == RING and p == LL then busBw = math.min(llMaxBw, busBw * ((nNodes > 1 or ar) and 1 / 4 or 1 / 3)) end
        if a == RING and p == LL128 then
          busBw = math.min(busBw * (ppn < 2 and 0.7 or 0.92), gr.n * perChMaxRingLL128Bw)  -- T20:182
        end
        if a == TREE then busBw = math.min(busBw * .92, gr.n * perChMaxTreeBw) end   -- T20:183
        if a == TREE and p == LL then busBw = math.min(busBw / 3.8, llMaxBw) end     -- T20:184
        if a == TREE and p == LL128 then
          busBw = math.min(busBw * (nNodes == 1 and 7.0 / 9.0 or 120.0 / 128.0), gr.n * perChMaxTreeLL128Bw)  -- T20:185
        end
        if a == TREE and not treePattern then busBw = busBw * .85 end                -- T20:186
        if collnet then busBw = 0 end                                                -- CollNet off, as in M.tune
        if a == RING then busBw = busBw * nRanks / nsteps                            -- T20:213-219
        elseif a == NVLS or a == NVLST then busBw = busBw * 5.0 / 6.0
        else busBw = busBw * .5 end
        bws[coll][a][p] = busBw
        local lat = C.BASE_LAT[a][p]                                                 -- T20:224-265
        local intraLat = C.HW_LAT[HW_NVLINK][a][p]
        local interLat = C.HW_LAT[HW_NET][a][p] + topo.net_latency_us
        if p == SIMPLE then interLat = interLat + topo.net_latency_us end
        if a == RING then
          local netOverhead = nNodes > 1 and netOverheadBase * (p == SIMPLE and 3 or 1) or 0
          intraLat = math.max(intraLat, netOverhead)
          lat = lat + (nsteps - nInterSteps) * intraLat + nInterSteps * interLat
        elseif a == TREE then
          lat = lat + 2 * ((nRanks // nNodes - 1) * intraLat + log2i(nNodes) * interLat)
        elseif a == NVLS then
          lat = intraLat + (nNodes > 1 and interLat or 0)
        elseif a == NVLST then
          lat = lat + intraLat + 2 * log2i(nNodes) * interLat
        end
        lats[coll][a][p] = lat
        ::next_proto::
      end
      -- T20:286-293: NVLSTree off on one node; CollNet and multi-node NVLS off without CollNet.
      -- v2.20.5-1 src/transport/nvls.cc:240: no NVLS with 2 GPUs or fewer in the node's topology (its
      -- `nNodes > 1` test there sees 0: src/init.cc:1010 runs it before nNodes is counted at 1077-1086,
      -- and init.cc:1238-1245 connects NVLS trees when nNodes > 1).
      if (nNodes == 1 and a == NVLST) or ((a == CND or a == CNC or (a == NVLS and nNodes > 1)) and not topo.collnet)
         or ((a == NVLS or a == NVLST) and k <= 2) then
        bws[coll][a] = { 0, 0, 0 }
      end
    end
  end
  return { bandwidths = bws, latencies = lats, nRanks = nRanks, nNodes = nNodes, nChannels = model.nChannels }
end

-- ---- ncclTopoGetAlgoTime (T:584-600) and the choice (E:1784-1830) --------
local function algo_time(model, coll, a, p, nBytes, topo)
  local bw = model.bandwidths[coll][a][p]
  local lat = model.latencies[coll][a][p]
  if bw == 0 then return nil end
  local logSize = nBytes >= 64 and log2i(nBytes >> 6) or -1                          -- T:591
  if a == TREE and coll == "all_reduce" and logSize >= 0 and logSize < 23 then
    bw = bw * M.TREE_CORRECTION[p][logSize + 1]                                      -- T:592
  end
  if a == RING and p == SIMPLE and model.nNodes > 1 and coll == "all_reduce"
     and nBytes // (model.nChannels * model.nRanks) >= 64 then
    lat = lat * (topo.cc < 80 and 1.9 or 1.4)                                        -- T:593-596
  end
  local numPipeOps = 1
  local latCount = a == RING and numPipeOps or math.ceil(numPipeOps / NCCL_MAX_DEV_WORK_BATCH_COLLS)  -- T:598
  return lat * latCount + nBytes / (1000 * bw)                                       -- T:599
end

-- NCCL's choice for one size (E:1784-1830 updateCollCostTable, then the
-- minimum time, E:topoGetAlgoInfo): { us, a, p, table }.
local function choose(model, topo, kind, bytes, nodes, k, nvlsSupport, fp8, fill, forced, forced_proto)
  local nRanks = nodes * k
  local best, table_ = nil, {}
  for a = 1, #M.ALGORITHMS do
    local allowed = true
    if (a == NVLS or a == NVLST) and (not nvlsSupport or (kind ~= "all_reduce" and k > NCCL_MAX_NVLS_ARITY)) then
      allowed = false                                                                -- E:1802
    end
    if a == NVLS and not topo.collnet and nodes > 1 then allowed = false end         -- E:1803
    if forced and M.ALGORITHMS[a] ~= forced then allowed = false end                 -- NCCL_ALGO=<forced>
    if allowed then
      for p = 1, 3 do
        local t = (not forced_proto or M.PROTOCOLS[p] == forced_proto) and algo_time(model, kind, a, p, bytes, topo)
        if t then
          if fp8 and a == RING and nRanks > 8 then t = t * 1024.0 end                -- E:1809-1815
          table_[M.ALGORITHMS[a] .. "/" .. M.PROTOCOLS[p]] = t
          if not best or t < best.us then best = { us = t, a = a, p = p, lat = model.latencies[kind][a][p] } end
        end
      end
    end
  end
  if not best then
    error(string.format("nccl_model: no algorithm has bandwidth on this topology (%s, %d x %d): its links are slower "
      .. "than NCCL's graph search goes", kind, nodes, k), 0)
  end
  best.table = table_
  if fill then
    best.fill_us = fill * best.lat                       -- op.fill: the old fitted fill, for comparison
  else
    best.fill_us = M.pipeline_fill(model, topo, kind, best.a, best.p, bytes, best.us - best.lat)
  end
  best.filled = best.us + best.fill_us
  return best
end

-- Pipeline fill, derived (replaces issue 21's fitted 0.75 x latency).
-- NCCL's time (T:599) is latency + bytes / asymptotic bandwidth: it assumes
-- every stage a chunk passes through runs at once. A Simple-protocol
-- pipeline is store-and-forward at chunk granularity: a chunk enters stage
-- i+1 only when stage i has finished it, so S stages in series over M loop
-- steps take (M + S - 1) steps, not M. The extra (S - 1) steps are the fill:
--   fill = (S - 1) x t_step,  t_step = min(loopSize, bytes) / algbw
-- (algbw: NCCL's own, so t_step = that share of NCCL's bandwidth term).
-- loopSize = channels x heads x chunk, chunk as NCCL sizes it
-- (calcCollChunking, E2:2041-2069 below = src/enqueue.cc at v2.28.9-1).
--   * ring (every protocol): S - 1 = 0. Every rank sends step s while it
--     receives step s - 1 (lockstep), the pipeline is full from the first
--     step; the per-hop latency is NCCL's own nsteps x hwLat (T:379).
--   * LL / LL128 (tree): no fill: a line is forwarded as soon as its flag
--     lands (128-byte granularity), NCCL's per-hop latency covers it.
--   * NVLS all_reduce, one node: S = 3 -- the kernel's scatter warps (input
--     -> the heads' NVLS buffers), reduce+multicast warps (multimem
--     ld_reduce / st), gather warps (NVLS buffer -> output): three warp
--     groups handing chunks on (src/device/all_reduce.h:413-452 at
--     v2.28.9-1, nccl-tests buffers being unregistered: regUsed = 0).
--   * NVLS all_gather / reduce_scatter, one node: S = 2 (copy in, copy
--     out: src/device/all_gather.h:258-300).
--   * NVLSTree all_reduce: one step per inter-node tree hop, up and down:
--     S - 1 = 2 x log2i(nNodes), NCCL's own hop count (T:395). The intra-node
--     scatter / gather stages are not counted here: counting them too (S - 1
--     = 2 + 2 log2i) puts the 2 x 8 10 MiB row (NCCL 2.20.5) at 1.56 x
--     published; without them every NVLSTree row is within 25% (the choice
--     is the rows', see docs/cost-model.md).
--   * Tree / Simple (one node or few; NCCL seldom picks it on H100): no fill
--     modelled.
-- NVLS channels: nvls.cc:148-150 (NVLS_NCHANNELS_SM90 16, SM100 32 multi-node
-- / 24 one node); heads: the NVLS graph's channels; NCCL_NVLS_CHUNKSIZE
-- 128 KiB (nvls.cc:153); NVLSTree chunk at most 64 KiB from 4 nodes
-- (E2:2063, NCCL_NVLSTREE_MAX_CHUNKSIZE -2).
M.NVLS_CHUNKSIZE = 128 * 1024                                            -- nvls.cc:153
local function nvls_channels(topo, nNodes)                               -- nvls.cc:148-150, 192-196
  if topo.cc >= 100 then return nNodes > 1 and 32 or 24 end
  return 16
end

function M.pipeline_fill(model, topo, kind, a, p, bytes, bw_us)
  if bytes <= 0 or bw_us <= 0 or p ~= SIMPLE or (a ~= NVLS and a ~= NVLST) then return 0 end
  local nNodes = model.nNodes
  local ops = nvls_channels(topo, nNodes) * model.nvls.n                 -- E2:2051 concurrentOps; channels E2:1879-1885
  local chunk, stages = M.NVLS_CHUNKSIZE
  if a == NVLS then                                                      -- E2:2041-2055
    if bytes < 64 * ops * chunk and chunk > 65536 then chunk = 65536 end
    if bytes < 8 * ops * chunk and chunk > 32768 then chunk = 32768 end
    if bytes < 2 * ops * chunk and chunk > 16384 then chunk = 16384 end
    stages = kind == "all_reduce" and 2 or 1
  else                                                                   -- E2:2056-2069
    if nNodes >= 4 then chunk = math.min(chunk, 65536) end
    if bytes < 32 * ops * chunk and chunk > 262144 then chunk = 262144 end
    if bytes < 16 * ops * chunk and chunk > 131072 then chunk = 131072 end
    if bytes < 4 * ops * chunk and chunk > 65536 then chunk = 65536 end
    if bytes < 1 * ops * chunk and chunk > 32768 then chunk = 32768 end
    stages = 2 * log2i(nNodes)
  end
  return stages * bw_us * math.min(ops * chunk, bytes) / bytes
end

-- Predict one collective.
--   op = { kind = "all_gather"|"reduce_scatter"|"all_reduce",
--          bytes = nccl-tests size (the larger buffer: AG output, RS input, AR buffer),
--          dtype = "bfloat16"|"bf16"|"float32"|..., nodes = N, gpus_per_node = k }
--   topo = M.topology(preset [, overrides]) or a preset name
--          [algorithm = "nvls"|"ring"|... : NCCL_ALGO forced, as a measurement may have run],
--          [launch_floor_us = N : the launching host's per-iteration floor, see below],
--          [nccl_version = "2.20.5" : the NCCL a measurement ran; its tuning table chooses
--           where M.CHOICE_TABLES has it, 2.28.9's model prices the choice. Where that
--           version's choice switches algorithm, the time can step down with size, as that
--           NCCL's does (2.20.5 on one H100 node: all_gather 3 MiB 50 us, 4 MiB 45 us);
--           calibration rows only, plans pass none] }
-- Returns { us, nccl_us, raw_us, fill_us, algorithm, protocol, algbw_GBps, busbw_GBps, table }:
--   raw_us, algorithm, protocol and table (every candidate's time) are NCCL's
--   model exactly; nccl_us is raw_us made monotone in size; us adds the
--   pipeline fill (above) and is monotone too. NCCL's tree
--   correction (T:578-582) steps by up to 4/3 at a power of two, so its raw
--   time just past 2^j can be below its time just short of it (e.g. tree/LL128
--   at 3 MiB vs 4 MiB); a planner must never see a larger message as cheaper,
--   so us = max(raw_us, raw time at 2^j - 1 for every 2^j <= bytes).
-- A single-rank group costs 0 (E:1791-1794).
function M.predict(op, topo)
  if type(topo) ~= "table" then topo = M.topology(topo or "h100") end
  assert(COLL[op.kind], "nccl_model: unsupported collective " .. tostring(op.kind))
  local nodes, k = op.nodes or 1, op.gpus_per_node or 1
  local nRanks = nodes * k
  local bytes = op.bytes
  assert(type(bytes) == "number" and bytes >= 0, "nccl_model: bytes must be a number >= 0")
  bytes = math.floor(bytes)
  local factor = op.kind == "all_reduce" and 2 * (nRanks - 1) / nRanks or (nRanks - 1) / nRanks
  if nRanks <= 1 then
    return { us = 0, raw_us = 0, algorithm = "ring", protocol = "Simple", algbw_GBps = math.huge, busbw_GBps = 0,
             table = {} }
  end
  local model = M.tune(topo, { nodes = nodes, gpus_per_node = k })
  local dtype = canon_dtype(op.dtype)
  -- E:384: NVLS for a reduction needs a type NVLS reduces; all_gather always may.
  local nvlsSupport = topo.nvls and (op.kind == "all_gather" or NVLS_TYPES[dtype])
  local fp8 = dtype == "float8e4m3" or dtype == "float8e5m2"
  local fill = op.fill
  -- op.nccl_version (a calibration row's NCCL): that version's table chooses
  -- (above, M.CHOICE_TABLES), 2.28.9's model prices the choice.
  local older = M.choice_table(op.nccl_version) and M.tune_v2_20(topo, model)
  local function pick(b)
    if not older then return choose(model, topo, op.kind, b, nodes, k, nvlsSupport, fp8, fill, op.algorithm) end
    local c = choose(older, topo, op.kind, b, nodes, k, nvlsSupport, fp8, 0, op.algorithm)
    return choose(model, topo, op.kind, b, nodes, k, nvlsSupport, fp8, fill, M.ALGORITHMS[c.a], M.PROTOCOLS[c.p])
  end
  local best = pick(bytes)
  local us, nccl_us = best.filled, best.us
  for j = 7, 30 do
    if (1 << j) > bytes then break end
    local below = pick((1 << j) - 1)
    us, nccl_us = math.max(us, below.filled), math.max(nccl_us, below.us)
  end
  -- The launching host: nccl-tests times a loop of back-to-back launches and
  -- divides by the iterations, so where the host needs longer per iteration
  -- than the GPUs (one thread enqueueing all 8 GPUs' kernels, `-g 8`), the
  -- average is the host's time: max(host, GPU). Plans run one process per
  -- GPU (torchrun) and pass no floor.
  if op.launch_floor_us then us = math.max(us, op.launch_floor_us) end
  local algbw = bytes / (us * 1e3)
  return { us = us, nccl_us = nccl_us, raw_us = best.us, fill_us = best.fill_us, algorithm = M.ALGORITHMS[best.a],
           protocol = M.PROTOCOLS[best.p], algbw_GBps = algbw, busbw_GBps = algbw * factor, table = best.table }
end

return M
