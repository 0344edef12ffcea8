-- The plan file sandbox (gen/load.lua), attacked: what it exposes, endless
-- loops, unbounded memory, string-metatable tricks, pcall swallowing the
-- limits, and the state it must leave behind (no hook, string methods back).
local H = require("helpers")
local util = require("gen.util")
local load_plan = require("gen.load")
local T = {}

local LIM = util.LIMITS
local TAIL = "\nreturn { world_size = 1, model = { units = { { name = 'root', params = { { name = 'w', shape = { 4 } } } } } } }"

-- Runs src through the loader; returns the plan error's message (one
-- printable line of the contract's form) or fails.
local function refused(src, ...)
  local ok, err = pcall(load_plan.source, src, "plans/t.lua")
  if ok then error("expected a plan error, the plan loaded", 2) end
  if not util.is_plan_error(err) then error("expected a plan error, got: " .. tostring(err), 2) end
  local msg = tostring(err)
  if not msg:match("^plans/t%.lua:%d+: .-: .") then error("not in the file:line: field: form: " .. msg, 2) end
  if msg:find("[%c\127-\255]") then error("control bytes in " .. msg, 2) end
  for _, s in ipairs({ ... }) do
    if not msg:find(s, 1, true) then error(string.format("message %q lacks %q", msg, s), 2) end
  end
  -- The loader leaves no hook and gives strings their methods back.
  H.eq(debug.gethook(), nil, "hook after a refused plan")
  H.eq(getmetatable("").__index, string, "string metatable after a refused plan")
  return msg
end

-- Runs fn with some limits lowered (tests stay fast), restoring them.
local function with_limits(t, fn)
  local saved = {}
  for k, v in pairs(t) do saved[k] = LIM[k]; LIM[k] = v end
  local ok, err = pcall(fn)
  for k, v in pairs(saved) do LIM[k] = v end
  if not ok then error(err, 0) end
end

function T.exposes_exactly_the_documented_names()
  -- The plan lists what it can see, through the error message.
  local msg = refused([[
local names = {}
for k, v in pairs(_ENV) do
  names[#names + 1] = k
  if type(v) == "table" then
    for j in pairs(v) do names[#names + 1] = k .. "." .. j end
  end
end
local sorted = {}
for _, n in ipairs(names) do
  local pos = #sorted + 1
  for i = 1, #sorted do if n < sorted[i] then pos = i break end end
  table.insert(sorted, pos, n)
end
error(table.concat(sorted, " "), 0)]], "plan:")
  local got = msg:match("plan: (.-) %(error while running")
  H.eq(got, table.concat({
    "assert", "error", "ipairs", "math", "math.abs", "math.ceil", "math.floor", "math.huge", "math.max",
    "math.maxinteger", "math.min", "math.mininteger", "math.tointeger", "math.type", "next", "pairs", "pcall",
    "select", "string", "string.format", "string.len", "string.lower", "string.rep", "string.sub", "string.upper",
    "table", "table.concat", "table.insert", "table.unpack", "tonumber", "tostring", "type" }, " "), "sandbox names")
end

function T.dangerous_globals_are_undefined()
  for _, name in ipairs({ "io", "os", "require", "load", "loadfile", "dofile", "debug", "collectgarbage",
                          "setmetatable", "getmetatable", "rawset", "rawget", "rawequal", "rawlen", "coroutine",
                          "_G", "print", "package", "utf8", "xpcall", "string2", "unpack" }) do
    refused("local x = " .. name .. TAIL, name .. ":", "undefined variable")
  end
  refused("local x = _ENV.os" .. TAIL, "os:", "undefined")
  refused("local x = _ENV['o' .. 's']" .. TAIL, "undefined")
end

function T.string_methods_reach_only_the_safe_table()
  for _, m in ipairs({ "find", "gsub", "match", "gmatch", "dump", "byte", "char", "reverse", "pack", "unpack" }) do
    refused("local x = ('abc'):" .. m .. "('a')" .. TAIL, "string." .. m .. " is not available")
    refused("local x = ('')." .. m .. TAIL, "string." .. m .. " is not available")
  end
  refused("local s = ('x'):rep(1e9)" .. TAIL, "string.rep would make a string of 1000000000 bytes")
  refused("local s = ('x').rep('x', 1 << 40)" .. TAIL, "string.rep")
  refused("local s = ('x'):rep(3, ('y'):rep(600000))" .. TAIL, "string.rep")
  refused("local s = string.rep('ab', math.maxinteger)" .. TAIL, "string.rep")
  refused("local s = math.random()" .. TAIL, "math.random is not available")
  refused("local s = table.sort({})" .. TAIL, "table.sort is not available")
  -- The plan cannot reach the generator's string library through a method.
  refused("string.format = nil\nlocal x = ('%d'):format(1)" .. TAIL, "plan:")
  H.eq(type(string.format), "function", "generator's string.format untouched")
  -- Redefining its own string table is the plan's business, and ends with it.
  load_plan.source("string.upper = function() return 'X' end\nassert(('a'):upper() == 'X')" .. TAIL, "plans/t.lua")
  H.eq(("a"):upper(), "A", "string methods after the plan")
end

function T.endless_loops_stop_with_a_message()
  with_limits({ plan_instructions = 200000 }, function()
    refused("while true do end" .. TAIL, "plans/t.lua:1: plan:", "more than 200000 Lua instructions")
    refused("local function f() return f() end\nf()" .. TAIL, "plans/t.lua:1: plan:", "more than 200000")
    refused("local function f(n) return n + f(n + 1) end\nf(1)" .. TAIL, "plans/t.lua:1: plan:")
    refused("local t = {}\nfor i = 1, math.maxinteger do t[1] = i end" .. TAIL, "plans/t.lua:2: plan:", "instructions")
    -- pcall cannot swallow the stop, however nested.
    refused("while true do pcall(function() while true do end end) end" .. TAIL, "instructions")
    refused("for i = 1, 100 do pcall(pcall, pcall, function() while true do end end) end\nwhile true do end" .. TAIL,
      "instructions")
    refused("local ok = pcall(function() while true do end end)\nreturn { ok = ok }", "instructions")
    -- C work is counted too: inserting at the front is quadratic.
    refused("local t = {}\nfor i = 1, 100000 do table.insert(t, 1, i) end" .. TAIL, "instructions")
  end)
  -- After a stop the next plan runs normally.
  H.eq(load_plan.source("local n = 0\nfor i = 1, 1000 do n = n + i end" .. TAIL, "plans/t.lua").world_size, 1)
end

function T.endless_loop_at_the_real_limit()
  local t0 = os.clock()
  refused("local i = 0\nwhile true do i = i + 1 end" .. TAIL, "plans/t.lua:2: plan:",
    string.format("more than %d Lua instructions", LIM.plan_instructions))
  local dt = os.clock() - t0
  H.eq(dt < 15, true, string.format("stopped in %.1f s", dt))
end

function T.cpu_time_backstop()
  with_limits({ plan_seconds = 0 }, function()
    refused("local s = ('x'):rep(1000000)\nwhile true do local b = s < s end" .. TAIL, "CPU time")
  end)
end

function T.memory_is_capped()
  refused("local t = {}\nfor i = 1, math.maxinteger do t[i] = {} end" .. TAIL, "plans/t.lua:2: plan:",
    string.format("more than %d MiB", LIM.plan_memory_kib // 1024))
  refused("local s = 'xxxxxxxxxxxxxxxx'\nfor i = 1, 60 do s = s .. s end" .. TAIL, "MiB")
  refused("local s = ('x'):rep(1 << 20)\nlocal t = {}\nfor i = 1, 1e9 do t[i] = s .. i end" .. TAIL, "MiB")
  refused("local s = ('x'):rep(1 << 20)\nlocal t = {}\nfor i = 1, 100 do t[i] = s end\nlocal u = table.concat(t)" .. TAIL,
    "table.concat would make a string")
  refused("local s = ('x'):rep(1 << 20)\nlocal u = string.format('%s%s', s, s)" .. TAIL, "string.format would make")
  refused("local t = {}\nfor i = 1, 10 do t[i] = i end\nlocal u = table.concat(t, ',', 1, 1 << 40)" .. TAIL, "table.concat")
  refused("local u = table.unpack({}, 1, 1 << 30)" .. TAIL, "table.unpack")
  refused("local u = table.unpack({}, 1, 1.5)" .. TAIL, "table.unpack")
  refused("local u = table.unpack({}, math.mininteger, math.maxinteger)" .. TAIL, "table.unpack")
  refused("local u = table.concat({}, '', math.mininteger, math.maxinteger)" .. TAIL, "table.concat")
  refused("local t = {}\ntable.insert(t, math.mininteger, 1)" .. TAIL, "plan:")
  -- Garbage is not live memory: a plan making much short-lived data is fine.
  load_plan.source("for i = 1, 200 do local s = ('x'):rep(1 << 20) .. i end" .. TAIL, "plans/t.lua")
end

function T.addresses_never_reach_the_plan()
  refused("local n = tostring({})" .. TAIL, "tostring of a table")
  refused("local n = tostring(print)" .. TAIL, "undefined")
  refused("local n = tostring(tostring)" .. TAIL, "tostring of a function")
  refused("local n = string.format('%s', {})" .. TAIL, "string.format of a table")
  refused("local n = string.format('%p', 'x')" .. TAIL, "%p")
end

function T.source_limits()
  refused("\27Lua" .. string.rep("x", 40), "syntax error", "binary")
  refused(string.rep(" ", LIM.plan_source + 1), "plans/t.lua:1: plan:", "16 MiB")
  refused("return {", "plans/t.lua:1: plan: syntax error")
  refused("goto x", "syntax error")
  refused(string.rep("(", 1000) .. "1" .. string.rep(")", 1000), "syntax error")
end

function T.hook_and_metatable_restored_after_success()
  load_plan.source("local s = ('abc'):upper()" .. TAIL, "plans/t.lua")
  H.eq(debug.gethook(), nil, "hook")
  H.eq(getmetatable("").__index, string, "string metatable")
  -- A hook installed by the caller (a coverage tool) is put back.
  local calls = 0
  local function mine() calls = calls + 1 end
  debug.sethook(mine, "", 1000000)
  load_plan.source("local s = 1" .. TAIL, "plans/t.lua")
  local h = debug.gethook()
  debug.sethook()
  H.eq(h, mine, "caller's hook restored")
end

return T
