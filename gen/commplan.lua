-- commplan generator CLI.
--   lua5.4 gen/commplan.lua PLAN.lua OUTDIR      generate OUTDIR/{plan.h,plan.c,plan.json,SCHEDULE.md}
--   lua5.4 gen/commplan.lua --check PLAN.lua OUTDIR   exit 1 if OUTDIR differs from a fresh generation
-- Errors in the plan: one line on stderr, exit 2, nothing written.
local script_dir = arg[0]:match("^(.*)/gen/[^/]*$") or "."
package.path = script_dir .. "/?.lua;" .. package.path

local util = require("gen.util")
local plan_mod = require("gen.plan")
local emit = require("gen.emit")
local audit = require("gen.audit")

local function read(path)
  local fh = io.open(path, "rb")
  if not fh then return nil end
  local s = fh:read("a")
  fh:close()
  return s
end

-- Shown in generated headers: never an absolute path.
local function display_path(path)
  if path:sub(1, 1) ~= "/" then return (path:gsub("^%./", "")) end
  local cwd = os.getenv("PWD")
  if cwd and path:sub(1, #cwd + 1) == cwd .. "/" then return path:sub(#cwd + 2) end
  return "plans/" .. path:match("([^/]+)$")
end

local function generate(plan_path)
  local src = read(plan_path)
  if not src then util.plan_error(plan_path .. ": cannot read plan file; check the path (plans/<name>.lua)") end
  local p = plan_mod.from_source(src, display_path(plan_path))
  local fp = audit.fingerprint(p)
  local templates = {}
  for _, t in ipairs({ "plan.h.in", "plan.c.in", "plan_kernels.cu.in" }) do
    templates[t] = assert(read(script_dir .. "/templates/" .. t), "missing template " .. t)
  end
  local files = emit.render(p, fp, templates)
  files["plan.json"] = audit.json(p, fp)
  files["SCHEDULE.md"] = audit.schedule_md(p, fp)
  return files, p
end

local function main(argv)
  local check = false
  local args = {}
  for _, a in ipairs(argv) do
    if a == "--check" then check = true
    elseif a == "-h" or a == "--help" then
      io.stdout:write("usage: lua5.4 gen/commplan.lua [--check] PLAN.lua OUTDIR\n")
      return 0
    else args[#args + 1] = a end
  end
  if #args ~= 2 then
    io.stderr:write("usage: lua5.4 gen/commplan.lua [--check] PLAN.lua OUTDIR\n")
    return 2
  end
  local plan_path, outdir = args[1], args[2]
  local ok, files = pcall(generate, plan_path)
  if not ok then
    local e = files
    io.stderr:write((util.is_plan_error(e) and tostring(e) or ("commplan: " .. tostring(e))) .. "\n")
    return 2
  end
  local names = util.sorted_keys(files)
  if check then
    local stale = {}
    for _, n in ipairs(names) do
      if read(outdir .. "/" .. n) ~= files[n] then stale[#stale + 1] = outdir .. "/" .. n end
    end
    if #stale > 0 then
      io.stderr:write(string.format("%s: stale generated files: %s; run make PLAN=%s and commit\n",
        plan_path, table.concat(stale, ", "), plan_path:match("([^/]+)$")))
      return 1
    end
    return 0
  end
  if not os.execute("mkdir -p '" .. outdir:gsub("'", "'\\''") .. "'") then
    io.stderr:write(outdir .. ": cannot create output directory\n")
    return 2
  end
  -- All-or-nothing: write every file under a temporary name, then rename.
  for _, n in ipairs(names) do
    local tmp = outdir .. "/." .. n .. ".tmp"
    local fh = io.open(tmp, "wb")
    if not fh or not fh:write(files[n]) or not fh:close() then
      for _, m in ipairs(names) do os.remove(outdir .. "/." .. m .. ".tmp") end
      io.stderr:write(tmp .. ": cannot write generated file\n")
      return 2
    end
  end
  for _, n in ipairs(names) do
    local target = outdir .. "/" .. n
    -- Leave unchanged files untouched so make's timestamps stay useful.
    if read(target) == files[n] then os.remove(outdir .. "/." .. n .. ".tmp")
    else assert(os.rename(outdir .. "/." .. n .. ".tmp", target)) end
  end
  return 0
end

os.exit(main(arg))
