-- Deterministic JSON: objects are written with keys in the order the caller
-- gives (an array of {key, value} pairs via json.object) or sorted; a small
-- decoder for tests that read the FSDP2 recordings.
local json = {}

local OBJECT = {}

-- json.object({ "k1", v1, "k2", v2, ... }) keeps this key order (the list
-- itself marked as an object: plans hold an object per op).
function json.object(kv) return setmetatable(kv, OBJECT) end

local RAW = {}

-- json.raw(text): a value written as text, which must be JSON as the
-- encoder would write that value where it stands (its indent and depth):
-- for a large part a caller writes faster itself (plan.json's ops).
function json.raw(text) return setmetatable({ text = text }, RAW) end

local type, tostring, mtype = type, tostring, math.type

local ESC_MAP = { ['"'] = '\\"', ['\\'] = '\\\\', ['\n'] = '\\n', ['\t'] = '\\t', ['\r'] = '\\r' }

local function esc(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return ESC_MAP[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end

-- A string as JSON text (quoted and escaped).
json.quote = function(s) return esc(s) end

-- JSON has no inf or NaN, and every figure is range-checked where it
-- enters: a non-finite number (or a missing one) reaching here is the
-- generator's bug, refused rather than written as invalid JSON.
local function num(v)
  if math.type(v) == "integer" then return tostring(v) end
  if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge then
    error(string.format("internal error: gen/json.lua: cannot write %s as a JSON number (not a finite number: an "
      .. "input escaped its range check)", tostring(v)), 0)
  end
  if v == math.floor(v) and math.abs(v) < 2^53 then return string.format("%d", v) end
  -- The shortest of 15, 16 or 17 digits that reads back as the same double.
  for _, digits in ipairs({ "%.15g", "%.16g" }) do
    local s = string.format(digits, v)
    if tonumber(s) == v then return s end
  end
  return string.format("%.17g", v)
end

-- A number as JSON text (integers as themselves, doubles in the fewest
-- digits that read back the same).
json.number = function(v) return num(v) end

-- An encoder: a function (v, indent) -> JSON text, and a writer over the
-- same memo (begin(indent), value(v), raw(text), text()). Each keeps its own
-- memo of escaped strings, doubles' texts and key prefixes, so one
-- encoder serves many small documents (trace.json's events) without
-- escaping the same names again. indent: nil for compact; arrays of
-- scalars always stay on one line.
function json.encoder()
  local quoted = {} -- string -> its escaped, quoted form; double -> its text
  local out, n, indent
  -- Pieces are joined into a chunk every CHUNK of them, so a document of
  -- millions of values holds strings of its size, not millions of pieces.
  local CHUNK, chunks = 8192, nil
  local function flush()
    chunks[#chunks + 1] = table.concat(out, "", 1, n)
    out, n = {}, 0
  end
  local pads, firsts, nexts -- depth -> "\n" .. indent x depth; depth -> key -> '"key": ' (',"key": ')
  local function q(s)
    local r = quoted[s]
    if not r then r = esc(s); quoted[s] = r end
    return r
  end
  local function scalar(v, t)
    if t == "string" then
      local r = quoted[v]
      if not r then r = esc(v); quoted[v] = r end
      return r
    elseif t == "number" then
      if math.type(v) == "integer" then return tostring(v) end
      -- A double's shortest text takes up to three formats: memoized
      -- with the strings (plans repeat their figures: every op of a size
      -- predicts the same time).
      local r = num(v)
      quoted[v] = r
      return r
    elseif t == "boolean" then return v and "true" or "false"
    elseif t == "nil" then return "null" end
    error("json: cannot encode " .. t)
  end
  local function pad(depth)
    local p = pads[depth]
    if not p then p = indent and ("\n" .. string.rep(indent, depth)) or ""; pads[depth] = p end
    return p
  end
  local function prefixes(depth)
    local f = firsts[depth]
    if not f then
      local nl, sep = pad(depth), indent and ": " or ":"
      f = setmetatable({}, { __index = function(t, k) local r = nl .. q(k) .. sep; t[k] = r; return r end })
      firsts[depth] = f
      nexts[depth] = setmetatable({}, { __index = function(t, k) local r = "," .. f[k]; t[k] = r; return r end })
    end
    return f, nexts[depth]
  end
  local encode
  function encode(v, depth)
    local t = type(v)
    if t ~= "table" then
      n = n + 1
      out[n] = scalar(v, t)
      return
    end
    local mt = getmetatable(v)
    if mt == RAW then
      n = n + 1
      out[n] = v.text
    elseif mt == OBJECT or next(v) ~= nil and #v == 0 then
      local kv = v
      if mt ~= OBJECT then
        kv = {}
        local keys = {}
        for k in pairs(v) do keys[#keys + 1] = k end
        table.sort(keys)
        for _, k in ipairs(keys) do kv[#kv + 1] = k; kv[#kv + 1] = v[k] end
      end
      local first_pre, next_pre = prefixes(depth + 1)
      -- out and n in locals for the loop (upvalues cost more per field),
      -- written back around the recursion and the chunking
      local o, k = out, n + 1
      o[k] = "{"
      local pre = first_pre
      for i = 1, #kv, 2 do
        local x = kv[i + 1]
        if x ~= nil then
          k = k + 1
          o[k] = pre[kv[i]]
          pre = next_pre
          local r = quoted[x] -- a string or double met before (integers are not memoized)
          if r then
            k = k + 1
            o[k] = r
          elseif mtype(x) == "integer" then
            k = k + 1
            o[k] = x -- (table.concat writes it as tostring does)
          else
            local tx = type(x)
            if tx == "table" then
              n = k
              encode(x, depth + 1)
              o, k = out, n
            else
              k = k + 1
              o[k] = scalar(x, tx)
            end
          end
          if k >= CHUNK then
            n = k
            flush()
            o, k = out, n
          end
        end
      end
      k = k + 1
      o[k] = pre == first_pre and "}" or (pad(depth) .. "}")
      n = k
    else
      local scalars, ints, len = true, true, 0
      while v[len + 1] ~= nil do
        len = len + 1
        local x = v[len]
        if mtype(x) ~= "integer" then
          ints = false
          if type(x) == "table" then scalars = false end
        end
      end
      if ints then
        -- (table.concat writes integers as tostring does)
        n = n + 1
        out[n] = "[" .. table.concat(v, ",", 1, len) .. "]"
      elseif scalars then
        local items = {}
        for i = 1, len do
          local x = v[i]
          items[i] = scalar(x, type(x))
        end
        n = n + 1
        out[n] = "[" .. table.concat(items, ",") .. "]"
      else
        local nl = pad(depth + 1)
        local sep = "," .. nl
        n = n + 1
        out[n] = "["
        for i = 1, len do
          n = n + 1
          out[n] = i > 1 and sep or nl
          encode(v[i], depth + 1)
          if n >= CHUNK then flush() end
        end
        n = n + 1
        out[n] = pad(depth) .. "]"
      end
    end
  end
  local function start(ind)
    if ind ~= indent or not pads then
      indent, pads, firsts, nexts = ind, {}, {}, {}
    end
  end
  local function text()
    flush()
    local s = table.concat(chunks)
    out, chunks = nil, nil
    return s
  end
  return function(v, ind)
    out, n, chunks = {}, 0, {}
    start(ind)
    encode(v, 0)
    return text()
  end, {
    -- A writer: values and raw text appended to one buffer, for a document
    -- of many small values (trace.json: an event per line).
    begin = function(ind) out, n, chunks = {}, 0, {}; start(ind) end,
    value = function(v) encode(v, 0) end,
    raw = function(s)
      n = n + 1
      out[n] = s
      if n >= CHUNK then flush() end
    end,
    text = text,
  }
end

function json.encode(v, indent)
  return json.encoder()(v, indent)
end

-- Decoder: objects -> tables, arrays -> lists, null -> json.null.
json.null = setmetatable({}, { __tostring = function() return "null" end })

function json.decode(s)
  local pos = 1
  local function ws() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local value
  local function str()
    local out, i = {}, pos + 1
    while true do
      local c = s:sub(i, i)
      if c == '"' then pos = i + 1; return table.concat(out) end
      if c == "\\" then
        local e = s:sub(i + 1, i + 1)
        local map = { n = "\n", t = "\t", r = "\r", b = "\b", f = "\f", ['"'] = '"', ["\\"] = "\\", ["/"] = "/" }
        if e == "u" then out[#out + 1] = utf8.char(tonumber(s:sub(i + 2, i + 5), 16)); i = i + 6
        else out[#out + 1] = map[e]; i = i + 2 end
      elseif c == "" then error("json: unterminated string")
      else
        local j = s:find('["\\]', i)
        out[#out + 1] = s:sub(i, j - 1); i = j
      end
    end
  end
  function value()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then
      local t = {}
      pos = pos + 1; ws()
      if s:sub(pos, pos) == "}" then pos = pos + 1; return t end
      while true do
        ws(); local k = str(); ws()
        assert(s:sub(pos, pos) == ":", "json: expected ':'"); pos = pos + 1
        t[k] = value(); ws()
        local d = s:sub(pos, pos); pos = pos + 1
        if d == "}" then return t end
        assert(d == ",", "json: expected ',' in object")
      end
    elseif c == "[" then
      local t = {}
      pos = pos + 1; ws()
      if s:sub(pos, pos) == "]" then pos = pos + 1; return t end
      while true do
        t[#t + 1] = value(); ws()
        local d = s:sub(pos, pos); pos = pos + 1
        if d == "]" then return t end
        assert(d == ",", "json: expected ',' in array")
      end
    elseif c == '"' then return str()
    elseif s:sub(pos, pos + 3) == "true" then pos = pos + 4; return true
    elseif s:sub(pos, pos + 4) == "false" then pos = pos + 5; return false
    elseif s:sub(pos, pos + 3) == "null" then pos = pos + 4; return json.null
    else
      local a, b = s:find("^-?[%d.eE+-]+", pos)
      assert(a, "json: unexpected character at " .. pos)
      pos = b + 1
      return tonumber(s:sub(a, b))
    end
  end
  local v = value()
  return v
end

return json
