-- timeline.svg (gen/svg.lua): well-formed XML, one lane per stream that
-- has ops, the exposed marks are the figures' exposed collectives, names
-- from the plan escaped, the same bytes every time, small on llama405b_hsdp,
-- and `diff --svg` writes the before/after pair.
local H = require("helpers")
local plan = require("gen.plan")
local audit = require("gen.audit")
local svg = require("gen.svg")
local opkinds = require("gen.opkinds")
local T = {}

local read = H.read

local function generate(path, src)
  local p = plan.from_source(src or read(path), path)
  p.source_file = path
  return p, audit.fingerprint(p)
end

-- ---- a small XML well-formedness checker ----

local NAME = "[%a_:][%w_:%.%-]*"

-- Character data and attribute values: no '<', '&' only as one of XML's
-- five entities or a numeric reference, printable ASCII (and newlines).
local function check_chars(s, where)
  if s:find("<", 1, true) then error(where .. ": raw '<' in " .. s:sub(1, 80)) end
  local bad = s:find("[^\n\t -~]")
  if bad then error(string.format("%s: byte %d at %d", where, s:byte(bad), bad)) end
  for ref in s:gmatch("&([^;]*);?") do
    if not (ref == "amp" or ref == "lt" or ref == "gt" or ref == "quot" or ref == "apos" or ref:match("^#%d+$")
        or ref:match("^#x%x+$")) then
      error(where .. ": bad entity or raw '&' (&" .. ref .. ") in " .. s:sub(1, 120))
    end
  end
  for amp in s:gmatch("&[^;]*") do
    if not s:find(amp .. ";", 1, true) then error(where .. ": unterminated reference " .. amp) end
  end
end

-- Returns the root element's name and every element as { name, attrs,
-- text }; errors on anything not well-formed.
local function xml_parse(doc)
  local i, n = 1, #doc
  local stack, elems, root, closed_root = {}, {}, nil, false
  while i <= n do
    local lt = doc:find("<", i, true)
    local text = doc:sub(i, (lt or n + 1) - 1)
    if #stack == 0 then
      if text:find("%S") then error("text outside the root element: " .. text:sub(1, 40)) end
    else
      check_chars(text, "text")
      local e = elems[stack[#stack]]
      e.text = e.text .. text
    end
    if not lt then break end
    if doc:sub(lt, lt + 3) == "<!--" then
      local e = doc:find("-->", lt + 4, true)
      if not e then error("unterminated comment") end
      local body = doc:sub(lt + 4, e - 1)
      if body:find("--", 1, true) or body:sub(-1) == "-" then error("'--' inside a comment") end
      i = e + 3
    elseif doc:sub(lt, lt + 1) == "<?" then
      if lt ~= 1 then error("processing instruction not at the start") end
      local e = doc:find("?>", lt + 2, true)
      if not e then error("unterminated declaration") end
      i = e + 2
    elseif doc:sub(lt, lt + 1) == "</" then
      local name, e = doc:match("^</(" .. NAME .. ")%s*>()", lt)
      if not name then error("bad end tag at " .. lt) end
      local open = table.remove(stack)
      if not open or elems[open].name ~= name then
        error(string.format("end tag </%s> closes <%s>", name, open and elems[open].name or "nothing"))
      end
      if #stack == 0 then closed_root = true end
      i = e
    else
      local name, j = doc:match("^<(" .. NAME .. ")()", lt)
      if not name then error("bad start tag at " .. lt .. ": " .. doc:sub(lt, lt + 30)) end
      if closed_root then error("a second root element <" .. name .. ">") end
      local attrs, seen = {}, {}
      while true do
        local ws, k, v, e = doc:match('^(%s*)(' .. NAME .. ')="([^"]*)"()', j)
        if not k then break end
        if ws == "" then error("no space before attribute " .. k) end
        if seen[k] then error("attribute " .. k .. " twice in <" .. name .. ">") end
        check_chars(v, "attribute " .. k)
        seen[k] = true
        attrs[k] = v
        j = e
      end
      local close, e = doc:match("^%s*(/?)>()", j)
      if not close then error("bad tag <" .. name .. "> near " .. doc:sub(j, j + 40)) end
      elems[#elems + 1] = { name = name, attrs = attrs, text = "" }
      if #stack == 0 then root = name end
      if close == "" then stack[#stack + 1] = #elems
      elseif #stack == 0 then closed_root = true end
      i = e
    end
  end
  if #stack > 0 then error("unclosed <" .. elems[stack[#stack]].name .. ">") end
  if not root then error("no root element") end
  return root, elems
end

local function unescape(s)
  return (s:gsub("&#39;", "'"):gsub("&quot;", '"'):gsub("&lt;", "<"):gsub("&gt;", ">"):gsub("&amp;", "&"))
end

function T.xml_checker_refuses_broken_documents()
  for _, bad in ipairs({ "<svg><g></svg>", "<svg>a & b</svg>", '<svg x="<"/>', "<svg/><svg/>", "<svg>",
                         "<!-- a -- b --><svg/>", '<svg x="1"x="2"/>', "<svg>\1</svg>" }) do
    local ok = pcall(xml_parse, bad)
    assert(not ok, "accepted " .. bad)
  end
  H.eq((xml_parse('<?xml version="1.0"?>\n<!-- c --><svg a="&amp;"><g/><t>x &lt; y</t></svg>\n')), "svg", "root")
end

-- ---- the shipped plans ----

local SMALL = { "plans/fsdp4.lua", "plans/hsdp3x2_arlast.lua", "plans/llama_tiny_tp.lua", "plans/single.lua",
                "plans/hsdp2x2_stepend.lua" }

local function used_streams(p)
  local used, list = {}, {}
  for _, o in ipairs(p.ops) do used[o.stream] = true end
  for _, s in ipairs(opkinds.STREAMS) do if used[s] then list[#list + 1] = s end end
  return list
end

-- The elements of the whole-step panel (before the detail panel's heading).
local function main_panel(elems)
  local out = {}
  for _, e in ipairs(elems) do
    if e.name == "tspan" and e.text:find("^Detail") then break end
    out[#out + 1] = e
  end
  return out
end

local function check_svg(path, p, fp, text)
  local a = audit.analysis(p)
  local root, elems = xml_parse(text)
  H.eq(root, "svg", path .. " root")
  assert(text:find("^<%?xml[^\n]*\n<!%-%- generated by commplan from [^\n]*; do not edit%. fingerprint " .. fp .. " %-%->\n"),
    path .. ": no generated header")
  -- One lane per stream with ops, in opkinds order; captions name them.
  local m = svg.model(p, a)
  local want = used_streams(p)
  local got = {}
  for _, l in ipairs(m.lanes) do got[#got + 1] = l.stream end
  H.list_eq(got, want, path .. " lanes")
  local captions, lanes = {}, 0
  for _, e in ipairs(main_panel(elems)) do
    if e.attrs.class == "ln" then captions[#captions + 1] = e.text end
    if e.attrs.class == "lane" then lanes = lanes + 1 end
  end
  H.list_eq(captions, want, path .. " lane captions")
  H.eq(lanes, #want, path .. " lane rects")
  -- The exposed marks: per collective, the figures' exposed time (full
  -- checkpointing's recompute apart: it runs inside backward ops).
  local tl = a.timeline
  local per = {}
  for _, e in ipairs(m.exposure) do per[e.seq] = (per[e.seq] or 0) + (e.hi - e.lo) end
  local total = 0
  for _, o in ipairs(p.ops) do
    -- (drawn: a repeated micro-step's rows once; the figures count every repetition)
    local want_us = tl.exposed_drawn[o.seq] or 0
    assert(math.abs((per[o.seq] or 0) - want_us) <= 1e-6 * math.max(1, want_us),
      string.format("%s: op %d (%s) marked %.6f us, exposed %.6f us", path, o.seq, o.kind, per[o.seq] or 0, want_us))
    total = total + (tl.exposed_by[o.seq] or 0) + (tl.recompute_by[o.seq] or 0)
  end
  assert(math.abs(total - a.exposed_us) <= 2e-3, string.format("%s: marks + recompute %.3f, exposed %.3f", path, total,
    a.exposed_us))
  -- Drawn: the hatched area of the compute lane is the exposed time, to
  -- within the pixels folding may add (THIN_PX per widened box, half a
  -- pixel of height per column).
  local H_in = svg.COMPUTE_H - 2
  local area, tol, strips = 0, 0.5, 0
  for _, e in ipairs(main_panel(elems)) do
    local cls = e.attrs.class or ""
    if e.name == "rect" and (cls:match("^ex") or cls:match("^tp")) and not cls:find("key", 1, true) then
      local wd, ht = tonumber(e.attrs.width), tonumber(e.attrs.height)
      area = area + wd * ht / H_in
      -- A box widened to THIN_PX: up to THIN_PX more; a column: a pixel
      -- of height (at least one when present, rounded to half pixels);
      -- coordinates: 0.05 px each side.
      if wd <= svg.THIN_PX + 0.05 then tol = tol + svg.THIN_PX
      elseif ht < H_in - 0.05 then tol = tol + wd / H_in + 0.1
      else tol = tol + 0.1 end
    end
    if cls == "strip" then strips = strips + 1 end
  end
  local px = 0
  for _, e in ipairs(m.exposure) do px = px + (e.hi - e.lo) end
  -- (the window: the step as drawn, a repeated micro-step's rows once)
  px = px * (1200 - 118 - 24) / math.max(tl.drawn_step_us or tl.step_us, 1e-9)
  assert(math.abs(area - px) <= tol, string.format("%s: hatched %.1f px, exposed %.1f px (tolerance %.1f)", path, area,
    px, tol))
  assert((strips > 0) == (px > 0), path .. ": the exposed strip")
  -- The title states SCHEDULE.md's step line.
  local subtitle
  for _, e in ipairs(elems) do
    if e.attrs.class == "sub" and not subtitle then subtitle = unescape(e.text) end
  end
  H.eq(subtitle, audit.step_text(a), path .. " step line")
  return elems, m
end

function T.shipped_small_plans_draw_their_step()
  for _, path in ipairs(SMALL) do
    local p, fp = generate(path)
    local text = audit.timeline_svg(p, fp)
    check_svg(path, p, fp, text)
    -- The committed file is this one (make check-generated checks all).
    assert(read(path:gsub("%.lua$", "/timeline.svg")) == text, path .. ": the committed timeline.svg is another")
    -- Every wait for a collective that is wide enough is named above it.
    assert(#p.ops > svg.DETAIL_OPS or text:find('class="lbl"', 1, true) or not text:find('class="ex"', 1, true),
      path .. ": no label")
  end
end

function T.schedule_md_links_the_picture()
  local p, fp = generate("plans/fsdp4.lua")
  local md = audit.schedule_md(p, fp)
  local summary, details = md:find("## Summary", 1, true), md:find("## Details", 1, true)
  local link = md:find("![predicted step](timeline.svg)", 1, true)
  assert(link and link > summary and link < details, "SCHEDULE.md's summary links timeline.svg")
  assert(audit.files(p, fp)["timeline.svg"], "audit.files holds timeline.svg")
end

function T.deterministic_bytes()
  local src = read("plans/hsdp3x2_arlast.lua")
  local p1, fp1 = generate("plans/hsdp3x2_arlast.lua", src)
  local p2, fp2 = generate("plans/hsdp3x2_arlast.lua", src)
  assert(audit.timeline_svg(p1, fp1) == audit.timeline_svg(p2, fp2), "two generations differ")
  -- Through the CLI too: two output directories, the same bytes.
  local d = os.tmpname()
  os.remove(d)
  for _, sub in ipairs({ "a", "b" }) do
    assert(os.execute("lua5.4 gen/commplan.lua plans/llama_tiny_tp.lua " .. d .. "/" .. sub), "generation")
  end
  assert(read(d .. "/a/timeline.svg") == read(d .. "/b/timeline.svg"), "two CLI runs differ")
  os.execute("rm -rf " .. d)
end

-- Names from the plan file reach text and attributes escaped. The loader
-- refuses '<', '>' in names (SCHEDULE.md's Markdown); & " ' pass, and the
-- picture must survive whatever a name holds, so the plan's names are
-- also made hostile after loading.
function T.hostile_names_are_escaped()
  local src = H.generic(4, "{ dp_shard = 4 }", {
    { "emb&\"x'", { { "w1", { 64, 8 } } } },
    { "blk&amp;", { { "w2", { 64, 64 } } } },
    { "out", { { "w3", { 8, 64 } } } },
  })
  local p, fp = generate("plans/t.lua", src)
  local out
  for _, u in ipairs(p.layout.units) do if u.name == "out" then out = u end end
  out.name = "<script>alert('x')</script>&\"--"
  p.name = "evil<svg onload=\"x\">&"
  p.source_file = "odd\"<dir>&--/plan-.lua"
  local text = audit.timeline_svg(p, fp)
  local _, elems = xml_parse(text)
  assert(not text:find("<script", 1, true), "raw <script> in the SVG")
  assert(not text:find("<svg onload", 1, true), "raw plan name in the SVG")
  assert(text:find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;", 1, true), "escaped unit name")
  assert(text:find("emb&amp;&quot;x&#39;", 1, true), "escaped & \" '")
  assert(text:find("blk&amp;amp;", 1, true), "an entity in a name is text")
  local title
  for _, e in ipairs(elems) do if e.attrs.class == "ttl" then title = unescape(e.text) end end
  H.eq(title, "Predicted step: " .. p.name, "title")
  -- Control bytes and UTF-8 never reach the document.
  out.name = "a\1b\255c"
  xml_parse(audit.timeline_svg(p, fp))
  H.eq(svg.esc("a\1\n\255&"), "a???&amp;", "esc")
end

-- llama405b_hsdp: thousands of ops, folded: well under 1 MB, a lane per
-- stream, a detail panel around the longest wait.
function T.llama405b_stays_small()
  local path = "plans/llama405b_hsdp.lua"
  local p, fp = generate(path)
  assert(#p.ops > 3000, "llama405b ops")
  local a = audit.analysis(p)
  local t0 = os.clock()
  local text = audit.timeline_svg(p, fp)
  local dt = os.clock() - t0
  assert(#text < 400 * 1024, string.format("llama405b timeline.svg is %d bytes", #text))
  assert(dt < 1.0, string.format("llama405b timeline.svg took %.2f s", dt))
  local elems = check_svg(path, p, fp, text)
  local rects, detail = 0, false
  for _, e in ipairs(elems) do
    if e.name == "rect" then rects = rects + 1 end
    if e.name == "tspan" and e.text:find("^Detail") then detail = true end
  end
  assert(rects < 5 * 2 * 1200, "rects: " .. rects)
  assert(detail, "llama405b has a detail panel")
  -- Folded labels: a run of one kind's exposed collectives under one (the
  -- lanes' runs of collectives; the detail panel's per-layer TP all-gathers
  -- before ChunkedLossWrapper's exposed all-gathers of the [norm, lm_head]
  -- unit made the longest wait the loss's; the reduce-scatters, once exposed
  -- per layer by the arena's reuse, no longer are).
  assert(text:find(">collectives x%d+<") or text:find(">tp_all_gather x%d+<"), "folded label")
  assert(not text:find(">reduce_scatter x%d+<"), "reduce-scatters exposed layer by layer")
  H.eq(a.timeline.critical[#a.timeline.critical] ~= nil, true, "critical path")
end

-- `diff --svg DIR`: before.svg and after.svg, each side's timeline.svg.
function T.diff_writes_the_before_after_pair()
  local d = os.tmpname()
  os.remove(d)
  local ph = io.popen("lua5.4 gen/verbs.lua diff --svg " .. d .. "/out plans/fsdp4/plan.json plans/hsdp2x2.lua 2>&1")
  local out = ph:read("a")
  assert(ph:close(), out)
  assert(out:find("wrote " .. d .. "/out/before.svg", 1, true), out)
  assert(read(d .. "/out/before.svg") == read("plans/fsdp4/timeline.svg"), "before: the committed one beside plan.json")
  assert(read(d .. "/out/after.svg") == read("plans/hsdp2x2/timeline.svg"), "after: drawn from the plan file")
  -- A plan.json with no timeline.svg beside it and no plan file: one line.
  os.execute("cp plans/fsdp4/plan.json " .. d .. "/plan.json")
  ph = io.popen("lua5.4 gen/verbs.lua diff --svg " .. d .. "/out " .. d .. "/plan.json plans/fsdp4.lua 2>&1")
  out = ph:read("a")
  assert(not ph:close(), "diff --svg without a picture succeeded")
  assert(out:find("no timeline.svg beside it", 1, true) and not out:find("\n.", 1), out)
  os.execute("rm -rf " .. d)
end

-- A revision whose plan.json has no timeline.svg beside it (generated
-- before there was one) is drawn from its plan file, and says so.
function T.diff_svg_of_an_older_revision()
  local plandiff = require("gen.plandiff")
  local ok = os.execute("git rev-parse --verify -q 'HEAD:plans/fsdp4/plan.json' >/dev/null 2>&1")
  if not ok then return end -- not a git checkout
  local text, note = plandiff.svg_of("HEAD:plans/fsdp4/plan.json")
  xml_parse(text)
  if note then assert(note:find("drawn from HEAD:plans/fsdp4.lua", 1, true), note) end
end


-- A pipeline plan's trace.json and timeline.svg (gen/audit.lua through
-- gen/pipeline_timeline.lua): every timed action of the plan's schedule's
-- run, a box and an event each, its boxes labelled with stage and
-- microbatch, well-formed, the same bytes every time, the step the
-- figures state.
function T.pipeline_timeline_draws_every_timed_action()
  local trace = require("gen.trace")
  local json = require("gen.json")
  for _, path in ipairs({ "tests/pp/plans/pp_tiny_tp.lua", "tests/pp/plans/pp_tiny_zbv.lua" }) do
    local p = plan.from_file(path)
    p.source_file = path
    local fp = audit.fingerprint(p)
    local text = audit.timeline_svg(p, fp)
    H.eq(audit.timeline_svg(p, fp), text, path .. ": the same bytes twice")
    local root, elems = xml_parse(text)
    H.eq(root, "svg", path .. ": root")
    local a = audit.analysis(p)
    local acts = a.pipeline.facts.record
    local compute, reduce, want = 0, 0, {}
    for _, x in ipairs(acts) do
      if x.type == "REDUCE_GRAD" then reduce = reduce + 1 else compute = compute + 1 end
      want[x.type == "REDUCE_GRAD" and string.format("reduce stage %d", x.stage)
        or string.format("%s stage %d microbatch %d", x.type, x.stage, x.mb)] = true
    end
    assert(compute > 0 and reduce > 0, path .. ": timed actions")
    -- (the whole step's panel draws each once; a zoomed panel some again)
    local drawn, labels = {}, 0
    for _, e in ipairs(elems) do
      local name = e.name == "title" and e.text:match("^(.-):")
      if name then
        assert(want[name], path .. ": a box for no timed action: " .. e.text)
        drawn[name] = true
      end
      if e.name == "text" and (e.text:match("^s%d+ m%d+$") or e.text:match("^s%d+$")) then labels = labels + 1 end
    end
    local n = 0
    for _ in pairs(drawn) do n = n + 1 end
    local distinct = 0
    for _ in pairs(want) do distinct = distinct + 1 end
    H.eq(n, distinct, path .. ": a box per timed action")
    assert(labels > 0, path .. ": boxes labelled with stage and microbatch")
    local doc = json.decode(audit.trace_json(p, fp))
    H.eq(trace.validate(doc), nil, path .. ": trace events well-formed, no overlap on a track")
    local x = 0
    for _, e in ipairs(doc.traceEvents) do
      if e.ph == "X" then
        x = x + 1
        assert(e.args.stage and (e.args.microbatch or e.args.action == "REDUCE_GRAD"), "stage and microbatch")
      end
    end
    H.eq(x, compute + reduce, path .. ": an event per timed action")
    H.eq(doc.otherData.step_us, a.step_us, path .. ": the figures' step")
    H.eq(doc.otherData.bubble, a.pipeline.bubble, path .. ": the figures' bubble")
    if path:find("zbv") then
      assert(text:find("backward (input gradient)", 1, true), "legend")
      local has_i = false
      for _, e in ipairs(acts) do has_i = has_i or e.type == "I" end
      assert(has_i, "zero bubble's I actions drawn")
    end
  end
end

return T
