-- Fuzzing the generator with plan files, as a hostile and a careless user
-- would write them: random plans, and mutations of the shipped plans/*.lua
-- (numbers flipped to hostile values, keys deleted, duplicated or
-- misspelled, hostile names, nil holes, undefined variables, endless loops,
-- memory bombs, sandbox escapes, broken syntax).
--
-- Every input must end in success or in one plan error of the contract's
-- form "<file>:<line>: <field>: <message>" (one printable line), within a
-- time limit, never in an internal error or a Lua traceback. Every input
-- runs in-process (plan, emit and audit, nothing written); every
-- --cli-every'th one also through `lua5.4 gen/commplan.lua FILE OUTDIR`,
-- which must exit 0 (files written) or 2 (one stderr line equal to the
-- in-process message, nothing written).
--
--   lua5.4 tests/fuzz_plans.lua [--seconds 20] [--min-inputs 1000] [--seed N] [--cli-every 6] [--only I]
--
-- Input I depends only on (seed, I), so a failure reproduces with
-- --seed N --only I (the input is also saved under build/fuzz/).
package.path = "./?.lua;./tests/lua/?.lua;" .. package.path

local util = require("gen.util")
local plan = require("gen.plan")
local emit = require("gen.emit")
local audit = require("gen.audit")

-- min_inputs: run at least this many whatever the clock says, so a busy
-- machine (make test's torch lane beside it) does not thin the check
local opts = { seconds = 20, seed = 20240808, cli_every = 6, only = nil, min_inputs = 1000 }
do
  local i = 1
  while i <= #arg do
    local a, v = arg[i], arg[i + 1]
    if a == "--seconds" then opts.seconds = assert(tonumber(v), "--seconds N")
    elseif a == "--min-inputs" then opts.min_inputs = assert(tonumber(v), "--min-inputs N")
    elseif a == "--seed" then opts.seed = assert(math.tointeger(tonumber(v)), "--seed N")
    elseif a == "--cli-every" then opts.cli_every = assert(math.tointeger(tonumber(v)), "--cli-every N")
    elseif a == "--only" then opts.only = assert(math.tointeger(tonumber(v)), "--only I")
    else io.stderr:write("usage: lua5.4 tests/fuzz_plans.lua [--seconds S] [--min-inputs N] [--seed N] [--cli-every K] [--only I]\n")
      os.exit(2) end
    i = i + 2
  end
  opts.seed = math.tointeger(tonumber(os.getenv("FUZZ_SEED") or "")) or opts.seed
end

local LUA = os.getenv("LUA") or "lua5.4"
local DIR = "build/fuzz"
local PER_INPUT_SECONDS = 60 -- CPU seconds in-process, wall seconds through the CLI

local H = require("helpers")
local read, write = H.try_read, H.write

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

assert(os.execute("mkdir -p " .. DIR .. "/in " .. DIR .. "/out"))

local TEMPLATES = {}
for _, t in ipairs({ "plan.h.in", "plan.c.in", "plan_kernels.cu.in" }) do
  TEMPLATES[t] = assert(read("templates/" .. t), "run from the repository root")
end

-- Shipped plans, small ones weighted up (the big ones take a second each).
local SHIPPED = {}
do
  local p = io.popen("ls plans/*.lua")
  for f in p:lines() do
    local src = read(f)
    local w = f:find("llama405b", 1, true) and 1 or (f:find("llama70b", 1, true) or f:find("llama8b", 1, true)) and 2 or 8
    for _ = 1, w do SHIPPED[#SHIPPED + 1] = { file = f, src = src } end
  end
  p:close()
end

-- ---- value pools --------------------------------------------------------

local R -- the per-input random function (math.random after math.randomseed(seed, i))

local function pick(list) return list[R(#list)] end

local HOSTILE_NUMBERS = {
  "0", "-1", "1", "2", "3", "4", "7", "8", "1.5", "-0.0", "0/0", "-(0/0)", "math.huge", "-math.huge", "1e300",
  "-1e300", "2^63", "2^53", "2^53 + 1", "math.maxinteger", "math.mininteger", "4611686018427387904",
  "262144", "262145", "1 << 40", "1 << 53", "(1 << 53) + 1", "0x7fffffff", "2147483648", "1025", "513",
  "1024", "131073", "1e-300", "2.0", "'4'", "true", "{}", "nil", "5e-324", "0.01", "1e6", "1 << 20",
}

local HOSTILE_NAMES = {
  "count", "Count", "COUNT", "a.b", "a_b", "w", "W", "root", "layers.0", "layers_0", "", " ", "a\nb", "a\0b",
  "x*/y", "*/ int injected; /*", "??/", "??=", "x\\", "\\", '"', "'", "%b()", "[", "%", "cp_plan", "cp",
  "caf\195\169", "\255\254", "\27[31mred", string.rep("n", 201), string.rep("n", 200), "{{name}}", "a|b",
  "<!--", "`rm -rf /`", "$(touch /tmp/pwned)", "name with spaces", "tab\there", "\r",
}

local UNKNOWN_KEYS = {
  "dp_shrad = 2", "world_sise = 4", "['%b()'] = 1", "['['] = 1", "['.-.-.-.-.-.-.-x'] = 1", "[1] = 2",
  "num_experts = 8", "ulysses_degree = 2", "etp = 1", "dp = 2", "size = '8b'", "dim = 64", "n_layers = 2",
  "reshard_after_froward = true", "micro_step = 2", "[true] = 1", "[2^53] = 1", "name = 'fz'", "tp = 'colwise'",
  "shard_dim = 1", "dtype = 'fp64'", "family = 'gpt'", "units = {}", "params = {}", "shape = { 4 }",
}

local BAD_CODE = {
  "while true do end", "local t = {} for i = 1, 1e12 do t[i] = i end", "local s = ('x'):rep(1e10)",
  "local s = 'xxxxxxxx' for i = 1, 64 do s = s .. s end", "os.execute('touch /tmp/pwned')",
  "io.open('/etc/passwd')", "require('gen.util')", "load('return 1')", "debug.sethook()",
  "collectgarbage('stop')", "setmetatable({}, {})", "local x = ('').gsub", "local x = ('x'):find('.-.-.-x')",
  "error('boom')", "error({})", "error(nil)", "error('multi\\nline')", "local x = nil + 1", "local x = 1 // 0",
  "local x = tostring({})", "local x = string.format('%p', {})", "pcall(function() while true do end end)",
  "local x = undefined_global", "_ENV = nil", "string.format = nil", "local t = {} t[0/0] = 1",
  "local x = #nil", "local x = ('x'):rep(-1)", "local x = table.concat({{}})", "goto nowhere",
  "local function f() return f() end f()", "local x = math.floor(0/0)", "local x = 2^1024 // 1",
}

local function hostile_string()
  return string.format("%q", pick(HOSTILE_NAMES)):gsub("\\\n", "\\n")
end

-- ---- text mutations -----------------------------------------------------

-- Positions of tokens matching pattern in src (start, end).
local function positions(src, pattern)
  local out, init = {}, 1
  while true do
    local s, e = src:find(pattern, init)
    if not s then break end
    out[#out + 1] = { s, e }
    init = e + 1
  end
  return out
end

local function replace_at(src, s, e, text) return src:sub(1, s - 1) .. text .. src:sub(e + 1) end

local function lines_of(src)
  local t = {}
  for l in (src .. "\n"):gmatch("([^\n]*)\n") do t[#t + 1] = l end
  return t
end

local MUTATIONS = {
  -- flip a number
  function(src)
    local ps = positions(src, "%f[%w_.]%d+%f[^%w_.]")
    if #ps == 0 then return src end
    local p = pick(ps)
    return replace_at(src, p[1], p[2], R(3) == 1 and tostring(R(0, 1 << R(0, 62))) or pick(HOSTILE_NUMBERS))
  end,
  -- delete a key = value pair
  function(src)
    local ps = positions(src, "[%a_][%w_]* = [^,{}\n]+,?")
    if #ps == 0 then return src end
    local p = pick(ps)
    return replace_at(src, p[1], p[2], "")
  end,
  -- duplicate, delete or swap lines
  function(src)
    local ls = lines_of(src)
    local i = R(#ls)
    local k = R(3)
    if k == 1 then table.insert(ls, i, ls[i])
    elseif k == 2 then table.remove(ls, i)
    else local j = R(#ls); ls[i], ls[j] = ls[j], ls[i] end
    return table.concat(ls, "\n")
  end,
  -- a hostile name in place of a string literal
  function(src)
    local ps = positions(src, "\"[^\"\n]*\"")
    if #ps == 0 then return src end
    local p = pick(ps)
    return replace_at(src, p[1], p[2], hostile_string())
  end,
  -- an undefined variable or a nil hole inside a list
  function(src)
    local ps = positions(src, "{ ")
    if #ps == 0 then return src end
    local p = pick(ps)
    local ins = pick({ "dimm, ", "nil, ", "layer1, ", "nothing, ", "{}, ", "nil, nil, 3, " })
    if ins:find("nothing") then src = "local nothing\n" .. src; p = { p[1] + 14, p[2] + 14 } end
    return replace_at(src, p[1], p[2], "{ " .. ins)
  end,
  -- an unknown, ignored or misspelled key in some table
  function(src)
    local ps = positions(src, "{ ")
    if #ps == 0 then return src end
    local p = pick(ps)
    return replace_at(src, p[1], p[2], "{ " .. pick(UNKNOWN_KEYS) .. ", ")
  end,
  -- hostile code before the return
  function(src)
    local ls = lines_of(src)
    local at = 1
    for i, l in ipairs(ls) do if l:match("^return") then at = i end end
    table.insert(ls, R(at), pick(BAD_CODE))
    return table.concat(ls, "\n")
  end,
  -- byte-level damage: delete, duplicate or insert a character
  function(src)
    local i = R(math.max(1, #src))
    local k = R(3)
    if k == 1 then return src:sub(1, i - 1) .. src:sub(i + 1)
    elseif k == 2 then return src:sub(1, i) .. src:sub(i)
    else return src:sub(1, i - 1) .. pick({ "{", "}", ",", "=", "\"", "'", "[[", "--", "\0", "\255", "(" }) .. src:sub(i) end
  end,
  -- a hostile top-level setting
  function(src)
    local ps = positions(src, "return {")
    if #ps == 0 then return src end
    local p = ps[#ps]
    local set = pick({
      "fsdp = { micro_steps = " .. pick(HOSTILE_NUMBERS) .. " }", "world_size = " .. pick(HOSTILE_NUMBERS),
      "name = " .. hostile_string(), "topology = { intra_node_GBps = " .. pick(HOSTILE_NUMBERS) .. " }",
      "parallel = { dp_replicate = " .. pick(HOSTILE_NUMBERS) .. ", dp_shard = -1 }",
      "fsdp = { param_dtype = 'bf16', reduce_dtype = 'fp16', reduce_op = 'sum' }",
      "topology = { gpus_per_node = " .. pick(HOSTILE_NUMBERS) .. " }",
      -- issue 33: every network figure (gen/hardware.lua's BOUNDS), the activations' sizes, loss_chunks
      "topology = { collectives = 'alpha_beta', " .. pick({ "intra_node_GBps", "inter_node_GBps", "latency_us" })
        .. " = " .. pick(HOSTILE_NUMBERS) .. " }",
      "topology = { " .. pick({ "nic_Gbps", "nvlink_GBps", "pci_GBps", "net_latency_us", "nvlinks", "nics_per_node",
        "gpu_memory_GB", "hbm_GBps", "gpu_TFLOPS", "mfu" }) .. " = " .. pick(HOSTILE_NUMBERS) .. " }",
      "training = { local_batch_size = " .. pick(HOSTILE_NUMBERS) .. ", loss_chunks = " .. pick(HOSTILE_NUMBERS) .. " }",
    })
    return replace_at(src, p[1], p[2], "return { " .. set .. ",")
  end,
}

-- ---- random plans -------------------------------------------------------

local function lua_value(v)
  if type(v) == "string" then return (string.format("%q", v):gsub("\\\n", "\\n")) end
  if math.type(v) == "float" then
    if v ~= v then return "0/0" elseif v == math.huge then return "math.huge" elseif v == -math.huge then return "-math.huge" end
    return string.format("%.17g", v)
  end
  if type(v) == "table" then
    local parts = {}
    for i = 1, #v do parts[#parts + 1] = lua_value(v[i]) end
    local keys = {}
    for k in pairs(v) do if not (math.type(k) == "integer" and k >= 1 and k <= #v) then keys[#keys + 1] = k end end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    for _, k in ipairs(keys) do
      local kt = type(k) == "string" and k:match("^[%a_][%w_]*$") and k or ("[" .. lua_value(k) .. "]")
      parts[#parts + 1] = kt .. " = " .. lua_value(v[k])
    end
    return "{ " .. table.concat(parts, ", ") .. " }"
  end
  return tostring(v)
end

local function small_int()
  return pick({ 1, 1, 2, 2, 3, 4, 4, 5, 7, 8, 8, 12, 16, 17, 32, 64, 100, 1024 })
end

local function random_name(kind, i)
  if R(12) == 1 then return pick(HOSTILE_NAMES) end
  return pick({ kind .. i, "layers." .. i .. "." .. kind, kind .. "_" .. i, "blocks." .. i })
end

local function random_plan()
  local shard = pick({ 1, 1, 2, 3, 4, 8 })
  local rep = pick({ 1, 1, 1, 2, 3 })
  local tp = R(6) == 1 and pick({ 2, 4 }) or 1
  local world = shard * rep * tp
  local t = { world_size = world, parallel = {} }
  if R(3) == 1 then t.parallel.dp_shard = -1 else t.parallel.dp_shard = shard end
  if rep > 1 then t.parallel.dp_replicate = rep end
  if tp > 1 then t.parallel.tp = tp end
  if R(4) == 1 then
    local m = { family = "llama", dim = pick({ 16, 32, 64, 96 }), n_layers = R(3), n_heads = pick({ 1, 2, 4, 8 }),
                vocab_size = pick({ 10, 37, 250 }), multiple_of = pick({ 4, 16 }) }
    m.n_kv_heads = pick({ 1, 2, m.n_heads })
    if R(2) == 1 then m.ffn_dim_multiplier = pick({ 1.3, 1.0, 0.5 }) end
    if tp > 1 or R(3) == 1 then m.seq_len = pick({ 16, 128, 100 }) end
    t.model = m
  else
    local units = {}
    local nunits = R(5)
    for u = 1, nunits do
      local params = {}
      for j = 1, R(4) do
        local shape = {}
        local nd = R(10) == 1 and R(0, 10) or R(3)
        for k = 1, nd do shape[k] = R(15) == 1 and pick({ 0, -3, 1 << 31, 1 << 50, 2.5 }) or small_int() end
        local p = { name = random_name("p" .. u .. "_", j), shape = shape }
        if R(5) == 1 then p.shard_dim = R(0, math.max(0, nd - 1) + (R(6) == 1 and 2 or 0)) end
        if R(6) == 1 then p.dtype = pick({ "fp32", "bf16", "fp16", "fp64" }) end
        if tp > 1 and R(2) == 1 then p.tp = pick({ "colwise", "rowwise", "replicate", "shard(0)", "shard(1)", "shard(5)" }) end
        params[j] = p
      end
      units[u] = { name = u == nunits and "root" or random_name("unit", u), params = params }
    end
    t.model = { units = units }
    if R(3) == 1 then t.model.family = "generic" end
    if R(4) == 1 then t.model.dtype = pick({ "fp32", "bf16", "fp16" }) end
  end
  if R(2) == 1 then
    t.fsdp = {}
    if R(2) == 1 then t.fsdp.reshard_after_forward = R(2) == 1 end
    if R(2) == 1 then t.fsdp.micro_steps = R(10) == 1 and pick({ 0, 1025, 100000, 1.5 }) or R(4) end
    if R(3) == 1 then t.fsdp.reduce_op = pick({ "avg", "sum", "max" }) end
    if R(3) == 1 then t.fsdp.param_dtype = pick({ "bf16", "fp16", "fp32" }) end
    if R(3) == 1 then t.fsdp.reduce_dtype = pick({ "bf16", "fp16", "fp32" }) end
  end
  if R(5) == 1 then
    t.topology = R(2) == 1 and { gpus_per_node = pick({ 1, 2, 8 }), collectives = "alpha_beta",
                                 latency_us = pick({ 0, 5, 10.5 }) }
      or { gpus_per_node = pick({ 1, 2, 8 }), preset = pick({ "h100", "h200", "b200", "a100" }),
           nics_per_node = pick({ 1, 4, 8 }), nvls = R(2) == 1, sharp = R(2) == 1 }
  end
  return "return " .. lua_value(t) .. "\n"
end

-- Input i: its source and how it was made.
local function make_input(i)
  math.randomseed(opts.seed, i)
  R = math.random
  local src, how
  if R(2) == 1 then
    local s = pick(SHIPPED)
    src, how = s.src, "mutated " .. s.file
  else
    src, how = random_plan(), "random"
  end
  local n = src:find("^return") and R(0, 2) or R(1, 3)
  for _ = 1, n do
    local m = R(#MUTATIONS)
    -- Endless loops and bombs cost their full limit: keep them rare.
    if m == 7 and R(4) ~= 1 then m = 1 end
    src = MUTATIONS[m](src)
  end
  return src, how .. " + " .. n .. " mutations"
end

-- ---- running and judging ------------------------------------------------

local function form_ok(msg, path)
  if msg:find("\n", 1, true) or msg:find("[%c\127-\255]") then return false, "not one printable line" end
  if msg:find("traceback", 1, true) then return false, "traceback" end
  local prefix = path .. ":"
  if msg:sub(1, #prefix) ~= prefix then return false, "does not start with the file" end
  if not msg:sub(#prefix + 1):match("^%d+: .-: .") then return false, "not <file>:<line>: <field>: <message>" end
  return true
end

-- Raised by the output checks below (not by the generator).
local Unsafe = {}
local function unsafe(msg) error(setmetatable({ msg = msg }, Unsafe), 0) end

local function in_process(src, path)
  local p = plan.from_source(src, path)
  -- (every plan's outputs are gen/audit.lua's, a pipeline plan's too: gen/commplan.lua)
  local fp = audit.fingerprint(p)
  local files = emit.render(p, fp, TEMPLATES)
  files["plan.json"] = audit.json(p, fp)
  files["SCHEDULE.md"] = audit.schedule_md(p, fp)
  -- What the C compiler will see: printable ASCII only, no trigraph (??x
  -- would rewrite a string literal under plain -std=c11), one enumerator
  -- per name.
  for _, f in ipairs({ "plan.h", "plan.c", "plan_kernels.cu" }) do
    local bad = files[f]:find("[^\n -~]")
    if bad then unsafe(string.format("%s holds byte %d at %d", f, files[f]:byte(bad), bad)) end
    local tri = files[f]:find("??", 1, true)
    if tri then unsafe(string.format("%s holds a trigraph start: %s", f, files[f]:sub(tri - 20, tri + 5))) end
  end
  -- timeline.svg: printable ASCII, every '&' an entity, every '<' one of
  -- the elements gen/svg.lua writes (a name never opens a tag).
  local svg = audit.timeline_svg(p, fp)
  local bad = svg:find("[^\n -~]")
  if bad then unsafe(string.format("timeline.svg holds byte %d at %d", svg:byte(bad), bad)) end
  for ref in svg:gmatch("&([^;&<]*)") do
    if not (ref == "amp" or ref == "lt" or ref == "gt" or ref == "quot" or ref == "#39") then
      unsafe("timeline.svg holds a bare '&': &" .. ref:sub(1, 20))
    end
  end
  local TAGS = { ["?xml"] = true, ["!--"] = true, svg = true, style = true, defs = true, pattern = true, rect = true,
                 line = true, text = true, tspan = true, path = true, g = true, title = true }
  for tag in svg:gmatch("</?([^%s>/]*)") do
    if not TAGS[tag:sub(1, 3) == "!--" and "!--" or tag] then unsafe("timeline.svg opens <" .. tag:sub(1, 20)) end
  end
  files["timeline.svg"] = svg
  local seen = {}
  for id in files["plan.h"]:gmatch("\n%s+([%w_]+) = %d+,?") do
    if seen[id] then unsafe("duplicate C enumerator " .. id) end
    seen[id] = true
  end
  return files
end

local failures, tried, accepted, refused, cli_runs = {}, 0, 0, 0, 0
local by_field = {} -- refusals per field (indices folded), for the summary

local function fail(i, how, src, why)
  local saved = string.format("%s/fail-%d-%d.lua", DIR, opts.seed, i)
  write(saved, src)
  failures[#failures + 1] = string.format("input %d (%s): %s [saved %s; rerun: %s tests/fuzz_plans.lua --seed %d --only %d]",
    i, how, util.one_line(why), saved, LUA, opts.seed, i)
  io.stdout:write("FAIL " .. failures[#failures] .. "\n")
end

local function run_cli(i, how, src, path, want_msg)
  cli_runs = cli_runs + 1
  local out = string.format("%s/out/fz%d", DIR, i)
  os.execute("rm -rf " .. sh_quote(out))
  local errf = string.format("%s/out/fz%d.err", DIR, i)
  local cmd = string.format("timeout %d %s gen/commplan.lua %s %s >/dev/null 2>%s", PER_INPUT_SECONDS, LUA,
    sh_quote(path), sh_quote(out), sh_quote(errf))
  local _, _, rc = os.execute(cmd)
  local err = read(errf) or ""
  os.remove(errf)
  local wrote = read(out .. "/plan.h") ~= nil
  os.execute("rm -rf " .. sh_quote(out))
  if rc == 124 then return fail(i, how, src, "CLI ran past " .. PER_INPUT_SECONDS .. " s") end
  if want_msg == nil then
    if rc ~= 0 then return fail(i, how, src, "in-process accepted, CLI exit " .. tostring(rc) .. ": " .. err) end
    if not wrote then return fail(i, how, src, "CLI exit 0 without plan.h") end
    return
  end
  if rc ~= 2 then return fail(i, how, src, "CLI exit " .. tostring(rc) .. " (want 2): " .. err) end
  if wrote then return fail(i, how, src, "refused plan, yet files were written") end
  local line = err:match("^([^\n]*)\n$")
  if not line then return fail(i, how, src, "stderr is not exactly one line: " .. err) end
  if line ~= want_msg then return fail(i, how, src, "CLI message " .. line .. " differs from in-process " .. want_msg) end
end

local function one(i)
  local src, how = make_input(i)
  local path = string.format("%s/in/fz%d.lua", DIR, i)
  write(path, src)
  tried = tried + 1
  local t0 = os.clock()
  local ok, res = pcall(in_process, src, path)
  local dt = os.clock() - t0
  if dt > PER_INPUT_SECONDS then fail(i, how, src, string.format("took %.1f s of CPU in-process", dt)) end
  if debug.gethook() ~= nil or getmetatable("").__index ~= string then
    fail(i, how, src, "the loader left a hook or the string metatable changed")
    debug.sethook()
    getmetatable("").__index = string
  end
  local want
  if ok then
    accepted = accepted + 1
  elseif util.is_plan_error(res) then
    refused = refused + 1
    want = tostring(res)
    local field = want:sub(#path + 2):match("^%d+: (.-): ") or "?"
    field = field:gsub("%[%d+%]", "[]")
    by_field[field] = (by_field[field] or 0) + 1
    local good, why = form_ok(want, path)
    if not good then fail(i, how, src, why .. ": " .. want) end
  elseif getmetatable(res) == Unsafe then
    fail(i, how, src, "accepted, but the generated C is unsafe: " .. res.msg)
  else
    fail(i, how, src, "internal error: " .. tostring(res))
  end
  if opts.only or (opts.cli_every > 0 and i % opts.cli_every == 0) then run_cli(i, how, src, path, want) end
  if not opts.only then os.remove(path) end
  if opts.only then
    local verdict = ok and "accepted" or type(res) == "table" and res.msg or tostring(res)
    io.stdout:write(src, "\n-- ", how, "\n-- ", util.one_line(verdict), "\n")
  end
end

io.stdout:write(string.format("fuzz: seed %d, %s s, CLI every %d inputs (reproduce: %s tests/fuzz_plans.lua --seed %d --only I)\n",
  opts.seed, tostring(opts.seconds), opts.cli_every, LUA, opts.seed))
io.stdout:flush()
if opts.only then
  one(opts.only)
else
  local start = os.time()
  local i = 0
  while (os.difftime(os.time(), start) < opts.seconds or i < opts.min_inputs) and #failures < 20 do
    i = i + 1
    one(i)
  end
end
do
  local fields = {}
  for f, n in pairs(by_field) do fields[#fields + 1] = { f, n } end
  table.sort(fields, function(a, b) return a[2] > b[2] or (a[2] == b[2] and a[1] < b[1]) end)
  local top = {}
  for k = 1, math.min(12, #fields) do top[k] = fields[k][1] .. " " .. fields[k][2] end
  io.stdout:write("fuzz: refusals by field: ", table.concat(top, ", "), "\n")
end
io.stdout:write(string.format("fuzz: %d inputs, %d accepted, %d refused (%d also through the CLI), %d failures\n",
  tried, accepted, refused, cli_runs, #failures))
os.exit(#failures == 0 and 0 or 1)
