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
local plan = require("gen.plan")
local audit = require("gen.audit")
local json = require("gen.json")
local T = {}

local function sh(cmd) return os.execute(cmd) == true end
local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local tmpdir, write = H.tmpdir, H.write
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
  -- the same link named with a trailing / or /. (stat follows those to the directory)
  for _, form in ipairs({ "/linkdir/", "/linkdir/.", "/linkdir//./" }) do
    rc, err = run("lua5.4 gen/verbs.lua diff --svg " .. q(d .. form) .. " plans/fsdp4.lua plans/llama_tiny.lua")
    H.eq(rc, 2, "DIR a link as " .. form .. ": " .. err)
    assert(err:find("is a symbolic link, not a directory", 1, true), err)
    assert(not exists(d .. "/real/before.svg"), "nothing written through DIR's link as " .. form)
  end
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

-- ---- network figures: range-checked where they enter, rendered finitely ----

-- plans/llama_tiny_tp.lua (8 ranks, TP's activation collectives) over four
-- nodes of 2 GPUs, with a topology section: every output, in memory.
local function tp_plan(topology)
  local src = H.read("plans/llama_tiny_tp.lua"):gsub("training = {", "topology = { gpus_per_node = 2, " .. topology
    .. " },\n  training = {", 1)
  -- (the host link prices CPU offload's copies only: a plan that offloads)
  if topology:find("host_GBps", 1, true) then src = src:gsub("fsdp = {", "fsdp = { cpu_offload = true,", 1) end
  return src
end
local function all_outputs(src)
  return pcall(function()
    local p = plan.from_source(src, "plans/t.lua")
    local fp = audit.fingerprint(p)
    return { ["plan.json"] = audit.json(p, fp), ["SCHEDULE.md"] = audit.schedule_md(p, fp),
             ["trace.json"] = audit.trace_json(p, fp), ["timeline.svg"] = audit.timeline_svg(p, fp) }
  end)
end
-- Outputs free of inf and NaN, plan.json and trace.json valid JSON.
local function finite(files, what)
  for name, text in pairs(files) do
    for _, bad in ipairs({ "%f[%w]inf%f[%W]", "%f[%w]nan%f[%W]", "%f[%w]NaN%f[%W]", "%f[%w]Infinity%f[%W]" }) do
      local at = text:find(bad)
      if at then error(string.format("%s: %s holds %q", what, name, text:sub(math.max(1, at - 40), at + 10)), 2) end
    end
  end
  json.decode(files["plan.json"])
  json.decode(files["trace.json"])
end

-- Each figure of gen/hardware.lua's BOUNDS: tiny, huge, zero, negative,
-- NaN and infinite values are refused at load in one line naming the field;
-- the bounds themselves generate, every output finite.
function T.network_figures_refused_at_load_or_rendered_finitely()
  local bounds = require("gen.hardware").BOUNDS
  local alpha_beta = { intra_node_GBps = true, inter_node_GBps = true, latency_us = true }
  local fields = {}
  for f in pairs(bounds) do fields[#fields + 1] = f end
  table.sort(fields)
  for _, field in ipairs(fields) do
    local b = bounds[field]
    local section = (alpha_beta[field] and "collectives = 'alpha_beta', " or "") .. field .. " = "
    for _, v in ipairs({ "5e-324", "1e-300", "0", "-1", "0/0", "-(0/0)", "math.huge", "-math.huge", "1e308",
                         string.format("%.17g", b.min / 2), string.format("%.17g", b.max * 2) }) do
      local val = load("return " .. v)()
      local inside = val == val and val >= b.min and val <= b.max and (not b.int or math.tointeger(val))
      local ok, res = all_outputs(tp_plan(section .. v))
      if ok then
        assert(inside, string.format("%s = %s: accepted outside %s..%s", field, v, b.min, b.max))
        finite(res, field .. " = " .. v)
      else
        assert(util.is_plan_error(res), string.format("%s = %s: not a plan error: %s", field, v, tostring(res)))
        local msg = tostring(res)
        assert(not msg:find("\n") and msg:find("topology." .. field, 1, true), field .. " = " .. v .. ": " .. msg)
      end
    end
    for _, v in ipairs({ b.min, b.max }) do
      local ok, res = all_outputs(tp_plan(section .. string.format("%.17g", v)))
      assert(ok, string.format("%s = %s (a bound): %s", field, v, tostring(res)))
      finite(res, field .. " at its bound " .. v)
    end
  end
end

-- The slowest network every bound allows at once, on a multi-node plan:
-- every figure finite in every output (the step runs to ~1e10 us).
function T.slowest_network_renders_finitely()
  local ok, res = all_outputs(tp_plan("collectives = 'alpha_beta', intra_node_GBps = 0.01, inter_node_GBps = 0.01, "
    .. "latency_us = 1e6, gpu_TFLOPS = 0.01, mfu = 0.001, hbm_GBps = 0.1, gpu_memory_GB = 1e-9"))
  assert(ok, tostring(res))
  finite(res, "alpha-beta at its bounds")
  ok, res = all_outputs(tp_plan("nic_Gbps = 10, nvlink_GBps = 5, nvlinks = 1, nics_per_node = 1, pci_GBps = 1, "
    .. "net_latency_us = 1e6"))
  assert(ok, tostring(res))
  finite(res, "NCCL's model at its bounds")
end

-- Where a figure enters other than through a plan (a caller's own
-- topology), and where a renderer would take one: an internal error that
-- says what, never invalid JSON, a nil crash or "inf" in an SVG.
function T.renderers_refuse_non_finite_numbers()
  local nccl = require("gen.nccl_model")
  for _, over in ipairs({ { nic_Gbps = 0 }, { pci_GBps = 0 / 0 }, { nvlink_GBps = math.huge }, { nvlinks = 0.5 },
                          { net_latency_us = -1 } }) do
    local ok, err = pcall(nccl.topology, "h100", over)
    assert(not ok and tostring(err):find("internal error: gen/nccl_model.lua topology: .* is outside"), tostring(err))
  end
  for _, v in ipairs({ 0 / 0, math.huge, -math.huge, "nil" }) do
    local x = v ~= "nil" and v or nil
    local ok, err = pcall(json.number, x)
    assert(not ok and tostring(err):find("internal error: gen/json.lua: cannot write", 1, true), tostring(err))
    ok, err = pcall(json.encode, { a = { 1, x or 0 / 0 } })
    assert(not ok and tostring(err):find("not a finite number", 1, true), tostring(err))
    ok, err = pcall(require("gen.figures").round, v ~= "nil" and v or "x")
    assert(not ok and tostring(err):find("internal error: gen/figures.lua", 1, true), tostring(err))
  end
  H.eq(require("gen.figures").round(nil), nil, "a figure the plan does not have")
end

-- ---- loss_chunks without seq_len ----

-- training.loss_chunks on a plan without model.seq_len is judged on the
-- seq_len the rest of the plan assumes (torchtitan's default, gen/compute.lua's
-- DEFAULTS): refused or accepted exactly as the same plan with it given.
function T.loss_chunks_without_seq_len_as_with_the_default()
  local default = require("gen.compute").DEFAULTS.seq_len
  H.eq(default, 2048, "torchtitan's training.seq_len")
  local base = H.read("plans/llama_tiny.lua")
  local without = base:gsub(", seq_len = 128", "", 1)
  assert(not without:find("seq_len", 1, true), "the base without seq_len")
  local given = base:gsub("seq_len = 128", "seq_len = " .. default, 1)
  for _, chunks in ipairs({ 1, 2, 3, 5, 7, 16, 24, 2048, 4096, 1 << 20 }) do
    local a_ok, a = pcall(plan.from_source, (without:gsub("loss_chunks = 1", "loss_chunks = " .. chunks)), "plans/t.lua")
    local b_ok, b = pcall(plan.from_source, (given:gsub("loss_chunks = 1", "loss_chunks = " .. chunks)), "plans/t.lua")
    H.eq(a_ok, b_ok, string.format("loss_chunks = %d without seq_len as with seq_len = %d (%s | %s)", chunks, default,
      a_ok and "ok" or tostring(a), b_ok and "ok" or tostring(b)))
    if not a_ok then
      assert(util.is_plan_error(a) and tostring(a):find("training.loss_chunks: loss_chunks=" .. chunks
        .. " does not divide seq_len=2048 (model.seq_len not set", 1, true), tostring(a))
    end
  end
end

-- ---- buffer sizes from a huge local_batch_size x seq_len ----

-- A TP, a CP, a pipeline and an EP plan (the shipped small plans), with the
-- local batch and seq_len given.
local BIG_BASES = {
  tp = function(b, seq)
    return (H.read("plans/llama_tiny_tp.lua"):gsub("local_batch_size = 2", "local_batch_size = " .. b)
      :gsub("seq_len = 32", "seq_len = " .. seq))
  end,
  cp = function(b, seq)
    return (H.read("tests/plans/llama_tiny_cp.lua"):gsub("local_batch_size = 2", "local_batch_size = " .. b)
      :gsub("seq_len = 512", "seq_len = " .. seq))
  end,
  pp = function(b, seq)
    return (H.read("plans/llama_tiny.lua"):gsub("parallel = { dp_shard = %-1 }", "parallel = { dp_shard = 2, pp = 2 },\n"
      .. "  pipeline = { schedule = '1F1B', microbatches = 2 }"):gsub("seq_len = 128", "seq_len = " .. seq)
      :gsub("loss_chunks = 1", "loss_chunks = 1, local_batch_size = " .. b))
  end,
  ep = function(b, seq)
    return (H.read("tests/plans/moe_mixtral_hsdp.lua"):gsub("dp_replicate = 2, dp_shard = %-1", "dp_shard = -1, ep = 2")
      :gsub("top_k = 2,", "top_k = 2, seq_len = " .. seq .. ",")
      :gsub("fsdp = {", "training = { local_batch_size = " .. b .. " },\n  fsdp = {"))
  end,
}

-- Past 2^53 elements (the proofs' bound) and past the activation bound:
-- one plan-error line naming training.local_batch_size, never an internal
-- error. The bases themselves, and a batch just inside, still generate.
-- An activation past 2^40 elements where the step's FLOPs stay under
-- 2^62 (a tiny model, a wide vocabulary): refused by the activations'
-- own bound, naming the widest row (without it the plan was accepted with
-- a 2^42-element buffer).
function T.activation_bound_alone()
  local src = "return { world_size = 4, parallel = { dp_shard = 4 }, model = { family = 'llama', dim = 64, "
    .. "n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 4096, seq_len = 1024 }, "
    .. "training = { local_batch_size = 1 << 20 } }"
  local ok, err = pcall(plan.from_source, src, "plans/t.lua")
  assert(not ok and util.is_plan_error(err), tostring(err))
  local msg = tostring(err)
  assert(msg:find("(vocab_size: 4096), is more than 1099511627776 (2^40) elements in one activation buffer", 1, true),
    msg)
end

function T.huge_batch_times_seq_len_is_a_plan_error()
  for _, kind in ipairs({ "tp", "cp", "pp", "ep" }) do
    local make = BIG_BASES[kind]
    for _, c in ipairs({ { 1 << 20, 1 << 30 }, { 1 << 20, 1 << 24 }, { 1024, 1 << 30 }, { 1 << 16, 1 << 24 },
                         { 4, 1 << 29 } }) do
      local ok, err = pcall(plan.from_source, make(c[1], c[2]), "plans/t.lua")
      H.eq(ok, false, string.format("%s plan, local_batch_size %d x seq_len %d", kind, c[1], c[2]))
      assert(util.is_plan_error(err), string.format("%s plan, %d x %d: not a plan error: %s", kind, c[1], c[2],
        tostring(err)))
      local msg = tostring(err)
      assert(not msg:find("\n") and msg:find("training.local_batch_size: local_batch_size " .. c[1] .. " x seq_len "
        .. c[2], 1, true) and msg:find("; lower training.local_batch_size", 1, true), msg)
    end
    -- inside the bounds: generated, every output finite (no count past 2^53 reaches the proofs)
    local ok, res = all_outputs(make(64, 1 << 16))
    if kind == "pp" then
      -- a pipeline plan's tables, in memory
      ok, res = pcall(plan.from_source, make(64, 1 << 16), "plans/t.lua")
    else
      finite(ok and res or {}, kind .. " plan inside the bounds")
    end
    assert(ok, kind .. " plan inside the bounds: " .. tostring(res))
  end
end

-- The CLI says it in one line, exit 2 (the proof caught it before as
-- "internal error (plan verification failed)").
function T.huge_batch_cli_one_line()
  local d = tmpdir()
  for _, kind in ipairs({ "tp", "ep" }) do
    write(d .. "/" .. kind .. ".lua", BIG_BASES[kind](1 << 20, 1 << 30))
    local rc, err = run("lua5.4 gen/commplan.lua " .. q(d .. "/" .. kind .. ".lua") .. " " .. q(d .. "/out"))
    H.eq(rc, 2, kind .. ": " .. err)
    one_line(err, kind .. " plan")
    assert(err:find("training.local_batch_size:", 1, true), err)
    assert(not exists(d .. "/out"), "nothing written")
  end
  sh("rm -rf " .. q(d))
end

return T
