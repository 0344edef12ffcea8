-- Deterministic JSON: objects are written with keys in the order the caller
-- gives (an array of {key, value} pairs via json.object) or sorted; a small
-- decoder for tests that read the FSDP2 recordings.
local json = {}

local OBJECT = {}

-- json.object({ "k1", v1, "k2", v2, ... }) keeps this key order.
function json.object(kv) return setmetatable({ kv = kv }, OBJECT) end

local function esc(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    local map = { ['"'] = '\\"', ['\\'] = '\\\\', ['\n'] = '\\n', ['\t'] = '\\t', ['\r'] = '\\r' }
    return map[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end

local function num(v)
  if math.type(v) == "integer" then return tostring(v) end
  if v ~= v or v == math.huge or v == -math.huge then error("json: non-finite number") end
  if v == math.floor(v) and math.abs(v) < 2^53 then return string.format("%d", v) end
  -- The shortest of 15, 16 or 17 digits that reads back as the same double.
  for _, digits in ipairs({ "%.15g", "%.16g" }) do
    local s = string.format(digits, v)
    if tonumber(s) == v then return s end
  end
  return string.format("%.17g", v)
end

-- indent: nil for compact; arrays of scalars always stay on one line.
local function encode(v, indent, depth, out)
  local t = type(v)
  if t == "nil" then out[#out + 1] = "null"
  elseif t == "boolean" then out[#out + 1] = tostring(v)
  elseif t == "number" then out[#out + 1] = num(v)
  elseif t == "string" then out[#out + 1] = esc(v)
  elseif t == "table" then
    local nl = indent and ("\n" .. string.rep(indent, depth + 1)) or ""
    local close = indent and ("\n" .. string.rep(indent, depth)) or ""
    local sep = indent and ": " or ":"
    if getmetatable(v) == OBJECT or next(v) ~= nil and #v == 0 then
      local kv = v.kv
      if getmetatable(v) ~= OBJECT then
        kv = {}
        local keys = {}
        for k in pairs(v) do keys[#keys + 1] = k end
        table.sort(keys)
        for _, k in ipairs(keys) do kv[#kv + 1] = k; kv[#kv + 1] = v[k] end
      end
      out[#out + 1] = "{"
      for i = 1, #kv, 2 do
        if kv[i + 1] ~= nil then
          if out[#out] ~= "{" then out[#out + 1] = "," end
          out[#out + 1] = nl .. esc(kv[i]) .. sep
          encode(kv[i + 1], indent, depth + 1, out)
        end
      end
      out[#out + 1] = (out[#out] == "{") and "}" or (close .. "}")
    else
      local scalars = true
      for _, x in ipairs(v) do if type(x) == "table" then scalars = false break end end
      out[#out + 1] = "["
      for i, x in ipairs(v) do
        if i > 1 then out[#out + 1] = "," end
        if not scalars then out[#out + 1] = nl end
        encode(x, indent, depth + 1, out)
      end
      out[#out + 1] = (scalars or #v == 0) and "]" or (close .. "]")
    end
  else error("json: cannot encode " .. t) end
end

function json.encode(v, indent)
  local out = {}
  encode(v, indent, 0, out)
  return table.concat(out)
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
