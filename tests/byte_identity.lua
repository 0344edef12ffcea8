-- Issue 34, item 4 ("nothing lost in the move"): every committed plan's
-- tables against a reference generation (git revision BASE): first the
-- generator before pipeline parallel became a module (c7c89b2), since
-- issue 37 the one that priced compute from shapes (cd5a596: its step
-- times re-decided the memory plan's holds, so nine plans' arena offsets
-- and event waits moved; nothing else in any table), since issue 36 the
-- one whose waits hold for the library's calls too (9897b8f: five TP / CP
-- plans' packs wait for the previous reduce-scatter themselves; then af77aa9: the MoE plans' copy-outs wait for their own all-gathers;
-- then be01654: issue 39's CPU offload adds op kinds and arena buffers, which
-- changes only each plan.c's _Static_assert line; then 37413a2: issue 39's
-- reshard_after_forward = k adds an op kind and an arena buffer, the same line).
--
--   lua5.4 tests/byte_identity.lua [--base REV] [--dir DIR] [NAME...]
--
-- NAMEs default to every plans/<name>.lua; each plan's files are read from
-- DIR/<name>/ (default plans/, the committed output; make test runs this
-- right after its golden checks, which prove plans/<name>/ equal a fresh
-- generation, so the committed files stand for the current generator and
-- no plan is generated twice). A plan without pipeline parallelism
-- (BASE's plan.json has no pipeline section with pp > 1): plan.c and
-- plan.h byte-identical to BASE's, plan.json equal section by section but
-- its audit (the cost model's figures). A pipeline plan: plan.c and
-- plan.h byte-identical, and plan.json's per-rank tables (pipeline.ranks[]
-- .ops and .units) equal field by field, since its schema may change
-- around them. A plan BASE does not have is new, and only counted.
-- Exit 0 when all agree; 1 with one line per differing file; 2 when BASE
-- is missing (a shallow clone) or an argument is wrong.
package.path = "./?.lua;./tests/lua/?.lua;" .. package.path
local json = require("gen.json")

local DEFAULT_BASE = "37413a2"
-- The fields of a pipeline op, in the order a difference is looked for.
local OP_FIELDS = { "seq", "kind", "unit", "micro_step", "stream", "group", "dtype", "count", "peer", "batch", "tag",
                    "waits_for" }

local function die(msg)
  io.stderr:write("byte_identity: " .. msg .. "\n")
  os.exit(2)
end

-- Runs a git command (every word checked as text below, never a shell
-- word from outside) and returns its output and whether it succeeded.
local function git(args)
  local ph = io.popen("git " .. args .. " 2>/dev/null")
  local out = ph:read("a")
  local ok = ph:close()
  return out, ok == true
end

local function parse_args(argv)
  local o = { base = DEFAULT_BASE, dir = "plans", names = {} }
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if (a == "--base" or a == "--dir") and argv[i + 1] then o[a:sub(3)] = argv[i + 1]; i = i + 2
    elseif a:sub(1, 1) == "-" then die("unknown argument '" .. a .. "'; usage: [--base REV] [--dir DIR] [NAME...]")
    else o.names[#o.names + 1] = a; i = i + 1 end
  end
  if not o.base:match("^[%w%._/~^@%-]+$") or o.base:sub(1, 1) == "-" then
    die(o.base .. ": not a git revision name (letters, digits and . _ / ~ ^ @ - only)")
  end
  if not o.dir:match("^[%w%._/%+%-]+$") then die(o.dir .. ": a directory named with A-Z a-z 0-9 _ . / + - only") end
  for _, n in ipairs(o.names) do
    if not n:match("^[%w_]+$") then die(n .. ": a plan name is [A-Za-z0-9_]+ (plans/<name>.lua)") end
  end
  return o
end

-- Every plans/<name>.lua with a name the generator takes (as tests/run.sh
-- lists them).
local function shipped_names()
  local out = git("ls-files -- plans")
  local names = {}
  for n in out:gmatch("plans/([%w_]+)%.lua\n") do names[#names + 1] = n end
  table.sort(names)
  return names
end

local read_file = require("helpers").try_read

-- Where two texts first differ: line and column, and both sides from a
-- little before that column (a generated line runs to hundreds of
-- characters; its start says nothing).
local function first_line_diff(a, b)
  local n, ia, ib = 1, 1, 1
  while true do
    local ea, eb = a:find("\n", ia, true), b:find("\n", ib, true)
    local la, lb = a:sub(ia, (ea or #a + 1) - 1), b:sub(ib, (eb or #b + 1) - 1)
    if la ~= lb or not ea or not eb then
      local col = 1
      while col <= #la and la:sub(col, col) == lb:sub(col, col) do col = col + 1 end
      local from = math.max(1, col - 30)
      return string.format("line %d, column %d: base %q, now %q", n, col, la:sub(from, from + 59),
        lb:sub(from, from + 59))
    end
    n, ia, ib = n + 1, ea + 1, eb + 1
  end
end

local function deep_equal(x, y)
  if x == json.null then x = nil end
  if y == json.null then y = nil end
  if type(x) ~= "table" or type(y) ~= "table" then return x == y end
  for k, v in pairs(x) do if not deep_equal(v, y[k]) then return false end end
  for k in pairs(y) do if x[k] == nil then return false end end
  return true
end

local function shown(v)
  if v == nil or v == json.null then return "absent" end
  if type(v) == "table" then return json.encode(v) end
  return tostring(v)
end

-- The first field of `fields` (default: every field of x) where x and y
-- differ, or nil.
local function first_field(x, y, fields)
  if not fields then
    fields = {}
    for k in pairs(x) do fields[#fields + 1] = k end
    table.sort(fields)
  end
  for _, f in ipairs(fields) do
    if not deep_equal(x[f], y[f]) then return f end
  end
  return nil
end

-- One pipeline rank's list (ops or units) against BASE's: nil, or the
-- first difference as text.
local function list_diff(what, base, now, fields)
  for i = 1, math.max(#base, #now) do
    local x, y = base[i], now[i]
    if not x or not y then
      return string.format("%s: %d in base, %d now (the first %d agree)", what, #base, #now, i - 1)
    end
    local f = first_field(x, y, fields)
    if f then
      local id = x.seq ~= nil and string.format("op %d (seq %s, %s of %s)", i - 1, shown(x.seq), shown(x.kind),
        shown(x.unit)) or string.format("unit %d (%s)", i - 1, shown(x.name))
      return string.format("%s: first difference at %s: field %s: base %s, now %s", what, id, f, shown(x[f]),
        shown(y[f]))
    end
  end
  return nil
end

-- A pipeline plan's plan.json: every rank's ops (OP_FIELDS) and units
-- (every field BASE wrote) as BASE had them; nil or the first difference.
local function pipeline_diff(path, base_doc, now_text)
  local ok, now = pcall(json.decode, now_text)
  local ranks = ok and type(now) == "table" and type(now.pipeline) == "table" and now.pipeline.ranks
  if type(ranks) ~= "table" then
    return path .. ": no pipeline.ranks section; a pipeline plan's plan.json keeps every rank's op list there "
      .. "(pipeline.ranks[].ops and .units)"
  end
  local by_rank = {}
  for i, r in ipairs(ranks) do by_rank[r.pp_rank or (i - 1)] = r end
  for i, r in ipairs(base_doc.pipeline.ranks) do
    local pr = r.pp_rank or (i - 1)
    local q = by_rank[pr]
    if not q then return string.format("%s: pipeline rank %d: missing from pipeline.ranks", path, pr) end
    local d = list_diff("ops", r.ops or {}, q.ops or {}, OP_FIELDS)
      or list_diff("units", r.units or {}, q.units or {}, nil)
    if d then return string.format("%s: pipeline rank %d: %s", path, pr, d) end
  end
  if #ranks ~= #base_doc.pipeline.ranks then
    return string.format("%s: %d pipeline ranks in base, %d now", path, #base_doc.pipeline.ranks, #ranks)
  end
  return nil
end

-- A plain plan's plan.json: every section but `audit` as BASE wrote it.
-- The audit holds the cost model's figures (derived, outside the
-- fingerprint: docs/plan-json.md), which issue 37 changed on purpose
-- (compute priced from shapes); the tables and everything they are built
-- from stay field for field. nil or the first differing section.
local function tables_diff(path, base_doc, now_text, base)
  local ok, now = pcall(json.decode, now_text)
  if not ok or type(now) ~= "table" then return path .. ": not JSON" end
  local fields = {}
  for k in pairs(base_doc) do if k ~= "audit" then fields[#fields + 1] = k end end
  for k in pairs(now) do if k ~= "audit" and base_doc[k] == nil then fields[#fields + 1] = k end end
  table.sort(fields)
  local f = first_field(base_doc, now, fields)
  if f then
    return string.format("%s: section %s differs from %s's (the audit section aside)", path, f, base)
  end
  return nil
end

local function is_pipeline(doc)
  return type(doc) == "table" and type(doc.pipeline) == "table" and (tonumber(doc.pipeline.pp) or 1) > 1
    and type(doc.pipeline.ranks) == "table"
end

-- One plan: a list of difference lines (empty when all agree), its kind
-- ("plain", "pipeline" or "new").
local function check_plan(o, name)
  local diffs = {}
  local function base_of(file)
    local out, ok = git(string.format("cat-file blob %s:plans/%s/%s", o.base, name, file))
    return ok and out or nil
  end
  local base_json = base_of("plan.json")
  if not base_json then return diffs, "new" end
  local doc = json.decode(base_json)
  local piped = is_pipeline(doc)
  for _, file in ipairs({ "plan.c", "plan.h", "plan.json" }) do
    local path = string.format("%s/%s/%s", o.dir, name, file)
    local now = read_file(path)
    local base = file == "plan.json" and base_json or base_of(file)
    if not now then
      diffs[#diffs + 1] = path .. ": missing; regenerate it (make regen-all)"
    elseif not base then
      diffs[#diffs + 1] = string.format("%s: %s has no plans/%s/%s", path, o.base, name, file)
    elseif file == "plan.json" and piped then
      diffs[#diffs + 1] = pipeline_diff(path, doc, now)
    elseif file == "plan.json" then
      diffs[#diffs + 1] = tables_diff(path, doc, now, o.base)
    elseif now ~= base then
      diffs[#diffs + 1] = string.format("%s: not byte-identical to %s's (%d bytes, %d now); first at %s", path,
        o.base, #base, #now, first_line_diff(base, now))
    end
  end
  return diffs, piped and "pipeline" or "plain"
end

local function main(argv)
  local o = parse_args(argv)
  local _, have = git(string.format("cat-file -e %s^{commit}", o.base))
  if not have then
    die(string.format("base revision %s (the generator before issue 34's move) is not in this clone (a shallow "
      .. "clone?); fetch it: git fetch --unshallow origin (or git fetch origin %s)", o.base, o.base))
  end
  local names = #o.names > 0 and o.names or shipped_names()
  local counts, bad = { plain = 0, pipeline = 0, new = 0 }, 0
  for _, name in ipairs(names) do
    local diffs, kind = check_plan(o, name)
    for _, d in ipairs(diffs) do io.stdout:write(d, "\n") end
    if #diffs > 0 then bad = bad + 1 else counts[kind] = counts[kind] + 1 end
  end
  io.stdout:write(string.format("byte_identity: against %s: %d plans byte-identical (plan.c, plan.h; plan.json but its audit), "
    .. "%d pipeline plans with identical plan.c, plan.h and per-rank op tables, %d new since, %d differ\n",
    o.base, counts.plain, counts.pipeline, counts.new, bad))
  return bad == 0 and 0 or 1
end

os.exit(main(arg))
