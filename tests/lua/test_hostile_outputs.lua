-- Issue 33: the surfaces added since the last hardening pass, as a hostile
-- user tries them. Every output of every verb goes through gen/fsio.lua's
-- one writer (never through a planted link); buffer sizes from a huge
-- local_batch_size x seq_len are a plan error, not an internal one; network
-- figures are range-checked where they enter and the renderers never take
-- nil, inf or NaN; loss_chunks without seq_len is judged on the seq_len the
-- rest of the plan assumes.
local H = require("helpers")
local fsio = require("gen.fsio")
local util = require("gen.util")
local T = {}

local function sh(cmd) return os.execute(cmd) == true end
local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local function tmpdir()
  local ph = assert(io.popen("mktemp -d"))
  local d = ph:read("l")
  ph:close()
  return d
end
local function write(path, text)
  local fh = assert(io.open(path, "wb"))
  fh:write(text)
  fh:close()
end
-- Runs a command under a 60 s bound: exit status, stderr (stdout dropped).
local function run(cmd)
  local ph = assert(io.popen("timeout 60 " .. cmd .. " 2>&1 >/dev/null; echo \"rc=$?\""))
  local out = ph:read("a")
  ph:close()
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return rc, (out:gsub("rc=%d+%s*$", ""))
end
local function exists(path) return sh("test -e " .. q(path) .. " -o -L " .. q(path)) end
local function is_link(path) return sh("test -L " .. q(path)) end
local function one_line(err, what)
  local lines = select(2, err:gsub("\n", "\n"))
  H.eq(lines, 1, what .. ": lines of stderr (" .. err .. ")")
  assert(not err:find("internal error", 1, true), what .. ": " .. err)
end

-- ---- writes through symlinks ----

-- A "committed" file and links to it planted under output names.
local function victim(d)
  write(d .. "/SCHEDULE.md", "committed plan report\n")
  return d .. "/SCHEDULE.md", "committed plan report\n"
end

function T.fsio_write_file_never_writes_through_a_link()
  local d = tmpdir()
  local target, text = victim(d)
  assert(sh("ln -s " .. q(target) .. " " .. q(d .. "/out.svg") .. " && mkdir " .. q(d .. "/dir")
    .. " && ln -s /dev/null " .. q(d .. "/null.csv")))
  local ok, why = fsio.write_file(d .. "/out.svg", "<svg/>")
  H.eq(ok, nil, "a link under the output's name")
  assert(why:find("is a symbolic link, not a regular file", 1, true), why)
  H.eq(H.read(target), text, "the link's target")
  assert(is_link(d .. "/out.svg"), "the link is left as it was")
  ok, why = fsio.write_file(d .. "/dir", "x")
  H.eq(ok, nil, "a directory")
  assert(why:find("is a directory, not a regular file", 1, true), why)
  ok = fsio.write_file(d .. "/null.csv", "x")
  H.eq(ok, nil, "a link to a device")
  -- a regular file is replaced whole; a new one made; no temporary left
  H.eq(fsio.write_file(d .. "/new.txt", "one\n"), true, "a new file")
  H.eq(fsio.write_file(d .. "/new.txt", "two\n"), true, "over a regular file")
  H.eq(H.read(d .. "/new.txt"), "two\n", "its bytes")
  ok, why = fsio.write_file(d .. "/new.txt", "x", { not_over = d .. "/new.txt" })
  H.eq(ok, nil, "the plan file itself")
  H.eq(why, "is the plan file itself", "not_over")
  ok, why = fsio.write_file(d .. "/missing/x.svg", "x")
  H.eq(ok, nil, "no such directory")
  assert(why:find("cannot be written", 1, true), why)
  local ph = assert(io.popen("ls -A " .. q(d)))
  local names = ph:read("a")
  ph:close()
  H.eq(names, "SCHEDULE.md\ndir\nnew.txt\nnull.csv\nout.svg\n", "the directory holds no temporary")
  sh("rm -rf " .. q(d))
end

-- diff --svg DIR (make diff-plan SVG=DIR) with links planted in DIR, one
-- at before.svg, one at after.svg: refused in one line, the committed file
-- untouched, nothing written (before.svg's check comes before either write).
function T.diff_svg_refuses_planted_links()
  local d = tmpdir()
  local target, text = victim(d)
  assert(sh("mkdir " .. q(d .. "/svg") .. " && ln -s " .. q(target) .. " " .. q(d .. "/svg/after.svg")))
  local rc, err = run("lua5.4 gen/verbs.lua diff --svg " .. q(d .. "/svg") .. " plans/fsdp4.lua plans/llama_tiny.lua")
  H.eq(rc, 2, "diff --svg over a link: " .. err)
  one_line(err, "diff --svg")
  assert(err:find(d .. "/svg/after.svg: is a symbolic link, not a regular file", 1, true), err)
  H.eq(H.read(target), text, "the committed file")
  assert(not exists(d .. "/svg/before.svg"), "nothing written when one target is refused")
  -- before.svg a link too, and DIR itself a link to a directory
  assert(sh("ln -s " .. q(target) .. " " .. q(d .. "/svg/before.svg")))
  rc, err = run("lua5.4 gen/verbs.lua diff --svg " .. q(d .. "/svg") .. " plans/fsdp4.lua plans/llama_tiny.lua")
  H.eq(rc, 2, "both links: " .. err)
  one_line(err, "diff --svg, two links")
  H.eq(H.read(target), text, "the committed file (two links)")
  assert(sh("mkdir " .. q(d .. "/real") .. " && ln -s real " .. q(d .. "/linkdir")))
  rc, err = run("lua5.4 gen/verbs.lua diff --svg " .. q(d .. "/linkdir") .. " plans/fsdp4.lua plans/llama_tiny.lua")
  H.eq(rc, 2, "DIR a link: " .. err)
  one_line(err, "diff --svg DIR a link")
  assert(err:find("is a symbolic link, not a directory", 1, true), err)
  assert(not exists(d .. "/real/before.svg"), "nothing written through DIR's link")
  -- a clean directory: both written, regular files
  rc, err = run("lua5.4 gen/verbs.lua diff --svg " .. q(d .. "/new") .. " plans/fsdp4.lua plans/llama_tiny.lua")
  H.eq(rc, 0, "a new directory: " .. err)
  assert(H.read(d .. "/new/before.svg"):find("<svg", 1, true) and not is_link(d .. "/new/after.svg"), "the pair")
  sh("rm -rf " .. q(d))
end

-- pipeline --csv (make pipeline CSV=) over a link to a committed file.
function T.pipeline_csv_refuses_a_planted_link()
  local d = tmpdir()
  local target, text = victim(d)
  assert(sh("ln -s " .. q(target) .. " " .. q(d .. "/s.csv")))
  local rc, err = run("lua5.4 gen/verbs.lua pipeline bench/llama405b_pp.lua --csv " .. q(d .. "/s.csv"))
  H.eq(rc, 2, "pipeline --csv over a link: " .. err)
  one_line(err, "pipeline --csv")
  assert(err:find(d .. "/s.csv: is a symbolic link, not a regular file", 1, true), err)
  H.eq(H.read(target), text, "the committed file")
  sh("rm -rf " .. q(d))
end

-- The generator: a link planted in OUTDIR under a generated file's name
-- (and OUTDIR itself a link to a committed plan directory) is replaced by
-- the published directory, never written through.
function T.generator_never_writes_through_outdir_links()
  local d = tmpdir()
  local target, text = victim(d)
  assert(sh("mkdir " .. q(d .. "/single") .. " && ln -s " .. q(target) .. " " .. q(d .. "/single/plan.c")))
  local rc, err = run("lua5.4 gen/commplan.lua plans/single.lua " .. q(d .. "/single"))
  H.eq(rc, 0, "generation: " .. err)
  H.eq(H.read(target), text, "the committed file behind plan.c")
  assert(not is_link(d .. "/single/plan.c"), "plan.c is the generated file")
  H.eq(H.read(d .. "/single/plan.c"), H.read("plans/single/plan.c"), "plan.c's bytes")
  assert(sh("mkdir " .. q(d .. "/committed") .. " && cp plans/fsdp4/* " .. q(d .. "/committed") .. " && ln -s committed "
    .. q(d .. "/out")))
  rc, err = run("lua5.4 gen/commplan.lua plans/single.lua " .. q(d .. "/out"))
  H.eq(rc, 0, "generation over a linked OUTDIR: " .. err)
  H.eq(H.read(d .. "/committed/plan.c"), H.read("plans/fsdp4/plan.c"), "the linked directory's files")
  sh("rm -rf " .. q(d))
end

-- Every file a user-run Lua script writes goes through fsio.write_file:
-- no io.open for writing anywhere else in gen/ or bench/.
function T.no_writer_outside_fsio()
  local ph = assert(io.popen("ls gen/*.lua gen/*/*.lua bench/*.lua 2>/dev/null"))
  local bad = {}
  for path in ph:lines() do
    if path ~= "gen/fsio.lua" then
      local src = H.read(path)
      for call in src:gmatch("io%.open%s*%b()") do
        local mode = call:match(",%s*[\"']([%a+]*)[\"']%s*%)$")
        if mode and mode:find("[wa+]") then bad[#bad + 1] = path .. ": " .. call end
      end
      if src:find("io%.output%s*%(") or src:find("os%.tmpname") then bad[#bad + 1] = path .. ": io.output/os.tmpname" end
    end
  end
  ph:close()
  H.eq(table.concat(bad, "; "), "", "writers outside gen/fsio.lua")
end

return T
