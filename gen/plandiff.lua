-- Plan diff: what a reviewer must know when a plan changes, from two
-- plan.json documents (a plan file is generated in memory first; a
-- committed plan at a git revision is read with `git show REV:path`):
-- world and mesh, groups, bytes per family, memory, predicted and exposed
-- time, warnings, and the ops and unit layouts added, removed or changed,
-- with runs of units folded (`layers.0-79`).
local json = require("gen.json")
local util = require("gen.util")
local fsio = require("gen.fsio")

local plandiff = {}

local function human(bytes)
  return require("gen.audit").human(bytes)
end
local function us_text(us) return require("gen.audit").us_text(us) end

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function fail(msg) util.plan_error(msg) end

-- An operand: a plan file (16 MiB at most, as the generator takes) or a
-- plan.json (256 MiB); nil when there is no such file (REV:path then).
local MAX_BYTES = 256 << 20
local function read_operand(path)
  if not fsio.stat(path) then return nil end
  local limit = path:match("%.lua$") and (16 << 20) or MAX_BYTES
  local src, why = fsio.read_regular(path, limit)
  if not src then
    fail(string.format("%s: the operand %s; give a plan file, a plan.json or REV:plans/<name>/plan.json",
      fsio.shown(path), why))
  end
  return src
end

-- `git show REV:PATH` (REV and PATH checked as text, then quoted); nil
-- when it finds nothing and `optional`.
local function git_show(rev, path, optional)
  if not rev:match("^[%w%._/~^@{}%-]+$") or rev:sub(1, 1) == "-" then
    fail(rev .. ": not a git revision name (letters, digits and . _ / ~ ^ @ { } - only)")
  end
  if not path:match("^[%w%._/%+%-]+$") or path:sub(1, 1) == "-" then
    fail(path .. ": a path in the repository is made of letters, digits and . _ / + - only")
  end
  local ph = io.popen("git show " .. sh_quote(rev .. ":" .. path) .. " 2>/dev/null")
  local out = ph and ph:read(MAX_BYTES + 1)
  local ok = ph and ph:close()
  if out and #out > MAX_BYTES then fail(string.format("%s:%s: more than %s; not a plan.json", rev, path, fsio.human(MAX_BYTES))) end
  if not ok or not out or out == "" then
    if optional then return nil end
    fail(string.format("%s:%s: git show found nothing; commit the plan's generated output or name another revision",
      rev, path))
  end
  return out
end

-- How a plan at a git revision reads its own files (pipeline.csv): from
-- that revision's tree, under the rule a plan on disk follows (plain names
-- below its directory, a regular file: a link's tree entry is refused,
-- bounded), never from today's working tree.
function plandiff.rev_reader(rev, plan_path)
  local dir = plan_path:match("^(.*)/[^/]*$")
  return function(rel, max_bytes)
    local parts, why = fsio.below_parts(rel)
    if not parts then return nil, why end
    local path = (dir and (dir .. "/") or "") .. table.concat(parts, "/")
    local ph = io.popen("git ls-tree " .. sh_quote(rev) .. " -- " .. sh_quote(path) .. " 2>/dev/null")
    local out = ph and ph:read(8192) or ""
    if ph then ph:close() end
    local mode, kind, hash = out:match("^(%d+) (%a+) (%x+)\t")
    if not mode then return nil, "does not exist at revision " .. rev end
    if mode == "120000" then return nil, "is a symlink at revision " .. rev .. "; a plan reads only its own files" end
    if kind ~= "blob" then return nil, "is not a regular file at revision " .. rev end
    ph = io.popen("git cat-file blob " .. hash .. " 2>/dev/null")
    local text = ph and ph:read(max_bytes + 1) or ""
    if ph then ph:close() end
    if #text > max_bytes then
      return nil, string.format("has more than the %s allowed at revision %s", fsio.human(max_bytes), rev)
    end
    return text
  end
end

-- A plan.json document from a plan file's source (generated in memory),
-- and the plan; rev: the git revision it was read at, if any.
function plandiff.doc_from_source(src, path, rev)
  local plan = require("gen.plan")
  local audit = require("gen.audit")
  local p = plan.from_source(src, path, rev and { read_beside = plandiff.rev_reader(rev, path) } or nil)
  p.source_file = path
  return json.decode(audit.json(p, audit.fingerprint(p))), p
end

-- An operand's source and the path it names: a file, or REV:path.
local function operand_source(spec)
  local src = read_operand(spec)
  if src then return src, spec, nil end
  local rev, path = spec:match("^([^:]+):(.+)$")
  if not rev then
    fail((spec == "" and "an empty operand" or fsio.shown(spec))
      .. ": no such file; give a plan file, a plan.json or REV:plans/<name>/plan.json")
  end
  return git_show(rev, path), path, rev
end

-- spec: PLAN.lua, plan.json, or REV:path (either kind) -> doc, label,
-- and the plan when spec is a plan file.
-- Two pipeline plans (parallel.pp > 1) compared by their own schedules'
-- predictions (gen/parallel/pp_report.lua): nil when neither operand is
-- one; a pipeline plan against a plan without pp is refused (e.g. REV:
-- plans/llama405b.lua from before it became the pipeline plan).
function plandiff.pipeline_compare(sa, sb)
  local load = require("gen.load")
  local sides = {}
  for i, spec in ipairs({ sa, sb }) do
    local src, path, rev = operand_source(spec)
    if path:match("%.lua$") then
      local loaded = load.source(src, path, rev and plandiff.rev_reader(rev, path) or nil)
      if (loaded.parallel.pp or 1) > 1 then sides[i] = loaded end
    end
  end
  if not sides[1] and not sides[2] then return nil end
  if not (sides[1] and sides[2]) then
    local other, piped = sides[1] and sb or sa, sides[1] and sa or sb
    fail(string.format("%s: not a pipeline plan, while %s is one (parallel.pp > 1); compare two pipeline plans, or "
      .. "two plans without pp (at a git revision, a plan of the same name may have been the other kind)", other,
      piped))
  end
  local report = require("gen.pipeline")
  local a, b = report.plan_row(sides[1]), report.plan_row(sides[2])
  local L = { string.format("pipeline %s -> %s (make pipeline shows every schedule)", sa, sb) }
  local function row(label, x, y) L[#L + 1] = string.format("  %s: %s", label, x == y and x or (x .. " -> " .. y)) end
  row("schedule", a.name, b.name)
  row("pp x microbatches", a.pp .. " x " .. a.microbatches, b.pp .. " x " .. b.microbatches)
  if a.refused or b.refused then
    row("proof", a.refused and ("refused: " .. a.refused) or "passed", b.refused and ("refused: " .. b.refused) or "passed")
    return table.concat(L, "\n") .. "\n"
  end
  row("stages", string.format("%d (%d per rank)", a.stages, a.per), string.format("%d (%d per rank)", b.stages, b.per))
  row("bubble", string.format("%.1f%%", 100 * a.sim.bubble), string.format("%.1f%%", 100 * b.sim.bubble))
  row("step", report.human_us(a.sim.step_us), report.human_us(b.sim.step_us))
  row("activations in flight (worst rank)", report.human_bytes(a.worst_bytes), report.human_bytes(b.worst_bytes))
  row("memory (worst rank)", report.human_bytes(a.mem) .. (a.fits and "" or " DOES NOT FIT"),
    report.human_bytes(b.mem) .. (b.fits and "" or " DOES NOT FIT"))
  row("p2p per rank", report.human_bytes(a.sends * a.act), report.human_bytes(b.sends * b.act))
  row("proof", "passed", "passed")
  return table.concat(L, "\n") .. "\n"
end

function plandiff.load(spec)
  local src, path, rev = operand_source(spec)
  if path:match("%.lua$") then
    local doc, p = plandiff.doc_from_source(src, path, rev)
    return doc, spec, p
  end
  local ok, doc = pcall(json.decode, src)
  if not ok or type(doc) ~= "table" or not doc.ops then fail(spec .. ": not a commplan plan.json") end
  if doc.schema ~= 2 then
    fail(string.format("%s: plan.json schema %s; this diff reads schema 2 (regenerate it: make regen-all)",
      spec, tostring(doc.schema)))
  end
  -- A plan.json is input like any other: held to its published schema
  -- before the diff reads a field of it (a document with schema 2 and no
  -- mesh was an internal error).
  local err = require("gen.jsonschema").validate(doc, plandiff.schema())
  if err then
    fail(string.format("%s: not a plan.json commplan wrote (%s); regenerate it with make regen-all or name the "
      .. "committed one", spec, fsio.shown(err):sub(1, 160)))
  end
  return doc, spec
end

-- docs/plan-json.schema.json, found beside gen/ (read once).
local SCHEMA
function plandiff.schema()
  if not SCHEMA then
    local root = debug.getinfo(1, "S").source:match("^@(.*)/gen/plandiff%.lua$") or "."
    local text, why = fsio.read_regular(root .. "/docs/plan-json.schema.json", 1 << 20)
    if not text then fail("docs/plan-json.schema.json " .. why .. "; it ships with commplan, restore it") end
    SCHEMA = json.decode(text)
  end
  return SCHEMA
end

-- An operand's timeline.svg (gen/svg.lua) and a note, or nil: a plan
-- file's is drawn from it (p: the plan load() generated); a plan.json's
-- is the timeline.svg beside it (at the same revision for REV:path); one
-- generated before timeline.svg existed has none, and its plan file
-- (plans/<name>.lua beside plans/<name>/) is drawn by this generator
-- instead, which the note says.
function plandiff.svg_of(spec, p)
  local audit = require("gen.audit")
  if p then return audit.timeline_svg(p, audit.fingerprint(p)) end
  local _, path, rev = operand_source(spec)
  local dir = path:match("^(.*)/[^/]+$") or "."
  local function get(rel)
    if rev then return git_show(rev, rel, true) end
    return fsio.stat(rel) and read_operand(rel) or nil
  end
  local s = get(dir .. "/timeline.svg")
  if s then return s end
  local plan_path = dir .. ".lua"
  local src = dir ~= "." and get(plan_path)
  if not src then
    fail(string.format("%s: no timeline.svg beside it and no plan file %s%s to draw one from; give the plan file",
      spec, rev and (rev .. ":") or "", plan_path))
  end
  local q = require("gen.plan").from_source(src, plan_path,
    rev and { read_beside = plandiff.rev_reader(rev, plan_path) } or nil)
  q.source_file = plan_path
  return audit.timeline_svg(q, audit.fingerprint(q)),
    string.format("%s has no timeline.svg (generated before it existed): drawn from %s%s by this generator", spec,
      rev and (rev .. ":") or "", plan_path)
end

-- ---- text helpers ----

local function pct(a, b)
  if a == b then return "" end
  if a == 0 then return " (new)" end
  return string.format(" (%+.1f%%)", 100 * (b - a) / a)
end

local function arrow(a, b, fmt)
  fmt = fmt or tostring
  if a == b then return fmt(a) end
  return fmt(a) .. " -> " .. fmt(b)
end

-- Unit names folded, each name once: `layers.0-3,5, root` (a unit met
-- again, in another micro-step or phase, is not listed again).
function plandiff.names_text(names)
  local by_tpl, order, plain, seen = {}, {}, {}, {}
  for _, n in ipairs(names) do
    local pre, num, post = n:match("^(.-)(%d+)([^%d]*)$")
    if not seen[n] and pre then
      local tpl = pre .. "#" .. post
      if not by_tpl[tpl] then by_tpl[tpl] = {}; order[#order + 1] = tpl end
      table.insert(by_tpl[tpl], tonumber(num))
    elseif not seen[n] then
      plain[#plain + 1] = n
    end
    seen[n] = true
  end
  local out = {}
  for _, tpl in ipairs(order) do
    local nums = by_tpl[tpl]
    table.sort(nums)
    local parts, i = {}, 1
    while i <= #nums do
      local j = i
      while j < #nums and nums[j + 1] == nums[j] + 1 do j = j + 1 end
      parts[#parts + 1] = i == j and tostring(nums[i]) or (nums[i] .. "-" .. nums[j])
      i = j + 1
    end
    out[#out + 1] = (tpl:gsub("#", table.concat(parts, ","), 1))
  end
  for _, n in ipairs(plain) do out[#out + 1] = n end
  return table.concat(out, ", ")
end

local function mesh_text(doc)
  local t = {}
  for i, n in ipairs(doc.mesh.names) do t[#t + 1] = n .. "=" .. doc.mesh.sizes[i] end
  return table.concat(t, " x ")
end

local function by_key(list, key)
  local t = {}
  for _, x in ipairs(list or {}) do t[x[key]] = x end
  return t
end

local function keys_union(a, b, order_a, order_b)
  local seen, out = {}, {}
  for _, list in ipairs({ order_a, order_b }) do
    for _, k in ipairs(list) do
      if not seen[k] and (a[k] or b[k]) then seen[k] = true; out[#out + 1] = k end
    end
  end
  return out
end

local function names_of(list, key)
  local t = {}
  for _, x in ipairs(list or {}) do t[#t + 1] = x[key] end
  return t
end

local function scalar_diffs(a, b, keys)
  local out = {}
  for _, k in ipairs(keys) do
    local x, y = a and a[k], b and b[k]
    if x == json.null then x = nil end
    if y == json.null then y = nil end
    if x ~= y then out[#out + 1] = string.format("%s %s -> %s", k, tostring(x), tostring(y)) end
  end
  return out
end

local function sorted_keys_of(...)
  local seen, out = {}, {}
  for i = 1, select("#", ...) do
    local t = select(i, ...)
    for k in pairs(t or {}) do if not seen[k] then seen[k] = true; out[#out + 1] = k end end
  end
  table.sort(out)
  return out
end

-- Entries that say the same thing of several names, as one: entries
-- { name = ..., ... } grouped by key(entry), in the order first met ->
-- { first = the first entry, names = every entry's name }.
function plandiff.fold_same(entries, key)
  local out, at = {}, {}
  for _, e in ipairs(entries) do
    local k = key(e)
    if not at[k] then
      at[k] = { first = e, names = {} }
      out[#out + 1] = at[k]
    end
    table.insert(at[k].names, e.name)
  end
  return out
end

-- A word that is a figure (`291.48`, `(12.95`, `62,`), and that figure.
local function figure_of(word)
  if not word then return nil end
  local core = word:gsub("^%(", ""):gsub("[,;:%)]+$", "")
  return core:match("^%d[%d%.]*$")
end

-- The units the audit writes after a figure: a figure and its unit are
-- one token, so `511.18 ms` and `1.92 s` are the same place in a text.
local UNITS = { B = true, KiB = true, MiB = true, GiB = true, TiB = true, us = true, ms = true, s = true }

-- A text as tokens: { text = the words as written, figure = the figure
-- and its unit (`511.18 ms`) or nil, shape = the words with '#' for the
-- figure and its unit }.
local function tokens(text)
  local words, out = {}, {}
  for word in text:gmatch("%S+") do words[#words + 1] = word end
  local i = 1
  while i <= #words do
    local word, fig = words[i], figure_of(words[i])
    local unit = fig and word:match("%d$") and words[i + 1] and words[i + 1]:match("^(%a+)[,;:%)]*$")
    if unit and UNITS[unit] then
      local tail = words[i + 1]:sub(#unit + 1)
      out[#out + 1] = { text = word .. " " .. words[i + 1], figure = fig .. " " .. unit, shape = "#" .. tail,
                        lead = word:match("^%(") or "", tail = tail }
      i = i + 2
    else
      local lead, tail = "", ""
      if fig then lead, tail = word:match("^(%(?)"), word:match("([,;:%)]*)$") end
      out[#out + 1] = { text = word, figure = fig, shape = fig and (lead .. "#" .. tail) or word, lead = lead,
                        tail = tail }
      i = i + 1
    end
  end
  return out
end

-- A text's shape: its words with every figure (and its unit) as '#': two
-- warnings of one shape say the same thing (the op kind, units and cause)
-- with other figures.
function plandiff.figure_shape(text)
  local t = {}
  for _, tok in ipairs(tokens(text)) do t[#t + 1] = tok.shape end
  return table.concat(t, " ")
end

-- Two texts of one shape as one, each figure that changed as `a -> b`.
function plandiff.figures_text(a, b)
  local ta, out = tokens(a), {}
  for i, tok in ipairs(tokens(b)) do
    local x = ta[i] and ta[i].figure
    out[#out + 1] = (x and tok.figure and x ~= tok.figure) and (tok.lead .. x .. " -> " .. tok.figure .. tok.tail)
      or tok.text
  end
  return table.concat(out, " ")
end

-- Warnings that went (-), came (+), and those that stayed with other
-- figures (~, one line each: a one-knob change moves every figure of a
-- warning, and a - line beside its + line would say it twice).
function plandiff.warnings_lines(list_a, list_b)
  local in_a, in_b = {}, {}
  for _, s in ipairs(list_a) do in_a[s] = true end
  for _, s in ipairs(list_b) do in_b[s] = true end
  local came = {}
  for i, s in ipairs(list_b) do
    if not in_a[s] then
      local k = plandiff.figure_shape(s)
      came[k] = came[k] or {}
      table.insert(came[k], i)
    end
  end
  local L, paired = {}, {}
  for _, s in ipairs(list_a) do
    if not in_b[s] then
      local j = table.remove(came[plandiff.figure_shape(s)] or {}, 1)
      if j then
        paired[j] = true
        L[#L + 1] = "  ~ " .. plandiff.figures_text(s, list_b[j])
      else
        L[#L + 1] = "  - " .. s
      end
    end
  end
  for i, s in ipairs(list_b) do
    if not in_a[s] and not paired[i] then L[#L + 1] = "  + " .. s end
  end
  return L
end

-- ---- the comparison ----

-- The plan's own settings in plan.json sections that also hold derived
-- figures: a one-knob change there (capacity, schedule, microbatches) is
-- named in the settings line, as a parallel or fsdp setting is.
plandiff.SECTION_KNOBS = {
  { "expert_parallel", { "capacity_policy", "capacity_factor" } },
  { "pipeline", { "schedule", "microbatches", "layers_per_stage", "first_stage_less_layers", "last_stage_less_layers",
                  "csv" } },
}

function plandiff.compare(a, b, la, lb)
  local L = {}
  local function w(fmt, ...) L[#L + 1] = select("#", ...) > 0 and string.format(fmt, ...) or fmt end
  w("plan diff: %s -> %s", la or a.plan, lb or b.plan)
  if a.fingerprint == b.fingerprint then
    w("fingerprint %s: the same tables (audit figures may differ)", a.fingerprint)
  else
    w("fingerprint %s -> %s: every rank must run the new tables", a.fingerprint, b.fingerprint)
  end
  w("world %s; mesh %s", arrow(a.world_size, b.world_size), arrow(mesh_text(a), mesh_text(b)))
  -- Settings that changed.
  local changed = {}
  for _, sec in ipairs({ "parallel", "fsdp", "topology" }) do
    for _, d in ipairs(scalar_diffs(a[sec], b[sec], sorted_keys_of(a[sec], b[sec]))) do
      changed[#changed + 1] = sec .. "." .. d
    end
  end
  -- A section's knobs, not its derived figures (expert_parallel's bytes and
  -- rows follow from ep and these; they show in the rows below).
  for _, sk in ipairs(plandiff.SECTION_KNOBS) do
    for _, d in ipairs(scalar_diffs(a[sk[1]], b[sk[1]], sk[2])) do changed[#changed + 1] = sk[1] .. "." .. d end
  end
  local sa, sb = a.audit and a.audit.settings, b.audit and b.audit.settings
  for _, d in ipairs(scalar_diffs(sa, sb, sorted_keys_of(sa, sb))) do changed[#changed + 1] = d end
  if #changed > 0 then w("settings: %s", table.concat(changed, "; ")) end
  -- Groups.
  w("")
  w("groups:")
  local ga, gb = by_key(a.groups, "name"), by_key(b.groups, "name")
  local glines = {}
  for _, name in ipairs(keys_union(ga, gb, names_of(a.groups, "name"), names_of(b.groups, "name"))) do
    local x, y = ga[name], gb[name]
    if not x then
      glines[#glines + 1] = { prefix = "+ ", name = name, text = string.format(": %d ranks x %d groups, %s", y.size,
        y.count, y.intra_node and "intra-node" or (y.nodes_per_group .. " nodes per group")) }
    elseif not y then
      glines[#glines + 1] = { prefix = "- ", name = name, text = string.format(" (was %d ranks x %d groups)", x.size,
        x.count) }
    elseif x.size ~= y.size or x.count ~= y.count or x.nodes_per_group ~= y.nodes_per_group
        or x.intra_node ~= y.intra_node then
      glines[#glines + 1] = { prefix = "", name = name, text = string.format(": size %s, groups %s, nodes per group %s%s",
        arrow(x.size, y.size), arrow(x.count, y.count), arrow(x.nodes_per_group, y.nodes_per_group),
        x.intra_node ~= y.intra_node and (y.intra_node and "; now intra-node" or "; now crosses nodes") or "") }
    end
  end
  -- a mesh change resizes every group over the same dimensions alike
  -- (dp_shard, fsdp, dp, loss): one line for them
  for _, e in ipairs(plandiff.fold_same(glines, function(e) return e.prefix .. e.text end)) do
    w("  %s%s%s", e.first.prefix, table.concat(e.names, ", "), e.first.text)
  end
  if #glines == 0 then w("  unchanged") end
  -- Bytes and time per family: plan.json's audit.by_group, SCHEDULE.md's
  -- rows (gen/figures.lua).
  w("")
  w("per rank per step (collectives, buffer bytes, wire bytes; time alone, in the step, exposed):")
  local rows_a, rows_b = plandiff.group_rows(a, "A"), plandiff.group_rows(b, "B")
  if rows_a.note then w("  (%s)", rows_a.note) end
  if rows_b.note then w("  (%s)", rows_b.note) end
  local fa, fb = by_key(rows_a, "group"), by_key(rows_b, "group")
  local zero = { ops = 0, recomputed_ops = 0, size_bytes = 0, wire_bytes = 0, alone_us = 0, predicted_us = 0,
                 exposed_us = 0 }
  for _, name in ipairs(keys_union(fa, fb, names_of(rows_a, "group"), names_of(rows_b, "group"))) do
    local x, y = fa[name] or zero, fb[name] or zero
    local function ops_text(r)
      return r.recomputed_ops > 0 and string.format("%d + %d recomputed", r.ops, r.recomputed_ops) or tostring(r.ops)
    end
    w("  %s: %s ops; %s -> %s%s; wire %s -> %s; alone %s -> %s; in the step %s -> %s%s; exposed %s -> %s",
      name, arrow(ops_text(x), ops_text(y)), human(x.size_bytes), human(y.size_bytes), pct(x.size_bytes, y.size_bytes),
      human(x.wire_bytes), human(y.wire_bytes), us_text(x.alone_us), us_text(y.alone_us), us_text(x.predicted_us),
      us_text(y.predicted_us), pct(x.predicted_us, y.predicted_us), us_text(x.exposed_us), us_text(y.exposed_us))
  end
  -- Memory and time.
  local ma, mb = a.audit and a.audit.memory, b.audit and b.audit.memory
  if ma and mb then
    w("")
    w("memory per rank:")
    for _, k in ipairs({ "params_bytes", "grads_bytes", "optimizer_bytes", "comm_bytes", "activation_bytes" }) do
      if ma[k] ~= mb[k] then
        w("  %s: %s -> %s%s", k:gsub("_bytes$", ""), human(ma[k]), human(mb[k]), pct(ma[k], mb[k]))
      end
    end
    w("  total: %s -> %s%s of %s; %s", human(ma.total_bytes), human(mb.total_bytes), pct(ma.total_bytes, mb.total_bytes),
      human(mb.gpu_bytes), arrow(ma.fits and "fits" or "DOES NOT FIT", mb.fits and "fits" or "DOES NOT FIT"))
  end
  local ta, tb = a.audit and a.audit.timeline, b.audit and b.audit.timeline
  if ta and tb then
    w("")
    w("time per step:")
    for _, k in ipairs({ { "step_us", "step" }, { "compute_us", "compute" },
                         { "exposed_comm_us", "communication exposed" }, { "waits_other_us", "other waits" },
                         { "comm_us", "communication in the step" }, { "comm_alone_us", "communication alone" } }) do
      local x, y = ta[k[1]], tb[k[1]]
      if x ~= nil or y ~= nil then
        local function t(v) return v == nil and "-" or us_text(v) end
        w("  %s: %s -> %s%s", k[2], t(x), t(y), (x and y) and pct(x, y) or "")
      end
    end
    plandiff.throughput_lines(a.audit.throughput, b.audit.throughput, w)
  end
  -- Ops.
  w("")
  plandiff.ops_diff(a, b, w)
  plandiff.units_diff(a, b, w)
  -- Warnings.
  local wl = plandiff.warnings_lines(a.audit and a.audit.warnings or {}, b.audit and b.audit.warnings or {})
  if #wl > 0 then
    w("")
    w("warnings (- gone, + new, ~ the same with other figures):")
    for _, line in ipairs(wl) do w("%s", line) end
  end
  return table.concat(L, "\n") .. "\n"
end

-- Throughput before and after (plan.json's audit.throughput, torchtitan's
-- tps and MFU for the predicted step): a step that doubles with the tokens
-- it carries reads as the same tokens/s. "-" where a side has no figure
-- (a plan.json from before it, or a model whose FLOPs per token are not known).
function plandiff.throughput_lines(ta, tb, w)
  ta, tb = ta or {}, tb or {}
  local function tps(v) return v == nil and "-" or plandiff.commas(v) end
  local function mfu(v) return v == nil and "-" or string.format("%.2f%%", 100 * v) end
  local x, y = ta.tokens_per_s_per_gpu, tb.tokens_per_s_per_gpu
  w("  tokens/s per GPU: %s -> %s%s", tps(x), tps(y), (x and y) and pct(x, y) or "")
  x, y = ta.mfu, tb.mfu
  w("  MFU: %s -> %s%s", mfu(x), mfu(y), (x and y) and string.format(" (%+.2f points)", 100 * (y - x)) or "")
end

-- A number rounded to a whole and written with thousands separators.
function plandiff.commas(n)
  local s = string.format("%d", math.floor(n + 0.5))
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^,", ""):gsub("^%-,", "-"))
end

-- A plan.json's figures per group family: audit.by_group (gen/figures.lua,
-- as SCHEDULE.md shows them); a plan.json from before it gets the older
-- audit's (per_rank_per_step with recompute_by_group, exposed_by_group)
-- and a note saying so.
function plandiff.group_rows(doc, label)
  local au = doc.audit or {}
  if au.by_group then return au.by_group end
  local rec = by_key(au.recompute_by_group, "group")
  local exp = {}
  for _, e in ipairs(au.timeline and au.timeline.exposed_by_group or {}) do exp[e.group] = e.us end
  local rows = {}
  for _, g in ipairs(doc.per_rank_per_step.by_group) do
    local r = rec[g.group] or { ops = 0, size_bytes = 0, wire_bytes = 0, predicted_us = 0 }
    local us = g.predicted_us + r.predicted_us
    rows[#rows + 1] = { group = g.group, ops = g.ops, recomputed_ops = r.ops, size_bytes = g.size_bytes + r.size_bytes,
      wire_bytes = g.wire_bytes + r.wire_bytes, alone_us = us, predicted_us = us, exposed_us = exp[g.group] or 0 }
  end
  rows.note = label .. "'s plan.json predates audit.by_group: its time in the step is its time alone, its exposed "
    .. "time the older audit's"
  return rows
end

-- Ops matched by (kind, unit, phase, micro_step, group): added, removed,
-- and matched ops whose size, stream or group changed, folded by units.
function plandiff.ops_diff(a, b, w)
  local function key(o) return table.concat({ o.kind, o.phase, o.micro_step, o.unit }, "|") end
  local ia = {}
  for _, o in ipairs(a.ops) do
    local k = key(o)
    ia[k] = ia[k] or {}
    table.insert(ia[k], o)
  end
  local added, changes, order = {}, {}, {}
  local used = {}
  for _, o in ipairs(b.ops) do
    local k = key(o)
    local list = ia[k]
    local x = list and table.remove(list, 1)
    if not x then
      local g = o.kind .. " (" .. o.phase .. ")"
      if not added[g] then added[g] = {}; order[#order + 1] = "+" .. g end
      table.insert(added[g], o.unit)
    else
      used[x] = true
      local diffs = {}
      local function cmp(field, fmt)
        local p, q = x[field], o[field]
        if p == json.null then p = nil end
        if q == json.null then q = nil end
        if p ~= q then diffs[#diffs + 1] = field .. " " .. (fmt and p and fmt(p) or tostring(p)) .. " -> "
          .. (fmt and q and fmt(q) or tostring(q)) end
      end
      cmp("group"); cmp("stream"); cmp("dtype"); cmp("count"); cmp("size_bytes", human)
      if #diffs > 0 then
        -- One line per change, listing the op kinds and units it touches.
        local g = table.concat(diffs, ", ")
        if not changes[g] then
          changes[g] = { kinds = {}, kind_order = {}, units = {}, seen = {}, n = 0 }
          order[#order + 1] = "~" .. g
        end
        local c = changes[g]
        local kp = o.kind .. " (" .. o.phase .. ")"
        if not c.kinds[kp] then c.kinds[kp] = true; c.kind_order[#c.kind_order + 1] = kp end
        if not c.seen[o.unit] then c.seen[o.unit] = true; c.units[#c.units + 1] = o.unit end
        c.n = c.n + 1
      end
    end
  end
  local removed = {}
  for _, o in ipairs(a.ops) do
    if not used[o] then
      local g = o.kind .. " (" .. o.phase .. ")"
      if not removed[g] then removed[g] = {}; order[#order + 1] = "-" .. g end
      table.insert(removed[g], o.unit)
    end
  end
  -- Matched ops present in both but reordered or re-waited are counted.
  local wa, wb = 0, 0
  for _, o in ipairs(a.ops) do wa = wa + #(o.waits_for or {}) end
  for _, o in ipairs(b.ops) do wb = wb + #(o.waits_for or {}) end
  w("ops: %s; event waits %s", arrow(#a.ops, #b.ops), arrow(wa, wb))
  if #order == 0 then w("  no op added, removed or resized") end
  -- Op kinds added (or removed) as many times over the same units fold
  -- into one line: an expert block's fourteen kinds are one change.
  local lines = {}
  for _, g in ipairs(order) do
    local sign, name = g:sub(1, 1), g:sub(2)
    if sign == "~" then
      local c = changes[name]
      lines[#lines + 1] = { name = g, text = string.format("  changed %s: %s x%d: %s", name,
        table.concat(c.kind_order, ", "), c.n, plandiff.names_text(c.units)) }
    else
      local units = sign == "+" and added[name] or removed[name]
      lines[#lines + 1] = { name = name, n = #units, text = string.format("%s x%%s%%s: %s",
        sign == "+" and "added" or "removed", plandiff.names_text(units)) }
    end
  end
  for _, e in ipairs(plandiff.fold_same(lines, function(e) return e.n and (e.n .. e.text) or e.name end)) do
    local f = e.first
    if not f.n then w("%s", f.text)
    else
      local verb, rest = f.text:match("^(%a+)(.*)$")
      w("  %s %s%s", verb, plandiff.kinds_text(e.names), string.format(rest, f.n, #e.names > 1 and " each" or ""))
    end
  end
end

-- Op kinds as `kind (phase)` names, those of one phase together:
-- `copy_in, all_gather (forward); copy_in (backward)`.
function plandiff.kinds_text(names)
  local out, kinds, phase = {}, {}, nil
  local function flush()
    if phase then out[#out + 1] = table.concat(kinds, ", ") .. " (" .. phase .. ")" end
  end
  for _, n in ipairs(names) do
    local kind, ph = n:match("^(.-) %((.*)%)$")
    if not kind then kind, ph = n, "" end
    if ph ~= phase then flush(); kinds, phase = {}, ph end
    kinds[#kinds + 1] = kind
  end
  flush()
  return table.concat(out, "; ")
end

-- Units of one layout (a list of units in forward order) against
-- another's: added or removed, and layout changes (slot numel, params'
-- shapes, padding) -> texts in order, the units of each.
local function unit_changes(a, b, list_a, list_b)
  local ua, ub = by_key(list_a, "name"), by_key(list_b, "name")
  local groups, order = {}, {}
  local function note(text, unit)
    if not groups[text] then groups[text] = {}; order[#order + 1] = text end
    table.insert(groups[text], unit)
  end
  for _, name in ipairs(keys_union(ua, ub, names_of(list_a, "name"), names_of(list_b, "name"))) do
    local x, y = ua[name], ub[name]
    if not x then note("added", name)
    elseif not y then note("removed", name)
    else
      local parts = {}
      if x.slot_numel ~= y.slot_numel then
        parts[#parts + 1] = string.format("slot %d -> %d elements per rank", x.slot_numel, y.slot_numel)
      end
      -- (ag_bytes: mixed all-gather dtypes, gathered as raw bytes; absent otherwise)
      for _, f in ipairs({ "ag_dtype", "reduce_dtype", "grad_dtype", "rs_op", "ar_op", "reshard_after_forward", "vec_ok",
                           "ag_bytes" }) do
        -- plan.json before grad_dtype: the unsharded grads were in ag_dtype
        local xf, yf = x[f], y[f]
        if f == "grad_dtype" then xf, yf = xf or x.ag_dtype, yf or y.ag_dtype end
        if xf ~= yf then parts[#parts + 1] = string.format("%s %s -> %s", f, tostring(xf), tostring(yf)) end
      end
      local pa, pb = by_key(x.params, "name"), by_key(y.params, "name")
      local shape_changes = 0
      for pname, q in pairs(pb) do
        local r = pa[pname]
        if not r or table.concat(r.shape, "x") ~= table.concat(q.shape, "x") then shape_changes = shape_changes + 1 end
      end
      for pname in pairs(pa) do if not pb[pname] then shape_changes = shape_changes + 1 end end
      if shape_changes > 0 then parts[#parts + 1] = shape_changes .. " parameter(s) added, removed or reshaped" end
      local pad_a, pad_b = 0, 0
      local Wa = a.parallel.dp_shard
      local Wb = b.parallel.dp_shard
      for _, q in ipairs(x.params) do pad_a = pad_a + Wa * q.padded_numel - q.numel end
      for _, q in ipairs(y.params) do pad_b = pad_b + Wb * q.padded_numel - q.numel end
      if pad_a ~= pad_b then parts[#parts + 1] = string.format("padding %d -> %d elements", pad_a, pad_b) end
      if #parts > 0 then note(table.concat(parts, "; "), name) end
    end
  end
  return order, groups
end

-- The units a TP rank's layout holds: its TP class's (plan.json
-- tp_classes[]), else class 0's (units[]); and the class's number.
local function units_of_tp_rank(doc, t)
  for _, c in ipairs(doc.tp_classes or {}) do
    for _, r in ipairs(c.tp_ranks) do
      if r == t then return c.units, c.class end
    end
  end
  return doc.units, 0
end

-- Units: class 0's layout (TP rank 0's), then every other TP class's:
-- TP ranks are grouped by the classes they hold in A and in B, and each
-- group's layouts compared, so a change to another TP rank's split shows.
function plandiff.units_diff(a, b, w)
  local with_classes = #(a.tp_classes or {}) > 0 or #(b.tp_classes or {}) > 0
  local sections = {}
  local order, groups = unit_changes(a, b, a.units, b.units)
  sections[1] = { label = with_classes and "units on TP rank 0 (class 0)" or "units", order = order, groups = groups }
  local old_doc
  for _, d in ipairs({ a, b }) do
    if d.parallel.tp > 1 and not d.tp_classes then old_doc = d end
  end
  if with_classes and old_doc then
    w("(%s's plan.json predates tp_classes: only TP rank 0's layouts are compared; regenerate it)",
      old_doc == a and "A" or "B")
    with_classes = false
    sections[1].label = "units"
  end
  if with_classes then
    local tp = math.min(a.parallel.tp, b.parallel.tp)
    local pairs_seen, pair_order, zero = {}, {}, {}
    for t = 0, tp - 1 do
      local la, ca = units_of_tp_rank(a, t)
      local lb, cb = units_of_tp_rank(b, t)
      if ca == 0 and cb == 0 then zero[#zero + 1] = tostring(t) end
      if ca ~= 0 or cb ~= 0 then
        local k = ca .. "/" .. cb
        if not pairs_seen[k] then
          pairs_seen[k] = { la = la, lb = lb, ca = ca, cb = cb, ranks = {} }
          pair_order[#pair_order + 1] = k
        end
        table.insert(pairs_seen[k].ranks, tostring(t))
      end
    end
    for _, k in ipairs(pair_order) do
      local pr = pairs_seen[k]
      local o, g = unit_changes(a, b, pr.la, pr.lb)
      sections[#sections + 1] = { order = o, groups = g, label = string.format("units on TP rank%s %s (class %s)",
        #pr.ranks == 1 and "" or "s", table.concat(pr.ranks, ", "), arrow(pr.ca, pr.cb)) }
    end
    if #zero > 0 then
      sections[1].label = string.format("units on TP rank%s %s (class 0)", #zero == 1 and "" or "s",
        table.concat(zero, ", "))
    end
  end
  local changed = false
  for _, sec in ipairs(sections) do if #sec.order > 0 then changed = true end end
  if not changed then
    w("units: layouts unchanged%s", with_classes and " on every TP rank" or "")
    return
  end
  for _, sec in ipairs(sections) do
    if #sec.order == 0 then
      w("%s: layouts unchanged", sec.label)
    else
      w("%s:", sec.label)
      for _, text in ipairs(sec.order) do w("  %s: %s", plandiff.names_text(sec.groups[text]), text) end
    end
  end
end

return plandiff
