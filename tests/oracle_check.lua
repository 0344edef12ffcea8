-- Compares a simulated run (binary --simulate --pattern oracle --dump DIR)
-- with the FSDP2 recordings, rank by rank: local shards, every collective
-- (group, dtype, reduce op, sizes, full input and output buffers) in issue
-- order, the per-communicator sequences, and the final sharded grads.
-- usage: lua5.4 tests/oracle_check.lua ORACLE_DIR DUMP_DIR CONFIG
package.path = "./?.lua;" .. package.path
local json = require("gen.json")

local oracle_dir, dump_dir, config = arg[1], arg[2], arg[3]
local failures, checks = 0, 0

local function read_json(path)
  local fh = assert(io.open(path, "rb"), "cannot open " .. path)
  local s = fh:read("a")
  fh:close()
  return json.decode(s)
end

local function fail(fmt, ...)
  failures = failures + 1
  if failures <= 20 then io.stderr:write("oracle mismatch: " .. string.format(fmt, ...) .. "\n") end
end

-- Values are float32 (or narrower) on both sides, printed differently: the
-- dump as %.9g, the recording as the double of the float. Compare the
-- float32 each one names, bit for bit (so 10.0 vs 10.000000953674316, one
-- ulp apart, is a mismatch).
local function f32(x)
  if type(x) ~= "number" then return x end
  return string.unpack("<f", string.pack("<f", x))
end

local function same_list(what, a, b)
  checks = checks + 1
  if #a ~= #b then return fail("%s: %d elements, recording has %d", what, #a, #b) end
  for i = 1, #a do
    if f32(a[i]) ~= f32(b[i]) then
      return fail("%s: element %d is %.17g, recording has %.17g", what, i - 1, a[i], b[i])
    end
  end
end

local function collectives(log)
  local out = {}
  for _, e in ipairs(log) do if e.op ~= "mark" then out[#out + 1] = e end end
  return out
end

local ranks = 0
for r = 0, 1023 do
  local ofile = string.format("%s/%s.rank%d.json", oracle_dir, config, r)
  local fh = io.open(ofile, "rb")
  if not fh then break end
  fh:close()
  ranks = ranks + 1
  local o = read_json(ofile)
  local d = read_json(string.format("%s/%s.rank%d.json", dump_dir, config, r))
  local tag = string.format("%s rank %d", config, r)
  for name, v in pairs(o.params_local) do
    if not d.params_local[name] then fail("%s: no local shard for %s", tag, name)
    else same_list(tag .. " params_local " .. name, d.params_local[name].values, v.values) end
  end
  for name, v in pairs(o.grads_local) do
    if not d.grads_local[name] then fail("%s: no grad for %s", tag, name)
    else same_list(tag .. " grads_local " .. name, d.grads_local[name].values, v.values) end
  end
  local ol, dl = collectives(o.log), collectives(d.log)
  -- The marks (stepN_forward / stepN_backward) fall between the same collectives.
  local function marks(log)
    local t, n = {}, 0
    for _, e in ipairs(log) do
      if e.op == "mark" then t[#t + 1] = e.what .. "@" .. n else n = n + 1 end
    end
    return table.concat(t, " ")
  end
  checks = checks + 1
  if marks(o.log) ~= marks(d.log) then fail("%s: marks %s, recording has %s", tag, marks(d.log), marks(o.log)) end
  checks = checks + 1
  if #ol ~= #dl then fail("%s: %d collectives, recording has %d", tag, #dl, #ol) end
  -- Per communicator (keyed by its rank list): identical op sequences.
  local per_comm_o, per_comm_d = {}, {}
  for i = 1, math.min(#ol, #dl) do
    local a, b = dl[i], ol[i]
    local what = string.format("%s collective %d (%s of %s)", tag, i - 1, a.op, a.unit)
    checks = checks + 1
    if a.op ~= b.op or a.dtype ~= b.dtype or (a.reduce_op or "") ~= (b.reduce_op or "")
        or a.in_numel ~= b.in_numel or a.out_numel ~= b.out_numel then
      fail("%s: %s %s %s in=%d out=%d, recording has %s %s %s in=%d out=%d", what, a.op, a.dtype, a.reduce_op or "-",
        a.in_numel, a.out_numel, b.op, b.dtype, b.reduce_op or "-", b.in_numel, b.out_numel)
    end
    same_list(what .. " ranks", a.ranks, b.ranks)
    same_list(what .. " in", a["in"], b["in"])
    same_list(what .. " out", a.out, b.out)
    local key = table.concat(b.ranks, ",")
    per_comm_o[key] = (per_comm_o[key] or "") .. b.op .. ":" .. b.in_numel .. ";"
    per_comm_d[table.concat(a.ranks, ",")] = (per_comm_d[table.concat(a.ranks, ",")] or "") .. a.op .. ":" .. a.in_numel .. ";"
  end
  for key, seq in pairs(per_comm_o) do
    checks = checks + 1
    if per_comm_d[key] ~= seq then fail("%s: communicator [%s] sequence differs", tag, key) end
  end
end
if ranks == 0 then
  io.stderr:write("oracle: no recordings " .. config .. ".rank*.json in " .. oracle_dir .. "\n")
  os.exit(1)
end
print(string.format("oracle %s: %d ranks, %d checks, %d mismatches", config, ranks, checks, failures))
os.exit(failures == 0 and 0 or 1)
