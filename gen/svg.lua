-- timeline.svg: the predicted step as a picture a reviewer looks at
-- (SCHEDULE.md's summary links it). A lane per CUDA stream that has ops,
-- ops as boxes coloured by kind (legend), the compute stream's waits
-- hatched by what they wait for (gen/timeline.lua's idle spans: the split
-- the figures' exposed time is made of) and labelled with the collective,
-- its TP collectives hatched too (exposed by nature), a red strip under
-- it wherever it waits for communication, the critical path as a line
-- through the lanes, a time axis, and the step's figures as SCHEDULE.md
-- states them. A plan of more than DETAIL_OPS ops gets a second panel:
-- the step around its longest wait, op by op.
--
-- Long plans stay small and readable: on a lane, an op at least MIN_PX
-- wide is a box of its own; narrower ops less than MIN_PX apart form a
-- cluster drawn as columns of about BUCKET_PX, each kind as tall as its
-- share of the column's time (a cluster narrower than two columns is one
-- box of its main kind), so a lane draws O(WIDTH) boxes whatever the
-- number of ops (llama405b_hsdp: ~235 KB); labels of three or more waits of
-- one kind close together fold into one ("reduce_scatter x126").
--
-- Deterministic bytes: coordinates as %.1f, everything in op, span or
-- x order, no time of generation. Every name from the plan file is
-- escaped (svg.esc) before it reaches text or an attribute.
local opkinds = require("gen.opkinds")
local fold = require("gen.fold")
local timeline = require("gen.timeline")

local svg = {}

svg.WIDTH = 1200
svg.MIN_PX = 2
svg.THIN_PX = 1 -- a narrower box is drawn this wide
local LEFT, RIGHT = 118, 24
local PLOT = svg.WIDTH - LEFT - RIGHT

-- Op kinds by class: one colour each, bottom up in a folded box, in
-- legend order; then the compute stream's waits (no op kind: the spans
-- it idles, by what it waited for).
svg.CLASSES = {
  { id = "fw", label = "forward", fill = "#8db9e3", kinds = { "forward" } },
  { id = "bw", label = "backward", fill = "#3b6ea8", kinds = { "backward", "backward_input" } },
  { id = "cp", label = "copies", fill = "#b9aea7",
    kinds = { "copy_in", "copy_out", "pack", "view_out", "view_out_add", "partial_save", "partial_add", "partial_fold",
              "post_forward" } },
  { id = "hl", label = "host copies (CPU offload)", fill = "#edc948", kinds = { "h2d", "d2h", "d2h_add" },
    optional = true },
  { id = "rh", label = "reshard", fill = "#dcdcdc", kinds = { "reshard" } },
  { id = "ag", label = "all-gather", fill = "#59a14f", kinds = { "all_gather" } },
  { id = "rs", label = "reduce-scatter", fill = "#f28e2b", kinds = { "reduce_scatter" } },
  { id = "ar", label = "all-reduce", fill = "#a66fa0", kinds = { "all_reduce" } },
  { id = "tp", label = "TP collectives (exposed)", fill = "url(#hatchtp)",
    kinds = { "tp_all_gather", "tp_reduce_scatter", "tp_all_reduce" } },
  -- optional: its style only in a plan that has such ops (pipeline parallelism's)
  { id = "pp", label = "pipeline sends / receives", fill = "#76b7b2", kinds = { "send", "recv" }, optional = true },
  { id = "ep", label = "expert all-to-alls", fill = "#e15759", kinds = { "a2a_counts", "a2a" }, optional = true },
  { id = "ex", label = "waits for a collective", fill = "url(#hatch)",
    kinds = { "exposed" } },
  { id = "wt", label = "other waits", fill = "url(#hatchgrey)", kinds = { "wait" } },
}
local CLASS_OF = {}
for i, c in ipairs(svg.CLASSES) do
  c.order = i
  for _, k in ipairs(c.kinds) do CLASS_OF[k] = c end
end
for _, d in ipairs(opkinds.LIST) do
  assert(CLASS_OF[d.name], "gen/svg.lua: no colour for op kind " .. d.name)
end

-- Lane heights (pixels).
svg.COMPUTE_H, svg.LANE_H = 34, 24

-- Approximate width of a text at a font size (sans-serif).
local function text_px(s, size) return #s * (size or 11) * 0.56 end

-- ---- text ----

local ENT = { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;", ["'"] = "&#39;" }

-- Text or an attribute value: XML's five specials escaped, and any byte
-- outside printable ASCII (control characters, stray UTF-8) as '?', so the
-- document is well-formed whatever a name holds.
function svg.esc(s)
  return (tostring(s):gsub("[^ -~]", "?"):gsub("[&<>\"']", ENT))
end

-- Comment text: no "--" inside, no "-" at the end (XML comments).
local function comment_text(s)
  s = tostring(s):gsub("[^ -~]", "?")
  while s:find("--", 1, true) do s = s:gsub("%-%-", "- -") end
  if s:sub(-1) == "-" then s = s .. " " end
  return s
end

-- A coordinate: one decimal, never "-0.0"; never inf, NaN or nil (the
-- figures are range-checked where they enter: one here is a bug, said so).
local function f1(x)
  if type(x) ~= "number" or x ~= x or x == math.huge or x == -math.huge then
    error(string.format("internal error: gen/svg.lua: a coordinate is %s, not a finite number", tostring(x)), 0)
  end
  local s = string.format("%.1f", x)
  if s == "-0.0" then s = "0.0" end
  return s
end

local function us_text(us) return require("gen.audit").us_text(us) end

-- The families (group names) of a list of ops, as a set.
function svg.families_of(ops)
  local t = {}
  for _, o in ipairs(ops or {}) do if o.group then t[o.group] = true end end
  return t
end

-- ---- the model: what is drawn, in plan terms (tests read it) ----

local function unit_name(p, o) return p.layout.units[o.unit + 1].name end

-- Names once each, in the order met, folded (`layers.3-8`).
local function names_text(names)
  local seen, list = {}, {}
  for _, n in ipairs(names) do
    if not seen[n] then seen[n] = true; list[#list + 1] = n end
  end
  if #list <= 3 then return table.concat(list, ", ") end
  return fold.unit_range(list)
end

-- "6 forward, 6 tp_all_gather": counts in the order met.
local function counts_text(kinds)
  local n, order = {}, {}
  for _, k in ipairs(kinds) do
    if not n[k] then n[k] = 0; order[#order + 1] = k end
    n[k] = n[k] + 1
  end
  local t = {}
  for _, k in ipairs(order) do t[#t + 1] = n[k] .. " " .. k end
  return table.concat(t, ", ")
end

-- Folds items (in time order: lo, hi) into clusters: an item at least
-- MIN_PX wide is a cluster of its own; narrower items with less than
-- MIN_PX between them share one. x(t) maps time to pixels.
local function clusters_of(items, x)
  local out, cur = {}, nil
  for _, it in ipairs(items) do
    local x0, x1 = x(it.lo), x(it.hi)
    local narrow = x1 - x0 < svg.MIN_PX
    if cur and narrow and cur.narrow and x0 - cur.x1 < svg.MIN_PX then
      cur.items[#cur.items + 1] = it
      cur.hi = math.max(cur.hi, it.hi)
      cur.x1 = math.max(cur.x1, x1)
    else
      cur = { lo = it.lo, hi = it.hi, x0 = x0, x1 = x1, narrow = narrow, items = { it } }
      out[#out + 1] = cur
    end
  end
  return out
end

svg.BUCKET_PX = 4

-- A cluster's cells: { x0, x1, stack = { { class, h } bottom up } }. One
-- item, or a cluster narrower than two buckets: one full-height cell of
-- its main class (at least THIN_PX wide). Else buckets of about
-- BUCKET_PX, each class as tall as its share of the bucket's time (half
-- pixels, at least one pixel when present), equal neighbours merged.
local function cells_of(cl, H, x_to_t)
  local w = cl.x1 - cl.x0
  if #cl.items == 1 or w < 2 * svg.BUCKET_PX then
    local time = {}
    for _, it in ipairs(cl.items) do time[it.class] = (time[it.class] or 0) + (it.hi - it.lo) end
    local best
    for _, it in ipairs(cl.items) do
      if not best or time[it.class] > time[best] + 1e-9 then best = it.class end
    end
    -- Widened inside the plot: one at its right end grows to the left.
    local x0 = w < svg.THIN_PX and math.min(cl.x0, LEFT + PLOT - svg.THIN_PX) or cl.x0
    return { { x0 = x0, x1 = x0 + math.max(w, svg.THIN_PX), stack = { { best, H } }, items = cl.items,
               widened = w < svg.THIN_PX } }
  end
  local nb = math.floor(w / svg.BUCKET_PX + 0.5)
  local bw = w / nb
  local shares = {}
  for b = 1, nb do shares[b] = {} end
  local t0 = x_to_t(cl.x0)
  local bt = x_to_t(cl.x0 + bw) - t0
  for _, it in ipairs(cl.items) do
    local first = math.max(1, math.floor((it.lo - t0) / bt) + 1)
    local last = math.min(nb, math.floor((it.hi - t0) / bt) + 1)
    for b = first, last do
      local lo, hi = t0 + (b - 1) * bt, t0 + b * bt
      local part = math.min(hi, it.hi) - math.max(lo, it.lo)
      if part > 0 then shares[b][it.class] = (shares[b][it.class] or 0) + part / bt end
    end
  end
  local cells = {}
  for b = 1, nb do
    local stack, key = {}, {}
    for _, c in ipairs(svg.CLASSES) do
      local sh = shares[b][c]
      if sh and sh > 0 then
        local h = math.max(1, math.floor(math.min(sh, 1) * H * 2 + 0.5) / 2)
        stack[#stack + 1] = { c, h }
        key[#key + 1] = c.id .. h
      end
    end
    key = table.concat(key, ",")
    local x0 = cl.x0 + (b - 1) * bw
    local prev = cells[#cells]
    if prev and prev.key == key then prev.x1 = x0 + bw
    elseif key ~= "" then cells[#cells + 1] = { x0 = x0, x1 = x0 + bw, stack = stack, key = key } end
  end
  return cells
end

-- Labels over the compute lane, from its clusters with exposed
-- communication (in time order: x0, x1, us, sig = what it waits for, n
-- collectives, text): three or more of one kind less than RUN_PX apart
-- take one label over their span ("reduce_scatter x128"), the others
-- their own; the most exposed first, in two rows, where they do not
-- overlap. Returns { x0, x1, row, text, span = x0, x1 of a run } in x order.
svg.RUN_PX = 60
function svg.place_labels(cands)
  local runs, open = {}, {}
  for _, c in ipairs(cands) do
    local r = open[c.sig]
    if r and c.x0 - r.x1 < svg.RUN_PX then
      r.x1, r.us, r.n = math.max(r.x1, c.x1), r.us + c.us, r.n + c.n
      r.members[#r.members + 1] = c
    else
      r = { sig = c.sig, x0 = c.x0, x1 = c.x1, us = c.us, n = c.n, members = { c } }
      open[c.sig] = r
      runs[#runs + 1] = r
    end
  end
  local labels = {}
  for _, r in ipairs(runs) do
    if #r.members >= 3 then
      labels[#labels + 1] = { us = r.us, x0 = r.x0, x1 = r.x1, text = r.sig .. " x" .. r.n, span = true }
    else
      for _, c in ipairs(r.members) do labels[#labels + 1] = { us = c.us, x0 = c.x0, x1 = c.x1, text = c.text } end
    end
  end
  table.sort(labels, function(u, v) return u.us > v.us or (u.us == v.us and u.x0 < v.x0) end)
  local placed = {}
  for _, l in ipairs(labels) do
    local tw = text_px(l.text, 10)
    local tx0 = math.max(LEFT, math.min((l.x0 + l.x1) / 2 - tw / 2, LEFT + PLOT - tw))
    local a0, a1 = math.min(tx0, l.x0), math.max(tx0 + tw, l.x1)
    for row = 0, 1 do
      local ok = true
      for _, q in ipairs(placed) do
        if q.row == row and a0 < q.a1 + 8 and a1 > q.a0 - 8 then ok = false; break end
      end
      if ok then
        placed[#placed + 1] = { x0 = tx0, x1 = tx0 + tw, a0 = a0, a1 = a1, row = row, text = l.text,
                                span = l.span and { l.x0, l.x1 } or nil }
        break
      end
    end
  end
  table.sort(placed, function(u, v) return u.x0 < v.x0 or (u.x0 == v.x0 and u.row < v.row) end)
  return placed
end

-- p: the plan; a: gen/figures.lua's figures (audit.analysis); t0, t1:
-- the window drawn (default: the whole step). Returns { step_us, t0, t1,
-- x (time to pixels), lanes[] = { stream, ops, busy_us, h, cells[] =
-- { x0, x1, stack, title? }, hits[] = { x0, x1, title } (a folded
-- cluster's tooltip), strips[] (where the compute stream waits for
-- communication) }, exposure[] = { lo, hi, seq, tp } (every span of a
-- collective the compute stream waits through: the figures' exposed time
-- but full checkpointing's recompute), labels[] (svg.place_labels),
-- path[] = { x, stream } }.
function svg.model(p, a, t0, t1)
  local tl = a.timeline
  -- (a repeated micro-step's rows are drawn once: the drawn step ends sooner)
  t0, t1 = t0 or 0, t1 or tl.drawn_step_us or tl.step_us
  local span = t1 > t0 and (t1 - t0) or 1
  local function x(t) return LEFT + PLOT * (t - t0) / span end
  local function x_to_t(px) return t0 + (px - LEFT) * span / PLOT end
  -- Items of the window, clipped to it.
  local function clip(it)
    if it.hi < t0 or it.lo > t1 or (it.hi == it.lo and (it.lo == t1 and t1 > t0)) then return nil end
    it.lo, it.hi = math.max(it.lo, t0), math.min(it.hi, t1)
    return it
  end
  local by_stream = {}
  for _, o in ipairs(p.ops) do
    local r = tl.ops[o.seq]
    local it = clip({ lo = r.start, hi = r.finish, op = o, r = r, class = CLASS_OF[o.kind] })
    if it then
      local l = by_stream[o.stream]
      if not l then l = {}; by_stream[o.stream] = l end
      l[#l + 1] = it
    end
  end
  local m = { step_us = tl.step_us, drawn_us = tl.drawn_step_us or tl.step_us, t0 = t0, t1 = t1,
             lanes = {}, exposure = {}, labels = {}, path = {}, x = x }
  -- The compute lane's idle spans are items too: hatched, by what they
  -- waited for.
  local compute_items = by_stream.compute
  if compute_items then
    for _, it in ipairs(compute_items) do
      if it.op.group then m.exposure[#m.exposure + 1] = { lo = it.lo, hi = it.hi, seq = it.op.seq, tp = true } end
    end
    local merged, i = {}, 1
    for _, sp in ipairs(tl.idle) do
      local it = clip({ lo = sp.lo, hi = sp.hi, span = sp, class = sp.by >= 0 and CLASS_OF.exposed or CLASS_OF.wait })
      if it then
        while i <= #compute_items and compute_items[i].lo <= it.lo do merged[#merged + 1] = compute_items[i]; i = i + 1 end
        merged[#merged + 1] = it
        if sp.by >= 0 then m.exposure[#m.exposure + 1] = { lo = it.lo, hi = it.hi, seq = sp.by } end
      end
    end
    while i <= #compute_items do merged[#merged + 1] = compute_items[i]; i = i + 1 end
    by_stream.compute = merged
    table.sort(m.exposure, function(u, v) return u.lo < v.lo or (u.lo == v.lo and u.seq < v.seq) end)
  end
  local label_cands = {}
  for _, s in ipairs(opkinds.STREAMS) do
    local items = by_stream[s]
    if items then
      local H = (s == "compute" and svg.COMPUTE_H or svg.LANE_H) - 2
      local lane = { stream = s, ops = 0, busy_us = 0, cells = {}, hits = {}, strips = {}, h = H + 2 }
      for _, it in ipairs(items) do
        if it.op then lane.ops, lane.busy_us = lane.ops + 1, lane.busy_us + (it.hi - it.lo) end
      end
      for _, cl in ipairs(clusters_of(items, x)) do
        local cells = cells_of(cl, H, x_to_t)
        local kinds, names, exp_kinds, exp_names, exp_us, exp_fams = {}, {}, {}, {}, 0, {}
        for _, it in ipairs(cl.items) do
          if it.op then kinds[#kinds + 1] = it.op.kind; names[#names + 1] = unit_name(p, it.op) end
          local eo = it.span and it.span.by >= 0 and p.ops[it.span.by + 1] or (it.op and it.op.group and s == "compute" and it.op)
          if eo then
            exp_kinds[#exp_kinds + 1] = eo.kind
            exp_names[#exp_names + 1] = unit_name(p, eo)
            if eo.group then exp_fams[eo.group] = true end
            exp_us = exp_us + (it.hi - it.lo)
          end
        end
        local title
        if #cl.items == 1 then
          local it = cl.items[1]
          if it.op then
            local o, r = it.op, it.r
            title = string.format("%s %s (%s%s): %s from %s%s", o.kind, unit_name(p, o), o.phase,
              p.fsdp.micro_steps > 1 and (", micro-step " .. o.micro_step) or "", us_text(r.finish - r.start),
              us_text(r.start), r.extra_comm and (", with " .. us_text(r.extra_comm)
                .. " of " .. timeline.inline_labels(svg.families_of(r.extra_ops)) .. " recomputed") or "")
          else
            local sp = it.span
            local wo = sp.waiting and p.ops[sp.waiting + 1]
            local who = wo and (wo.kind .. " " .. unit_name(p, wo)) or "the step's end"
            if sp.by >= 0 then
              local bo = p.ops[sp.by + 1]
              title = string.format("exposed communication: %s waits %s for %s %s, from %s", who,
                us_text(sp.hi - sp.lo), bo.kind, unit_name(p, bo), us_text(sp.lo))
            else
              title = string.format("%s waits %s for copies on other streams, from %s", who, us_text(sp.hi - sp.lo),
                us_text(sp.lo))
            end
          end
          cells[1].title = title
        else
          local parts = {}
          if #kinds > 0 then parts[#parts + 1] = counts_text(kinds) .. "; " .. names_text(names) end
          if exp_us > 0 then
            parts[#parts + 1] = string.format("exposed communication %s: %s", us_text(exp_us), counts_text(exp_kinds))
          end
          lane.hits[#lane.hits + 1] = { x0 = cells[1].x0, x1 = cells[#cells].x1, title = string.format(
            "%d ops in %s from %s: %s", #kinds, us_text(cl.hi - cl.lo), us_text(cl.lo), table.concat(parts, "; ")) }
        end
        for _, c in ipairs(cells) do lane.cells[#lane.cells + 1] = c end
        if exp_us > 0 then
          local x0, x1 = cells[1].x0, cells[#cells].x1
          local last = lane.strips[#lane.strips]
          if last and x0 <= last.x1 + 0.05 then last.x1 = math.max(last.x1, x1)
          else lane.strips[#lane.strips + 1] = { x0 = x0, x1 = x1 } end
          -- A label: the collective waited for, or what the cluster holds.
          local uk, ukinds = {}, {}
          for _, k in ipairs(exp_kinds) do
            if not uk[k] then uk[k] = true; ukinds[#ukinds + 1] = k end
          end
          local sig
          if #ukinds == 1 then sig = ukinds[1]
          else
            -- (the compute stream's own collectives by what they are: gen/timeline.lua's labels)
            local inline = true
            for _, k in ipairs(ukinds) do
              local d = opkinds.BY_NAME[k]
              if not (d.tp or k == "a2a" or k == "a2a_counts") then inline = false end
            end
            sig = inline and timeline.inline_labels(exp_fams) or "collectives"
          end
          label_cands[#label_cands + 1] = { us = exp_us, x0 = x0, x1 = x1, sig = sig, n = #exp_kinds,
            text = #exp_kinds == 1 and (exp_kinds[1] .. " " .. exp_names[1]) or (sig .. " x" .. #exp_kinds) }
        end
      end
      m.lanes[#m.lanes + 1] = lane
    end
  end
  m.labels = svg.place_labels(label_cands)
  -- The critical path: a point where it enters and leaves each stream,
  -- one per pixel and lane.
  local segs = require("gen.audit").critical_segments(p, tl)
  local pts = {}
  local function add(t, stream)
    local px = tonumber(f1(x(t)))
    local last = pts[#pts]
    if last and last.stream == stream and last.x == px then return end
    -- Three points on one lane: the middle one adds nothing.
    local before = pts[#pts - 1]
    if last and before and last.stream == stream and before.stream == stream then pts[#pts] = nil end
    pts[#pts + 1] = { x = px, stream = stream }
  end
  for _, sg in ipairs(segs) do
    local lo, hi = math.max(sg.start, t0), math.min(sg.start + sg.us, t1)
    if hi >= lo then
      add(lo, sg.stream)
      add(hi, sg.stream)
    end
  end
  m.path = pts
  return m
end

-- ---- drawing ----

local function nice_step(span)
  local raw = span / 8
  local e = 10 ^ math.floor(math.log(raw, 10))
  for _, k in ipairs({ 1, 2, 5, 10 }) do
    if raw <= k * e * 1.0000001 then return k * e end
  end
  return 10 * e
end

-- Ticks at 1, 2 or 5 x 10^k in the unit the span reads best in.
local function axis_ticks(t0, t1)
  local span = t1 - t0
  local scale, unit = 1, "us"
  if span >= 1e6 then scale, unit = 1e6, "s" elseif span >= 1e3 then scale, unit = 1e3, "ms" end
  local dt = nice_step(span > 0 and span / scale or 1)
  local decimals = math.max(0, -math.floor(math.log(dt, 10) + 1e-9))
  local ticks = {}
  local i = math.ceil(t0 / scale / dt - 1e-7)
  while i * dt <= t1 / scale * (1 + 1e-7) + 1e-9 do
    ticks[#ticks + 1] = { t = i * dt * scale, text = string.format("%." .. decimals .. "f", i * dt) .. " " .. unit }
    i = i + 1
  end
  return ticks
end

-- The notes under the axis: the exposed time by collective kind and
-- group (the figures' split), wrapped to the picture's width.
local function notes_of(p, a)
  local tl = a.timeline
  local fams, order = {}, {}
  for _, o in ipairs(p.ops) do
    local e = tl.exposed_by[o.seq] or 0
    if e > 0 then
      local k = o.kind .. " (" .. tostring(o.group) .. ")"
      if not fams[k] then fams[k] = { us = 0, n = 0 }; order[#order + 1] = k end
      fams[k].us, fams[k].n = fams[k].us + e, fams[k].n + (o.times or 1)
    end
  end
  local rec, rec_fams = 0, {}
  for _, o in ipairs(p.ops) do
    if (tl.recompute_by[o.seq] or 0) > 0 then rec, rec_fams[o.group] = rec + tl.recompute_by[o.seq], true end
  end
  table.sort(order, function(u, v) return fams[u].us > fams[v].us or (fams[u].us == fams[v].us and u < v) end)
  local parts = {}
  for _, k in ipairs(order) do
    parts[#parts + 1] = string.format("%s %s (%d op%s)", k, us_text(fams[k].us), fams[k].n, fams[k].n == 1 and "" or "s")
  end
  if rec > 0 then
    parts[#parts + 1] = timeline.inline_labels(rec_fams) .. " recomputed inside backward " .. us_text(rec)
      .. " (not drawn apart)"
  end
  local text = "Exposed communication " .. us_text(a.exposed_us) .. (#parts > 0 and (": " .. table.concat(parts, ", ")) or "")
    .. (us_text(a.waits_us) ~= us_text(0) and ("; other waits " .. us_text(a.waits_us)) or "") .. "."
  local lines, cur = {}, ""
  for word in text:gmatch("%S+") do
    local cand = cur == "" and word or (cur .. " " .. word)
    if text_px(cand, 12) > svg.WIDTH - 32 and cur ~= "" then lines[#lines + 1] = cur; cur = word else cur = cand end
  end
  if cur ~= "" then lines[#lines + 1] = cur end
  return lines
end

-- The detail panel's window: the longest wait for a collective (the
-- earliest of equal ones), with three times its length either side and
-- at least a sixtieth of the step; nil when the compute stream never
-- waits for one.
function svg.detail_window(a)
  local tl = a.timeline
  local best
  for _, sp in ipairs(tl.idle) do
    if sp.by >= 0 and (not best or sp.hi - sp.lo > best.hi - best.lo + 1e-9) then best = sp end
  end
  if not best then return nil end
  local d = math.max(best.hi - best.lo, tl.step_us / 60 / 7)
  local mid = (best.lo + best.hi) / 2
  local t0, t1 = math.max(0, mid - 3.5 * d), math.min(tl.drawn_step_us or tl.step_us, mid + 3.5 * d)
  return t0, t1, best
end

-- One panel (lanes, labels, critical path, axis) from y = top; returns
-- the y below it. full: the whole step (lane captions with ops and busy
-- time; the detail window outlined when given).
local function draw_panel(w, a, m, top, full, win)
  local lanes_y, y = {}, top
  for _, lane in ipairs(m.lanes) do
    if lane.stream == "compute" then y = y + 28 end -- the labels' rows
    lane.y = y
    lanes_y[lane.stream] = lane
    y = y + lane.h + (lane.stream == "compute" and 14 or 10)
  end
  local plot_bottom = y - 6
  local y_axis = plot_bottom + 4
  local x = m.x
  w('<g class="axis">')
  for _, tk in ipairs(axis_ticks(m.t0, m.t1)) do
    local tx = f1(x(tk.t))
    w('<line class="grid" x1="%s" y1="%d" x2="%s" y2="%d"/>', tx, top, tx, plot_bottom)
    w('<text class="tick" x="%s" y="%d" text-anchor="middle">%s</text>', tx, y_axis + 12, tk.text)
  end
  w('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#888888" stroke-width="1"/>', LEFT, y_axis, LEFT + PLOT, y_axis)
  if full then
    w('<text class="tick" x="%d" y="%d" text-anchor="end">%s</text>', LEFT + PLOT, y_axis + 26,
      svg.esc(m.drawn_us < m.step_us and string.format("drawn %s of a %s step", us_text(m.drawn_us), us_text(m.step_us))
        or ("step " .. us_text(m.step_us))))
  end
  w("</g>")
  for _, lane in ipairs(m.lanes) do
    local H = lane.h - 2
    w('<g class="stream">')
    w('<text class="ln" x="12" y="%s">%s</text>', f1(lane.y + lane.h / 2 + (full and 0 or 4)), lane.stream)
    if full then
      w('<text class="small" x="12" y="%s">%d ops, %.0f%% busy</text>', f1(lane.y + lane.h / 2 + 12), lane.ops,
        m.t1 > m.t0 and 100 * lane.busy_us / (m.t1 - m.t0) or 0)
    end
    w('<rect class="lane" x="%d" y="%s" width="%d" height="%s"/>', LEFT, f1(lane.y), PLOT, f1(lane.h))
    -- Cells widened to THIN_PX last, over their neighbours.
    for pass = 1, 2 do
      for _, c in ipairs(lane.cells) do
        if (pass == 2) == (c.widened == true) then
          local cw, yb = c.x1 - c.x0, lane.y + 1 + H
          for _, st in ipairs(c.stack) do
            local cls, h = st[1], math.min(st[2], yb - lane.y - 1)
            if h > 0 then
              local attrs = string.format('class="%s%s" x="%s" y="%s" width="%s" height="%s"', cls.id,
                (c.title and cw >= 6) and " sep" or "", f1(c.x0), f1(yb - h), f1(cw), f1(h))
              if c.title then w("<rect %s><title>%s</title></rect>", attrs, svg.esc(c.title))
              else w("<rect %s/>", attrs) end
              yb = yb - h
            end
          end
        end
      end
    end
    for _, h in ipairs(lane.hits) do
      w('<rect class="hit" x="%s" y="%s" width="%s" height="%s"><title>%s</title></rect>', f1(h.x0), f1(lane.y),
        f1(h.x1 - h.x0), f1(lane.h), svg.esc(h.title))
    end
    for _, st in ipairs(lane.strips) do
      w('<rect class="strip" x="%s" y="%s" width="%s" height="3"/>', f1(st.x0), f1(lane.y + lane.h + 1),
        f1(st.x1 - st.x0))
    end
    if lane.stream == "compute" then
      for _, l in ipairs(m.labels) do
        local by = lane.y - 5 - 13 * l.row
        w('<text class="lbl" x="%s" y="%s">%s</text>', f1(l.x0), f1(by), svg.esc(l.text))
        if l.span then
          w('<path class="brk" d="M%s %sv2.5H%sv-2.5"/>', f1(l.span[1]), f1(by + 1.5), f1(l.span[2]))
        end
      end
    end
    w("</g>")
  end
  -- The critical path, over the lanes: its runs on a stream bold, its
  -- jumps between streams thin.
  if #m.path > 0 then
    local runs, jumps = {}, {}
    for i, pt in ipairs(m.path) do
      local ly = lanes_y[pt.stream]
      local yy = f1(ly.y + ly.h / 2)
      local prev = m.path[i - 1]
      if prev and prev.stream == pt.stream then
        runs[#runs + 1] = "H" .. f1(pt.x)
      else
        if prev then
          local py = lanes_y[prev.stream]
          jumps[#jumps + 1] = "M" .. f1(prev.x) .. " " .. f1(py.y + py.h / 2) .. "L" .. f1(pt.x) .. " " .. yy
        end
        runs[#runs + 1] = "M" .. f1(pt.x) .. " " .. yy
      end
    end
    w('<g class="critical"><title>critical path: %d ops</title><path class="cjump" d="%s"/><path class="cpath" '
      .. 'd="%s"/></g>', #a.timeline.critical, table.concat(jumps), table.concat(runs))
  end
  if win then
    local x0, x1 = x(win[1]), x(win[2])
    w('<rect class="zoom" x="%s" y="%d" width="%s" height="%d"/><text class="small" x="%s" y="%d" '
      .. 'text-anchor="middle">detail below</text>', f1(x0 - 1), top - 2, f1(x1 - x0 + 2), plot_bottom - top + 4,
      f1((x0 + x1) / 2), plot_bottom + 2 + 24)
  end
  return y_axis + (full and 30 or 18)
end

svg.DETAIL_OPS = 200

-- p: the plan; a: the figures (audit.analysis); fp: the fingerprint.
function svg.render(p, a, fp)
  local m = svg.model(p, a)
  local out = {}
  local function w(fmt, ...) out[#out + 1] = select("#", ...) > 0 and string.format(fmt, ...) or fmt end
  -- Legend: the classes the plan has, wrapped.
  local present = {}
  for _, o in ipairs(p.ops) do present[CLASS_OF[o.kind]] = true end
  for _, sp in ipairs(a.timeline.idle) do present[sp.by >= 0 and CLASS_OF.exposed or CLASS_OF.wait] = true end
  -- The activation collectives' class: TP's, or context parallel's K/V
  -- exchange on the cp group (the same op kinds: gen/parallel/cp.lua).
  local groups_of_act = {}
  for _, o in ipairs(p.ops) do
    if CLASS_OF[o.kind].id == "tp" then groups_of_act[o.group] = true end
  end
  local act_label = groups_of_act.cp and (timeline.inline_labels(groups_of_act) .. " (exposed)") or nil
  local legend, lx, ly = {}, 16, 70
  for _, c in ipairs(svg.CLASSES) do
    if present[c] then
      local tw = 16 + text_px(c.id == "tp" and act_label or c.label) + 12
      if lx + tw > svg.WIDTH - 16 then lx, ly = 16, ly + 18 end
      legend[#legend + 1] = { c = c, x = lx, y = ly }
      lx = lx + tw
    end
  end
  if lx + 30 + text_px("critical path") > svg.WIDTH - 16 then lx, ly = 16, ly + 18 end
  local cp_legend = { x = lx, y = ly }
  -- The detail panel of a long plan.
  local dm, dt0, dt1, dsp
  if #p.ops > svg.DETAIL_OPS then
    dt0, dt1, dsp = svg.detail_window(a)
    if dt0 then dm = svg.model(p, a, dt0, dt1) end
  end
  -- Lay out by drawing into a buffer, then the header with the height.
  local body = {}
  local function wb(fmt, ...) body[#body + 1] = select("#", ...) > 0 and string.format(fmt, ...) or fmt end
  local y = draw_panel(wb, a, m, ly + 34, true, dm and { dt0, dt1 })
  if dm then
    local wo, bo = dsp.waiting and p.ops[dsp.waiting + 1], p.ops[dsp.by + 1]
    wb('<text class="sub" x="16" y="%d"><tspan font-weight="bold">Detail, %s to %s:</tspan> the longest wait, %s waits '
      .. '%s for %s %s</text>', y + 8, svg.esc(us_text(dt0)), svg.esc(us_text(dt1)),
      svg.esc(wo and (wo.kind .. " " .. unit_name(p, wo)) or "the step's end"), svg.esc(us_text(dsp.hi - dsp.lo)),
      svg.esc(bo.kind), svg.esc(unit_name(p, bo)))
    y = draw_panel(wb, a, dm, y + 14, false, nil)
  end
  local lines = notes_of(p, a)
  lines[#lines + 1] = string.format("A lane per CUDA stream. Where ops are under %d px wide, each %d px column shows "
    .. "the share of its time per kind; hover for what a box holds.", svg.MIN_PX, svg.BUCKET_PX)
  local notes_y = y + 18
  local height = notes_y + 16 * (#lines - 1) + 12
  w('<?xml version="1.0" encoding="UTF-8"?>')
  w("<!-- generated by commplan from %s; do not edit. fingerprint %s -->", comment_text(p.source_file),
    comment_text(fp))
  w('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
    .. 'font-family="Helvetica, Arial, sans-serif" font-size="11">', svg.WIDTH, height, svg.WIDTH, height)
  w("<style>")
  for _, c in ipairs(svg.CLASSES) do
    if present[c] or not c.optional then w(".%s{fill:%s}", c.id, c.fill) end
  end
  w(".lane{fill:#f5f5f5;stroke:#d0d0d0;stroke-width:0.5}.grid{stroke:#e0e0e0;stroke-width:1}"
    .. ".sep{stroke:#ffffff;stroke-width:0.6}.strip{fill:#c62828}.hit{fill:#000000;fill-opacity:0}"
    .. ".cpath{fill:none;stroke:#111111;stroke-width:1.6}"
    .. ".cjump{fill:none;stroke:#111111;stroke-width:0.5;stroke-opacity:0.6}"
    .. ".zoom{fill:none;stroke:#555555;stroke-width:0.8;stroke-dasharray:3 2}"
    .. ".lbl{fill:#b71c1c;font-size:10px}.brk{fill:none;stroke:#b71c1c;stroke-width:0.8}"
    .. ".ttl{font-size:16px;font-weight:bold}.sub{fill:#333333;font-size:12px}"
    .. ".ln{font-weight:bold;font-size:12px}.small{fill:#555555;font-size:10px}.tick{fill:#444444;font-size:10px}")
  w("</style>")
  local function hatch(id, bg, fg)
    return string.format('<pattern id="%s" width="5" height="5" patternUnits="userSpaceOnUse" '
      .. 'patternTransform="rotate(45)"><rect width="5" height="5" fill="%s"/><line x1="0" y1="0" x2="0" y2="5" '
      .. 'stroke="%s" stroke-width="1.8"/></pattern>', id, bg, fg)
  end
  w("<defs>%s%s%s</defs>", hatch("hatch", "#fde0e0", "#c62828"), hatch("hatchtp", "#e8c547", "#c62828"),
    hatch("hatchgrey", "#eeeeee", "#757575"))
  w('<rect width="%d" height="%d" fill="#ffffff"/>', svg.WIDTH, height)
  -- Title: the plan and its step as SCHEDULE.md states it.
  w('<text class="ttl" x="16" y="24">Predicted step: %s</text>', svg.esc(p.name))
  w('<text class="sub" x="16" y="44">%s</text>', svg.esc(require("gen.audit").step_text(a)))
  local repeated = p.rep and string.format(" (micro-steps %d-%d drawn once: the step runs them %d times)",
    p.rep.micro_first, p.rep.micro_last, p.rep.times) or ""
  w('<text class="small" x="16" y="60">%d ops%s on %d stream%s; fingerprint %s; generated by commplan from %s</text>',
    #p.ops, repeated, #m.lanes, #m.lanes == 1 and "" or "s", svg.esc(fp), svg.esc(p.source_file))
  for _, l in ipairs(legend) do
    w('<rect class="%s key" x="%s" y="%d" width="12" height="12"/><text x="%s" y="%d">%s</text>', l.c.id, f1(l.x), l.y,
      f1(l.x + 16), l.y + 10, svg.esc(l.c.id == "tp" and act_label or l.c.label))
  end
  w('<path class="cpath" d="M%s %dh24"/><text x="%s" y="%d">critical path</text>', f1(cp_legend.x), cp_legend.y + 6,
    f1(cp_legend.x + 30), cp_legend.y + 10)
  for _, b in ipairs(body) do out[#out + 1] = b end
  for i, line in ipairs(lines) do
    w('<text class="%s" x="16" y="%d">%s</text>', i < #lines and "sub" or "small", notes_y + 16 * (i - 1), svg.esc(line))
  end
  w("</svg>")
  return table.concat(out, "\n") .. "\n"
end

return svg
