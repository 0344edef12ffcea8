-- Stage 2: ParallelDims, as torchtitan/hyper_parallel's parallel_dims.py
-- defines it: degree validation, dp_shard = -1 inference, model checks, the
-- canonical mesh (pp > dp_replicate > dp_shard > cp > tp, only dims > 1:
-- torchtitan 0.3's dense mesh puts pp outermost)
-- and the flattened aliases fsdp (dp_shard x cp) / dp / loss. Messages follow the Python.
--
-- Expert parallel follows torchtitan 0.3 (parallel_dims.py's build_mesh,
-- not the seeds' peer mesh dim): ep is not a dim of the world; it borrows
-- its ranks from dp_shard * cp * tp, and the expert ("sparse") mesh is
-- (pp, dp_replicate, efsdp, ep) over the same ranks, row-major, with
-- efsdp = dp_shard * cp * tp / ep. The experts are not tensor-parallel
-- there (etp resolves to 1). docs/expert-parallel.md lists every difference
-- from the seeds.
local util = require("gen.util")

local dims = {}

dims.ORDER = { "pp", "dp_replicate", "dp_shard", "cp", "tp" }
-- torchtitan 0.3's sparse mesh (build_mesh's full_sparse_mesh), when ep > 1.
dims.SPARSE_ORDER = { "pp", "dp_replicate", "efsdp", "ep" }

local function fail(ctx, field, msg) util.field_error(ctx, field, msg) end

-- Product of the named degrees, or nil when it passes `limit` (checked
-- before each multiplication: no wrap).
local function degrees_product(d, names, limit)
  local p = 1
  for _, n in ipairs(names) do
    p = util.mul_within(p, d[n], limit)
    if not p then return nil end
  end
  return p
end

-- plan.parallel + world_size -> { degrees..., world_size }. load has
-- bounded every degree to [-2^18, 2^18] and world_size to [1, 2^18].
function dims.infer(ctx, parallel, world_size)
  local d = {
    dp_replicate = parallel.dp_replicate or 1,
    dp_shard = parallel.dp_shard,
    cp = parallel.cp or 1, tp = parallel.tp or 1, pp = parallel.pp or 1, ep = parallel.ep or 1,
    ulysses_degree = parallel.ulysses_degree, world_size = world_size,
  }
  -- etp: the seeds default it to tp; with ep > 1 torchtitan 0.3's experts
  -- are not tensor-parallel (ep borrows tp's ranks), so it resolves to 1.
  d.etp = parallel.etp or (d.ep > 1 and 1 or d.tp)
  local f = "parallel."
  -- Settings that would be accepted and ignored are refused.
  if parallel.dp ~= nil and parallel.dp_shard ~= nil then
    fail(ctx, f .. "dp", "dp is the legacy name of dp_shard and is ignored when dp_shard is given: remove one")
  end
  -- Legacy single `dp` maps to dp_shard when dp_shard is not given.
  -- torchtitan's default data_parallel_shard_degree is -1 (inferred).
  if d.dp_shard == nil then d.dp_shard = parallel.dp or -1 end
  for _, name in ipairs({ "dp_replicate", "cp", "tp", "pp", "ep", "etp" }) do
    if d[name] < 1 then
      fail(ctx, f .. name, string.format("Parallel degree %s=%d must be >= 1", name, d[name]))
    end
  end
  if d.dp_shard < -1 or d.dp_shard == 0 then
    fail(ctx, f .. "dp_shard", string.format("dp_shard=%d must be -1 (auto) or a positive int", d.dp_shard))
  end
  if parallel.etp ~= nil and d.ep == 1 then
    fail(ctx, f .. "etp", string.format("etp (expert tensor parallel) applies only with ep > 1; with ep=1 "
      .. "etp=%d changes nothing: remove it", d.etp))
  end
  if d.ulysses_degree ~= nil and d.cp == 1 then
    fail(ctx, f .. "ulysses_degree", string.format("ulysses_degree splits context parallel (cp); with cp=1 "
      .. "ulysses_degree=%d changes nothing: remove it or set cp", d.ulysses_degree))
  end
  if d.ulysses_degree ~= nil and d.ulysses_degree < 1 then
    fail(ctx, f .. "ulysses_degree", string.format("ulysses_degree=%d must be >= 1", d.ulysses_degree))
  end
  if d.dp_shard == -1 then
    -- ep borrows from dp_shard*cp*tp (torchtitan 0.3): it does not reduce
    -- the dp pool.
    local non_dp = degrees_product(d, { "dp_replicate", "cp", "tp", "pp" }, world_size)
    if not non_dp or world_size % non_dp ~= 0 then
      fail(ctx, f .. "dp_shard", string.format(
        "Cannot auto-infer dp_shard: world_size=%d is not divisible by dp_replicate*cp*tp*pp=%s",
        world_size, non_dp and tostring(non_dp) or ("more than " .. world_size)))
    end
    d.dp_shard = math.max(world_size // non_dp, 1)
    d.dp_shard_inferred = true
  end
  local product = degrees_product(d, { "dp_replicate", "dp_shard", "cp", "tp", "pp" }, world_size)
  if product ~= world_size then
    fail(ctx, f .. "dp_shard", string.format(
      "Invalid parallel dims: dp_replicate(%d) * dp_shard(%d) * cp(%d) * tp(%d) * pp(%d) = %s "
      .. "!= world_size(%d). Set dp_shard=-1 to auto-infer.",
      d.dp_replicate, d.dp_shard, d.cp, d.tp, d.pp,
      product and tostring(product) or ("more than " .. world_size), world_size))
  end
  if d.ep > 1 then
    -- dp_shard*cp*tp divides world_size here: no wrap.
    local pool = d.dp_shard * d.cp * d.tp
    if pool % d.ep ~= 0 then
      fail(ctx, f .. "ep", string.format("ep=%d must divide dp_shard*cp*tp=%d: expert parallel borrows its ranks "
        .. "from them (torchtitan 0.3: efsdp = dp_shard*cp*tp/ep); pick ep from the divisors of %d",
        d.ep, pool, pool))
    end
    if d.etp > 1 then
      -- torchtitan 0.3 has no etp (ParallelismConfig, config/configs.py:112-279: tensor_parallel_degree and
      -- expert_parallel_degree only); at ep > 1 its experts' placement has no TP axis (models/common/
      -- moe_sharding.py:29-47: EP Shard(0)), ep borrowing tp's ranks (parallel_dims.py:279)
      fail(ctx, f .. "etp", string.format("etp=%d: torchtitan 0.3 has no expert tensor-parallel degree (its "
        .. "ParallelismConfig, config/configs.py:112-279); at ep > 1 its experts are not tensor-parallel (EP "
        .. "Shard(0), no TP axis: models/common/moe_sharding.py:29-47; ep from dp_shard*cp*tp); set etp=1 or "
        .. "remove it", d.etp))
    end
    d.efsdp = pool // d.ep
  end
  if d.ulysses_degree ~= nil and d.cp > 1 then
    if d.ulysses_degree > d.cp then
      fail(ctx, f .. "ulysses_degree", string.format("ulysses_degree=%d must be <= cp=%d", d.ulysses_degree, d.cp))
    end
    if d.cp % d.ulysses_degree ~= 0 then
      fail(ctx, f .. "ulysses_degree", string.format("cp=%d must be divisible by ulysses_degree=%d", d.cp, d.ulysses_degree))
    end
  end
  return d
end

-- A rank's activations, bounded where their sizes enter: one rank's tokens
-- per micro-step (training.local_batch_size x seq_len: the plan's, else
-- torchtitan's default, gen/compute.lua's DEFAULTS) times the widest row an
-- activation buffer holds per token -- the model's dim, vocabulary, FFN or
-- attention width, an MoE layer's routed rows (top_k, or top_k x ep rows
-- gathered by expert parallel's all-to-alls, at most every expert) -- is
-- the largest buffer TP, CP, EP and the pipeline size from it, and the
-- memory model's largest term. At most ACT_NUMEL elements (as a unit's
-- slot, util.LIMITS.unit_slot: 4 TiB in fp32, past any GPU), and every
-- layer's at 4 bytes at most util.LIMITS.bytes in all; else one line
-- naming both fields, before any buffer is sized (the proofs would
-- otherwise find counts past 2^53, or integers wrap).
dims.ACT_NUMEL = 1 << 40

local function widest_row(cfg, ep)
  local huge = math.maxinteger
  local function mul(a, b) return util.mul_within(a or 0, b or 0, 1 << 62) or huge end
  local rows = {
    { cfg.dim, "dim" }, { cfg.vocab_size, "vocab_size" }, { cfg.hidden or cfg.hidden_dim, "the FFN's hidden dim" },
    { cfg.dense_hidden_dim, "dense_hidden_dim" },
    { mul(cfg.n_heads, cfg.head_dim), "n_heads x head_dim" }, { mul(cfg.n_kv_heads, cfg.head_dim), "n_kv_heads x head_dim" },
    { mul(cfg.n_heads, (cfg.qk_nope_head_dim or 0) + (cfg.qk_rope_head_dim or 0)), "n_heads x the q/k head dims" },
    { mul(cfg.n_heads, cfg.v_head_dim), "n_heads x v_head_dim" },
  }
  if cfg.top_k then
    -- routed rows per token: top_k for the experts' compute, up to top_k x ep in the all-to-alls' buffers
    local routed = math.max(cfg.top_k, math.min(mul(cfg.top_k, ep), math.max(cfg.num_experts or 0, cfg.top_k)))
    rows[#rows + 1] = { mul(routed, math.max(cfg.dim or 0, cfg.moe_hidden_dim or 0)),
                        string.format("%d routed rows x max(dim, moe_hidden_dim)", routed) }
  end
  local w, what = 1, "one element"
  for _, r in ipairs(rows) do
    if r[1] and r[1] > w then w, what = r[1], r[2] end
  end
  return w, what
end

-- The FLOPs the figures count per step stay integers that do not wrap:
-- 6 x tokens x parameters (an expert weight's share: top_k of its
-- experts), plus attention's 12 x tokens x seq_len x width per layer,
-- times the micro-steps, at most 2^62.
dims.STEP_FLOPS = 1 << 62

local function step_flops_within(units, cfg, tokens, seq, micro_steps)
  local L = dims.STEP_FLOPS
  local P = 0
  for _, u in ipairs(units or {}) do
    for _, q in ipairs(u.params) do
      local n = util.product_within(q.shape, 1 << 53) or (1 << 53)
      -- (a fused w13 [E, F, 2, D], model.fused "grouped_experts", as the E x F x D pair it replaces)
      if cfg and cfg.top_k and (#q.shape == 3 or #q.shape == 4) and q.name:find("routed_experts.inner_experts.", 1, true) then
        n = util.ceil_div(n, q.shape[1]) * math.min(cfg.top_k, q.shape[1])
      end
      P = P + n -- (at most 2^53 in all: the model's bound)
    end
  end
  local f = util.mul_within(6 * P, tokens, L)
  if cfg then
    local width = math.max((cfg.n_heads or 0) * math.max(cfg.head_dim or 0, (cfg.qk_nope_head_dim or 0)
      + (cfg.qk_rope_head_dim or 0)), cfg.dim or 0)
    local attn = util.mul_within(tokens, seq, L)
    attn = attn and util.mul_within(attn, width, L)
    attn = attn and util.mul_within(attn, 12 * (cfg.n_layers or 1), L)
    f = f and attn and util.add_within(f, attn, L)
  end
  return f and util.mul_within(f, micro_steps, L)
end

function dims.check_tokens(ctx, d, p, cfg)
  local tr = p.training or {}
  local b = tr.local_batch_size or 1
  local seq = p.model.seq_len or require("gen.compute").DEFAULTS.seq_len
  local w, what = 1, "one element"
  if cfg then w, what = widest_row(cfg, d.ep) end
  local tokens = util.mul_within(b, seq, dims.ACT_NUMEL)
  local elems = tokens and util.mul_within(tokens, w, dims.ACT_NUMEL)
  local layers = cfg and cfg.n_layers or 1
  local all = elems and util.mul_within(elems * 4, layers + 3, util.LIMITS.bytes)
  local field = tr.local_batch_size and "training.local_batch_size" or "model.seq_len"
  if all then return end
  util.field_error(ctx, field, string.format("local_batch_size %d x seq_len %d%s tokens per rank and micro-step, "
    .. "times the widest row an activation holds per token (%s: %d), is %s; lower training.local_batch_size or "
    .. "model.seq_len", b, seq, p.model.seq_len and "" or " (torchtitan's default)", what, w,
    elems and string.format("more than %s bytes of activations over %d layers", util.pow2_text(util.LIMITS.bytes),
      layers)
      or string.format("more than %s elements in one activation buffer (TP's, CP's, EP's and the pipeline's are "
      .. "sized from it)", util.pow2_text(dims.ACT_NUMEL))))
end

-- The step's FLOPs (units: the model's, before any parallelism splits them).
function dims.check_flops(ctx, p, cfg, units)
  local tr = p.training or {}
  local b = tr.local_batch_size or 1
  local seq = p.model.seq_len or require("gen.compute").DEFAULTS.seq_len
  local micro = p.fsdp and p.fsdp.micro_steps or 1
  -- (check_tokens ran first: b x seq fits)
  if step_flops_within(units, cfg, b * seq, seq, micro) then return end
  util.field_error(ctx, tr.local_batch_size and "training.local_batch_size" or "model.seq_len", string.format(
    "local_batch_size %d x seq_len %d%s tokens per rank and micro-step make more than %s FLOPs a step (6 x tokens "
    .. "x parameters, attention's tokens x seq_len, x %d micro-steps), past what the predicted step counts "
    .. "exactly; lower training.local_batch_size, model.seq_len or fsdp.micro_steps", b, seq,
    p.model.seq_len and "" or " (torchtitan's default)", util.pow2_text(dims.STEP_FLOPS), micro))
end

-- validate_against_model: runs for every number the model gives, and
-- (given the plan) bounds its activations (dims.check_tokens).
function dims.validate_model(ctx, d, model, p, units)
  if p then
    dims.check_tokens(ctx, d, p, model.config)
    dims.check_flops(ctx, p, model.config, units)
  end
  local heads, kv, experts, seq = model.n_heads, model.n_kv_heads, model.num_experts, model.seq_len
  if heads and d.tp > 1 and heads % d.tp ~= 0 then
    fail(ctx, "parallel.tp", string.format(
      "num_attention_heads=%d not divisible by tp=%d. Pick tp from the divisors of %d.", heads, d.tp, heads))
  end
  if kv and d.tp > 1 and kv % d.tp ~= 0 then
    fail(ctx, "parallel.tp", string.format(
      "num_key_value_heads=%d not divisible by tp=%d (GQA constraint). Pick tp from the divisors of %d.", kv, d.tp, kv))
  end
  if experts and d.ep > 1 and experts % d.ep ~= 0 then
    fail(ctx, "parallel.ep", string.format(
      "num_experts=%d not divisible by ep=%d. Pick ep from the divisors of %d.", experts, d.ep, experts))
  end
  -- cp and tp divide world_size (<= 2^18), so cp*tp cannot wrap.
  if seq and d.cp * d.tp > 1 and seq % (d.cp * d.tp) ~= 0 then
    local div = d.cp * d.tp
    fail(ctx, "model.seq_len", string.format(
      "max_seq_len=%d not divisible by cp*tp=%d. Increase seq_len to a multiple of %d or reduce cp/tp.", seq, div, div))
  end
end

-- The device mesh: materialized dims (size > 1) in canonical order, strides
-- for row-major rank numbering, and the flattened aliases.
function dims.mesh(d)
  local names, sizes = {}, {}
  for _, name in ipairs(dims.ORDER) do
    if d[name] > 1 then names[#names + 1] = name; sizes[#sizes + 1] = d[name] end
  end
  if #names == 0 then names, sizes = { "dp_shard" }, { d.world_size } end
  local strides = {}
  local s = 1
  for i = #sizes, 1, -1 do strides[i] = s; s = s * sizes[i] end
  local index = {}
  for i, n in ipairs(names) do index[n] = i end
  local has = function(n) return index[n] ~= nil end
  -- Alias -> list of base dim names, registered as _register_flatten_aliases does.
  local aliases, alias_order = {}, {}
  local function add(alias, src) aliases[alias] = src; alias_order[#alias_order + 1] = alias end
  -- FSDP shards over dp_shard x cp (torchtitan 0.3's fsdp mesh, fully_shard's
  -- ("dp_shard", "cp") under spmd_types: gen/parallel/cp.lua)
  if has("dp_shard") and has("cp") then add("fsdp", { "dp_shard", "cp" })
  elseif has("dp_shard") then add("fsdp", { "dp_shard" })
  elseif has("cp") then add("fsdp", { "cp" }) end
  if has("dp_replicate") and has("dp_shard") then add("dp", { "dp_replicate", "dp_shard" })
  elseif has("dp_replicate") then add("dp", { "dp_replicate" })
  elseif has("dp_shard") then add("dp", { "dp_shard" }) end
  if has("cp") then
    local src = {}
    for _, n in ipairs({ "dp_replicate", "dp_shard" }) do if has(n) then src[#src + 1] = n end end
    src[#src + 1] = "cp"
    add("loss", src)
  elseif aliases.dp then
    add("loss", aliases.dp)
  end
  return { names = names, sizes = sizes, strides = strides, index = index,
           aliases = aliases, alias_order = alias_order, world_size = d.world_size,
           sparse = d.ep > 1 and dims.sparse_mesh(d) or nil }
end

-- The expert mesh when ep > 1: torchtitan 0.3's full_sparse_mesh (pp,
-- dp_replicate, efsdp, ep) unflattened from the same world, row-major (ep
-- innermost: its groups are runs of consecutive ranks inside a group of
-- dp_shard*cp*tp). pp and dp_replicate only when > 1, as in the dense
-- mesh; efsdp and ep always (torchtitan keeps efsdp with a real backend
-- whenever ep > 1, even of size 1: fully_shard wraps the experts over it).
function dims.sparse_mesh(d)
  local names, sizes = {}, {}
  for _, name in ipairs(dims.SPARSE_ORDER) do
    if d[name] > 1 or name == "efsdp" or name == "ep" then names[#names + 1] = name; sizes[#sizes + 1] = d[name] end
  end
  local strides = {}
  local s = 1
  for i = #sizes, 1, -1 do strides[i] = s; s = s * sizes[i] end
  local index = {}
  for i, n in ipairs(names) do index[n] = i end
  return { names = names, sizes = sizes, strides = strides, index = index, world_size = d.world_size }
end

function dims.coords(mesh, rank)
  local c = {}
  for i = 1, #mesh.sizes do c[i] = (rank // mesh.strides[i]) % mesh.sizes[i] end
  return c
end

return dims
