-- The expected trace (gen/expect.lua): each rank's collectives, sends and
-- receives per step in Flight Recorder's terms, from plan.json alone.
local H = require("helpers")
local expect = require("gen.expect")
local plandiff = require("gen.plandiff")
local T = {}

local function doc_of(path) return (plandiff.load(path)) end

-- Every group instance's ids, the folded rows expanded, run 1..per_step
-- without a gap or a repeat, and the members of an instance agree on its
-- sequence (op, sizes, dtype at every id): what Flight Recorder matches.
local function ids_complete(doc, r)
  local rows, per_group = expect.rows(doc, r)
  local seen = {}
  for _, row in ipairs(rows) do
    local key = row.group and (row.group .. "#" .. row.instance) or (row.op .. "@" .. row.peer)
    seen[key] = seen[key] or {}
    for k = 0, (row.times or 1) - 1 do
      local id = row.group_seq + k * (row.stride or 0)
      assert(not seen[key][id], string.format("rank %d: %s id %d twice", r, key, id))
      seen[key][id] = row
    end
  end
  for key, n in pairs(per_group) do
    for id = 1, n do assert(seen[key][id], string.format("rank %d: %s id %d missing of %d", r, key, id, n)) end
  end
  return seen
end

local function agree(doc)
  local by_instance = {}
  for r = 0, doc.world_size - 1 do
    for key, ids in pairs(ids_complete(doc, r)) do
      if not key:find("@") then
        local prev = by_instance[key]
        if prev then
          for id, row in pairs(ids) do
            local o = prev[id]
            assert(o and o.op == row.op and o.numel_in == row.numel_in and o.dtype == row.dtype,
              string.format("rank %d: %s id %d: %s %s, a peer has %s", r, key, id, row.op, tostring(row.numel_in),
                o and (o.op .. " " .. tostring(o.numel_in)) or "nothing"))
          end
        else by_instance[key] = ids end
      end
    end
  end
end

function T.fsdp4_rows()
  local doc = doc_of("plans/fsdp4/plan.json")
  local rows, per_group = expect.rows(doc, 2)
  H.eq(#rows, 11, "rows")
  H.eq(per_group["fsdp#0"], 11, "fsdp ids per step")
  H.eq(rows[1].op, "all_gather"); H.eq(rows[1].numel_in, 243); H.eq(rows[1].numel_out, 972)
  H.eq(rows[11].op, "reduce_scatter"); H.eq(rows[11].numel_in, 972); H.eq(rows[11].numel_out, 243)
  H.eq(rows[1].dtype, "Float")
  assert(expect.name(rows[7]):find("reduce%-scatter of layers%.2's gradients %(backward, micro%-step 0"),
    expect.name(rows[7]))
  agree(doc)
end

function T.instances_hsdp()
  local doc = doc_of("plans/hsdp2x2/plan.json")
  local g = {}
  for _, x in ipairs(doc.groups) do g[x.name] = x end
  local ranks, color = expect.instance(g.dp_replicate, 3)
  H.eq(table.concat(ranks, ","), "1,3"); H.eq(color, 1)
  ranks, color = expect.instance(g.fsdp, 3)
  H.eq(table.concat(ranks, ","), "2,3"); H.eq(color, 1)
  agree(doc)
end

-- A repeated micro-step: its rows folded, the ids still every issue's.
function T.folded_repeat()
  local doc = doc_of("plans/hsdp2x3_bf16/plan.json")
  assert(doc["repeat"], "hsdp2x3_bf16 folds its micro-steps")
  local rows = expect.rows(doc, 4)
  local folded = 0
  for _, row in ipairs(rows) do if row.times then folded = folded + 1 end end
  assert(folded > 0, "folded rows")
  agree(doc)
end

-- A pipeline plan: every send has its receive on the peer, in order, same size.
function T.pipeline_messages_pair()
  local doc = plandiff.doc_from_source(H.read("tests/plans/llama_tiny_cppp.lua"), "tests/plans/llama_tiny_cppp.lua")
  assert(doc.pipeline, "a pipeline plan")
  local sends, recvs = {}, {}
  for r = 0, doc.world_size - 1 do
    for _, row in ipairs(expect.rows(doc, r)) do
      if row.op == "send" then
        local k = r .. ">" .. row.peer
        sends[k] = sends[k] or {}; sends[k][#sends[k] + 1] = row.numel_in
      elseif row.op == "recv" then
        local k = row.peer .. ">" .. r
        recvs[k] = recvs[k] or {}; recvs[k][#recvs[k] + 1] = row.numel_in
      end
    end
    ids_complete(doc, r)
  end
  local n = 0
  for k, list in pairs(sends) do
    H.eq(table.concat(list, ","), table.concat(recvs[k] or {}, ","), "messages " .. k)
    n = n + #list
  end
  assert(n > 0, "messages")
  agree(doc)
end

-- Expert parallelism: the count exchange moves every expert's count over
-- the ep instance; the token all-to-alls carry no sizes (routing decides).
function T.expert_counts_sized()
  local doc = plandiff.doc_from_source(H.read("tests/ep/plans/ep2_mixtral.lua"), "tests/ep/plans/ep2_mixtral.lua")
  local counts, tokens = 0, 0
  for _, row in ipairs(expect.rows(doc, 1)) do
    if row.kind == "a2a_counts" then
      counts = counts + 1
      H.eq(row.numel_in, 4, "every expert's count (2 per member x ep 2)"); H.eq(row.numel_out, 4)
      H.eq(row.dtype, "Long", "torchtitan's counts are int64 (moe.py:437)")
      H.eq(table.concat(row.ranks, ","), "0,1")
    elseif row.kind == "a2a" then
      tokens = tokens + 1
      H.eq(row.numel_in, nil, "a token all-to-all's size")
    end
  end
  assert(counts > 0 and tokens > 0, "ep rows")
  agree(doc)
end

-- A pipeline message goes over the rank's pipeline group, its peer in it.
function T.pipeline_pg()
  local doc = plandiff.doc_from_source(H.read("tests/plans/llama_tiny_cppp.lua"), "tests/plans/llama_tiny_cppp.lua")
  for r = 0, doc.world_size - 1 do
    for _, row in ipairs(expect.rows(doc, r)) do
      if row.peer then
        H.eq(row.pg, "pp")
        local has_r, has_peer = false, false
        for _, x in ipairs(row.pg_ranks) do
          has_r = has_r or x == r; has_peer = has_peer or x == row.peer
        end
        assert(has_r and has_peer and row.peer ~= r, "rank " .. r .. ": peer " .. row.peer .. " outside its pp group")
      end
    end
  end
end

-- A mutant: one unit's parameter of another shape moves that unit's counts, not the others'.
function T.mutant_shape_moves_counts()
  local src = H.read("plans/fsdp4.lua")
  local a = plandiff.doc_from_source(src, "plans/fsdp4.lua")
  local b = plandiff.doc_from_source((src:gsub('p%("w1", { 20, 12 }%)', 'p("w1", { 24, 12 })', 1)), "plans/fsdp4.lua")
  local ra, rb = expect.rows(a, 0), expect.rows(b, 0)
  H.eq(#ra, #rb)
  local differ = 0
  for i = 1, #ra do if ra[i].numel_in ~= rb[i].numel_in then differ = differ + 1 end end
  -- layers.0's params all change (the same p() builds every layer): 3 layers x (2 AG + 1 RS)
  H.eq(differ, 9, "rows whose sizes moved")
end

return T
