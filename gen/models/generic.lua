-- Generic model: the plan lists its units in fully_shard (wrapping) order,
-- root last, each with its parameters in registration order. gen/load has
-- checked every name (printable ASCII, length) and every shape.
local util = require("gen.util")

local generic = {}

-- C names the generated header reserves next to <NAME>_UNIT_<unit> and
-- <NAME>_PARAM_<param> (templates/plan.h.in): the counts.
generic.RESERVED = { COUNT = "the generated count enumerator" }

-- Names that map to one C identifier (util.c_ident: "a.b" and "a_b", "W"
-- and "w") would declare one enumerator twice: refused, naming both.
-- seen: identifier -> { name, path } of its first holder.
local function check_c_name(ctx, seen, kind, enum, name, path)
  local id = util.c_ident(name)
  local reserved = generic.RESERVED[id]
  if reserved then
    util.field_error(ctx, path, string.format("%s %q becomes the C name <NAME>_%s_%s, %s in plan.h; rename it",
      kind, name, enum, id, reserved))
  end
  local first = seen[id]
  if first then
    util.field_error(ctx, path, string.format("%s %q and %s %q (%s) both become the C name <NAME>_%s_%s "
      .. "(every character but letters and digits maps to _, case is folded); rename one", kind, name, kind,
      first.name, first.path, enum, id))
  end
  seen[id] = { name = name, path = path }
end

-- A unit's 2-D weights' shapes as Llama block's, given Q = n_heads x
-- head_dim and kv = n_kv_heads x head_dim: wq [Q, d], wk and wv [kv, d]
-- (or torchtitan's fused wqkv [Q + 2kv, d]), wo [d, Q], w1 and w3 [f, d],
-- w2 [d, f], in any order and under any names. d, f, fused; or nil.
local function full(q) return q.full_shape or q.shape end

local function block_shape(u, Q, kv)
  local ws = {}
  for _, q in ipairs(u.params) do
    if #full(q) == 2 then ws[#ws + 1] = full(q) end
  end
  if #ws ~= 7 and #ws ~= 5 then return nil end
  local fused = #ws == 5
  local function take(pool, o, i)
    for j, w in ipairs(pool) do
      if w[1] == o and w[2] == i then table.remove(pool, j); return true end
    end
    return false
  end
  for _, cand in ipairs(ws) do
    local d = cand[2]
    local pool = {}
    for j, w in ipairs(ws) do pool[j] = w end
    local qkv = fused and take(pool, Q + 2 * kv, d)
      or not fused and take(pool, Q, d) and take(pool, kv, d) and take(pool, kv, d)
    if qkv and take(pool, d, Q) and #pool == 3 then
      local f = pool[1][1] == d and pool[1][2] or pool[1][1]
      if take(pool, f, d) and take(pool, f, d) and take(pool, d, f) then return d, f, fused end
    end
  end
  return nil
end

-- torchtitan's Llama block and ends by name (the names commplan.hf_config
-- writes): a generic model so named is placed over TP by torchtitan's
-- Llama plan (gen/parallel/tp.lua) and gets its TP activation collectives
-- (gen/parallel/tp_acts.lua's llama), biases and tied embeddings included.
generic.LLAMA_BLOCK = { "attention.wq.weight", "attention.wk.weight", "attention.wv.weight", "attention.wo.weight",
                        "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight" }

-- A generic model's decoder structure, where model gives its attention
-- shape (n_heads, head_dim, n_layers; n_kv_heads, enable_weight_tying) and
-- its units have it, found by the parameters' (full, pre-TP) shapes: n_layers
-- units each a decoder block of one d and f (a Llama block's seven 2-D
-- weights, or five with a fused wqkv, any names, any 1-D parameters: norms,
-- biases), the others holding the embedding (its 2-D weight named *embed*),
-- the output projection (output.weight; tied: the embedding's table) or only
-- 1-D parameters. Returns { cfg = { dim, hidden, n_heads, n_kv_heads,
-- head_dim, n_layers, vocab_size, enable_weight_tying }, block = { [unit
-- name] = true }, sac = { [param name] = true } (the weights torchtitan's
-- SAC recomputes), fused, head (the unit name holding the output
-- projection), head_weight, llama_names (every block's weights named as
-- torchtitan's Llama's, generic.LLAMA_BLOCK) }, or nil. With tp > 1 only a
-- decoder under Llama's names: its TP plan is then torchtitan's Llama plan;
-- under other names where TP shards its activations is not known.
function generic.decoder(model, units, tp)
  if not (model and model.n_heads and model.head_dim and model.n_layers) then return nil end
  local kvh = model.n_kv_heads or model.n_heads
  local Q, kv = model.n_heads * model.head_dim, kvh * model.head_dim
  local r = { block = {}, sac = {}, llama_names = true,
              cfg = { n_heads = model.n_heads, n_kv_heads = kvh, head_dim = model.head_dim, n_layers = model.n_layers,
                      enable_weight_tying = model.enable_weight_tying } }
  local others, n = {}, 0
  for _, u in ipairs(units) do
    local d, f, fused = block_shape(u, Q, kv)
    if d and (not r.cfg.dim or (r.cfg.dim == d and r.cfg.hidden == f and r.fused == fused)) then
      r.cfg.dim, r.cfg.hidden, r.fused, r.block[u.name] = d, f, fused, true
      -- SelectiveAC's every second mm in forward order (wq, wk, wv, wo, w1, w3, w2; fused:
      -- wqkv, wo, w1, w3, w2): wk, wo, w3 -- one weight of each shape, [kv, d] (unfused), [d, Q],
      -- [f, d], whichever holds it (their cost is their shape's)
      local want = {}
      for _, k in ipairs({ not fused and (kv .. "x" .. d) or nil, d .. "x" .. Q, f .. "x" .. d }) do
        want[k] = (want[k] or 0) + 1
      end
      local names = {}
      for _, q in ipairs(u.params) do
        local s = full(q)
        local key = #s == 2 and (s[1] .. "x" .. s[2])
        if key and (want[key] or 0) > 0 then
          want[key], r.sac[q.name] = want[key] - 1, true
        end
        if #s == 2 then names[q.name:gsub("^layers%.%d+%.", "")] = true end
      end
      for _, w in ipairs(generic.LLAMA_BLOCK) do r.llama_names = r.llama_names and names[w] == true end
      n = n + 1
    else
      others[#others + 1] = u
    end
  end
  local ok = n == model.n_layers and n > 0
  local d = r.cfg.dim
  for _, u in ipairs(ok and others or {}) do
    for _, q in ipairs(u.params) do
      local s = full(q)
      if #s == 2 then
        local embed = q.name:find("embed", 1, true) ~= nil
        if s[2] ~= d or (r.cfg.vocab_size and r.cfg.vocab_size ~= s[1]) then ok = false
        elseif not embed or model.enable_weight_tying then
          -- the output projection: output.weight, or the tied embedding's table
          if r.head then ok = false end
          r.head, r.head_weight = u.name, q.name
        end
        r.cfg.vocab_size = s[1]
      elseif #s > 2 then ok = false end
    end
  end
  ok = ok and r.head ~= nil
  r.llama_names = r.llama_names and (r.head_weight == (model.enable_weight_tying and "tok_embeddings.weight"
    or "output.weight"))
  if not ok or (tp > 1 and not r.llama_names) then return nil end
  return r
end

function generic.units(ctx, model)
  local seen_unit, seen_param = {}, {}
  local unit_ids, param_ids = {}, {}
  local units = {}
  for i, u in ipairs(model.units) do
    local path = string.format("model.units[%d]", i)
    if seen_unit[u.name] then
      util.field_error(ctx, path .. ".name", string.format("unit %q appears twice (units %d and %d); give each unit its own name",
        u.name, seen_unit[u.name], i))
    end
    seen_unit[u.name] = i
    check_c_name(ctx, unit_ids, "unit", "UNIT", u.name, path .. ".name")
    local params = {}
    for j, p in ipairs(u.params) do
      local ppath = string.format("%s.params[%d].name", path, j)
      if seen_param[p.name] then
        util.field_error(ctx, ppath, string.format(
          "parameter %q is already in unit %q; FSDP2 gives a parameter to one unit only (wrap both modules in one unit)",
          p.name, seen_param[p.name]))
      end
      seen_param[p.name] = u.name
      check_c_name(ctx, param_ids, "parameter", "PARAM", p.name, ppath)
      params[j] = { name = p.name, shape = p.shape, dtype = p.dtype, shard_dim = p.shard_dim, tp = p.tp }
    end
    -- torchtitan's [norm, lm_head] unit (ChunkedLossWrapper's, gen/parallel/fsdp_schedule.lua):
    -- the norm's weight, then lm_head's, as fully_shard([norm, lm_head]) orders them
    if u.loss_head and #u.params ~= 2 then
      util.field_error(ctx, path .. ".loss_head", string.format("unit %q has %d parameters; the loss head is "
        .. "torchtitan's [norm, lm_head] (distributed/fsdp.py:202-207): the norm's weight, then lm_head's, "
        .. "without biases; drop loss_head or wrap those two modules alone", u.name, #u.params))
    end
    units[i] = { name = u.name, params = params, reshard_after_forward = u.reshard_after_forward,
                 param_dtype = u.param_dtype, reduce_dtype = u.reduce_dtype, loss_head = u.loss_head or nil }
  end
  return units, { n_heads = model.n_heads, n_kv_heads = model.n_kv_heads, num_experts = model.num_experts,
                  seq_len = model.seq_len }
end

return generic
