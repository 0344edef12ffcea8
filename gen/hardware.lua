-- Hardware presets a plan names in topology.preset (issue 21): the GPU
-- (memory, dense rate, HBM rate) and the node's network (NVLink, NVLS,
-- NICs), and the topology every stage reads, resolved from the preset and
-- the plan's overrides. Pure functions; the network figures and their
-- sources are gen/nccl_model.lua's PRESETS.
local nccl_model = require("gen.nccl_model")

local hardware = {}

-- GPU figures per preset. gpu_memory_MiB: the memory as the device
-- reports it (nvidia-smi's memory.total, MiB = 2^20 bytes), the whole-rank
-- verdict's limit unless the plan sets topology.gpu_memory_GB; the
-- datasheets' "80 GB" is not what the device has (an H100's 81,559 MiB are
-- 85.52e9 bytes, 79.65 GiB). gpu_TFLOPS: dense BF16 tensor-core peak;
-- hbm_GBps: what a copy kernel reaches, ~90% of the datasheet's peak (the
-- H100's 3000 of 3350 GB/s, measured by bench/ in an earlier session; the
-- others scaled by the same fraction).
--   H100 SXM: 80 GB HBM3 (nvidia-smi: 81559MiB), 989 TFLOPS, 3.35 TB/s (NVIDIA H100 datasheet)
--   H200 SXM: 141 GB HBM3e (nvidia-smi: 143771MiB), 989 TFLOPS, 4.8 TB/s (NVIDIA H200 datasheet)
--   B200 (HGX B200): 180 GB HBM3e (nvidia-smi: 183359MiB, e.g. NVIDIA/TensorRT-LLM#10278), 2,250 TFLOPS
--     dense, 7.7 TB/s (NVIDIA HGX B200 datasheet, per GPU)
--   H100 96 GB HBM2e at 500 W (h100_hbm2e, Meta's Grand Teton hosts that
--     ran torchtitan's published benchmarks: benchmarks/
--     llama3_h100_202412_torchtitan.md, "Hardware": 96 GB HBM2e, 2.4 TB/s,
--     the default 500 W power limit (memory: 97,871 MiB assumed, as GH200's
--     96 GB reports; not seen here); its footnote 2: the peak is "between
--     SXM and NVL", unknown): 96 GB; 989 TFLOPS, the peak torchtitan's MFU
--     divides by for any H100 but the NVL and PCIe (tools/utils.py:163-171),
--     so the MFU printed is the benchmark's (its "33% to 39%"); what the
--     500 W limit sustains is the kernel table's clock (gen/kernel_tables.lua);
--     2,160 GB/s (90% of 2.4 TB/s)
--   A100 SXM 80GB: 80 GB HBM2e (nvidia-smi: 81920MiB), 312 TFLOPS, 2.04 TB/s (NVIDIA A100 datasheet)
-- host_GBps: the host link's rate per direction, what CPU offload's H2D
-- and D2H copies of pinned memory are priced at (gen/compute.lua op_us):
-- the datasheets' PCIe figure, both directions, halved (no measurement
-- here yet: a pinned cudaMemcpyAsync reaches somewhat less)
--   H100 SXM, H200 SXM: "PCIe Gen5: 128GB/s" (NVIDIA H100 / H200 datasheets) -> 64
--   B200 (HGX B200): PCIe Gen5 x16 to the host, 128 GB/s both ways (NVIDIA HGX B200 datasheet) -> 64
--   A100 SXM: "PCIe Gen4: 64GB/s" (NVIDIA A100 datasheet) -> 32
--   H100 96 GB HBM2e (h100_hbm2e): an H100's PCIe Gen5 -> 64
-- (torch.cuda.get_device_properties().total_memory is a little less: the
-- driver's own reservation; the audit's assumptions say the CUDA context
-- and NCCL's buffers are not counted.)
hardware.GPUS = {
  h100 = { gpu_memory_MiB = 81559, gpu_TFLOPS = 989, hbm_GBps = 3000, host_GBps = 64 },
  h200 = { gpu_memory_MiB = 143771, gpu_TFLOPS = 989, hbm_GBps = 4300, host_GBps = 64 },
  b200 = { gpu_memory_MiB = 183359, gpu_TFLOPS = 2250, hbm_GBps = 6900, host_GBps = 64 },
  a100 = { gpu_memory_MiB = 81920, gpu_TFLOPS = 312, hbm_GBps = 1830, host_GBps = 32 },
  h100_hbm2e = { gpu_memory_MiB = 97871, gpu_TFLOPS = 989, hbm_GBps = 2160, host_GBps = 64 },
}

hardware.PRESET_NAMES = { "h100", "h200", "b200", "a100", "h100_hbm2e" }
hardware.DEFAULT_PRESET = "h100"

-- The plan's topology fields that override a network figure of the preset
-- (plan field -> gen/nccl_model.lua's field). sharp: in-network reduction
-- (NCCL's CollNet enabled), which lets NVLS run across nodes.
hardware.NETWORK_FIELDS = {
  nics_per_node = "nics_per_node", nic_Gbps = "nic_Gbps", nvlink_GBps = "nvlink_GBps", nvlinks = "nvlinks",
  nvls = "nvls", pci_GBps = "pci_GBps", net_latency_us = "net_latency_us", sharp = "collnet",
}
-- Printed in this order (SCHEDULE.md's assumptions, plan.json's topology).
hardware.NETWORK_ORDER = { "nvlink_GBps", "nvlinks", "nvls", "nics_per_node", "nic_Gbps", "pci_GBps",
                           "net_latency_us", "sharp" }

-- Every number a plan's topology section gives, with its documented
-- bounds (gen/load.lua's schema is built from this table: one place). The
-- network's are gen/nccl_model.lua's BOUNDS. The others keep every
-- predicted time and ratio finite (bytes are at most 2^53, ops at most a
-- few million), so no output ever has to render inf or NaN:
--   intra_node_GBps, inter_node_GBps (collectives = "alpha_beta"): 0.01
--     GB/s (10 MB/s, below any link NCCL runs on: its graph search's
--     slowest is 0.12 GB/s) .. 1e6;
--   latency_us: 0 .. 1e6 (a second per log2 step);
--   gpu_memory_GB: 1e-9 (one byte: the memory verdict divides by it; the
--     memory tests squeeze tiny plans into a few KB) .. 1e6;
--   gpu_TFLOPS 0.01 .. 1e6, mfu 0.001 .. 1, hbm_GBps 0.1 .. 1e6.
hardware.BOUNDS = {
  intra_node_GBps = { min = 0.01, max = 1e6 }, inter_node_GBps = { min = 0.01, max = 1e6 },
  latency_us = { min = 0, max = 1e6 },
  gpu_memory_GB = { min = 1e-9, max = 1e6 }, gpu_TFLOPS = { min = 0.01, max = 1e6 },
  mfu = { min = 0.001, max = 1 }, hbm_GBps = { min = 0.1, max = 1e6 }, host_GBps = { min = 0.1, max = 1e6 },
}
for field, b in pairs(nccl_model.BOUNDS) do hardware.BOUNDS[field] = b end

-- The GPU figure `key` for a topology: the plan's own value, else the preset's.
function hardware.gpu_default(topo, key)
  return hardware.GPUS[topo.preset or hardware.DEFAULT_PRESET][key]
end

-- The GPU's memory: bytes, and the MiB the device reports where the
-- preset gives it (nil where the plan sets topology.gpu_memory_GB, decimal
-- GB: 1e9 bytes each).
function hardware.gpu_memory(topo)
  if topo.gpu_memory_GB ~= nil then return topo.gpu_memory_GB * 1e9, nil end
  local mib = hardware.gpu_default(topo, "gpu_memory_MiB")
  return mib * 1048576, mib
end

-- The network gen/nccl_model.lua prices collectives on: the preset with the
-- plan's overrides.
function hardware.network(topo)
  local over = {}
  for field, model_field in pairs(hardware.NETWORK_FIELDS) do
    if topo[field] ~= nil then over[model_field] = topo[field] end
  end
  return nccl_model.topology(topo.preset or hardware.DEFAULT_PRESET, over)
end

-- The network's figures in the plan's own field names, overrides applied.
function hardware.network_fields(topo)
  local net = hardware.network(topo)
  local out = {}
  for _, field in ipairs(hardware.NETWORK_ORDER) do
    local v = net[hardware.NETWORK_FIELDS[field]]
    if v == nil and field == "sharp" then v = false end
    out[field] = v
  end
  return out, net
end

return hardware
