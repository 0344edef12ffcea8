-- A JSON Schema (draft 2020-12) validator for the subset
-- docs/plan-json.schema.json uses: type, const, enum, properties, required,
-- additionalProperties (false or a schema), items, minItems, maxItems,
-- minimum, maximum, minLength, maxLength, description/title (ignored) and
-- $ref to "#/$defs/<name>". Values are gen/json.lua's decoded tables.
-- A keyword outside the subset is an error, so the schema cannot use one
-- that this validator would silently skip.
local json = require("gen.json")

local jsonschema = {}

local KNOWN = {
  ["$schema"] = true, ["$id"] = true, ["$defs"] = true, ["$ref"] = true, title = true, description = true,
  type = true, const = true, enum = true, properties = true, required = true, additionalProperties = true,
  items = true, minItems = true, maxItems = true, minimum = true, maximum = true, minLength = true, maxLength = true,
}

-- The JSON type of a decoded value; an empty table is both object and array.
local function kind(v)
  if v == json.null then return "null" end
  local t = type(v)
  if t == "string" or t == "boolean" then return t end
  if t == "number" then return math.type(v) == "integer" and "integer" or "number" end
  if t == "table" then
    if next(v) == nil then return "empty" end
    return #v > 0 and "array" or "object"
  end
  return t
end

local function type_ok(v, want)
  local k = kind(v)
  if want == "number" then return k == "number" or k == "integer" end
  if want == "integer" then return k == "integer" or (k == "number" and v == math.floor(v)) end
  if want == "object" or want == "array" then return k == want or k == "empty" end
  return k == want
end

local function deep_eq(a, b)
  if type(a) ~= "table" or type(b) ~= "table" then return a == b end
  for k, v in pairs(a) do if not deep_eq(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

-- Returns nil when v satisfies schema, else "path: reason".
function jsonschema.validate(v, schema, root, path)
  root = root or schema
  path = path or "$"
  for k in pairs(schema) do
    if not KNOWN[k] then return string.format("%s: schema keyword %q is outside this validator's subset", path, k) end
  end
  if schema["$ref"] then
    local name = schema["$ref"]:match("^#/%$defs/(.+)$")
    local target = name and root["$defs"] and root["$defs"][name]
    if not target then return path .. ": unresolvable $ref " .. schema["$ref"] end
    local err = jsonschema.validate(v, target, root, path)
    if err then return err end
  end
  if schema.type then
    local types = type(schema.type) == "table" and schema.type or { schema.type }
    local ok = false
    for _, t in ipairs(types) do if type_ok(v, t) then ok = true; break end end
    if not ok then return string.format("%s: %s is not of type %s", path, kind(v), table.concat(types, "|")) end
  end
  if schema.const ~= nil and not deep_eq(v, schema.const) then
    return string.format("%s: %s is not the constant %s", path, tostring(v), tostring(schema.const))
  end
  if schema.enum then
    local ok = false
    for _, e in ipairs(schema.enum) do if deep_eq(v, e) then ok = true; break end end
    if not ok then return string.format("%s: %s is not one of the enum values", path, tostring(v)) end
  end
  if type(v) == "number" then
    if schema.minimum and v < schema.minimum then return string.format("%s: %s < minimum %s", path, v, schema.minimum) end
    if schema.maximum and v > schema.maximum then return string.format("%s: %s > maximum %s", path, v, schema.maximum) end
  end
  if type(v) == "string" then
    if schema.minLength and #v < schema.minLength then return path .. ": string shorter than minLength" end
    if schema.maxLength and #v > schema.maxLength then return path .. ": string longer than maxLength" end
  end
  local k = kind(v)
  if (k == "array" or k == "empty") and (schema.items or schema.minItems or schema.maxItems) then
    if schema.minItems and #v < schema.minItems then return string.format("%s: %d items < minItems %d", path, #v, schema.minItems) end
    if schema.maxItems and #v > schema.maxItems then return string.format("%s: %d items > maxItems %d", path, #v, schema.maxItems) end
    if schema.items then
      for i, x in ipairs(v) do
        local err = jsonschema.validate(x, schema.items, root, string.format("%s[%d]", path, i - 1))
        if err then return err end
      end
    end
  end
  if (k == "object" or k == "empty") and (schema.properties or schema.required or schema.additionalProperties ~= nil) then
    for _, r in ipairs(schema.required or {}) do
      if v[r] == nil then return string.format("%s: required property %q missing", path, r) end
    end
    local props = schema.properties or {}
    local keys = {}
    for key in pairs(v) do keys[#keys + 1] = key end
    table.sort(keys)
    for _, key in ipairs(keys) do
      local sub = props[key]
      local p = path .. "." .. key
      if sub then
        local err = jsonschema.validate(v[key], sub, root, p)
        if err then return err end
      elseif schema.additionalProperties == false then
        return string.format("%s: property %q is not in the schema", path, key)
      elseif type(schema.additionalProperties) == "table" then
        local err = jsonschema.validate(v[key], schema.additionalProperties, root, p)
        if err then return err end
      end
    end
  end
  return nil
end

return jsonschema
