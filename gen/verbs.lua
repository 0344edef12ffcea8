-- commplan's audit verbs, beside the generator CLI:
--   lua5.4 gen/verbs.lua diff A B
--       A and B: a plan file (generated in memory), a plan.json, or
--       REV:path (git show), e.g. HEAD:plans/llama70b/plan.json
--   lua5.4 gen/verbs.lua diff --rev REV plans/<name>.lua
--       the plan file against its plan.json committed at REV
--   --svg DIR (before the operands) also writes DIR/before.svg and
--       DIR/after.svg: each side's timeline.svg (gen/plandiff.svg_of)
--   lua5.4 gen/verbs.lua advise PLAN.lua [--world-size N] [--gpus-per-node G] [--global-batch B] [--top K]
--       rank the meshes ParallelDims accepts for PLAN's model on N GPUs
-- gen/commplan.lua dispatches `diff` and `advise` here when it knows them
-- (verbs.main(argv)). Errors: one line on stderr, exit 2.
local script_dir = arg and arg[0] and arg[0]:match("^(.*)/gen/[^/]*$") or "."
package.path = script_dir .. "/?.lua;" .. package.path

local util = require("gen.util")
local fsio = require("gen.fsio")

local verbs = {}

-- Operands are plan files (16 MiB, as the generator takes) or plan.json
-- documents (llama405b_hsdp's is 1.4 MB, the pipeline plan llama405b's 8.7 MB;
-- 256 MiB leaves room for any world).
verbs.PLAN_MAX_BYTES = 16 << 20
verbs.JSON_MAX_BYTES = 256 << 20

verbs.USAGE = "usage: lua5.4 gen/verbs.lua diff [--svg DIR] A B | diff [--svg DIR] --rev REV PLAN.lua\n"
  .. "       lua5.4 gen/verbs.lua advise PLAN.lua [--world-size N] [--gpus-per-node G] [--global-batch B] [--top K]\n"
  .. "       lua5.4 gen/verbs.lua pipeline PLAN.lua [--csv FILE]   (a plan with parallel.pp > 1 and pipeline.microbatches)\n"
  .. "       lua5.4 gen/verbs.lua expect PLAN.lua|plan.json [--rank R | --ranks A-B | --ranks all] [--json]\n"

local function int_arg(v, name)
  local n = v and v:match("^%d+$") and tonumber(v)
  if not n or n < 1 or n > (1 << 30) then
    util.plan_error(string.format("%s: expects a positive integer, got %s", name, tostring(v)))
  end
  return n
end

-- stdout, refusing (one line, exit 2) when it cannot be written.
local function write_out(text)
  local ok, why = fsio.write_stdout(text)
  if not ok then util.plan_error("commplan: " .. why .. "; check the disk or pipe it writes to") end
end

function verbs.main(argv)
  local verb = argv[1]
  if verb == "pipeline" then
    -- torch's pipeline schedules for the plan, side by side (gen/parallel/pp_report.lua);
    -- --csv FILE: the plan's schedule as torch's CSV (_load_csv reads it back)
    local path, csv
    local i = 2
    while i <= #argv do
      if argv[i] == "--csv" and argv[i + 1] and argv[i + 1] ~= "" then csv = argv[i + 1]; i = i + 2
      elseif argv[i]:sub(1, 2) == "--" or path then io.stderr:write(verbs.USAGE); return 2
      else path = argv[i]; i = i + 1 end
    end
    if not path then io.stderr:write(verbs.USAGE); return 2 end
    local src, why = fsio.read_regular(path, verbs.PLAN_MAX_BYTES)
    if not src then util.plan_error(string.format("%s: the plan file %s", fsio.shown(path), why)) end
    local loaded = require("gen.load").source(src, path)
    local report = require("gen.pipeline")
    local text = report.text(loaded)
    if csv then text = text .. verbs.write_file(csv, report.csv(loaded), "the schedule's CSV", path) end
    write_out(text)
    return 0
  end
  if verb == "expect" then return verbs.expect(argv) end
  if verb == "diff" then
    local args, svg_dir = {}, nil
    local i = 2
    while i <= #argv do
      if argv[i] == "--svg" and argv[i + 1] and argv[i + 1] ~= "" then svg_dir = argv[i + 1]; i = i + 2
      else args[#args + 1] = argv[i]; i = i + 1 end
    end
    local sa, sb = args[1], args[2]
    if sa == "--rev" and #args == 3 then
      -- The plan against its generated output committed at a revision.
      local name = args[3]:match("([%w_]+)%.lua$")
      if not name then util.plan_error(args[3] .. ": --rev compares a plan file (plans/<name>.lua)") end
      sa, sb = args[2] .. ":plans/" .. name .. "/plan.json", args[3]
      -- a pipeline plan has no generated output: the plan file itself at REV
      local src = fsio.read_regular(args[3], verbs.PLAN_MAX_BYTES)
      local ok, loaded = pcall(require("gen.load").source, src or "", args[3])
      if src and ok and ((loaded.parallel or {}).pp or 1) > 1 then sa = args[2] .. ":" .. args[3] end
    elseif #args ~= 2 or sa:sub(1, 2) == "--" or sb:sub(1, 2) == "--" then
      io.stderr:write(verbs.USAGE)
      return 2
    end
    local plandiff = require("gen.plandiff")
    local piped = plandiff.pipeline_compare(sa, sb)
    if piped then
      write_out(piped)
      return 0
    end
    local a, la, pa = plandiff.load(sa)
    local b, lb, pb = plandiff.load(sb)
    local text = plandiff.compare(a, b, la, lb)
    if svg_dir then text = text .. verbs.write_svgs(plandiff, svg_dir, sa, pa, sb, pb) end
    write_out(text)
    return 0
  elseif verb == "advise" then
    local opts, path = {}, nil
    local i = 2
    while i <= #argv do
      local x = argv[i]
      if x == "--world-size" then opts.world_size = int_arg(argv[i + 1], x); i = i + 2
      elseif x == "--gpus-per-node" then opts.gpus_per_node = int_arg(argv[i + 1], x); i = i + 2
      elseif x == "--top" then opts.top = int_arg(argv[i + 1], x); i = i + 2
      elseif x == "--global-batch" then opts.global_batch = int_arg(argv[i + 1], x); i = i + 2
      elseif x:sub(1, 2) == "--" or path then io.stderr:write(verbs.USAGE); return 2
      else path = x; i = i + 1 end
    end
    if not path then io.stderr:write(verbs.USAGE); return 2 end
    local src, why = fsio.read_regular(path, verbs.PLAN_MAX_BYTES)
    if not src then
      util.plan_error(string.format("%s: the plan file %s; give the path of a plan file (plans/<name>.lua)",
        fsio.shown(path), why))
    end
    write_out(require("gen.advisor").report(src, path, opts))
    return 0
  end
  io.stderr:write(verbs.USAGE)
  return 2
end

-- diff --svg DIR: DIR/before.svg and DIR/after.svg (DIR made if need
-- be), each through fsio.write_file; returns the lines that say so. Both
-- targets are checked before either is written, and DIR itself must be a
-- directory, not a link to one: a refusal writes nothing.
function verbs.write_svgs(plandiff, dir, sa, pa, sb, pb)
  -- `link/` and `link/.` name the directory a link points at (stat follows
  -- it): the link itself is what must not be one
  repeat
    local before = dir
    dir = dir:gsub("/%.$", ""):gsub("([^/])/+$", "%1")
  until dir == before
  local lines = { "", "timeline:" }
  local out = {}
  for _, side in ipairs({ { "before", sa, pa }, { "after", sb, pb } }) do
    local text, note = plandiff.svg_of(side[2], side[3])
    out[#out + 1] = { dir .. "/" .. side[1] .. ".svg", text }
    if note then lines[#lines + 1] = "  (" .. note .. ")" end
  end
  local kind = fsio.identity(dir)
  if kind and kind ~= "directory" then
    util.plan_error(fsio.shown(dir) .. ": is a " .. kind .. ", not a directory; give --svg (SVG=) a directory for "
      .. "the timelines")
  end
  local q = "'" .. dir:gsub("'", "'\\''") .. "'"
  if not kind and os.execute("mkdir -p -- " .. q .. " 2>/dev/null") ~= true then
    util.plan_error(fsio.shown(dir) .. ": cannot create the directory for the timelines")
  end
  for _, f in ipairs(out) do
    local ok, why = fsio.check_target(f[1])
    if not ok then util.plan_error(fsio.shown(f[1]) .. ": " .. why .. "; remove it or give another --svg directory") end
  end
  for _, f in ipairs(out) do
    verbs.write_file(f[1], f[2], "the timeline")
    lines[#lines + 1] = "  wrote " .. fsio.shown(f[1])
  end
  return table.concat(lines, "\n") .. "\n"
end

-- expect PLAN [--rank R | --ranks A-B | --ranks all] [--json]: the
-- expected trace of one step in Flight Recorder's terms (gen/expect.lua);
-- text for one rank (default 0), --json for the ranks asked (at most
-- verbs.EXPECT_MAX_RANKS of them: python/commplan/diagnose.py asks for
-- the ranks it has dumps of).
verbs.EXPECT_MAX_RANKS = 4096
function verbs.expect(argv)
  local path, as_json, ranks = nil, false, nil
  local i = 2
  while i <= #argv do
    local x = argv[i]
    if x == "--json" then as_json = true; i = i + 1
    elseif x == "--rank" then
      local v = argv[i + 1]
      ranks = { v and v:match("^%d+$") and tonumber(v) or int_arg(v, x) }; i = i + 2
    elseif x == "--ranks" and argv[i + 1] then ranks = argv[i + 1]; i = i + 2
    elseif x:sub(1, 2) == "--" or path then io.stderr:write(verbs.USAGE); return 2
    else path = x; i = i + 1 end
  end
  if not path then io.stderr:write(verbs.USAGE); return 2 end
  local doc = require("gen.plandiff").load(path)
  local expect = require("gen.expect")
  if type(ranks) == "string" then
    local a, b = ranks:match("^(%d+)%-(%d+)$")
    if ranks == "all" then a, b = 0, doc.world_size - 1 end
    a, b = tonumber(a), tonumber(b)
    if not a or b < a or b >= doc.world_size or b - a + 1 > verbs.EXPECT_MAX_RANKS then
      util.plan_error(string.format("--ranks %s: give A-B within 0..%d (at most %d ranks) or all (a world of at "
        .. "most %d)", ranks, doc.world_size - 1, verbs.EXPECT_MAX_RANKS, verbs.EXPECT_MAX_RANKS))
    end
    ranks = {}
    for r = a, b do ranks[#ranks + 1] = r end
  end
  ranks = ranks or { 0 }
  if as_json then
    write_out(require("gen.json").encode(expect.document(doc, ranks)) .. "\n")
  else
    local parts = {}
    for _, r in ipairs(ranks) do parts[#parts + 1] = expect.text(doc, r) end
    write_out(table.concat(parts))
  end
  return 0
end

-- text written to path by fsio.write_file (a new or regular file, never
-- through a link; never the file not_over, the plan it was made from);
-- the line to print, or the one-line refusal.
function verbs.write_file(path, text, what, not_over)
  local ok, why = fsio.write_file(path, text, { not_over = not_over })
  if not ok then
    util.plan_error(fsio.shown(path) .. ": " .. why .. "; give the path of a new or regular file for " .. what)
  end
  return "wrote " .. fsio.shown(path) .. " (" .. what .. ")\n"
end

-- Run as a script (not when required by gen/commplan.lua).
if arg and arg[0] and arg[0]:match("verbs%.lua$") then
  local ok, rc = pcall(verbs.main, arg)
  if not ok then
    local msg = util.is_plan_error(rc) and tostring(rc.msg or rc)
      or ("commplan: internal error: " .. tostring(rc):gsub("\n.*", ""))
    io.stderr:write(msg .. "\n")
    rc = 2
  end
  local flushed, why = fsio.flush_stdout()
  if not flushed then
    io.stderr:write("commplan: " .. why .. "; check the disk or pipe it writes to\n")
    rc = 2
  end
  os.exit(rc)
end

return verbs
