-- Assertions shared by the Lua test suites.
local util = require("gen.util")
local plan = require("gen.plan")

local H = {}

function H.eq(got, want, what)
  if got ~= want then
    error(string.format("%s: got %s, want %s", what or "value", tostring(got), tostring(want)), 2)
  end
end

function H.list_eq(got, want, what)
  H.eq(#got, #want, (what or "list") .. " length")
  for i = 1, #want do H.eq(got[i], want[i], string.format("%s[%d]", what or "list", i)) end
end

-- ok, err of a pcall that must have raised a one-line plan error holding
-- every text in pats; level: where the failure is reported (the test).
local function one_line_plan_error(ok, err, pats, level)
  if ok then error("expected a plan error, it succeeded", level) end
  if not util.is_plan_error(err) then error("expected a plan error, got: " .. tostring(err), level) end
  local msg = tostring(err)
  if msg:find("\n") then error("error message is not one line: " .. msg, level) end
  for _, pat in ipairs(pats) do
    if not msg:find(pat, 1, true) then error(string.format("message %q lacks %q", msg, pat), level) end
  end
  return msg
end

-- Generating `source` must fail with a plan error containing every pattern.
function H.plan_fails(source, ...)
  local ok, err = pcall(plan.from_source, source, "plans/t.lua")
  return one_line_plan_error(ok, err, { ... }, 3)
end

-- fn() must raise a one-line plan error holding every text given.
function H.plan_fails_with(fn, ...)
  local ok, err = pcall(fn)
  return one_line_plan_error(ok, err, { ... }, 3)
end

function H.generic(world, parallel, units, fsdp)
  local lines = { "return {", "  world_size = " .. world .. ",", "  parallel = " .. parallel .. ",",
                  "  model = { family = 'generic', units = {" }
  for _, u in ipairs(units) do
    local ps = {}
    for _, p in ipairs(u[2]) do
      ps[#ps + 1] = string.format("{ name = %q, shape = { %s }%s }", p[1], table.concat(p[2], ", "),
        p[3] and (", shard_dim = " .. p[3]) or "")
    end
    lines[#lines + 1] = string.format("    { name = %q, params = { %s } },", u[1], table.concat(ps, ", "))
  end
  lines[#lines + 1] = "  } },"
  lines[#lines + 1] = "  fsdp = " .. (fsdp or "{}") .. ","
  lines[#lines + 1] = "}"
  return table.concat(lines, "\n")
end

-- A file's bytes, or nil where it cannot be opened.
function H.try_read(path)
  local fh = io.open(path, "rb")
  if not fh then return nil end
  local s = fh:read("a")
  fh:close()
  return s
end

-- A file's bytes (it must exist).
function H.read(path)
  return (assert(H.try_read(path), path))
end

-- The shipped plan files, sorted.
function H.plan_files()
  local ph = io.popen("ls plans/*.lua")
  local out = {}
  for line in ph:lines() do out[#out + 1] = line end
  ph:close()
  return out
end

-- The shipped plans without a pipeline (parallel.pp absent or 1): the
-- plans whose tables, timeline and plan.json are the dense ones (a
-- pipeline plan's are gen/parallel/pp.lua's: tests/lua/test_pp_tables.lua).
function H.dense_plan_files()
  local out = {}
  for _, path in ipairs(H.plan_files()) do
    local t = dofile(path)
    if ((t.parallel or {}).pp or 1) <= 1 then out[#out + 1] = path end
  end
  return out
end


-- A fresh temporary directory (mktemp -d).
function H.tmpdir()
  local ph = assert(io.popen("mktemp -d"))
  local d = ph:read("l")
  ph:close()
  return d
end

-- Writes text to path, creating its directory where it is missing.
function H.write(path, text)
  local fh = io.open(path, "wb")
  local dir = not fh and path:match("^(.*)/[^/]*$")
  if dir then
    assert(os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'"))
    fh = io.open(path, "wb")
  end
  fh = assert(fh, path)
  fh:write(text)
  fh:close()
end

return H
