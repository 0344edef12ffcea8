-- Issue 20: every path the generator and the audit verbs read is a regular
-- file of bounded size (a FIFO or a device gets one line, never a hang);
-- stdout write errors are an exit 2; a world that is not whole nodes is
-- refused, a world inside one node named among the warnings.
local H = require("helpers")
local fsio = require("gen.fsio")
local plan = require("gen.plan")
local audit = require("gen.audit")
local T = {}

local function sh(cmd) return os.execute(cmd) == true end
local function tmpdir()
  local ph = assert(io.popen("mktemp -d"))
  local d = ph:read("l")
  ph:close()
  return d
end
-- Runs a command under a 10 s bound: exit status and stderr.
local function run(cmd)
  local ph = assert(io.popen("timeout 10 " .. cmd .. " 2>&1 >/dev/null; echo \"rc=$?\""))
  local out = ph:read("a")
  ph:close()
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return rc, out:gsub("rc=%d+%s*$", "")
end

function T.read_regular_refuses_every_other_kind()
  local d = tmpdir()
  assert(sh("mkfifo " .. d .. "/fifo.lua && printf 'return {}' >" .. d .. "/ok.lua && ln -s /dev/zero " .. d .. "/zero.lua"))
  local data = fsio.read_regular(d .. "/ok.lua", 100)
  H.eq(data, "return {}", "a regular file reads")
  local _, why = fsio.read_regular(d .. "/fifo.lua", 100)
  H.eq(why, "is a FIFO (named pipe), not a regular file", "FIFO")
  _, why = fsio.read_regular(d .. "/zero.lua", 100)
  H.eq(why, "is a character device, not a regular file", "symlink to /dev/zero")
  _, why = fsio.read_regular(d, 100)
  H.eq(why, "is a directory, not a regular file", "directory")
  _, why = fsio.read_regular(d .. "/ok.lua", 4)
  H.eq(why, "has 9 bytes, more than the 4 bytes allowed", "size bound")
  _, why = fsio.read_regular(d .. "/none.lua", 4)
  H.eq(why, "does not exist (or cannot be read)", "missing")
  sh("rm -rf " .. d)
end

-- Each CLI that takes a path, given a FIFO, /dev/zero and a directory:
-- exit 2 within the bound, one line naming the path and its kind.
function T.cli_operands_never_block()
  local d = tmpdir()
  assert(sh("mkfifo " .. d .. "/p.lua && mkfifo " .. d .. "/p.json"))
  local cases = {
    { "lua5.4 gen/commplan.lua " .. d .. "/p.lua " .. d .. "/out", d .. "/p.lua: the plan file is a FIFO" },
    { "lua5.4 gen/commplan.lua --check " .. d .. "/p.lua " .. d .. "/out", d .. "/p.lua: the plan file is a FIFO" },
    { "lua5.4 gen/commplan.lua /dev/zero " .. d .. "/out", "/dev/zero: the plan file is a character device" },
    { "lua5.4 gen/verbs.lua diff " .. d .. "/p.json plans/fsdp4.lua", d .. "/p.json: the operand is a FIFO" },
    { "lua5.4 gen/verbs.lua diff plans/fsdp4.lua /dev/zero", "/dev/zero: the operand is a character device" },
    { "lua5.4 gen/verbs.lua diff plans plans/fsdp4.lua", "plans: the operand is a directory" },
    { "lua5.4 gen/verbs.lua advise " .. d .. "/p.lua", d .. "/p.lua: the plan file is a FIFO" },
    { "make --no-print-directory -s PLAN=" .. d .. "/p.lua", d .. "/p.lua: the plan file is fifo, not a regular file" },
  }
  for _, c in ipairs(cases) do
    local rc, err = run(c[1])
    H.eq(rc, 2, c[1] .. " exit status (" .. err .. ")")
    assert(err:find(c[2], 1, true), c[1] .. ": message lacks '" .. c[2] .. "': " .. err)
  end
  sh("rm -rf " .. d)
end

-- A FIFO planted in OUTDIR under a generated file's name is replaced, not
-- read (check mode reports it stale).
function T.fifo_in_outdir_is_not_read()
  local d = tmpdir()
  assert(sh("cp -r plans/single " .. d .. "/single && rm " .. d .. "/single/plan.c && mkfifo " .. d .. "/single/plan.c"))
  local rc, err = run("lua5.4 gen/commplan.lua --check plans/single.lua " .. d .. "/single")
  H.eq(rc, 1, "check mode: " .. err)
  assert(err:find("stale generated files: " .. d .. "/single/plan.c", 1, true), err)
  rc, err = run("lua5.4 gen/commplan.lua plans/single.lua " .. d .. "/single")
  H.eq(rc, 0, "generation over it: " .. err)
  rc = run("lua5.4 gen/commplan.lua --check plans/single.lua " .. d .. "/single")
  H.eq(rc, 0, "regenerated")
  sh("rm -rf " .. d)
end

-- --check's line names the command that regenerates OUTDIR: make only for this
-- tree's plans/<name>.lua into plans/<name> (make writes nowhere else); the
-- generator itself on PLAN and OUTDIR otherwise; --regen-command's when given.
function T.check_names_the_regenerating_command()
  local d = tmpdir()
  local rc, err = run("lua5.4 gen/commplan.lua --check plans/single.lua " .. d .. "/single")
  H.eq(rc, 1, "never generated: " .. err)
  assert(err:find("run lua5.4 gen/commplan.lua plans/single.lua " .. d .. "/single and commit", 1, true), err)
  assert(not err:find("make PLAN", 1, true), err)
  rc, err = run("lua5.4 gen/commplan.lua --check --regen-command 'commplan generate x/single.lua' plans/single.lua "
    .. d .. "/single")
  H.eq(rc, 1, "never generated: " .. err)
  assert(err:find("run commplan generate x/single.lua and commit", 1, true), err)
  rc, err = run("lua5.4 gen/commplan.lua --regen-command x plans/single.lua " .. d .. "/single")
  H.eq(rc, 2, "--regen-command without --check: " .. err)
  sh("rm -rf " .. d)
end

function T.stdout_write_errors_exit_2()
  for _, cmd in ipairs({ "lua5.4 gen/commplan.lua --version", "lua5.4 gen/verbs.lua diff plans/fsdp4.lua plans/fsdp4.lua",
                         "lua5.4 gen/verbs.lua advise plans/llama8b.lua" }) do
    local ph = assert(io.popen("timeout 20 " .. cmd .. " 2>&1 >/dev/full; echo rc=$?"))
    local out = ph:read("a")
    ph:close()
    assert(out:find("rc=2", 1, true), cmd .. " >/dev/full: " .. out)
    assert(out:find("cannot write standard output", 1, true), cmd .. ": " .. out)
  end
end

local function generic(world, topology)
  return string.format("return { world_size = %d, %s model = { family = 'generic', units = { "
    .. "{ name = 'root', params = { { name = 'w', shape = { 6, 4 } } } } } } }", world, topology or "")
end

function T.world_must_be_whole_nodes()
  H.plan_fails(generic(12), "plans/t.lua:1: world_size: world_size 12 is not a whole number of nodes of 8 GPUs",
    "the default", "set gpus_per_node")
  H.plan_fails(generic(12, "topology = {\n gpus_per_node = 8 },"),
    "plans/t.lua:2: topology.gpus_per_node: world_size 12 is not a whole number of nodes of 8 GPUs")
  H.eq(plan.from_source(generic(12, "topology = { gpus_per_node = 4 },"), "plans/t.lua").world_size, 12, "3 nodes of 4")
  H.eq(plan.from_source(generic(16), "plans/t.lua").world_size, 16, "2 nodes of 8")
  local ok, err = pcall(require("gen.advisor").report, io.open("plans/llama8b.lua"):read("a"), "plans/llama8b.lua",
    { world_size = 12 })
  H.eq(ok, false, "advise on 12 GPUs of 8-GPU nodes")
  assert(tostring(err.msg):find("12 GPUs are not a whole number of nodes of 8 GPUs", 1, true), tostring(err.msg))
end

function T.world_inside_one_node_is_a_warning()
  local p = plan.from_source(generic(6), "plans/t.lua")
  local md = audit.schedule_md(p, audit.fingerprint(p))
  assert(md:find("the world of 6 ranks uses 6 of one node's 8 GPUs", 1, true), "SCHEDULE.md lacks the partial-node warning")
  p = plan.from_source(generic(8), "plans/t.lua")
  md = audit.schedule_md(p, audit.fingerprint(p))
  assert(not md:find("of one node's", 1, true), "a full node is not warned about")
end

return T
