-- commplan generator CLI.
--   lua5.4 gen/commplan.lua PLAN.lua OUTDIR          generate OUTDIR/{plan.h,plan.c,plan.json,SCHEDULE.md,trace.json,timeline.svg,plan_kernels.cu}
--   lua5.4 gen/commplan.lua --check PLAN.lua OUTDIR  exit 1 if OUTDIR differs from a fresh generation (writes nothing);
--       its one line names the command that regenerates OUTDIR: make PLAN=<name>.lua for this tree's
--       plans/<name>.lua into plans/<name>, else this generator on PLAN and OUTDIR, or
--       --regen-command CMD's CMD (the `commplan check` verb passes `commplan generate PLAN`)
--   lua5.4 gen/commplan.lua --version                "commplan <version>" (from the VERSION file)
-- Errors: one line on stderr, exit 2, nothing written.
-- A plan that does not fit its GPU (SCHEDULE.md's memory verdict): one line
-- on stderr (the worst rank, GiB needed and available, the largest term and
-- its fix: gen/audit.lua's fit_line), the plan still generated, exit 0;
-- with --strict it is an error (exit 2, nothing written).
--
-- Publication is all-or-nothing for the directory as a whole: every file is
-- written into a new sibling directory (.<name>.new.<pid>.tmp), which then
-- replaces OUTDIR by renames. Two generators on one OUTDIR are serialized by
-- a lock directory (.<name>.lock.tmp, made by one atomic rename of a
-- directory holding the owner's pid); the loser gets one line and exit 2.
local script_dir = arg[0]:match("^(.*)/gen/[^/]*$") or "."
package.path = script_dir .. "/?.lua;" .. package.path

local util = require("gen.util")
local plan_mod = require("gen.plan")
local emit = require("gen.emit")
local audit = require("gen.audit")
local fsio = require("gen.fsio")

local USAGE = "usage: lua5.4 gen/commplan.lua [--check [--regen-command CMD]] [--strict] PLAN.lua OUTDIR | --version | --help\n"

local function read(path)
  local fh = io.open(path, "rb")
  if not fh then return nil end
  local s = fh:read("a")
  fh:close()
  return s
end

local function version()
  local v = read(script_dir .. "/VERSION")
  v = v and v:match("^%s*([%w%.%+%-]+)%s*$")
  return v or "unknown"
end

-- A failure of the CLI itself (not of the plan): one line, exit 2.
local Fail = {}
local function fail(msg) error(setmetatable({ msg = msg }, Fail), 0) end

-- ---- paths ----

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local function sh(cmd) return os.execute(cmd) == true end

local function normalize(path)
  local abs = path:sub(1, 1) == "/"
  local parts = {}
  for seg in path:gmatch("[^/]+") do
    if seg == ".." then
      if #parts > 0 and parts[#parts] ~= ".." then parts[#parts] = nil
      elseif not abs then parts[#parts + 1] = ".." end
    elseif seg ~= "." then parts[#parts + 1] = seg end
  end
  return (abs and "/" or "") .. table.concat(parts, "/")
end

local cwd
local function absolute(path)
  if path:sub(1, 1) == "/" then return normalize(path) end
  if not cwd then
    -- The shell's pwd checks $PWD against the real directory.
    local ph = io.popen("pwd")
    cwd = ph and ph:read("l")
    if ph then ph:close() end
    if not cwd or cwd:sub(1, 1) ~= "/" then fail("cannot find the current directory") end
  end
  return normalize(cwd .. "/" .. path)
end

-- The source named in generated files: the path relative to the repository
-- when the plan is inside it, else the file's basename and a note. Never an
-- absolute path (output stays the same on every machine and checkout).
local function display_path(path)
  local root = absolute(script_dir)
  local abs = absolute(path)
  if abs:sub(1, #root + 1) == root .. "/" then return abs:sub(#root + 2) end
  return (abs:match("([^/]+)$") or "plan.lua") .. " (outside the commplan repository)"
end

-- ---- generation (in memory) ----

-- A plan file: a regular file of at most 16 MiB (a FIFO or /dev/zero would
-- block or never end), read with a bound (gen/fsio.lua).
local PLAN_MAX_BYTES = 16 << 20
local function read_plan(plan_path)
  local src, why = fsio.read_regular(plan_path, PLAN_MAX_BYTES)
  if not src then
    util.plan_error(string.format("%s: the plan file %s; give the path of a plan file (plans/<name>.lua)",
      fsio.shown(plan_path), why))
  end
  return src
end

local function generate(plan_path)
  local src = read_plan(plan_path)
  -- Errors name the file as given; generated files name display_path.
  collectgarbage("stop")
  local ok, p = pcall(plan_mod.from_source, src, plan_path)
  collectgarbage("restart")
  if not ok then error(p, 0) end
  p.source_file = display_path(plan_path)
  local fp = audit.fingerprint(p)
  local templates = {}
  for _, t in ipairs({ "plan.h.in", "plan.c.in", "plan_kernels.cu.in" }) do
    templates[t] = read(script_dir .. "/templates/" .. t) or fail("missing template templates/" .. t)
  end
  local files = emit.render(p, fp, templates)
  -- (every plan, a pipeline's too: gen/audit.lua renders them all)
  files["plan.json"] = audit.json(p, fp)
  files["SCHEDULE.md"] = audit.schedule_md(p, fp)
  files["trace.json"] = audit.trace_json(p, fp)
  files["timeline.svg"] = audit.timeline_svg(p, fp)
  return files, p
end

-- ---- the file system ----

local function exists(path) return os.rename(path, path) ~= nil end

local function is_dir(path)
  local fh = io.open(path, "rb")
  if not fh then return false end
  local _, _, code = fh:read(1)
  fh:close()
  return code == 21 -- EISDIR
end

local function list_dir(path)
  local ph = io.popen("find " .. sh_quote(path) .. " -mindepth 1 -maxdepth 1 -printf '%f\\0' 2>/dev/null")
  if not ph then fail(path .. ": cannot list directory") end
  local out = ph:read("a")
  ph:close()
  local names = {}
  for n in out:gmatch("([^%z]+)%z") do names[#names + 1] = n end
  return names
end

local function rm_rf(path) return not exists(path) or sh("rm -rf -- " .. sh_quote(path)) end

local function my_pid()
  local s = read("/proc/self/stat")
  local pid = s and s:match("^(%d+)")
  if pid then return pid end
  local ph = io.popen("echo $PPID")
  pid = ph and ph:read("l")
  if ph then ph:close() end
  return pid and pid:match("^%d+$") and pid or fail("cannot find this process's id")
end

-- A pid holds a lock while a commplan generator runs under it.
local function alive(pid)
  if not pid then return false end
  local cmd = read("/proc/" .. pid .. "/cmdline")
  if cmd then return cmd:find("commplan", 1, true) ~= nil end
  if exists("/proc/self") then return false end -- /proc works: the pid is gone
  return sh("kill -0 " .. pid .. " 2>/dev/null")
end

-- Test hook: COMMPLAN_TEST_CRASH=<stage> kills the generator with SIGKILL
-- at that stage of publication (tests/run.sh proves every crash leaves a
-- complete directory).
local function crash_point(stage, pid)
  if os.getenv("COMMPLAN_TEST_CRASH") == stage then
    io.stdout:flush()
    os.execute("kill -9 " .. pid)
  end
end

-- (inside a directory this process just made: fsio's one writer all the same)
local function write_file(path, data) return fsio.write_file(path, data) == true end

-- ---- publication ----

local Publisher = {}
Publisher.__index = Publisher

local function publisher(outdir)
  local o = outdir:gsub("/+$", "")
  if o == "" then fail(outdir .. ": OUTDIR must name a directory for one plan, not /") end
  local parent, base = o:match("^(.*)/([^/]+)$")
  if not parent then parent, base = ".", o end
  if parent == "" then parent = "/" end
  if base == "." or base == ".." then
    fail(outdir .. ": OUTDIR must name a directory for one plan (e.g. plans/<name>), not " .. base)
  end
  local self = setmetatable({ outdir = o, parent = parent, base = base, pid = my_pid() }, Publisher)
  self.lock = self:sibling("lock")
  return self
end

-- Sibling names end in .tmp, which git ignores.
function Publisher:sibling(kind, pid)
  return self.parent .. "/." .. self.base .. "." .. kind .. (pid and ("." .. pid) or "") .. ".tmp"
end

function Publisher:lock_owner()
  local s = read(self.lock .. "/pid")
  return s and s:match("^(%d+)")
end

-- The lock is a directory holding the owner's pid, put in place by one
-- rename of a complete staging directory, so it is never seen without its
-- pid. A lock whose owner is gone is taken over by renaming it aside first
-- (only one taker wins that rename).
function Publisher:acquire()
  if not sh("mkdir -p -- " .. sh_quote(self.parent) .. " 2>/dev/null") or not is_dir(self.parent) then
    fail(self.parent .. ": cannot create the output directory's parent")
  end
  local stage = self:sibling("lock", self.pid)
  rm_rf(stage)
  if not sh("mkdir -- " .. sh_quote(stage) .. " 2>/dev/null") or not write_file(stage .. "/pid", self.pid .. "\n") then
    rm_rf(stage)
    fail(self.parent .. ": cannot write in the output directory's parent")
  end
  for _ = 1, 3 do
    if os.rename(stage, self.lock) then
      self.locked = true
      return
    end
    local owner = self:lock_owner()
    if alive(owner) then
      rm_rf(stage)
      fail(string.format("%s: another commplan (pid %s) is writing this plan directory; run again when it has finished",
        self.outdir, owner or "?"))
    end
    -- Stale: its owner died. Take it aside, check it is the one we judged.
    local stolen = self:sibling("stale", self.pid)
    rm_rf(stolen)
    if os.rename(self.lock, stolen) then
      local got = read(stolen .. "/pid")
      got = got and got:match("^(%d+)")
      if got ~= owner and alive(got) then
        os.rename(stolen, self.lock) -- a live owner's fresh lock: give it back
        rm_rf(stage)
        fail(string.format("%s: another commplan (pid %s) is writing this plan directory; run again when it has finished",
          self.outdir, got))
      end
      rm_rf(stolen)
    end
  end
  rm_rf(stage)
  fail(self.lock .. ": cannot take the output directory's lock; remove it if no commplan is running")
end

function Publisher:release()
  if not self.locked then return end
  self.locked = false
  os.remove(self.lock .. "/pid")
  os.remove(self.lock)
end

-- Under the lock: finish or undo what a killed generator left, then remove
-- its temporaries. A generator renames OUTDIR aside (.old.<pid>) only once
-- its new directory (.new.<pid>) is complete, so with OUTDIR missing, a
-- dead pid's .new is complete and wins; a lone .old is the complete old.
function Publisher:recover()
  local leftovers, by_pid = {}, {}
  local prefix = "." .. self.base .. "."
  for _, n in ipairs(list_dir(self.parent)) do
    if n:sub(1, #prefix) == prefix then
      local kind, pid = n:sub(#prefix + 1):match("^(%a+)%.(%d+)%.tmp$")
      if kind and (pid == self.pid or not alive(pid)) then
        leftovers[#leftovers + 1] = self.parent .. "/" .. n
        by_pid[pid] = by_pid[pid] or {}
        by_pid[pid][kind] = self.parent .. "/" .. n
      end
    end
  end
  if not exists(self.outdir) then
    for _, k in ipairs(util.sorted_keys(by_pid)) do
      local t = by_pid[k]
      if t.old and t.new and os.rename(t.new, self.outdir) then break end
      if t.old and os.rename(t.old, self.outdir) then break end
    end
  end
  for _, path in ipairs(leftovers) do
    if exists(path) and path ~= self:sibling("lock", self.pid) then rm_rf(path) end
  end
end

-- Generated file names, and temporaries of the per-file renames of older
-- commplan versions: the only entries OUTDIR may hold.
local function known_entries(files)
  local known = {}
  for n in pairs(files) do
    known[n] = true
    known["." .. n .. ".tmp"] = true
  end
  return known
end

-- Returns true when OUTDIR already holds exactly these files.
function Publisher:check_existing(files)
  if not exists(self.outdir) then return false end
  if not is_dir(self.outdir) then fail(self.outdir .. ": OUTDIR exists and is not a directory; choose another OUTDIR") end
  local known, same, seen = known_entries(files), true, 0
  for _, n in ipairs(list_dir(self.outdir)) do
    if not known[n] then
      fail(string.format("%s: OUTDIR holds %s, which commplan did not generate; move it away or choose another OUTDIR",
        self.outdir, (n:gsub("[%c]", "?"))))
    end
    if files[n] then seen = seen + 1 else same = false end
    if files[n] and fsio.read_regular(self.outdir .. "/" .. n, #files[n] + 1) ~= files[n] then same = false end
  end
  return same and seen == #util.sorted_keys(files)
end

function Publisher:publish(files, names)
  local new = self:sibling("new", self.pid)
  rm_rf(new)
  if not sh("mkdir -- " .. sh_quote(new) .. " 2>/dev/null") then fail(new .. ": cannot create the new plan directory") end
  for _, n in ipairs(names) do
    if not write_file(new .. "/" .. n, files[n]) then
      rm_rf(new)
      fail(new .. "/" .. n .. ": cannot write generated file (disk full or read-only?)")
    end
  end
  crash_point("new-written", self.pid)
  if not exists(self.outdir) then
    if not os.rename(new, self.outdir) then rm_rf(new); fail(self.outdir .. ": cannot rename the new plan directory in") end
    return
  end
  -- No portable atomic exchange of two directories from Lua (renameat2's
  -- RENAME_EXCHANGE): OUTDIR is renamed aside, then the new one in. Between
  -- the two renames OUTDIR is briefly absent, but the complete old (.old)
  -- and the complete new (.new) both exist; if the generator dies there,
  -- the next run's recover() puts the new one in place.
  local old = self:sibling("old", self.pid)
  rm_rf(old)
  if not os.rename(self.outdir, old) then rm_rf(new); fail(self.outdir .. ": cannot rename the old plan directory aside") end
  crash_point("old-aside", self.pid)
  if not os.rename(new, self.outdir) then
    os.rename(old, self.outdir)
    rm_rf(new)
    fail(self.outdir .. ": cannot rename the new plan directory in")
  end
  crash_point("new-in", self.pid)
  rm_rf(old)
end

-- ---- main ----

-- The command that regenerates OUTDIR from PLAN, for --check's line: make for
-- this tree's own plans/<name>.lua into plans/<name> (what make check-generated
-- checks), else the generator itself on the same operands (make would write
-- build/<name>/gen/, not OUTDIR).
local function regen_command(plan_path, outdir)
  local root = absolute(script_dir)
  local name = plan_path:match("([^/]+)%.lua$")
  if name and absolute(plan_path) == root .. "/plans/" .. name .. ".lua" and absolute(outdir) == root .. "/plans/" .. name then
    return "make PLAN=" .. name .. ".lua"
  end
  return "lua5.4 " .. arg[0] .. " " .. plan_path .. " " .. outdir
end

local function check_mode(files, names, plan_path, outdir, regen)
  local stale, missing = {}, {}
  for _, n in ipairs(names) do
    local kind = fsio.stat(outdir .. "/" .. n)
    local have = kind and fsio.read_regular(outdir .. "/" .. n, #files[n] + 1)
    if kind == nil then missing[#missing + 1] = outdir .. "/" .. n
    elseif have ~= files[n] then stale[#stale + 1] = outdir .. "/" .. n end
  end
  if #stale + #missing > 0 then
    local what = {}
    if #stale > 0 then what[#what + 1] = "stale generated files: " .. table.concat(stale, ", ") end
    if #missing > 0 then what[#what + 1] = "never generated: " .. table.concat(missing, ", ") end
    io.stderr:write(string.format("%s: %s; run %s and commit\n",
      plan_path, table.concat(what, "; "), regen or regen_command(plan_path, outdir)))
    return 1
  end
  return 0
end

local function main(argv)
  -- Generation allocates many short-lived tables (a row per op per
  -- stage): collecting when the heap has grown 4x rather than 2x, in
  -- larger steps, saves a fifth of a 1,000-layer plan's time for a third
  -- more peak memory, still linear in the ops (bench/gen_time.sh).
  collectgarbage("incremental", 400, 400)
  -- Audit verbs: lua5.4 gen/commplan.lua diff A B | advise PLAN [--world-size N]
  if argv[1] == "diff" or argv[1] == "advise" or argv[1] == "pipeline"
     or argv[1] == "expect" then return require("gen.verbs").main(argv) end
  local check, strict, regen = false, false, nil
  local args = {}
  local i = 0
  while i < #argv do
    i = i + 1
    local a = argv[i]
    if a == "--check" then check = true
    elseif a == "--regen-command" then
      regen = argv[i + 1]
      if not regen or regen == "" or regen:find("[%c]") then
        io.stderr:write("commplan: --regen-command takes the command that regenerates OUTDIR (one line); " .. USAGE)
        return 2
      end
      i = i + 1
    elseif a == "--strict" then strict = true
    elseif a == "--version" then
      io.stdout:write("commplan " .. version() .. "\n")
      return 0
    elseif a == "-h" or a == "--help" then
      io.stdout:write(USAGE)
      return 0
    elseif a:sub(1, 2) == "--" then
      io.stderr:write("commplan: unknown option '" .. a:gsub("[%c]", "?") .. "'; " .. USAGE)
      return 2
    else args[#args + 1] = a end
  end
  if #args ~= 2 then
    io.stderr:write(USAGE)
    return 2
  end
  local plan_path, outdir = args[1], args[2]
  local files, p = generate(plan_path)
  local names = util.sorted_keys(files)
  if regen and not check then
    io.stderr:write("commplan: --regen-command goes with --check; " .. USAGE)
    return 2
  end
  if check then return check_mode(files, names, plan_path, outdir, regen) end
  local unfit = audit.fit_line(p, plan_path)
  if unfit then
    io.stderr:write(unfit .. (strict and "; refused under --strict, nothing written" or "") .. "\n")
    if strict then return 2 end
  end
  local pub = publisher(outdir)
  local ok, err = pcall(function()
    pub:acquire()
    crash_point("locked", pub.pid)
    pub:recover()
    crash_point("recovered", pub.pid)
    if not pub:check_existing(files) then pub:publish(files, names) end
  end)
  pub:release()
  if not ok then error(err, 0) end
  return 0
end

local ok, rc = pcall(main, arg)
if not ok then
  local e = rc
  local msg
  if util.is_plan_error(e) then msg = tostring(e.msg)
  elseif getmetatable(e) == Fail then msg = e.msg
  else msg = "commplan: internal error: " .. tostring(e):gsub("\n.*", "") end
  io.stderr:write(msg .. "\n")
  rc = 2
end
local flushed, why = fsio.flush_stdout()
if not flushed then
  io.stderr:write("commplan: " .. why .. "; check the disk or pipe it writes to\n")
  rc = 2
end
os.exit(rc)
