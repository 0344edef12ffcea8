-- Fuzzing the surfaces added since tests/fuzz_plans.lua was written, as a
-- hostile and a careless user would use them, each input through the CLI
-- (a fresh process under a wall-clock and an address-space limit):
--
--   pipeline  the pipeline section of plan files (schedule names,
--             microbatches, stage splits, csv paths) and the sizes around
--             it (pp, n_layers, local_batch_size x seq_len)
--   csv       pipeline.csv: hostile CSV text (numbers past 2^63, negative
--             and non-integer cells, long cells, many rows and columns,
--             unknown actions, NULs, quotes, newlines), and CSVs placed
--             outside the plan's directory, behind symlinks, as a FIFO, a
--             directory or /dev/zero, or holding a secret
--   network   topology figures and presets (0, negative, tiny, huge, nan,
--             inf, strings) with both collective models
--   ep        expert parallelism's fields (capacity, capacity_factor, ep,
--             experts, top_k, sizes)
--   diff      `diff [--svg DIR] A B` (make diff-plan): operands missing,
--             directories, symlinks, FIFOs, non-plans, huge; DIR with
--             planted symlinks, directories and files
--
-- The contract for every input: exit 0 (a generation wrote its outputs), or
-- exit 2 with exactly one printable stderr line ("<file>:<line>: <field>:
-- <message>" for a plan file) and nothing written; never an internal error,
-- a traceback, a run past the time limit or the memory limit; a secret
-- planted in a file the plan must not read never appears in any output; a
-- CSV outside the plan's directory or behind a symlink is never read; no
-- file outside the output (the canaries) is ever written.
--
--   lua5.4 tests/fuzz_surfaces.lua [--seconds 20] [--min-inputs 200] [--seed N] [--only I]
--                                  [--max-failures 20] [--per-input 20] [--mem-mb 2048]
--                                  [--surface pipeline|csv|network|ep|diff-plan] (that one only)
--
-- Inputs 1..#CORPUS are fixed shapes, one per class known to have broken a
-- surface; every later input I depends only on (seed, I), so a failure reproduces with
-- --seed N --only I; its files are also kept under build/fuzz/surfaces-fail-N-I/.
package.path = "./?.lua;./tests/lua/?.lua;" .. package.path

-- per_input: CPU seconds (ulimit -t: a loaded machine does not fail a bounded input), and 1.5
-- times that in wall-clock seconds (a process blocked in a FIFO uses no CPU). The issue's own
-- measure: "no answer in 20 s".
local opts = { seconds = 20, seed = 20261129, only = nil, min_inputs = 200, max_failures = 20, per_input = 20,
               mem_mb = 2048 }
do
  local i = 1
  local usage = "usage: lua5.4 tests/fuzz_surfaces.lua [--seconds S] [--min-inputs N] [--seed N] [--only I] "
    .. "[--max-failures K] [--per-input S] [--mem-mb M] [--surface NAME]\n"
  while i <= #arg do
    local a, v = arg[i], math.tointeger(tonumber(arg[i + 1] or ""))
    if a == "--seconds" and v then opts.seconds = v
    elseif a == "--min-inputs" and v then opts.min_inputs = v
    elseif a == "--seed" and v then opts.seed = v
    elseif a == "--only" and v then opts.only = v
    elseif a == "--max-failures" and v then opts.max_failures = v
    elseif a == "--per-input" and v then opts.per_input = v
    elseif a == "--mem-mb" and v then opts.mem_mb = v
    elseif a == "--surface" and arg[i + 1] then opts.surface = arg[i + 1]
    else io.stderr:write(usage); os.exit(2) end
    i = i + 2
  end
  opts.seed = math.tointeger(tonumber(os.getenv("FUZZ_SEED") or "")) or opts.seed
end

local LUA = os.getenv("LUA") or "lua5.4"
-- (its own directory: two runs at once do not share files)
local TOP = "build/fuzz/surf." .. assert(io.popen("echo $PPID"):read("l"))
local W = TOP .. "/w" -- the current input's files: plan/, outside/, ops/, svg/, canary/, out
local SECRET = "SECRET_hD_7f3a" -- planted where no plan may read it; never printed

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local function sh(cmd)
  local _, _, rc = os.execute(cmd)
  return rc
end

local H = require("helpers")
local read, write = H.try_read, H.write

-- What a path is, without following a symlink: "symbolic link", "regular file", ... or nil.
local function kind_of(path)
  local ph = io.popen("LC_ALL=C stat -c '%F' -- " .. sh_quote(path) .. " 2>/dev/null")
  local k = ph:read("l")
  ph:close()
  return k
end

-- Every entry under dir (recursively, no symlink followed), sorted, as "path kind size".
local function listing(dir)
  local ph = io.popen("cd " .. sh_quote(dir) .. " 2>/dev/null && LC_ALL=C find . -mindepth 1 -printf '%p %y %s\\n' | sort")
  local s = ph:read("a")
  ph:close()
  return s
end

assert(read("gen/commplan.lua"), "run from the repository root")
assert(os.execute("mkdir -p " .. TOP))
local ROOT = io.popen("pwd"):read("l")

-- ---- base plans -----------------------------------------------------------

-- A plan file's table (the bases are plain tables; a local function is fine).
local function table_of(path)
  local f = assert(load(assert(read(path), path), "=" .. path, "t", {}))
  return f()
end

local function copy(t)
  if type(t) ~= "table" then return t end
  local c = {}
  for k, v in pairs(t) do c[k] = copy(v) end
  return c
end

local PP_BASES, EP_BASES, NET_BASES = {}, {}, {}
for _, f in ipairs({ "pp_tiny", "pp_tiny_dpv", "pp_tiny_gpipe", "pp_tiny_izb", "pp_tiny_lbfs", "pp_tiny_tp", "pp_tiny_zbv" }) do
  PP_BASES[#PP_BASES + 1] = { file = "tests/pp/plans/" .. f .. ".lua", t = table_of("tests/pp/plans/" .. f .. ".lua") }
end
-- llama405b's shape (pp x tp x dp, a named size) on few ranks: the shipped one takes seconds
PP_BASES[#PP_BASES + 1] = { file = "plans/llama405b.lua (shrunk)", t = {
  world_size = 8, parallel = { dp_shard = 2, tp = 2, pp = 2, async_tp = true },
  pipeline = { schedule = "Interleaved1F1B", microbatches = 4 },
  model = { family = "llama", dim = 64, n_layers = 8, n_heads = 4, n_kv_heads = 2, vocab_size = 256, multiple_of = 16,
            seq_len = 64 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" }, topology = { gpus_per_node = 8 },
  training = { activation_checkpointing = "full", local_batch_size = 4 } } }
for _, f in ipairs({ "ep2_dsv3_shard1", "ep2_mixtral", "ep2_mixtral_ac", "ep2_mixtral_hsdp", "ep4_dsv3_tp2", "ep4_mixtral_efsdp1" }) do
  EP_BASES[#EP_BASES + 1] = { file = "tests/ep/plans/" .. f .. ".lua", t = table_of("tests/ep/plans/" .. f .. ".lua") }
end
for _, f in ipairs({ "plans/fsdp4.lua", "plans/hsdp2x2.lua", "plans/llama_tiny.lua", "plans/llama_tiny_tp.lua", "plans/single.lua",
                     "tests/pp/plans/pp_tiny.lua", "tests/ep/plans/ep2_mixtral.lua" }) do
  NET_BASES[#NET_BASES + 1] = { file = f, t = table_of(f) }
end

-- ---- values -----------------------------------------------------------------

local R -- the per-input random function (math.random after math.randomseed(seed, i))
local function pick(list) return list[R(#list)] end

-- A Lua expression written as is into the plan file.
local EXPR = { __name = "expr" }
local function expr(s) return setmetatable({ s }, EXPR) end

local function lua_value(v)
  if getmetatable(v) == EXPR then return v[1] end
  if type(v) == "string" then return (string.format("%q", v):gsub("\\\n", "\\n")) end
  if math.type(v) == "float" then
    if v ~= v then return "0/0" elseif v == math.huge then return "1/0" elseif v == -math.huge then return "-1/0" end
    return string.format("%.17g", v)
  end
  if type(v) == "table" then
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    local parts = {}
    for _, k in ipairs(keys) do
      local kt = type(k) == "string" and k:match("^[%a_][%w_]*$") and k or ("[" .. lua_value(k) .. "]")
      parts[#parts + 1] = kt .. " = " .. lua_value(v[k])
    end
    return "{ " .. table.concat(parts, ", ") .. " }"
  end
  return tostring(v)
end

-- The schedules torch loads a CSV for (multi-stage), with the CSV commplan writes for them.
local CSV_BASES = {}
do
  local load = require("gen.load")
  local report = require("gen.pipeline")
  for _, sched in ipairs({ "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV" }) do
    local t = copy(PP_BASES[1].t)
    t.pipeline.schedule = sched
    local ok, csv = pcall(function()
      -- (a table, serialized below; a path inside the repository, never written)
      return report.csv(load.source("return " .. lua_value(t), "tests/pp/plans/pp_tiny.lua"))
    end)
    if ok and type(csv) == "string" and csv ~= "" then CSV_BASES[#CSV_BASES + 1] = { sched = sched, t = t, csv = csv } end
  end
  assert(#CSV_BASES > 0, "no pipeline schedule gave a CSV (gen/parallel/pp_report.lua's csv)")
end

-- Hostile numbers, as expressions: the bounds' edges, past 2^53 and 2^63, not numbers at all.
local NUMS = {
  "0", "-1", "1", "2", "3", "4", "7", "8", "16", "1.5", "2.5", "-0.0", "0/0", "1/0", "-1/0", "1e300", "-1e300", "1e-300",
  "5e-324", "1e-9", "0.001", "2^53", "2^53 + 1", "2^63", "9007199254740993", "9223372036854775807",
  "-9223372036854775807 - 1", "1 << 31", "1 << 40", "1 << 20", "(1 << 20) + 1", "1e6", "1e6 + 1", "4096", "4097",
  "1024", "1025", "65536", "1e15", "'4'", "'x'", "true", "{}", "''",
}
local function num() return expr(pick(NUMS)) end
-- A big but maybe-valid size: what the documented bounds must refuse before the work starts.
local function big() return expr(pick({ "1000", "4000", "20000", "100000", "1 << 20", "1 << 24", "1 << 30", "2^40" })) end

local HOSTILE_STRINGS = {
  "", " ", "x", "1F1B ", "1f1b", "GPipe\0", "Schedule1F1B", "ScheduleGPipe", "../1F1B", "%s", "\27[31m", "\255",
  string.rep("Z", 5000), "nil", "a\nb", "secret",
}

-- ---- per-input files ------------------------------------------------------

local function fresh()
  sh("rm -rf " .. sh_quote(W))
  assert(os.execute("mkdir -p " .. W .. "/plan " .. W .. "/outside " .. W .. "/canary"))
  -- canaries: files outside every output; nothing may change them
  write(W .. "/canary/c1", "canary one\n")
  write(W .. "/canary/c2", "canary two\n")
end

local function plan_file(t, extra)
  local src = "return " .. lua_value(t) .. "\n"
  if extra then src = extra .. "\n" .. src end
  write(W .. "/plan/p.lua", src)
  return W .. "/plan/p.lua"
end

-- ---- the surfaces -----------------------------------------------------------

local SCHEDULES = { "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV" }

local function set(t, sec, key, v)
  if type(t[sec]) ~= "table" then t[sec] = {} end
  t[sec][key] = v
end

-- Sizes whose product passes 2^53 elements, each within its own bound.
local function batch_times_seq(t)
  set(t, "training", "local_batch_size", expr(pick({ "1 << 20", "1 << 16", "65535" })))
  set(t, "model", "seq_len", expr(pick({ "1 << 30", "1 << 34", "(1 << 31) - 1", "1 << 40" })))
end

-- (a) pipeline fields: returns argv, how, checks
local function gen_pipeline()
  local base = pick(PP_BASES)
  local t = copy(base.t)
  local hows = {}
  for _ = 1, R(3) do
    local k = R(12)
    if k == 1 then set(t, "pipeline", "schedule", R(2) == 1 and pick(SCHEDULES) or pick(HOSTILE_STRINGS)); hows[#hows + 1] = "schedule"
    elseif k == 2 then set(t, "pipeline", "microbatches", R(3) == 1 and big() or num()); hows[#hows + 1] = "microbatches"
    elseif k == 3 then
      set(t, "pipeline", pick({ "layers_per_stage", "first_stage_less_layers", "last_stage_less_layers" }), num())
      hows[#hows + 1] = "stage split"
    elseif k == 4 then set(t, "pipeline", "csv", pick({ "none.csv", "", "/", "..", ".", "/etc/passwd", "/dev/zero",
      "../../../../etc/hostname", "a\0b.csv", "a\1b.csv", string.rep("a/", 3000) .. "s.csv", "~/s.csv", "$HOME/s.csv",
      "`id`.csv", "s.csv;rm -rf x", "-s.csv" })); hows[#hows + 1] = "csv path"
    elseif k == 5 then
      local pp = pick({ 1, 2, 3, 4, 8, 16, 64 })
      t.parallel.pp = R(4) == 1 and num() or pp
      if R(2) == 1 and math.type(t.parallel.pp) == "integer" then t.world_size = pp * 2 end
      hows[#hows + 1] = "pp"
    elseif k == 6 then set(t, "model", "n_layers", R(2) == 1 and big() or num()); hows[#hows + 1] = "n_layers"
    elseif k == 7 then set(t, "training", "local_batch_size", R(2) == 1 and big() or num()); hows[#hows + 1] = "local_batch_size"
    elseif k == 8 then
      if R(2) == 1 then set(t, "model", "seq_len", R(2) == 1 and big() or num()); hows[#hows + 1] = "seq_len"
      else batch_times_seq(t); hows[#hows + 1] = "local_batch_size x seq_len past 2^53" end
    elseif k == 9 then t.pipeline = pick({ expr("'1F1B'"), expr("{}"), expr("{ 1, 2 }"), expr("true"), nil }); hows[#hows + 1] = "pipeline table"
    elseif k == 10 then set(t, "pipeline", pick({ "schedul", "micro_batches", "stages_per_rank", "csv_format", "[1]" }), num())
      hows[#hows + 1] = "unknown key"
    elseif k == 11 then
      -- many layers with many microbatches: the growth the bounds must stop in one line
      set(t, "model", "n_layers", big()); set(t, "pipeline", "microbatches", expr(pick({ "256", "1024", "4096" })))
      hows[#hows + 1] = "layers x microbatches"
    else set(t, "training", "loss_chunks", num()); if R(2) == 1 then t.model.seq_len = nil end; hows[#hows + 1] = "loss_chunks" end
  end
  local p = plan_file(t)
  return { argv = { LUA, "gen/commplan.lua", p, W .. "/out" }, plan = p, how = base.file .. ": " .. table.concat(hows, ", ") }
end

-- (a') pipeline CSVs
local function mutate_csv(csv)
  local rows = {}
  for line in csv:gmatch("([^\n]*)\n") do rows[#rows + 1] = line:gsub("\r$", "") end
  local hows = {}
  for _ = 1, R(2) do
    local k = R(14)
    local r = R(#rows)
    local cells = {}
    for c in (rows[r] .. ","):gmatch("([^,]*),") do cells[#cells + 1] = c end
    local ci = R(#cells)
    local function put(v, what) cells[ci] = v; rows[r] = table.concat(cells, ","); hows[#hows + 1] = what end
    if k == 1 then put(pick({ "0F9223372036854775808", "0F18446744073709551617", "9223372036854775808F0",
      "99999999999999999999999F0", "0F" .. string.rep("9", 400), "0F99999", "4F0", "1000000F0" }), "number past 2^63")
    elseif k == 2 then put(pick({ "0F-1", "-1F0", "0F1.5", "1.5F0", "0F1e3", "0F0x10", "0F 1", "0 F0", "0F+1" }), "bad number")
    elseif k == 3 then put(pick({ "0X0", "0UNSHARD", "0SEND_F0", "0RECV_B0", "(0F0;0B0)OVERLAP_F_B", "(0F0)ZZZ", "F0", "0",
      "0F", "()", "(;;)X", "0RESHARD", "0REDUCE_GRAD" }), "unknown or comm action")
    elseif k == 4 then put(pick({ "0F0" .. string.rep(" ", 20000) .. "x", string.rep(" ", 30000) .. "0F0" .. string.rep(" ", 30000),
      string.rep("x", 200000) }), "long cell")
    elseif k == 5 then
      local n = pick({ 10, 100, 1000, 20000 })
      for j = 1, n do rows[#rows + 1] = rows[(j - 1) % r + 1] end
      hows[#hows + 1] = n .. " extra rows"
    elseif k == 6 then
      local n = pick({ 100, 10000, 100000 })
      rows[r] = rows[r] .. string.rep("," .. cells[ci], n)
      hows[#hows + 1] = n .. " extra columns"
    elseif k == 7 then put(pick({ "0F\0000", "\0", "0F0\0", '"0F0\n1F0"', '"0F0', '0F0"', '""""', '"0F0"x', '"\r"',
      "0F0\r\r", "\239\187\1910F0" }), "NUL, newline or quote")
    elseif k == 8 then put(SECRET, "secret cell")
    elseif k == 9 then rows[1] = SECRET .. "," .. rows[1]; hows[#hows + 1] = "secret first cell"
    elseif k == 10 then table.remove(rows, r); hows[#hows + 1] = "a row removed"
    elseif k == 11 then rows = { "" }; hows[#hows + 1] = "empty"
    elseif k == 12 then rows[r] = string.rep(",", pick({ 1, 50, 5000 })); hows[#hows + 1] = "commas only"
    elseif k == 13 then
      local bytes = {}
      for j = 1, R(2000) do bytes[j] = string.char(R(0, 255)) end
      rows[r] = table.concat(bytes); hows[#hows + 1] = "binary row"
    else put("", "empty cell") end
  end
  return table.concat(rows, R(2) == 1 and "\r\n" or "\n") .. (R(3) == 1 and "" or "\r\n"), table.concat(hows, ", ")
end

-- Where the CSV sits and how the plan names it; must_refuse: a placement the plan may not read.
-- force (the corpus below): { base = i, text = function(csv) -> text, how, place = 1..12 }
local function gen_csv(force)
  force = force or {}
  local base = force.base and CSV_BASES[math.min(force.base, #CSV_BASES)] or pick(CSV_BASES)
  local t = copy(base.t)
  local text, how = base.csv, "valid"
  if force.text then text, how = force.text(base.csv)
  elseif not force.place and R(5) ~= 1 then text, how = mutate_csv(base.csv) end
  local place = force.place or R(12)
  local must_refuse, where
  local abs_outside = ROOT .. "/" .. W .. "/outside/s.csv"
  if place <= 4 then write(W .. "/plan/s.csv", text); t.pipeline.csv = "s.csv"; where = "beside"
  elseif place == 5 then
    assert(os.execute("mkdir -p " .. W .. "/plan/sub")); write(W .. "/plan/sub/s.csv", text)
    t.pipeline.csv = "sub/s.csv"; where = "under the plan's dir"
  elseif place == 6 then
    write(W .. "/outside/s.csv", text); t.pipeline.csv = "../outside/s.csv"; must_refuse = true; where = "../ outside"
  elseif place == 7 then
    write(W .. "/outside/s.csv", text); t.pipeline.csv = abs_outside; must_refuse = true; where = "absolute outside"
  elseif place == 8 then
    write(W .. "/outside/s.csv", text); sh("ln -s ../outside/s.csv " .. W .. "/plan/s.csv")
    t.pipeline.csv = "s.csv"; must_refuse = true; where = "symlink to outside"
  elseif place == 9 then
    write(W .. "/plan/real.csv", text); sh("ln -s real.csv " .. W .. "/plan/s.csv")
    t.pipeline.csv = "s.csv"; must_refuse = true; where = "symlink beside"
  elseif place == 10 then
    -- a secret file outside: read through a symlink, its contents must never be printed
    write(W .. "/outside/secret.txt", SECRET .. ",x\n" .. SECRET .. "\n")
    if R(2) == 1 then sh("ln -s ../outside/secret.txt " .. W .. "/plan/s.csv"); t.pipeline.csv = "s.csv"
    else t.pipeline.csv = R(2) == 1 and "../outside/secret.txt" or (ROOT .. "/" .. W .. "/outside/secret.txt") end
    must_refuse = true; how = "secret file"; where = "outside"
  elseif place == 11 then
    local k = R(4)
    if k == 1 then assert(os.execute("mkdir " .. W .. "/plan/s.csv")); where = "a directory"
    elseif k == 2 then sh("mkfifo " .. W .. "/plan/s.csv"); where = "a FIFO"
    elseif k == 3 then sh("ln -s /dev/zero " .. W .. "/plan/s.csv"); where = "symlink to /dev/zero"
    else sh("ln -s nowhere.csv " .. W .. "/plan/s.csv"); where = "dangling symlink" end
    t.pipeline.csv = "s.csv"; must_refuse = true
  else
    write(W .. "/plan/s.csv", text); t.pipeline.csv = "s.csv"
    set(t, "pipeline", "microbatches", num()); where = "beside, hostile microbatches"
  end
  local p = plan_file(t)
  return { argv = { LUA, "gen/commplan.lua", p, W .. "/out" }, plan = p, must_refuse = must_refuse,
           how = string.format("%s CSV (%s), %s", base.sched, how, where) }
end

-- (b) network figures and presets
local NET_FIELDS = { "gpus_per_node", "preset", "collectives", "nics_per_node", "nic_Gbps", "nvlink_GBps", "nvlinks", "nvls",
  "pci_GBps", "net_latency_us", "sharp", "intra_node_GBps", "inter_node_GBps", "latency_us", "gpu_memory_GB",
  "gpu_TFLOPS", "mfu", "hbm_GBps" }
local TINY = { "1e-300", "5e-324", "1e-9", "1e-6", "0.001", "0.01", "0.1", "1e-30" }
-- Values at the edges of each figure's documented range (gen/load.lua), accepted by the
-- loader: what reaches the cost model and the renderers.
local EDGES = {
  gpus_per_node = { "1", "2", "3" }, nics_per_node = { "1", "64", "3" }, nvlinks = { "1", "64" },
  nic_Gbps = { "10", "10.000001", "1e6" }, nvlink_GBps = { "5", "5.0000001", "1e6" }, pci_GBps = { "1", "1e6" },
  net_latency_us = { "0", "5e-324", "1e6" }, intra_node_GBps = { "5e-324", "1e-300", "1e-12", "1e6" },
  inter_node_GBps = { "5e-324", "1e-300", "1e-12", "1e6" }, latency_us = { "0", "5e-324", "1e6" },
  gpu_memory_GB = { "5e-324", "1e-300", "1e6" }, gpu_TFLOPS = { "0.01", "1e6" }, mfu = { "0.001", "1" },
  hbm_GBps = { "0.1", "1e6" },
}
local function gen_network()
  local base = pick(NET_BASES)
  local t = copy(base.t)
  local topo = type(t.topology) == "table" and t.topology or {}
  t.topology = topo
  local hows = {}
  if R(2) == 1 then topo.collectives = "alpha_beta"; hows[#hows + 1] = "alpha_beta" end
  for _ = 1, R(4) do
    local f = pick(NET_FIELDS)
    local v
    if f == "preset" then v = R(2) == 1 and pick({ "h100", "h200", "b200", "a100" }) or pick(HOSTILE_STRINGS)
    elseif f == "collectives" then v = R(2) == 1 and pick({ "nccl", "alpha_beta" }) or pick(HOSTILE_STRINGS)
    elseif f == "nvls" or f == "sharp" then v = R(3) == 1 and num() or R(2) == 1
    elseif R(3) ~= 1 and EDGES[f] then v = expr(pick(EDGES[f])); f = f .. " (edge)"
    elseif R(3) == 1 then v = expr(pick(TINY))
    else v = num() end
    topo[f:match("^%S+")] = v
    hows[#hows + 1] = f
  end
  if R(15) == 1 then t.topology = pick({ expr("'h100'"), expr("{ 1 }"), expr("true") }); hows = { "topology not a table" } end
  local p = plan_file(t)
  return { argv = { LUA, "gen/commplan.lua", p, W .. "/out" }, plan = p, how = base.file .. ": " .. table.concat(hows, ", ") }
end

-- (c) expert parallelism's fields
local function gen_ep()
  local base = pick(EP_BASES)
  local t = copy(base.t)
  local hows = {}
  for _ = 1, R(3) do
    local k = R(10)
    if k == 1 then set(t, "expert_parallel", "capacity", R(2) == 1 and pick({ "dropless", "factor" }) or pick(HOSTILE_STRINGS))
      hows[#hows + 1] = "capacity"
    elseif k == 2 then
      set(t, "expert_parallel", "capacity_factor", R(2) == 1 and expr(pick(TINY)) or num())
      if R(2) == 1 then t.expert_parallel.capacity = "factor" end
      hows[#hows + 1] = "capacity_factor"
    elseif k == 3 then t.parallel.ep = R(2) == 1 and pick({ 1, 2, 3, 4, 8, 16 }) or num(); hows[#hows + 1] = "ep"
    elseif k == 4 then set(t, "model", pick({ "num_experts", "top_k", "num_shared_experts" }), R(3) == 1 and big() or num())
      hows[#hows + 1] = "experts / top_k"
    elseif k == 5 then set(t, "model", pick({ "moe_hidden_dim", "dim" }), R(2) == 1 and big() or num()); hows[#hows + 1] = "dims"
    elseif k == 6 then set(t, "training", "local_batch_size", R(2) == 1 and big() or num()); hows[#hows + 1] = "local_batch_size"
    elseif k == 7 then
      if R(2) == 1 then set(t, "model", "seq_len", R(2) == 1 and big() or num()); hows[#hows + 1] = "seq_len"
      else batch_times_seq(t); hows[#hows + 1] = "local_batch_size x seq_len past 2^53" end
    elseif k == 8 then set(t, "expert_parallel", pick({ "capacity_factr", "dispatcher", "[1]" }), num()); hows[#hows + 1] = "unknown key"
    elseif k == 9 then set(t, "model", pick({ "n_expert_groups", "n_limited_groups" }), num()); hows[#hows + 1] = "expert groups"
    else set(t, "parallel", "etp", num()); hows[#hows + 1] = "etp" end
  end
  local p = plan_file(t)
  return { argv = { LUA, "gen/commplan.lua", p, W .. "/out" }, plan = p, how = base.file .. ": " .. table.concat(hows, ", ") }
end

-- (d) diff-plan's operands and --svg outputs
local HUGE_LUA = TOP .. "/huge.lua" -- past the 16 MiB a plan file may have, made once
-- force (the corpus below): { a = k, b = k, svg = k } for operand() and the --svg DIR setup
local function gen_diff(force)
  force = force or {}
  local ops = W .. "/ops"
  assert(os.execute("mkdir -p " .. ops))
  local function plan_operand(name, from)
    local p = ops .. "/" .. name
    write(p, assert(read(from)))
    return p
  end
  local function operand(forced)
    local k = forced or R(16)
    if k <= 4 then return plan_operand("a" .. R(99) .. ".lua", pick({ "plans/fsdp4.lua", "plans/hsdp2x2.lua",
      "plans/llama_tiny.lua", "plans/single.lua", "tests/ep/plans/ep2_mixtral.lua" })), "plan"
    elseif k == 5 then return plan_operand("pp" .. R(99) .. ".lua", pick({ "tests/pp/plans/pp_tiny.lua",
      "tests/pp/plans/pp_tiny_izb.lua" })), "pipeline plan"
    elseif k == 6 then return pick({ "plans/fsdp4/plan.json", "plans/hsdp2x2/plan.json" }), "committed plan.json"
    elseif k == 7 then return ops .. "/missing.lua", "missing"
    elseif k == 8 then assert(os.execute("mkdir -p " .. ops .. "/dir.lua")); return ops .. "/dir.lua", "directory"
    elseif k == 9 then
      write(ops .. "/t.lua", assert(read("plans/fsdp4.lua"))); sh("ln -sf t.lua " .. ops .. "/l.lua")
      return ops .. "/l.lua", "symlink to a plan"
    elseif k == 10 then sh("ln -sf /dev/zero " .. ops .. "/z.json"); return ops .. "/z.json", "symlink to /dev/zero"
    elseif k == 11 then sh("rm -f " .. ops .. "/f.lua; mkfifo " .. ops .. "/f.lua"); return ops .. "/f.lua", "FIFO"
    elseif k == 12 then
      write(ops .. "/n" .. k .. ".lua", pick({ "hello", "return 1", "return {}", "\0\1\2", "return { world_size = 4 }",
        "return " .. string.rep("{", 10000) }))
      return ops .. "/n" .. k .. ".lua", "not a plan"
    elseif k == 13 then
      write(ops .. "/j.json", pick({ "{}", "[]", "{\"ops\": 1}", "{\"ops\": [], \"schema\": 2}", "{\"ops\": [], \"schema\": 99}",
        string.rep("[", 100000), "\255\254", "{\"ops\": [" .. string.rep("{},", 10000) .. "{}], \"schema\": 2}" }))
      return ops .. "/j.json", "not a plan.json"
    elseif k == 14 then
      if not read(HUGE_LUA .. ".ok") then
        local fh = assert(io.open(HUGE_LUA, "wb"))
        local chunk = "-- " .. string.rep("x", 1020) .. "\n"
        for _ = 1, 17 * 1024 do fh:write(chunk) end
        fh:write("return {}\n")
        fh:close()
        write(HUGE_LUA .. ".ok", "")
      end
      return HUGE_LUA, "17 MiB plan file"
    elseif k == 15 then return pick({ "nope:plans/x.json", "HEAD:../../etc/passwd", "-x:y", "HEAD:plans/fsdp4/plan.json",
      "HEAD~999999:plans/fsdp4/plan.json", "HEAD:plans/fsdp4.lua", "$(id):x", "" }), "REV:path"
    else return W .. "/canary/c1", "a non-plan file (a canary)" end
  end
  local a, ha = operand(force.a)
  local b, hb = operand(force.b)
  local argv = { LUA, R(3) == 1 and "gen/commplan.lua" or "gen/verbs.lua", "diff" }
  local how = ha .. " vs " .. hb
  local svg
  if force.svg or (force.svg == nil and R(4) ~= 1) then
    svg = W .. "/svg"
    local k = force.svg or R(10)
    if k >= 2 then assert(os.execute("mkdir -p " .. svg)) end
    if k == 1 then how = how .. ", --svg new dir"
    elseif k == 2 then how = how .. ", --svg empty dir"
    elseif k == 3 then sh("ln -s ../canary/c1 " .. svg .. "/before.svg"); how = how .. ", --svg: before.svg a symlink to a canary"
    elseif k == 4 then sh("ln -s ../canary/c2 " .. svg .. "/after.svg"); how = how .. ", --svg: after.svg a symlink to a canary"
    elseif k == 5 then sh("ln -s ../canary/new " .. svg .. "/before.svg"); how = how .. ", --svg: before.svg dangling into the canaries"
    elseif k == 6 then assert(os.execute("mkdir " .. svg .. "/after.svg")); how = how .. ", --svg: after.svg a directory"
    elseif k == 7 then write(svg .. "/before.svg", "old\n"); write(svg .. "/keep.txt", "keep\n"); how = how .. ", --svg: files there"
    elseif k == 8 then
      -- (DIR itself may be a link, as /tmp is on some systems: writing in its target is writing in DIR)
      sh("rmdir " .. svg .. "; mkdir " .. W .. "/svgtarget; ln -s svgtarget " .. svg); how = how .. ", --svg DIR a symlink to a dir"
    elseif k == 9 then sh("rmdir " .. svg); write(svg, "a file\n"); how = how .. ", --svg DIR a regular file"
    else sh("mkfifo " .. svg .. "/before.svg"); how = how .. ", --svg: before.svg a FIFO" end
    argv[#argv + 1] = "--svg"
    argv[#argv + 1] = svg
  end
  argv[#argv + 1] = a
  argv[#argv + 1] = b
  return { argv = argv, diff = true, svg = svg, how = "diff " .. how }
end

local SURFACES = {
  { name = "pipeline fields", gen = gen_pipeline, w = 3 },
  { name = "csv", gen = gen_csv, w = 3 },
  { name = "network", gen = gen_network, w = 2 },
  { name = "ep", gen = gen_ep, w = 2 },
  { name = "diff-plan", gen = gen_diff, w = 2 },
}

-- The first inputs: one of each shape known to have broken a surface (issue 33's classes and
-- what this fuzzer found), so that the quick tier's few inputs hold every class.
local function plan_case(t, how)
  local p = plan_file(t)
  return { argv = { LUA, "gen/commplan.lua", p, W .. "/out" }, plan = p, how = "corpus: " .. how }
end
local function with(base, edit)
  local t = copy(base)
  edit(t)
  return t
end
local function first_row_with(cells)
  return function(csv) return (csv:gsub("^([^\r\n]*)", function(row) return cells(row) end, 1)), "corpus" end
end
local function diff_case(a, b, how)
  local ops = W .. "/ops"
  assert(os.execute("mkdir -p " .. ops))
  return { argv = { LUA, "gen/verbs.lua", "diff", a, b }, diff = true, how = "corpus: " .. how }
end
local CORPUS = {
  { "pipeline fields", function() return plan_case(with(PP_BASES[3].t, function(t) t.model.n_layers = 100000 end),
    "a pipeline plan with 100000 layers") end },
  { "pipeline fields", function() return plan_case(with(PP_BASES[4].t, function(t)
    t.model.n_layers = 2000; t.pipeline.microbatches = 4096; t.training.local_batch_size = 4096 end),
    "2000 layers x 4096 microbatches") end },
  { "pipeline fields", function() return plan_case(with(PP_BASES[1].t, function(t)
    t.training.local_batch_size = 1 << 20; t.model.seq_len = 1 << 30 end), "local_batch_size x seq_len = 2^50 (x dim past 2^53)") end },
  { "pipeline fields", function() return plan_case(with(PP_BASES[1].t, function(t)
    t.model.n_layers = 20000; t.parallel.pp = 1; t.pipeline = nil end), "a dense Llama with 20000 layers") end },
  { "csv", function() return gen_csv({ base = 1, place = 1, text = first_row_with(function(r) return "0F9223372036854775808," .. r end) }) end },
  -- (an action twice in a row: torch's _validate_schedule counts each once)
  { "csv", function() return gen_csv({ base = 2, place = 1, text = first_row_with(function(r)
    return r .. "," .. r:match("([^,]+),*$") end) }) end },
  { "csv", function() return gen_csv({ base = 1, place = 1, text = first_row_with(function(r)
    return "0F0" .. string.rep(" ", 30000) .. "x," .. r end) }) end },
  { "csv", function() return gen_csv({ base = 1, place = 1, text = function(csv) return csv:rep(20000), "20000 copies" end }) end },
  { "csv", function() return gen_csv({ base = 1, place = 8 }) end },
  { "csv", function() return gen_csv({ base = 1, place = 6 }) end },
  { "csv", function() return gen_csv({ base = 1, place = 10 }) end },
  { "csv", function() return gen_csv({ base = 1, place = 1, text = first_row_with(function(r) return SECRET .. "," .. r end) }) end },
  { "network", function() return plan_case(with(NET_BASES[2].t, function(t)
    t.topology = { collectives = "alpha_beta", gpus_per_node = 2, intra_node_GBps = expr("5e-324") } end),
    "alpha_beta with intra_node_GBps = 5e-324") end },
  { "ep", function() return plan_case(with(EP_BASES[2].t, function(t)
    t.training = { local_batch_size = 1 << 20 }; t.model.seq_len = 1 << 30 end), "ep: local_batch_size x seq_len past 2^53") end },
  { "diff-plan", function() return gen_diff({ a = 1, b = 2, svg = 3 }) end },
  { "diff-plan", function() return gen_diff({ a = 1, b = 2, svg = 10 }) end },
  { "diff-plan", function() return gen_diff({ a = 1, b = 2, svg = 6 }) end },
  { "diff-plan", function()
    write(W .. "/j.json", '{"ops": [], "schema": 2}')
    return diff_case(W .. "/j.json", "plans/fsdp4.lua", "a plan.json of schema 2 with no mesh")
  end },
  { "diff-plan", function() return diff_case("", "plans/fsdp4.lua", "an empty operand") end },
}

-- ---- running and judging --------------------------------------------------

local function run_argv(argv)
  local q = {}
  for i, a in ipairs(argv) do q[i] = sh_quote(a) end
  local cmd = string.format("timeout -k 2 %d sh -c 'ulimit -v %d; ulimit -t %d; exec \"$@\"' sh %s </dev/null >%s 2>%s",
    opts.per_input * 3 // 2, opts.mem_mb * 1024, opts.per_input, table.concat(q, " "), TOP .. "/stdout", TOP .. "/stderr")
  local t0 = os.time()
  local rc = sh(cmd)
  return rc, read(TOP .. "/stdout") or "", read(TOP .. "/stderr") or "", os.difftime(os.time(), t0)
end

-- The input's verdict: nil (kept the contract) or a failure class and its detail.
local function judge(c, rc, out, err, before)
  if rc == 124 or rc == 137 or rc == 152 then
    return string.format("time: ran past %d s of CPU or %d s (killed)", opts.per_input, opts.per_input * 3 // 2), ""
  end
  if out:find(SECRET, 1, true) or err:find(SECRET, 1, true) then
    return "disclosure: a secret planted outside the plan was printed", err:sub(1, 300)
  end
  local lower = err:lower()
  if lower:find("not enough memory", 1, true) then return "memory: ran out of its " .. opts.mem_mb .. " MiB", err end
  if lower:find("internal error", 1, true) then
    -- the class: the message without paths and numbers
    local cls = err:gsub("%s+$", ""):gsub("^.-internal error:?%s*", ""):gsub("[^%s]*/[^%s]*", "F"):gsub("%d+", "N"):sub(1, 90)
    return "internal error: " .. cls, err
  end
  if lower:find("traceback", 1, true) then return "traceback", err end
  -- what the input wrote besides its output
  local canaries = listing(W .. "/canary")
  if canaries ~= before.canaries or read(W .. "/canary/c1") ~= "canary one\n" or read(W .. "/canary/c2") ~= "canary two\n" then
    return "wrote outside its output (a canary changed or appeared)", canaries
  end
  if rc == 0 then
    if c.must_refuse then return "csv read from outside the plan's directory or through a symlink (accepted)", c.how end
    if c.diff then
      if out == "" then return "diff: exit 0 with nothing on stdout", err end
      if c.svg then
        for _, f in ipairs({ "/before.svg", "/after.svg" }) do
          local k = kind_of(c.svg .. f)
          if k ~= "regular file" then return "diff --svg: exit 0, " .. f:sub(2) .. " is " .. tostring(k), "" end
        end
      end
    elseif kind_of(W .. "/out/plan.h") ~= "regular file" then
      return "exit 0 without plan.h", err
    end
    return nil
  end
  if rc ~= 2 then return "exit " .. tostring(rc) .. " (want 0 or 2)", err end
  local line = err:match("^([^\n]*)\n$")
  if not line then return "refusal is not exactly one stderr line", err end
  if line:find("[%c\127]") then return "refusal holds a control character", line end
  if c.plan then
    local rest = line:sub(#c.plan + 2)
    if line:sub(1, #c.plan + 1) ~= c.plan .. ":" or not rest:match("^%d+: [^:]+: .") then
      return "refusal is not <file>:<line>: <field>: <message>", line
    end
  elseif not line:find(".: .") then
    return "refusal is not <operand>: <message>", line
  end
  -- nothing written on a refusal
  if c.plan and listing(W):find("%./out[ /.]") then return "refused, yet wrote (out/ exists)", listing(W) end
  if c.svg and listing(W .. "/svg") ~= before.svg then return "diff refused, yet --svg DIR changed", listing(W .. "/svg") end
  return nil
end

local counts, tried, passed = {}, 0, 0
local failures, classes, class_order = {}, {}, {}

local function one(i)
  math.randomseed(opts.seed, i)
  R = math.random
  local total = 0
  for _, s in ipairs(SURFACES) do total = total + s.w end
  local r, surface = R(total), nil
  for _, s in ipairs(SURFACES) do
    if r <= s.w then surface = s; break end
    r = r - s.w
  end
  if opts.surface then
    surface = nil
    for _, s in ipairs(SURFACES) do if s.name:find(opts.surface, 1, true) == 1 then surface = s end end
    if not surface then io.stderr:write("--surface: pipeline, csv, network, ep or diff-plan\n"); os.exit(2) end
  end
  fresh()
  local c
  if i <= #CORPUS and not opts.surface then
    for _, x in ipairs(SURFACES) do if x.name == CORPUS[i][1] then surface = x end end
    c = CORPUS[i][2]()
  else
    c = surface.gen()
  end
  tried = tried + 1
  counts[surface.name] = (counts[surface.name] or 0) + 1
  local before = { canaries = listing(W .. "/canary"), svg = c.svg and listing(c.svg) or "" }
  local rc, out, err, dt = run_argv(c.argv)
  local cls, detail = judge(c, rc, out, err, before)
  if opts.only then
    io.stdout:write(string.format("input %d: %s: %s\n  argv: %s\n  exit %s in %d s\n  stderr: %s\n", i, surface.name, c.how,
      table.concat(c.argv, " "):sub(1, 400), tostring(rc), dt, err:sub(1, 600)))
  end
  if not cls then passed = passed + 1; return end
  local saved = string.format("build/fuzz/surfaces-fail-%d-%d", opts.seed, i)
  sh("rm -rf " .. sh_quote(saved) .. " && cp -a " .. W .. " " .. sh_quote(saved) .. " 2>/dev/null")
  write(saved .. "/HOW", string.format("%s: %s\nargv: %s\nexit %s\nstderr: %s\n-- %s\nrerun: %s tests/fuzz_surfaces.lua --seed %d --only %d\n",
    surface.name, c.how, table.concat(c.argv, " "), tostring(rc), err, cls, LUA, opts.seed, i))
  local text = string.format("input %d (%s: %s): %s: %s [saved %s; rerun: %s tests/fuzz_surfaces.lua --seed %d --only %d]",
    i, surface.name, c.how, cls, (detail or ""):gsub("%s+", " "):sub(1, 240), saved, LUA, opts.seed, i)
  failures[#failures + 1] = text
  io.stdout:write("FAIL " .. text .. "\n")
  io.stdout:flush()
  local key = surface.name .. " | " .. cls
  if not classes[key] then classes[key] = { n = 0, first = saved .. " (" .. c.how .. ")" }; class_order[#class_order + 1] = key end
  classes[key].n = classes[key].n + 1
end

io.stdout:write(string.format("fuzz-surfaces: seed %d, %d s, at least %d inputs, each under %d s of CPU and %d MiB "
  .. "(reproduce: %s tests/fuzz_surfaces.lua --seed %d --only I)\n", opts.seed, opts.seconds, opts.min_inputs,
  opts.per_input, opts.mem_mb, LUA, opts.seed))
io.stdout:flush()
-- The committed tree (plans/ and tests/) as git sees it: no input may change it.
local function committed_state()
  local ph = io.popen("git status --porcelain --untracked-files=no -- plans tests 2>/dev/null | LC_ALL=C sort; "
    .. "git diff -- plans tests 2>/dev/null | cksum")
  local st = ph:read("a")
  ph:close()
  return st
end
local committed_before = committed_state()
if opts.only then
  one(opts.only)
else
  local start = os.time()
  local i = 0
  while (os.difftime(os.time(), start) < opts.seconds or i < opts.min_inputs) and #failures < opts.max_failures do
    i = i + 1
    one(i)
  end
end
sh("rm -rf " .. sh_quote(TOP))
if committed_state() ~= committed_before then
  failures[#failures + 1] = "a committed file under plans/ or tests/ changed during the run (git status)"
  io.stdout:write("FAIL " .. failures[#failures] .. "\n")
end
if #class_order > 0 then
  io.stdout:write("fuzz-surfaces: failure classes (surface | class: count, first):\n")
  for _, k in ipairs(class_order) do
    io.stdout:write(string.format("  %s: %d, %s\n", k, classes[k].n, classes[k].first))
  end
end
local function n(s) return counts[s] or 0 end
io.stdout:write(string.format("fuzz-surfaces: %d inputs (pipeline fields %d, csv %d, network %d, ep %d, diff-plan %d), "
  .. "%d passed, %d failed\n", tried, n("pipeline fields"), n("csv"), n("network"), n("ep"), n("diff-plan"), passed,
  #failures))
os.exit(#failures == 0 and 0 or 1)
