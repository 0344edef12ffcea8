-- Context parallel, the module (gen/parallel/init.lua's contract), as
-- torchtitan 0.3 runs it on every family with an attention (cp.FAMILIES,
-- and a generic decoder under one's names: gen/models/generic.lua's decoder;
-- docs/context-parallel.md; recorded live on gloo by
-- tests/titan/test_cp_record.py):
--  * the mesh: cp is a dim of the dense mesh between dp_shard and tp
--    (gen/dims.lua), and FSDP shards over dp_shard x cp (gen/dims.lua's
--    fsdp alias, gen/parallel/fsdp_layout.lua's W): torchtitan's fsdp mesh,
--    fully_shard's ("dp_shard", "cp") under its default spmd_types backend;
--    HSDP replicates over dp_replicate as without cp;
--  * each rank runs seq_len / cp tokens of every sequence (the head-tail
--    load balancer shards inputs, labels, positions and the block mask: no
--    collective), so the activation model's tokens divide by cp
--    (gen/compute.lua);
--  * unit_ops: every transformer block's attention all-gathers K and V over
--    the cp group before flex attention (spmd_types' S(1) -> R on cp, one
--    all_gather_into_tensor each), and its backward reduce-scatters their
--    gradients (SUM; V's first), inside the block's compute: per rank
--    local_batch_size x seq_len / cp x n_kv_heads x head_dim elements each,
--    in the block's compute dtype (its all-gather dtype). They are the
--    activation collectives' op kinds (gen/opkinds.lua's tp_all_gather,
--    tp_reduce_scatter: in place on the unit's activation buffer, over the
--    op's group, the rank's slot its key in that group) on group "cp".
--    Under activation checkpointing (full or selective: torchtitan wraps
--    every block) the backward re-runs the block's forward first, and with
--    it the two all-gathers (spmd_types issues them as c10d all-gathers,
--    which SelectiveAC's save list does not hold): recorded live, they
--    come before the gradients' reduce-scatters (recompute = true).
--  * beside TP (with or without sequence parallelism; recorded live:
--    test_cp_record.py's cp2_tp2, cp2_tp2_nosp): the mesh is (.., cp, tp),
--    TP the inner dim of FSDP's dp_shard x cp storage mesh
--    (distributed/full_dtensor.py:56, :92-95); the inputs are S(1) on cp
--    and R on tp (full_dtensor.py:145-152), so TP's activation
--    collectives carry the rank's seq_len / cp tokens (gen/parallel/tp.lua),
--    and the K/V the attention exchanges are its TP-local kv heads,
--    n_kv_heads / tp (S(2) on tp, S(1) -> R on cp at the inner attention's
--    local_map: models/common/decoder_sharding.py:225-260). The exchange
--    sits between TP's attention-input gather and wo's output collective
--    (backward: between wo's output-gradient one and the attention input
--    gradient's): each op names its region in the block and
--    gen/parallel/init.lua's unit_ops merges the two modules' ops by it.
--  * on DeepSeek-V3 (MLA: K and V of different widths, cp.FAMILIES;
--    recorded: dsv3_dp2_cp2, dsv3_cp2_tp2) the same, V's gradient first;
--  * on gpt-oss (attn_backend "flex"; recorded: gpt_dp2_cp2, gpt_cp2_tp2,
--    gpt_dp2_cp2_ep2) the same, its sinks and sliding window adding none;
--  * on the MoE families (mixtral, qwen3_moe: torchtitan's Qwen3 MoE
--    decoder, flex attention; recorded live: mixtral_dp2_cp2) the same
--    exchange in each block's attention; beside EP (ep borrows the
--    innermost ranks of dp_shard x cp x tp, gen/dims.lua) each rank routes
--    its own seq_len / cp tokens (gen/parallel/ep.lua), the dispatch after
--    the block's K/V all-gathers (recorded: mixtral_dp2_cp2_ep2).
-- Refused, one line each: Ulysses (torch 2.15 and torchtitan 0.3 have
-- none), ep and cp x tp that do not nest (the runtime's refined mesh), a
-- family not in cp.FAMILIES, gpt-oss's default varlen attention (torchtitan
-- refuses it under CP), a seq_len torchtitan refuses (its Trainer's
-- tp (under SP) x 2 x cp, trainer.py:306-315; flex's CP block mask needs
-- cp x 128).
-- Inside a pipeline (pp > 1: torchtitan's pipeline_llm runs parallelize_llama
-- on every stage's module, distributed/pipeline_parallel.py:111) PP's stage
-- mesh keeps cp: these hooks plan each stage (one microbatch, so the K/V
-- counts and the activations between stages are the microbatch's seq_len / cp
-- tokens) and PP's step calls unit_ops inside every F and B (docs/pipeline.md).
local util = require("gen.util")
local generic = require("gen.models.generic")

local cp = { name = "cp", label = "CP", dims = { "cp" }, groups = { "cp" } }

-- flex attention's query block (torch's _DEFAULT_SPARSE_BLOCK_SIZE): the CP
-- block mask needs seq_len divisible by cp x it (_create_cp_block_mask).
cp.FLEX_BLOCK = 128

function cp.used(d) return d.cp > 1 end

local function refuse(ctx, field, fmt, ...) util.field_error(ctx, field, string.format(fmt, ...)) end

-- The degrees alone (gen/parallel/init.lua's check_supported runs it, as
-- tests/titan/dims_dump.lua does): Ulysses, and ep across cp groups
-- without nesting.
function cp.check_dims(ctx, d)
  if d.cp == 1 then return end -- (ulysses_degree without cp: gen/dims.lua refuses it)
  if d.ulysses_degree ~= nil then
    refuse(ctx, "parallel.ulysses_degree", "ulysses_degree=%d: torch 2.15 and torchtitan 0.3 have no Ulysses "
      .. "(all-to-all over heads) context parallel; their cp all-gathers K and V over the sequence "
      .. "(docs/context-parallel.md): remove ulysses_degree", d.ulysses_degree)
  end
  -- ep borrows the innermost ranks of dp_shard x cp x tp (gen/dims.lua);
  -- the runtime's mesh refines the dense and expert meshes
  -- (gen/emit.lua's refined_mesh), whose strides must nest: ep a multiple
  -- or a divisor of cp x tp (every power-of-two choice is)
  local inner = d.cp * d.tp
  if d.ep > 1 and d.ep % inner ~= 0 and inner % d.ep ~= 0 then
    refuse(ctx, "parallel.cp", "cp=%d x tp=%d with ep=%d: the expert mesh's ep groups would cut across cp groups "
      .. "without nesting (commplan's runtime mesh refines the two meshes; torchtitan runs it); pick ep a multiple "
      .. "or a divisor of %d, or set cp=1", d.cp, d.tp, d.ep, inner)
  end
end

-- The families whose attention exchanges K/V over cp: the suffix of the
-- parameter that marks a block, and the per-token widths of K and V as the
-- inner attention gets them on a TP rank (tp: the TP degree). torchtitan
-- 0.3's llama3, qwen3 (and its MoE decoder: mixtral, qwen3_moe) and
-- deepseek_v3 registries build FlexAttention (attn_backend="flex" by
-- default: models/qwen3/__init__.py:613-622, models/deepseek_v3/__init__.py:
-- 618 -> models/common/config_utils.py:83-84), which distributed/
-- full_dtensor.py:44-52 (validate_config) accepts under CP. GQA: K and V
-- of the TP-local kv heads (n_kv_heads / tp; qwen3's q_norm / k_norm run
-- before the exchange, at the inner attention's boundary, and add none).
-- MLA (models/deepseek_v3/model.py:127-143): K = [k_nope, k_pe expanded]
-- and V of the TP-local heads (n_heads / tp: wkv_b colwise), qk_nope +
-- qk_rope and v_head_dim wide.
local function gqa(cfg, tp) local w = cfg.n_kv_heads // tp * cfg.head_dim; return w, w end
local function mla(cfg, tp)
  local h = cfg.n_heads // tp
  return h * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim), h * cfg.v_head_dim
end
local ATTN = "attention.wo.weight"
cp.FAMILIES = { llama = { block = ATTN, widths = gqa }, qwen3 = { block = ATTN, widths = gqa },
                mixtral = { block = ATTN, widths = gqa }, qwen3_moe = { block = ATTN, widths = gqa },
                deepseek_v3 = { block = ATTN, widths = mla },
                -- gpt-oss: GQA's exchange (recorded live: test_cp_record.py's gpt_* configs); its sinks
                -- rescale by flex's lse over the gathered keys and its sliding window is a block mask, so
                -- neither adds a collective
                gpt_oss = { block = ATTN, widths = gqa } }

-- numbers: the model family's (gen/models/*.lua units' second result), attn_backend its resolved backend
function cp.rules(ctx, d, p, numbers)
  if d.cp == 1 then return end
  -- (a generic model giving its attention shape may be a decoder under a
  -- family's names: cp.on_layout refuses it where it is not)
  local m = p.model
  local maybe = m.family == "generic" and m.n_heads ~= nil and m.head_dim ~= nil and m.n_layers ~= nil
  if not cp.FAMILIES[m.family] and not maybe then
    refuse(ctx, "parallel.cp", "cp=%d: context parallel is planned for the families whose attention exchanges K "
      .. "and V over cp (llama, qwen3, mixtral, qwen3_moe, deepseek_v3, gpt_oss); the %s family has none; set cp=1",
      d.cp, p.model.family)
  end
  -- torchtitan runs CP with flex attention only: varlen (and sdpa) refused under spmd_types
  -- (distributed/full_dtensor.py:44-52, validate_config) and under the other backends
  -- (distributed/context_parallel/api.py:103-104); the backend as the family resolved it (its registry's default
  -- where model.attn_backend is unset: gen/models/*.lua)
  local backend = numbers and numbers.attn_backend
  if backend and backend ~= "flex" then
    refuse(ctx, "model.attn_backend", "cp=%d with attn_backend \"%s\"%s: torchtitan refuses context parallel with "
      .. "varlen attention (distributed/full_dtensor.py:44-52; context_parallel/api.py:103-104); set attn_backend = "
      .. "\"flex\" (as torchtitan's model_registry(..., attn_backend=\"flex\") builds it) or cp=1", d.cp,
      backend, m.attn_backend and "" or " (the registry's default)")
  end
  local seq = p.model.seq_len
  if not seq then
    refuse(ctx, "model.seq_len", "cp=%d: seq_len is needed to size the K/V all-gathers; set model.seq_len (and "
      .. "training.local_batch_size, sequences per rank, default 1)", d.cp)
  end
  -- torchtitan's Trainer (trainer.py:306-315): seq_len % (tp under sequence
  -- parallelism x 2 x cp): the head-tail balancer's 2 x cp chunks, each
  -- rank's seq_len / cp tokens then cut in tp sequence shards
  local sp = d.tp > 1 and p.parallel.sequence_parallel ~= false
  local div = (sp and d.tp or 1) * 2 * d.cp
  if seq % div ~= 0 then
    refuse(ctx, "model.seq_len", "seq_len=%d is not divisible by %s%d (torchtitan's Trainer, trainer.py:306: the "
      .. "head-tail load balancer cuts each sequence into 2 x cp chunks%s); pick seq_len a multiple of %d", seq,
      sp and "tp x 2 x cp = " or "2 x cp=", div, sp and ", sequence parallelism each rank's tokens in tp" or "", div)
  end
  -- torch's _create_cp_block_mask: Q_LEN % (cp * flex's query block)
  local block = d.cp * cp.FLEX_BLOCK
  if seq % block ~= 0 then
    refuse(ctx, "model.seq_len", "seq_len=%d is not divisible by cp x %d = %d (torch's CP block mask for flex "
      .. "attention, torchtitan's attention under CP); pick seq_len a multiple of %d", seq, cp.FLEX_BLOCK, block, block)
  end
end

local function holds(u, suffix)
  for _, q in ipairs(u.params) do
    if q.name:sub(-#suffix) == suffix then return true end
  end
  return false
end

-- Each block's K/V exchange: u.cp_acts (each act its count), and the
-- unit's activation buffer (act_numel, ag_dtype elements) at least the
-- gathered K and V.
function cp.on_layout(ctx, lay, units, d, p, cfg)
  local b = p.training and p.training.local_batch_size or 1
  local family = p.model.family
  if family == "generic" then
    -- a decoder under torchtitan's Llama or decoder names (gen/models/generic.lua's decoder,
    -- the decision TP's placements take too): that family's attention, K and V of its shape
    local dec = generic.decoder(p.model, units, d.tp)
    if not (dec and dec.names) then
      refuse(ctx, "parallel.cp", "cp=%d: this generic model is not a decoder under torchtitan's Llama or decoder "
        .. "names (attention.wq .. wo or qkv_linear, feed_forward.w1 .. w3, output.weight or lm_head.weight) with "
        .. "model.n_heads x head_dim blocks, so its attention's K and V are not known; set cp=1", d.cp)
    end
    family, cfg = dec.names, dec.cfg
  end
  local ac = p.training and p.training.activation_checkpointing or "none"
  local recompute = ac == "full" or ac == "selective"
  -- K and V as the attention sees them: the rank's seq_len / cp tokens of
  -- its TP-local heads (S(2) on tp, S(1) -> R on cp at the inner
  -- attention's local_map: models/common/decoder_sharding.py:225-260)
  local fam = cp.FAMILIES[family]
  local kw, vw = fam.widths(cfg, d.tp)
  local tokens = b * (p.model.seq_len // d.cp)
  local k, v = tokens * kw, tokens * vw
  local function act(kind, phase, count, what, region, again)
    return { kind = kind, phase = phase, count = count, what = what, region = region, recompute = again }
  end
  for _, u in ipairs(lay.units) do
    if holds(u, fam.block) then
      u.cp_acts = { act("tp_all_gather", "forward", k, "K over the sequence (cp)", "attention"),
                    act("tp_all_gather", "forward", v, "V over the sequence (cp)", "attention") }
      if recompute then
        for _, a in ipairs({ { k, "K" }, { v, "V" } }) do
          u.cp_acts[#u.cp_acts + 1] = act("tp_all_gather", "backward", a[1], a[2] .. " over the sequence (cp), "
            .. "recomputed (activation checkpointing)", "recompute", true)
        end
      end
      -- the gradients in the reverse order: V's, then K's (autograd runs the
      -- later redistribution's backward first; recorded on MLA, where they differ)
      for _, a in ipairs({ { v, "V" }, { k, "K" } }) do
        u.cp_acts[#u.cp_acts + 1] = act("tp_reduce_scatter", "backward", a[1], a[2] .. " gradient (cp)", "attention")
      end
      u.act_numel = math.max(u.act_numel or 0, math.max(k, v) * d.cp)
    end
  end
  lay.cp = { size = d.cp, k = k, v = v, blocks = 0, recompute = recompute }
  for _, u in ipairs(lay.units) do
    if u.cp_acts then lay.cp.blocks = lay.cp.blocks + 1 end
  end
  return lay
end

-- Inside the block's compute, on the compute stream, over the cp group.
function cp.unit_ops(out, u, m, at)
  local acts = u.cp_acts
  if not acts or (at ~= "forward" and at ~= "backward") then return end
  for _, a in ipairs(acts) do
    if a.phase == at then
      out[#out + 1] = { kind = a.kind, unit = u.index, micro_step = m, phase = a.phase, group = "cp",
                        dtype = u.ag_dtype, count = a.count,
                        reduce_op = a.kind == "tp_reduce_scatter" and "sum" or nil, what = a.what,
                        recompute = a.recompute, region = a.region }
    end
  end
end

-- Every block issues its two all-gathers in each micro-step's forward and
-- its two reduce-scatters in its backward (after its two recomputed
-- all-gathers under checkpointing), nothing else runs on cp.
function cp.prove_class(lay, ops, p)
  local want, got = {}, {}
  local per = lay.cp and lay.cp.recompute and 4 or 2
  for _, u in ipairs(lay.units) do
    if u.cp_acts then want[u.index] = { forward = 2 * p.fsdp.micro_steps, backward = per * p.fsdp.micro_steps } end
  end
  for _, o in ipairs(ops) do
    if o.group == "cp" then
      local w = want[o.unit]
      local kind = (o.phase == "forward" or o.recompute) and "tp_all_gather" or "tp_reduce_scatter"
      if not w or o.kind ~= kind or (o.count ~= lay.cp.k and o.count ~= lay.cp.v) then
        error(string.format("internal: cp op %d (%s of unit %d in %s) is no block's K/V exchange", o.seq, o.kind,
          o.unit, o.phase), 0)
      end
      got[o.unit] = got[o.unit] or { forward = 0, backward = 0 }
      got[o.unit][o.phase] = got[o.unit][o.phase] + (o.times or 1)
    end
  end
  for i, w in pairs(want) do
    local g = got[i] or { forward = 0, backward = 0 }
    if g.forward ~= w.forward or g.backward ~= w.backward then
      error(string.format("internal: unit %d issues %d/%d cp collectives in forward/backward, not %d/%d", i,
        g.forward, g.backward, w.forward, w.backward), 0)
    end
  end
end

return cp
