-- Issue 33: every size that drives the generator's work is bounded before
-- that work starts (gen/util.lua LIMITS, gen/load.lua, pp_stages.check_size;
-- docs/plan-files.md, "Numbers"), and a pipeline CSV is read only beside
-- the plan, bounded by it, parsed in linear time, and never quoted back.
local H = require("helpers")
local load = require("gen.load")
local plan = require("gen.plan")
local util = require("gen.util")
local pps = require("gen.parallel.pp_schedule")
local report = require("gen.pipeline")
local T = {}

-- fn() must raise a one-line plan error holding every text given, within
-- `seconds` of CPU time (a count hook stops a runaway in Lua code, so a
-- regression fails here instead of running for minutes). Returns the message.
local function refused_within(seconds, fn, ...)
  local t0 = os.clock()
  debug.sethook(function()
    if os.clock() - t0 > seconds then
      debug.sethook()
      error(string.format("took more than %g s of CPU time", seconds), 2)
    end
  end, "", 10000)
  local ok, err = pcall(fn)
  debug.sethook()
  local elapsed = os.clock() - t0
  if elapsed > seconds then error(string.format("took %.2f s, more than %g s", elapsed, seconds), 2) end
  if ok then error("expected a plan error, it succeeded", 2) end
  if not util.is_plan_error(err) then error("expected a plan error, got: " .. tostring(err), 2) end
  local msg = tostring(err)
  if msg:find("\n") then error("error message is not one line: " .. msg, 2) end
  for _, pat in ipairs({ ... }) do
    if not msg:find(pat, 1, true) then error(string.format("message %q lacks %q", msg, pat), 2) end
  end
  return msg
end

local PP_SRC = H.read("tests/pp/plans/pp_tiny.lua")

-- pp_tiny with another schedule, pp, microbatches and world.
local function pp_variant(schedule, pp, mb, world)
  return (PP_SRC:gsub('schedule = "1F1B", microbatches = 4', string.format('schedule = %q, microbatches = %d',
    schedule, mb)):gsub("pp = 2,", "pp = " .. pp .. ","):gsub("world_size = 4", "world_size = " .. world)
    :gsub("local_batch_size = 4", "local_batch_size = " .. mb))
end

-- ---- sizes ---------------------------------------------------------------

-- A dense Llama of 100,000 layers took minutes and ~12 GB: refused at
-- load, naming the field and the bound.
function T.huge_n_layers_refused_at_load()
  local src = "return { world_size = 8, parallel = { dp_shard = 8 }, model = { family = 'llama', size = '8b', "
    .. "n_layers = 100000, seq_len = 8192 } }"
  refused_within(1, function() load.source(src, "plans/t.lua") end, "model.n_layers", "100000 is above the limit",
    tostring(util.LIMITS.units - 3), "units")
  refused_within(1, function() plan.from_source(src, "plans/t.lua") end, "model.n_layers")
  -- units x micro-steps: 35 units x 1,000 micro-steps
  refused_within(2, function() plan.from_source("return { world_size = 8, parallel = { dp_shard = 8 }, model = { "
    .. "family = 'llama', size = '8b' }, fsdp = { micro_steps = 1000 } }", "plans/t.lua") end,
    "fsdp.micro_steps", "unit-steps", "use fewer micro-steps")
end

-- A MoE model under expert parallelism: its memory plan grows with the
-- square of the layers (1,000 took minutes): refused at load.
function T.moe_layers_under_ep_refused_at_load()
  local src = H.read("plans/mixtral8x7b.lua"):gsub('size = "8x7b",', 'size = "8x7b", n_layers = 1000,')
  refused_within(1, function() load.source(src, "plans/t.lua") end, "model.n_layers", "parallel.ep=8",
    "expert parallelism", "use at most 512 layers")
end

-- TP over 2^20 ranks of a model of 4,096 TP-split parameters: TP's
-- classes took every parameter's rows on every TP rank (no answer in 20 s,
-- ~1 GB): refused once the units are known, before any class is built.
function T.tp_times_params_refused_before_classes()
  local ps = {}
  for i = 1, 4096 do ps[i] = string.format("{ name = 'w%d', shape = { 1 << 20, 1 }, tp = 'colwise' }", i) end
  local src = "return { world_size = 1 << 20, parallel = { dp_shard = 1, tp = 1 << 20 }, model = { family = 'generic', "
    .. "units = { { name = 'a', params = { " .. table.concat(ps, ", ") .. " } }, { name = 'root', params = {} } } } }"
  refused_within(2, function() plan.from_source(src, "plans/t.lua") end, "parallel.tp",
    "tp=1048576 x 4096 parameters is more than 4194304 (2^22)", "use a smaller tp")
end

-- A pipeline of 512 microbatches on pp 8 (44 s and 3.6 GB before): refused
-- at load by microbatches x pp; 256 microbatches x 16 stages after the
-- stage count is known, before any stage is planned.
function T.big_pipeline_refused_before_work()
  local base = H.read("bench/llama405b_pp.lua")
  local function mbs(n)
    -- (a shorter sequence keeps the step's FLOPs under gen/dims.lua's 2^62,
    -- so the pipeline's own bound is the one met)
    return (base:gsub("microbatches = 16", "microbatches = " .. n):gsub("local_batch_size = 16", "local_batch_size = " .. n)
      :gsub("seq_len = 8192", "seq_len = 1024"))
  end
  refused_within(1, function() load.source(mbs(512), "bench/t.lua") end, "pipeline.microbatches",
    "512 microbatches x pp=8", "2048 (2^11)", "use at most 256 microbatches")
  refused_within(2, function() plan.from_source(mbs(256), "bench/t.lua") end, "pipeline.microbatches",
    "256 microbatches x 16 stages", "2048 (2^11)", "use at most 128 microbatches")
  -- 512 data-parallel copies of the pipeline (32 s before): the whole-step proof's bound
  local wide = base:gsub("dp_shard = 8, tp = 8", "dp_shard = 512, tp = 1"):gsub("world_size = 512", "world_size = 4096")
  refused_within(2, function() plan.from_source(wide, "bench/t.lua") end, "parallel.dp_shard",
    "512 data-parallel copies", "65536 (2^16)", "fewer data-parallel ranks")
  -- make pipeline's entry takes the same bound
  refused_within(2, function() report.tables(load.source(wide, "bench/t.lua")) end, "parallel.dp_shard")
end

-- ---- the CSV: rows, cells and numbers ------------------------------------

-- 32 rows for a pipeline of 2: refused by the row count, before the rows
-- are validated or lowered (they were lowered in full, then compared).
function T.csv_rows_bounded_before_lowering()
  local big = pps.derive({ schedule = "Interleaved1F1B", pp = 32, microbatches = 32 })
  local text = pps.to_csv(big.torch_order)
  refused_within(0.5, function() pps.import_csv(text, { pp = 2, microbatches = 4, num_stages = 4 }) end,
    "CSV has 32 rows; the plan's pipeline has 2 ranks (parallel.pp)")
  -- without the plan's counts, the generator's own bound
  refused_within(0.5, function() pps.from_csv(("0F0\n"):rep(util.LIMITS.pp_actions + 1)) end,
    "rows; at most 2048")
  -- a row longer than the step's actions
  refused_within(0.5, function() pps.import_csv(("0F0,"):rep(100) .. "\n", { pp = 1, microbatches = 1,
    num_stages = 2 }) end, "CSV:1:17: more than 16 cells in a row")
end

-- One long cell: the trim was a pattern whose time grew with the square
-- of the cell (32 KB of spaces: ~6 s, 1 MB: hours). Now linear, and a
-- cell longer than any action is refused by its length first.
function T.csv_long_cell_linear()
  -- (spaces inside are the slow case: 40 KB of them took the old pattern ~9 s, so a
  -- regression fails here rather than hangs)
  local spaces, inside = (" "):rep(1 << 20), "0" .. (" "):rep(40 << 10) .. "x"
  local t0 = os.clock()
  H.eq(pps.trim(spaces .. "0F0" .. spaces), "0F0", "trimmed")
  H.eq(pps.trim(spaces), "", "all spaces")
  H.eq(pps.trim(spaces .. inside .. spaces), inside, "spaces inside kept")
  assert(os.clock() - t0 < 1, "trim of 1 MB took " .. (os.clock() - t0) .. " s")
  refused_within(1, function() pps.from_csv("0F0" .. (" "):rep(32768) .. "x\n") end, "CSV:1:1: a cell of 32772 bytes",
    "at most 64")
  refused_within(1, function() pps.from_csv('0F0,"' .. (" "):rep(1 << 20) .. '"\n') end, "CSV:1:2: a quoted cell")
  H.eq(pps.format_action(pps.parse_action("  2F0\t ")), "2F0", "spaces around an action")
end

-- Numbers past 2^31 - 1 (past 2^63 they became floats), and numbers past
-- the plan's stages or microbatches, refused naming row and column.
function T.csv_numbers_range_checked()
  for _, case in ipairs({
    { "0F0,9223372036854775808F0\n", "CSV:1:2: its stage number has 19 digits" },
    { "0F18446744073709551617\n", "CSV:1:1: its microbatch number has 20 digits" },
    { "0F0\n0F2147483648\n", "CSV:2:1: its microbatch number" },
    { "0F1.5\n", "CSV:1:1: not an action" },
    { "0F-1\n", "CSV:1:1: not an action" },
    { "(0F0;99999999999B0)OVERLAP_F_B\n", "CSV:1:1: its stage number has 11 digits" },
  }) do
    local msg = refused_within(0.5, function() pps.from_csv(case[1]) end, case[2])
    assert(not msg:find("9223372036854775808", 1, true), "the number is not echoed: " .. msg)
  end
  -- inside 2^31 but past the plan's: named with the plan's range
  refused_within(0.5, function() pps.import_csv("0F0,7F0\n1F0\n", { pp = 2, microbatches = 1, num_stages = 4 }) end,
    "CSV:1:2: 7F0 names stage 7, and the plan has stages 0..3")
  refused_within(0.5, function() pps.import_csv("0F0,0F1000\n", { pp = 1, microbatches = 4, num_stages = 2 }) end,
    "CSV:1:2: 0F1000 names microbatch 1000, and the step has microbatches 0..3")
  -- without the plan's counts: a stage of 2 billion no longer loops over every stage below it
  refused_within(0.5, function() pps.import_csv("2000000000F0,2000000000B0\n") end, "names stage 2000000000")
end

-- A repeated action (torch's validation counts distinct ones, so it would
-- run twice): refused naming its rank and step, not an internal error
-- from the memory plan ("grads ... still live at the end of the step").
function T.csv_repeated_action_refused()
  local two = { pp = 2, microbatches = 1, num_stages = 2 }
  refused_within(0.5, function() pps.import_csv("0F0,0F0,0B0\n1F0,1B0\n", two) end,
    "rank 0 step 1: 0F0 runs a second time")
  refused_within(0.5, function() pps.import_csv("0F0,0B0,0B0\n1F0,1B0\n", two) end,
    "rank 0 step 2: 0B0 runs a second time")
end

-- ---- the CSV: where it is read from, and what a refusal shows -------------

local tmpdir, write = H.tmpdir, H.write

local function with_csv(rel)
  return pp_variant("Interleaved1F1B", 2, 4, 4):gsub("pipeline = {", string.format("pipeline = { csv = %q,", rel))
end

-- Read only below the plan's directory, never through a symlink, never
-- by an absolute path or ..; the good CSV beside the plan still reads.
function T.csv_read_only_beside_the_plan()
  local dir = tmpdir()
  local good = report.csv(load.source(pp_variant("Interleaved1F1B", 2, 4, 4), "tests/pp/plans/pp_tiny.lua"))
  write(dir .. "/real.csv", good)
  write(dir .. "/sub/real.csv", good)
  local outside = tmpdir()
  write(outside .. "/o.csv", good)
  assert(os.execute("ln -s real.csv " .. dir .. "/link.csv"))
  assert(os.execute("ln -s " .. outside .. " " .. dir .. "/linkdir"))
  local path = dir .. "/p.lua"
  local function tables(rel) return report.tables(load.source(with_csv(rel), path)) end
  H.eq(tables("real.csv").sched.schedule, "Interleaved1F1B (CSV)", "beside the plan")
  H.eq(tables("sub/real.csv").sched.schedule, "Interleaved1F1B (CSV)", "below the plan")
  refused_within(1, function() tables("link.csv") end, "pipeline.csv:", "reached through a symlink (link.csv)")
  refused_within(1, function() tables("linkdir/o.csv") end, "pipeline.csv:", "reached through a symlink (linkdir)")
  refused_within(1, function() tables(outside .. "/o.csv") end, "pipeline.csv:", "is an absolute path",
    "below the plan file's directory")
  refused_within(1, function() tables("../" .. outside:match("[^/]+$") .. "/o.csv") end, "pipeline.csv:",
    "not a plain name", "below the plan file's directory")
  refused_within(1, function() tables("/etc/passwd") end, "pipeline.csv:", "is an absolute path")
  refused_within(1, function() tables("sub") end, "pipeline.csv:", "a directory, not a regular file")
  refused_within(1, function() tables("real.csv/x") end, "pipeline.csv:", "real.csv is not a directory")
  -- a hard link to a file elsewhere (as /etc/passwd could be): its rows are not counted back
  assert(os.execute("ln " .. outside .. "/o.csv " .. dir .. "/hard.csv"))
  refused_within(1, function() tables("hard.csv") end, "pipeline.csv:", "has other hard links")
  os.execute("rm -rf " .. dir .. " " .. outside)
end

-- A plan at a git revision (make diff-plan REV=..., `diff REV:path`) reads
-- its pipeline.csv from that revision, not from today's working tree (a
-- CSV removed or changed since then), and a link committed in its place
-- is refused as on disk.
function T.csv_of_a_plan_at_a_revision_read_at_that_revision()
  local repo = tmpdir()
  local ph = io.popen("pwd")
  local root = ph:read("l")
  ph:close()
  local good = report.csv(load.source(pp_variant("Interleaved1F1B", 2, 4, 4), "tests/pp/plans/pp_tiny.lua"))
  write(repo .. "/p/c1.lua", with_csv("s.csv"))
  write(repo .. "/p/s.csv", good)
  write(repo .. "/p/c2.lua", with_csv("l.csv"))
  assert(os.execute("cd " .. repo .. " && ln -s s.csv p/l.csv && git init -q && git add -A && "
    .. "git -c user.name=t -c user.email=t@t commit -qm plans"))
  os.remove(repo .. "/p/s.csv") -- the working tree no longer has it
  local function diff(a, b)
    local dp = io.popen("cd " .. repo .. " && lua5.4 " .. root .. "/gen/verbs.lua diff " .. a .. " " .. b .. " 2>&1")
    local out = dp:read("a")
    local ok = dp:close()
    return ok, out
  end
  local ok, out = diff("HEAD:p/c1.lua", "HEAD:p/c1.lua")
  assert(ok and out:find("pipeline", 1, true), "the CSV read at HEAD, absent from the working tree: " .. out)
  ok, out = diff("HEAD:p/c2.lua", "HEAD:p/c2.lua")
  assert(not ok and out:find("pipeline.csv: l.csv is a symlink at revision HEAD", 1, true), out)
  local _, n = out:gsub("\n", "")
  H.eq(n, 1, "one line")
  os.execute("rm -rf " .. repo)
end

-- A refusal never prints the file's text: a CSV whose first cell is a
-- secret (as the first field of a system file would be) is refused
-- naming the row and column only, whatever the secret looks like.
function T.csv_refusal_does_not_echo_the_file()
  local dir = tmpdir()
  local path = dir .. "/p.lua"
  for _, secret in ipairs({ "hunter2secret", "root:$6$salt$hash:19000:0:99999:7:::", "0Fsecret", "(s3cret)F",
                            "(0F0;s3cret)OVERLAP_F_B", "0SECRET1" }) do
    write(dir .. "/s.csv", secret .. ",0B0\n1F0,1B0\n")
    local msg = refused_within(1, function() report.tables(load.source(with_csv("s.csv"), path)) end,
      "pipeline.csv:", "s.csv:1:1:")
    local needle = secret:match("[%a%d]*[eE][cC][rR][eE][tT]") or secret:sub(1, 8)
    assert(not msg:find(needle, 1, true), string.format("the refusal %q shows the file's %q", msg, needle))
  end
  os.execute("rm -rf " .. dir)
end

-- A fixed-seed fuzz of the CSV surface: valid schedules' CSVs mutated as a
-- careless or hostile file would be (cells swapped for huge, negative,
-- fractional, long, quoted or secret text, or harmlessly quoted and
-- padded; rows dropped, doubled, truncated; line ends changed). Every
-- input ends in an import or one plan error line, within the time the
-- bounds promise, never an internal error, and no refusal shows the
-- planted secret.
function T.csv_fuzz()
  local seed = 33
  local function R(n) seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n + 1 end
  local bases = {}
  for _, c in ipairs({ { "Interleaved1F1B", 2, 4 }, { "ZBVZeroBubble", 2, 4 }, { "DualPipeV", 2, 4 },
                       { "InterleavedZeroBubble", 4, 8 }, { "LoopedBFS", 4, 4 } }) do
    local d = pps.derive({ schedule = c[1], pp = c[2], microbatches = c[3] })
    bases[#bases + 1] = { text = pps.to_csv(d.torch_order), pp = c[2], mb = c[3], stages = d.num_stages }
  end
  local SECRET = "SECRETxyzzy"
  local cells = { SECRET, "0F" .. SECRET, "(" .. SECRET .. ")F", "(0F0;" .. SECRET .. ")OVERLAP_F_B", "0F0" .. SECRET,
                  "9223372036854775808F0", "0F18446744073709551617", "0F-1", "0F1.5", "1e3F0", "-0F0", "0F0x",
                  (" "):rep(5000) .. "0F0", "0" .. (" "):rep(5000) .. "F0", '"0F0', '"0F""0"', '""', "", " ",
                  "(0F0;1B0)OVERLAP_F_B", "()OVERLAP_F_B", "0SEND_F0", "0UNSHARD", "7F0", "0F7", "2147483647F0",
                  "0F2147483647", "\\0F0", "0W0", "0I0", "0B3", "1F0" }
  local accepted, refused = 0, 0
  for i = 1, 1500 do
    local b = bases[R(#bases)]
    local rows = {}
    for line in b.text:gmatch("([^\n]*)\n") do rows[#rows + 1] = line end
    for _ = 1, R(3) - 1 do
      local k, r = R(8), R(#rows)
      local cs = {}
      for c in ((rows[r] or "") .. ","):gmatch("([^,]*),") do cs[#cs + 1] = c end
      local at = R(#cs)
      if k <= 3 then cs[at] = cells[R(#cells)]
      elseif k == 4 then cs[at] = '"' .. cs[at]:gsub("\r", "") .. '"'     -- quoted: still the same action
      elseif k == 5 then cs[at] = " " .. cs[at]:gsub("\r", "") .. "\t"    -- padded: likewise
      elseif k == 6 then table.remove(rows, r); cs = nil
      elseif k == 7 then table.insert(rows, r, rows[r] or ""); cs = nil
      else rows[r] = (rows[r] or ""):sub(1, R(40)); cs = nil end
      if cs then rows[r] = table.concat(cs, ",") end
    end
    local text = table.concat(rows, "\n") .. (R(3) == 1 and "" or "\n")
    if R(2) == 1 then text = text:gsub("\r\n", "\n") end
    local t0 = os.clock()
    local ok, e = pcall(pps.import_csv, text, { pp = b.pp, microbatches = b.mb, num_stages = b.stages, file = "F" })
    if os.clock() - t0 > 0.5 then error(string.format("input %d took %.2f s", i, os.clock() - t0)) end
    if ok then accepted = accepted + 1
    else
      if not util.is_plan_error(e) then error(string.format("input %d: internal error: %s", i, tostring(e))) end
      local msg = tostring(e)
      if msg:find("\n") or msg:find(SECRET, 1, true) or #msg > 600 then
        error(string.format("input %d: refusal not one short line without the file's text: %q", i, msg))
      end
      refused = refused + 1
    end
  end
  assert(accepted > 200 and refused > 500, string.format("fuzz: %d accepted, %d refused", accepted, refused))
end

return T
