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
-- w2 [d, f], in any order and under any names. d, f, fused; or nil. A
-- fused SwiGLU's w13 [f, 2, d] (torchtitan's fused_swiglu override,
-- gen/models/fused.lua) counts as w1 and w3.
local function full(q) return q.full_shape or q.shape end
local function is_w13(q) local s = full(q); return #s == 3 and s[2] == 2 and q.name:sub(-4) == ".w13" end

local function block_shape(u, Q, kv)
  local ws = {}
  for _, q in ipairs(u.params) do
    if #full(q) == 2 then ws[#ws + 1] = full(q) end
    if is_w13(q) then
      local s = full(q)
      ws[#ws + 1], ws[#ws + 2] = { s[1], s[3] }, { s[1], s[3] }
    end
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

-- The decoders' names whose TP plan and activation collectives are known,
-- by the family that has them (gen/parallel/tp.lua, tp_acts.lua): "llama",
-- torchtitan <= 0.2's Llama (the names commplan.hf_config writes: Qwen2's
-- q/k/v biases, Llama's attention_bias / mlp_bias and tied embeddings), and
-- "qwen3", torchtitan 0.3's decoder (models/common/decoder_sharding.py, the
-- plan llama3 and qwen3 share; the names commplan.plan_from_titan writes:
-- qkv_linear's fused wqkv or wq, wk, wv, lm_head). Each: the block's 2-D
-- weights (one of the sets) and the output projection's name.
generic.NAMES = {
  llama = { blocks = { { "attention.wq.weight", "attention.wk.weight", "attention.wv.weight", "attention.wo.weight",
                         "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight" } },
            output = "output.weight" },
  qwen3 = { blocks = { { "attention.qkv_linear.wqkv.weight", "attention.wo.weight", "feed_forward.w1.weight",
                         "feed_forward.w2.weight", "feed_forward.w3.weight" },
                       { "attention.qkv_linear.wq.weight", "attention.qkv_linear.wk.weight",
                         "attention.qkv_linear.wv.weight", "attention.wo.weight", "feed_forward.w1.weight",
                         "feed_forward.w2.weight", "feed_forward.w3.weight" },
                       -- (fused SwiGLU: w2, w13; gen/models/fused.lua)
                       { "attention.qkv_linear.wqkv.weight", "attention.wo.weight", "feed_forward.w2.weight",
                         "feed_forward.w13" },
                       { "attention.qkv_linear.wq.weight", "attention.qkv_linear.wk.weight",
                         "attention.qkv_linear.wv.weight", "attention.wo.weight", "feed_forward.w2.weight",
                         "feed_forward.w13" } },
            output = "lm_head.weight" },
}

-- Which generic.NAMES a block's 2-D weights' names (suffix -> true, n of them) are.
local function names_of(set, n)
  for fam, spec in pairs(generic.NAMES) do
    for _, b in ipairs(spec.blocks) do
      local all = #b == n
      for _, w in ipairs(b) do all = all and set[w] == true end
      if all then return fam end
    end
  end
  return nil
end

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
-- projection), head_weight, names (the family of generic.NAMES every block's
-- and the output's names are, or nil) }, or nil. With tp > 1 only a decoder
-- under those names: its TP plan is then that family's; under other names
-- where TP shards its activations is not known.
function generic.decoder(model, units, tp)
  if not (model and model.n_heads and model.head_dim and model.n_layers) then return nil end
  local kvh = model.n_kv_heads or model.n_heads
  local Q, kv = model.n_heads * model.head_dim, kvh * model.head_dim
  local r = { block = {}, sac = {},
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
      local names, n2 = {}, 0
      for _, q in ipairs(u.params) do
        local s = full(q)
        local key = #s == 2 and (s[1] .. "x" .. s[2])
        if key and (want[key] or 0) > 0 then
          want[key], r.sac[q.name] = want[key] - 1, true
        end
        if #s == 2 or is_w13(q) then names[q.name:gsub("^layers%.%d+%.", "")], n2 = true, n2 + 1 end
      end
      local fam = names_of(names, n2)
      if n == 0 then r.names = fam elseif r.names ~= fam then r.names = nil end
      n = n + 1
    else
      others[#others + 1] = u
    end
  end
  local ok = n == model.n_layers and n > 0
  local d = r.cfg.dim
  local tables = {} -- the embedding's tables (tied: the output projection where no other is)
  for _, u in ipairs(ok and others or {}) do
    for _, q in ipairs(u.params) do
      local s = full(q)
      if #s == 2 then
        if s[2] ~= d or (r.cfg.vocab_size and r.cfg.vocab_size ~= s[1]) then ok = false
        elseif q.name:find("embed", 1, true) then tables[#tables + 1] = { u.name, q.name }
        else
          -- the output projection (output.weight, lm_head.weight: any name but *embed*)
          if r.head then ok = false end
          r.head, r.head_weight = u.name, q.name
        end
        r.cfg.vocab_size = s[1]
      elseif #s > 2 then ok = false end
    end
  end
  -- tied embeddings: one table for both ends (commplan.hf_config's), or torchtitan 0.3's
  -- lm_head.weight beside it (untied under spmd_types before fully_shard, gen/models/qwen3.lua)
  if not r.head and model.enable_weight_tying and #tables == 1 then r.head, r.head_weight = tables[1][1], tables[1][2] end
  ok = ok and r.head ~= nil
  if r.names and r.head_weight ~= generic.NAMES[r.names].output
     and not (model.enable_weight_tying and r.head_weight == "tok_embeddings.weight") then
    r.names = nil
  end
  if not ok or (tp > 1 and not r.names) then return nil end
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
    local params, ignored = {}, {}
    for j, p in ipairs(u.params) do
      local ppath = string.format("%s.params[%d].name", path, j)
      if seen_param[p.name] then
        util.field_error(ctx, ppath, string.format(
          "parameter %q is already in unit %q; FSDP2 gives a parameter to one unit only (wrap both modules in one unit)",
          p.name, seen_param[p.name]))
      end
      seen_param[p.name] = u.name
      check_c_name(ctx, param_ids, "parameter", "PARAM", p.name, ppath)
      local q = { name = p.name, shape = p.shape, dtype = p.dtype, shard_dim = p.shard_dim, tp = p.tp,
                  param_dtype = p.param_dtype, frozen = p.frozen or nil }
      if p.ignored and p.frozen then
        util.field_error(ctx, string.format("%s.params[%d].frozen", path, j), "an ignored parameter is in no "
          .. "collective, so freezing it changes nothing FSDP2 does (its gradient is the training loop's): remove "
          .. "frozen or ignored")
      end
      if p.ignored then
        -- fully_shard's ignored_params (torch 2.15 _fsdp_init.py:342-360: left out of the managed
        -- parameters): no FSDP param, no collective; whole on every rank (the audit's memory counts it)
        if p.param_dtype then
          util.field_error(ctx, string.format("%s.params[%d].param_dtype", path, j), "an ignored parameter is "
            .. "never all-gathered, so its param_dtype changes nothing: remove it")
        end
        if u.loss_head then
          util.field_error(ctx, string.format("%s.params[%d].ignored", path, j), "the loss head is torchtitan's "
            .. "[norm, lm_head] with both parameters sharded (distributed/fsdp.py:202-207): remove ignored")
        end
        ignored[#ignored + 1] = q
      else
        params[#params + 1] = q
      end
    end
    -- torchtitan's [norm, lm_head] unit (ChunkedLossWrapper's, gen/parallel/fsdp_schedule.lua):
    -- the norm's weight, then lm_head's, as fully_shard([norm, lm_head]) orders them
    if u.loss_head and #u.params ~= 2 then
      util.field_error(ctx, path .. ".loss_head", string.format("unit %q has %d parameters; the loss head is "
        .. "torchtitan's [norm, lm_head] (distributed/fsdp.py:202-207): the norm's weight, then lm_head's, "
        .. "without biases; drop loss_head or wrap those two modules alone", u.name, #u.params))
    end
    units[i] = { name = u.name, params = params, ignored = ignored[1] and ignored or nil,
                 reshard_after_forward = u.reshard_after_forward,
                 reshard_after_backward = u.reshard_after_backward,
                 unshard_in_backward = u.unshard_in_backward,
                 forward_prefetch = u.forward_prefetch, backward_prefetch = u.backward_prefetch,
                 param_dtype = u.param_dtype, reduce_dtype = u.reduce_dtype, loss_head = u.loss_head or nil,
                 gradient_divide_factor = u.gradient_divide_factor,
                 force_sum_reduction_for_comms = u.force_sum_reduction_for_comms,
                 grad_accumulation = u.grad_accumulation,
                 cpu_offload = u.cpu_offload, pin_memory = u.pin_memory }
  end
  local sharded, trainable = 0, 0
  for _, u in ipairs(units) do
    sharded = sharded + #u.params
    for _, q in ipairs(u.params) do trainable = trainable + (q.frozen and 0 or 1) end
  end
  if model.input_requires_grad == false and sharded > 0 and trainable == 0 then
    util.field_error(ctx, "model.input_requires_grad", "every parameter FSDP manages is frozen and the input needs "
      .. "no gradient, so the loss has none and backward raises (torch: 'element 0 of tensors does not require "
      .. "grad'); unfreeze a parameter, or drop input_requires_grad = false")
  end
  if sharded == 0 then
    util.field_error(ctx, "model.units", "every parameter is ignored (ignored = true), so FSDP2 shards and "
      .. "communicates nothing and there is nothing to plan: leave at least one parameter to FSDP")
  end
  return units, { n_heads = model.n_heads, n_kv_heads = model.n_kv_heads, num_experts = model.num_experts,
                  seq_len = model.seq_len, attn_backend = model.attn_backend }
end

return generic
