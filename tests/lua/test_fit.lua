-- Issue 37, item 4: a plan that does not fit its GPU said at once (one
-- line from gen/commplan.lua and make PLAN=, an error under --strict), the
-- GPU presets' memory as the devices report it, and the advice never
-- putting a mesh that does not fit above one that does.
local H = require("helpers")
local plan = require("gen.plan")
local audit = require("gen.audit")
local compute = require("gen.compute")
local hardware = require("gen.hardware")
local advisor = require("gen.advisor")

local T = {}

local function read(path)
  local fh = assert(io.open(path, "rb"))
  local s = fh:read("a")
  fh:close()
  return s
end

local TINY = read("plans/llama_tiny.lua")

-- llama_tiny with extra topology / training fields.
local function tiny(topology, training)
  local src = TINY:gsub("training = { loss_chunks = 1 },",
    "training = { loss_chunks = 1" .. (training and (", " .. training) or "") .. " },"
      .. (topology and ("\n  topology = { " .. topology .. " },") or ""))
  return plan.from_source(src, "plans/llama_tiny.lua"), src
end

-- nvidia-smi's memory.total of each preset's GPU, in MiB: the bytes the
-- verdict compares with, never the datasheet's decimal GB.
function T.presets_take_the_memory_the_device_reports()
  local want = { h100 = 81559, h200 = 143771, b200 = 183359, a100 = 81920, h100_hbm2e = 97871 }
  for _, name in ipairs(hardware.PRESET_NAMES) do
    local p = tiny(string.format('preset = "%s"', name))
    local s = compute.settings(p)
    H.eq(s.gpu_memory_MiB, want[name], name .. " MiB")
    H.eq(s.gpu_memory_bytes, want[name] * 1048576, name .. " bytes")
    H.eq(s.defaulted.gpu_memory_MiB, true, name .. " stated as a default")
    H.eq(audit.analysis(p).memory.gpu_bytes, want[name] * 1048576, name .. " verdict's limit")
  end
  -- H100: 79.65 GiB, not the 74.51 GiB that 80e9 bytes are.
  local md = audit.schedule_md(tiny(), "fp")
  assert(md:find("81,559 MiB as the device reports it (79.65 GiB)", 1, true), "SCHEDULE.md names the device's MiB")
  assert(not md:find("74.51 GiB", 1, true), "no 80e9-byte H100 left")
  -- The plan's own figure stays decimal GB.
  local p = tiny("gpu_memory_GB = 80")
  local s = compute.settings(p)
  H.eq(s.gpu_memory_bytes, 80e9, "topology.gpu_memory_GB bytes")
  H.eq(s.gpu_memory_MiB, nil, "no device MiB for the plan's own figure")
  assert(audit.gpu_memory_text(s):find("80 GB (topology.gpu_memory_GB", 1, true), audit.gpu_memory_text(s))
end

-- The one line: nil when the plan fits; else the rank, needed vs
-- available, the largest term and a fix naming the plan field.
function T.fit_line_names_the_largest_term_and_its_fix()
  H.eq(audit.fit_line(tiny(), "plans/llama_tiny.lua"), nil, "a plan that fits says nothing")
  -- 1 MB: the activations of seq_len 128 x 4 sequences dominate.
  local p = tiny("gpu_memory_GB = 0.001", "local_batch_size = 64")
  local m = audit.analysis(p).memory
  H.eq(m.fits, false, "1 MB does not fit")
  local line = audit.fit_line(p, "plans/t.lua")
  assert(line and not line:find("\n"), "one line")
  for _, want in ipairs({ "plans/t.lua: does not fit: each rank needs ", "the GPU has 0.001 GB (topology.gpu_memory_GB",
                          "over; largest term activations", 'training.activation_checkpointing = "full" (it is "none")',
                          "make advise PLAN=plans/t.lua" }) do
    assert(line:find(want, 1, true), string.format("%q lacks %q", line, want))
  end
  -- (the figures in the line are the verdict's)
  assert(line:find(audit.human(m.total_bytes) .. ", the GPU has", 1, true), line)
  assert(line:find(audit.human(m.total_bytes - m.gpu_bytes) .. " over", 1, true), line)
  -- Under full checkpointing the activations' fix is the batch, not checkpointing again.
  local full = audit.fit_line(tiny("gpu_memory_GB = 0.001", 'local_batch_size = 64, activation_checkpointing = "full"'),
    "plans/t.lua")
  assert(full and not full:find("activation_checkpointing", 1, true), full)
  -- A generic model (its activations unknown): said, and the largest known
  -- term is the arena, its fix the plan's units or resharding.
  local g = read("plans/fsdp4.lua"):gsub("world_size = 4,", "world_size = 4, topology = { gpu_memory_GB = 1e-6 },", 1)
  local gl = audit.fit_line(plan.from_source(g, "plans/fsdp4.lua"), "plans/g.lua")
  for _, want in ipairs({ "without its activations (a generic model's are not known)",
                          "largest term communication buffers", "fix: smaller FSDP units" }) do
    assert(gl:find(want, 1, true), string.format("%q lacks %q", gl, want))
  end
  g = g:gsub("reshard_after_forward = true", "reshard_after_forward = false")
  gl = audit.fit_line(plan.from_source(g, "plans/fsdp4.lua"), "plans/g.lua")
  assert(gl:find("fix: set fsdp.reshard_after_forward = true", 1, true), gl)
end

local function sh(cmd)
  local ph = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local out = ph:read("a")
  ph:close()
  return out:match("^(.-)rc=(%d+)%s*$")
end

-- gen/commplan.lua: the line on stderr, the plan still generated (exit 0);
-- --strict: exit 2, nothing written; a plan that fits prints nothing.
function T.commplan_says_it_at_once_and_strict_refuses()
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir))
  local _, src = tiny("gpu_memory_GB = 0.001", "local_batch_size = 64")
  local fh = assert(io.open(dir .. "/big.lua", "wb"))
  fh:write(src)
  fh:close()
  local out, rc = sh(string.format("lua5.4 gen/commplan.lua %s/big.lua %s/out", dir, dir))
  H.eq(rc, "0", "generated: " .. out)
  local lines = {}
  for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
  H.eq(#lines, 1, "one line: " .. out)
  assert(lines[1]:find("big.lua: does not fit: each rank needs", 1, true), out)
  assert(io.open(dir .. "/out/plan.c", "rb"), "still built")
  local sout, src2 = sh(string.format("lua5.4 gen/commplan.lua --strict %s/big.lua %s/strict", dir, dir))
  H.eq(src2, "2", "--strict: an error")
  assert(sout:find("refused under --strict, nothing written", 1, true), sout)
  H.eq(io.open(dir .. "/strict/plan.c", "rb"), nil, "--strict writes nothing")
  local fout, frc = sh(string.format("lua5.4 gen/commplan.lua --strict plans/llama_tiny.lua %s/fits", dir))
  H.eq(frc, "0", "a plan that fits passes --strict")
  H.eq(fout, "", "and prints nothing")
  os.execute("rm -rf " .. dir)
end

-- The advice: a pipeline mesh that fits is the top choice when no mesh
-- without pipeline parallel fits (never a mesh that does not fit above it).
function T.advice_never_puts_a_mesh_that_does_not_fit_first()
  local s = compute.settings(tiny())
  local top = { fits = false, settings = s, mesh = "dp_shard=8", ac = "full", memory = { total_bytes = 200 * 2 ^ 30 } }
  local res = { results = { top }, pipeline = { results = {
    { mesh = "pp=2 x dp_shard=4 x tp=1", row = { fits = true, name = "Interleaved1F1B", mem = 70 * 2 ^ 30,
                                                 sim = { step_us = 2.5e6 } }, n = 8 } } } }
  local out = {}
  advisor.explain(top, res, out)
  assert(out[1]:find("**Top choice: pp=2 x dp_shard=4 x tp=1, the pipeline meshes' #1", 1, true), out[1])
  assert(out[1]:find("no mesh without pipeline parallel fits", 1, true), out[1])
  -- A pipeline mesh that does not fit either: no top choice, the smallest named.
  res.pipeline.results[1].row.fits = false
  out = {}
  advisor.explain(top, res, out)
  assert(out[1]:find("^No mesh fits in 81,559 MiB"), out[1])
end

return T
