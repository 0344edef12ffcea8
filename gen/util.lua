-- Shared helpers for the generator stages: plan errors, the generator's
-- limits, checked arithmetic, sorted iteration, did-you-mean suggestions,
-- C identifiers, string literals and comments. No stage keeps state
-- between calls.
local util = {}

-- Bytes per element of each dtype a plan names, and u8: the raw bytes FSDP2
-- all-gathers for a unit of mixed all-gather dtypes (gen/parallel/fsdp_layout.lua).
util.DTYPE_BYTES = { fp32 = 4, bf16 = 2, fp16 = 2, u8 = 1 }

-- ---- limits ----------------------------------------------------------------
-- Every number a plan gives is bounded before any arithmetic uses it, so no
-- product wraps, no value outside C's int reaches an int field, and
-- generation time stays bounded (docs/plan-files.md, "Limits", says why
-- each one is what it is).
util.LIMITS = {
  world = 1 << 20,           -- ranks: generation is O(1) in the world (closed-form groups); 1M ranks tested
  -- units x micro-steps ("unit-steps"): generation is linear in them.
  -- Measured again (issue 33's review): ~4 ms and ~370 KB a planned
  -- unit-step at 4,096 units (18 s, 1.5 GB), so the planned ones -- units
  -- x the micro-steps the tables hold: all below 6, else 5 (gen/repeat.lua
  -- keeps three copies of the repeated one and the last) -- are at most
  -- 2^12 (~1.5 GiB, ~20 s); the nominal units x micro-steps at most 2^14
  -- (llama405b at 64 micro-steps: 129 x 5 planned, 8,256 nominal); 2^12
  -- units (a 1,000-layer model is 1,003; the largest Llama, 126 layers).
  unit_steps = 1 << 14,
  planned_unit_steps = 1 << 12,
  unit_step_kib = 384,       -- the memory per planned unit-step, for the message
  units = 1 << 12,           -- fully_shard units (n_layers <= units - 3)
  micro_steps = 1 << 14,     -- gradient-accumulation micro-steps: unit_steps for one unit
  -- A pipeline (gen/parallel/pp_stages.lua's check_size, before any of its
  -- work): each rank's tables and memory plan, and the lowering, grow with
  -- microbatches x stages (~3 ms and ~0.5 MB each at pp 8); the whole-step
  -- proof with that per data-parallel copy of the pipeline, plus the units
  -- each copy gathers and reduces (~50 us an event, a few events each).
  -- plans/llama405b.lua: 32 x 16 = 512 and 8 x (512 + 129) = 5,128.
  pp_actions = 1 << 11,
  pp_events = 1 << 16,
  -- layers of a MoE model under expert parallelism (gen/load.lua's
  -- check_sizes): its memory plan's work grows with their square, ~8 s and
  -- ~1 GiB at 2^9 (the largest published, Qwen3-235B-A22B, has 94)
  ep_layers = 1 << 9,
  -- tp x the model's parameters (gen/parallel/tp.lua's apply_units): TP's
  -- classes take each one's rows on every TP rank (~1 s at 2^22; llama405b
  -- at tp 8: ~9,000)
  tp_splits = 1 << 22,
  params = 32768,            -- parameters in the whole model
  dims = 8,                  -- tensor dims: runtime/commplan.h CP_MAX_DIMS
  name_len = 200,            -- bytes in a unit or parameter name
  plan_name_len = 64,        -- bytes in a plan name (a C prefix)
  model_int = (1 << 31) - 1, -- llama dims, heads, vocab, seq_len
  numel = 1 << 53,           -- elements of one parameter, and of the whole model
  unit_slot = 1 << 40,       -- one rank's slot of one unit (the copy kernels number tiles in int)
  bytes = 1 << 53,           -- any derived byte count or offset (exact in a double, fits int64)
  -- Running the plan file itself (gen/load.lua's sandbox):
  plan_instructions = 10000000, -- Lua VM instructions, the sandbox's wrappers included (~2 s
                                -- with the counting hook; the largest plan the limits allow
                                -- takes ~3,000,000)
  plan_memory_kib = 32 * 1024,  -- live memory the plan body may add (the largest plan: ~10 MiB)
  plan_seconds = 10,            -- CPU seconds, a backstop for slow single instructions
  plan_string = 1 << 20,        -- bytes of one string.rep / string.format / table.concat result
  plan_source = 16 << 20,       -- bytes of plan file source
}

-- a * b when it is at most limit (both non-negative integers), else nil.
function util.mul_within(a, b, limit)
  if a == 0 or b == 0 then return 0 end
  if a > limit // b then return nil end
  local p = a * b
  if p > limit then return nil end
  return p
end

-- a + b when it is at most limit (both non-negative integers), else nil.
function util.add_within(a, b, limit)
  if a > limit - b then return nil end
  return a + b
end

-- Product of list[first..last] when it is at most limit, else nil.
function util.product_within(list, limit, first, last)
  local p = 1
  for i = first or 1, last or #list do
    p = util.mul_within(p, list[i], limit)
    if not p then return nil end
  end
  return p
end

-- A model family's units: each parameter's numel and their total held
-- within limit, else a one-line error on model.dim naming the parameter
-- and what to reduce (reduce: "dim, vocab_size or the FFN size").
function util.bound_model_numel(ctx, units, limit, reduce)
  local total = 0
  for _, u in ipairs(units) do
    for _, q in ipairs(u.params) do
      local numel = util.product_within(q.shape, limit)
      total = numel and util.add_within(total, numel, limit)
      if not total then
        util.field_error(ctx, "model.dim", string.format("%s (shape %s) makes the model hold more than %s "
          .. "elements; reduce %s", q.name, table.concat(q.shape, " x "), util.pow2_text(limit), reduce))
      end
    end
  end
end

-- "2^53" for powers of two, else the decimal number: limits in messages.
function util.pow2_text(n)
  if n > 0 and n & (n - 1) == 0 then
    local k = 0
    while (1 << k) ~= n do k = k + 1 end
    if k >= 10 then return string.format("%d (2^%d)", n, k) end
  end
  return tostring(n)
end

-- ---- plan errors -----------------------------------------------------------

-- A plan error carries one line for the user; the driver prints it and exits 2.
local PlanError = {}
PlanError.__index = PlanError
PlanError.__tostring = function(e) return e.msg end

local MAX_MESSAGE = 2000

-- One printable line: control and non-ASCII bytes become \ddd, and very long
-- messages are cut. Every plan error passes through here, so no plan
-- content can split the message or reach the terminal as control bytes.
function util.one_line(msg)
  msg = tostring(msg):gsub("[%c\127-\255]", function(c) return string.format("\\%03d", c:byte()) end)
  if #msg > MAX_MESSAGE then msg = msg:sub(1, MAX_MESSAGE) .. "...(cut)" end
  return msg
end

function util.plan_error(msg)
  error(setmetatable({ msg = util.one_line(msg) }, PlanError), 0)
end

function util.is_plan_error(e)
  return getmetatable(e) == PlanError
end

-- Any value as a short one-line text for messages: strings quoted with
-- escapes and cut at `max` bytes, numbers exactly, other types by name.
function util.show(v, max)
  max = max or 60
  local t = type(v)
  if t == "string" then
    local s = v
    local cut = #s > max
    if cut then s = s:sub(1, max) end
    s = s:gsub('[\\"]', "\\%0"):gsub("[%c\127-\255]", function(c) return string.format("\\%03d", c:byte()) end)
    return '"' .. s .. '"' .. (cut and string.format("...(%d bytes)", #v) or "")
  elseif t == "number" then
    if math.type(v) == "integer" then return tostring(v) end
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" elseif v == -math.huge then return "-inf" end
    return string.format("%.17g", v)
  elseif t == "boolean" or t == "nil" then
    return tostring(v)
  end
  return "a " .. t
end

-- A table key as it appears in a field path: identifiers bare, anything
-- else in brackets (escaped, cut).
function util.key_text(k)
  if type(k) == "string" and #k <= 60 and k:match("^[%a_][%w_]*$") then return k end
  if math.type(k) == "integer" then return "[" .. k .. "]" end
  return "[" .. util.show(k, 40) .. "]"
end

function util.join_field(path, k)
  local kt = util.key_text(k)
  if path == "" then return kt end
  if kt:sub(1, 1) == "[" then return path .. kt end
  return path .. "." .. kt
end

-- Error tied to a field of the plan file: "<file>:<line>: <field>: <msg>".
-- ctx = { file = ..., source = ... } from gen/load; the line is found by
-- looking for the field's key in the source text (first occurrence), then
-- its parents', then the plan's return statement. `key` (optional) is the
-- raw key to look for when the field's last part is not an identifier.
function util.field_error(ctx, field, msg, key)
  local file = ctx and ctx.file or "plan"
  local line = ctx and util.find_line(ctx.source, field, key) or 1
  util.plan_error(string.format("%s:%d: %s: %s", file, line, field, msg))
end

-- The line of a key in the source: the first place where `key = ` (not
-- `==`) stands as a whole word outside a -- comment, or "key" / 'key' is
-- quoted. The key is plain text, never a Lua pattern; one pass over the
-- source per form, so a long key or a long file costs linear time.
local MAX_KEY = 256

local function line_at(source, pos, from, line)
  -- Lines from position `from` (on line `line`) to pos.
  local _, n = source:sub(from, pos - 1):gsub("\n", "")
  return line + n
end

-- Is pos after a "--" on its line? Looks back at most 4096 bytes (a longer
-- line counts as code), so every check costs bounded time.
local function in_comment(source, pos)
  local from = math.max(1, pos - 4096)
  local back = source:sub(from, pos - 1)
  local bol = back:match("^.*\n()") or 1
  return back:find("--", bol, true) ~= nil
end

-- Occurrences examined per search: enough for any real plan, bounded for
-- a hostile one.
local MAX_TRIES = 2000

local function first_assignment(source, key, from)
  local init = from or 1
  for _ = 1, MAX_TRIES do
    local i, j = source:find(key, init, true)
    if not i then return nil end
    local before = i > 1 and source:sub(i - 1, i - 1) or ""
    local after = source:sub(j + 1, j + 1)
    if not before:match("[%w_]") and not after:match("[%w_]") then
      local rest = source:match("^[ \t]*(=?=?)", j + 1)
      if rest == "=" and not in_comment(source, i) then return i end
    end
    init = i + 1
  end
  return nil
end

local function first_quoted(source, key)
  local best
  for _, q in ipairs({ '"', "'" }) do
    local init = 1
    for _ = 1, MAX_TRIES do
      local i = source:find(q .. key .. q, init, true)
      if not i then break end
      if not in_comment(source, i) then
        if not best or i < best then best = i end
        break
      end
      init = i + 1
    end
  end
  return best
end

local function line_of_key(source, key)
  if key == "" or #key > MAX_KEY then return nil end
  local a, b = first_assignment(source, key), first_quoted(source, key)
  local pos = a and b and math.min(a, b) or a or b
  return pos and line_at(source, pos, 1, 1) or nil
end

-- The line of the last `return` at the start of a line, or 1.
function util.return_line(source)
  if not source then return 1 end
  local found, n = 1, 0
  for line in (source .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if line:match("^%s*return[%s{]") or line:match("^%s*return$") then found = n end
  end
  return found
end

function util.find_line(source, field, key)
  if not source or not field then return nil end
  if key and type(key) == "string" then
    local n = line_of_key(source, key)
    if n then return n end
  end
  -- Follow the field's path through the text: each part's assignment after
  -- the previous part's, the n-th one after a part indexed [n]
  -- ("model.units[2].params[1].name": model, then units, then the 2nd
  -- params after it, then the 1st name after that).
  local pos, found = 1, nil
  local skip = 1
  for name, index in field:gmatch("([%a_][%w_]*)(%[?%d*%]?)") do
    local at
    for _ = 1, skip do
      at = first_assignment(source, name, at and at + 1 or pos)
      if not at then break end
    end
    if not at then break end
    pos, found = at, at
    skip = tonumber(index:match("%d+")) or 1
  end
  if found and not in_comment(source, found) then return line_at(source, found, 1, 1) end
  -- Else the field's identifier parts, innermost first: "model.units[2].name"
  -- -> name, units, model.
  local parts = {}
  for part in field:gmatch("[%a_][%w_]*") do table.insert(parts, 1, part) end
  for _, part in ipairs(parts) do
    local n = line_of_key(source, part)
    if n then return n end
  end
  return util.return_line(source)
end

-- ---- tables and words ------------------------------------------------------

-- Keys sorted by type then value (plain order, no tostring of addresses).
function util.sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  local rank = { number = 1, string = 2, boolean = 3 }
  table.sort(keys, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then return (rank[ta] or 4) < (rank[tb] or 4) or ((rank[ta] or 4) == (rank[tb] or 4) and ta < tb) end
    if ta == "number" or ta == "string" then return a < b end
    if ta == "boolean" then return (not a) and b end
    return false
  end)
  return keys
end

local function levenshtein(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = (a:sub(i, i) == b:sub(j, j)) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

-- Closest candidate within edit distance 3, or nil (words longer than 64
-- bytes get no suggestion: the distance is quadratic).
function util.did_you_mean(word, candidates)
  if type(word) ~= "string" or #word > 64 then return nil end
  local best, best_d
  for _, c in ipairs(candidates) do
    local d = levenshtein(word, c)
    if d <= 3 and (not best_d or d < best_d or (d == best_d and c < best)) then
      best, best_d = c, d
    end
  end
  return best
end

function util.ceil_div(a, b)
  return (a + b - 1) // b
end

function util.product(list, first, last)
  local p = 1
  for i = first or 1, last or #list do p = p * list[i] end
  return p
end

-- ---- C text ----------------------------------------------------------------

-- C identifier from a dotted name: "layers.0.attention.wq.weight" -> "LAYERS_0_ATTENTION_WQ_WEIGHT".
function util.c_ident(name)
  local id = name:gsub("[^%w]", "_"):upper()
  if id:match("^%d") then id = "_" .. id end
  return id
end

-- A C string literal holding exactly the bytes of s, for any byte string,
-- under plain `cc -std=c11` (trigraphs on): printable ASCII stays except
-- \ " and ? (escaped, so no trigraph forms); every other byte is a
-- three-digit octal escape (a following digit cannot extend it).
local C_ESCAPE = { ["\\"] = "\\\\", ['"'] = '\\"', ["?"] = "\\?" }
function util.c_string(s)
  return '"' .. s:gsub('[%c\\"?\128-\255]', function(c)
    return C_ESCAPE[c] or string.format("\\%03o", c:byte())
  end) .. '"'
end

-- Any text made safe inside a /* ... */ comment: control and non-ASCII
-- bytes become \ooo text, "*/" and "/*" are broken with a space, "??"
-- (trigraph starts: ??/ would be a backslash) become "? ?", and a trailing
-- backslash is followed by a dot so no line splice can follow.
function util.c_comment(s)
  s = s:gsub("[%c\127-\255]", function(c) return string.format("\\%03o", c:byte()) end)
  repeat
    local n1, n2, n3
    s, n1 = s:gsub("%*/", "* /")
    s, n2 = s:gsub("/%*", "/ *")
    s, n3 = s:gsub("%?%?", "? ?")
  until n1 + n2 + n3 == 0
  if s:match("\\ *$") then s = s .. "." end
  return s
end

return util
