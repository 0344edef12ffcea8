-- Stage 1: load a plan file in a sandbox and check its shape against the
-- schema (known keys, types, ranges, list holes, names). Returns a
-- normalized plan table with defaults filled in; semantic checks belong to
-- later stages. Every refusal is one plan error naming file, line and field.
local util = require("gen.util")

local load_plan = {}

local LIM = util.LIMITS
local DTYPES = { "fp32", "bf16", "fp16" }

local WORLD_WHY = "commplan plans at most " .. util.pow2_text(LIM.world) .. " ranks (the largest world its "
  .. "generator and runtime are tested for)"

-- Schema: key -> { kind, extra }. kind is one of int, num, string, name,
-- bool, enum, table, list. int and num take min/max (num: gt = exclusive
-- minimum); list takes max (entries); every number is bounded.
local SCHEMA = {
  top = {
    name = { "string" }, world_size = { "int", min = 1, max = LIM.world, why = WORLD_WHY },
    parallel = { "table" }, model = { "table" }, fsdp = { "table" },
    topology = { "table" }, training = { "table" }, pipeline = { "table" }, expert_parallel = { "table" },
  },
  -- with parallel.ep > 1 (gen/parallel/ep.lua; docs/expert-parallel.md): the token all-to-alls' buffer
  -- capacity per ep member: "dropless" (the default: every routed row fits, as torchtitan's default
  -- dispatcher) or a capacity factor over the uniform share, ceil(factor x tokens x top_k / ep) rows
  expert_parallel = {
    capacity = { "enum", enum = { "dropless", "factor" } },
    capacity_factor = { "num", gt = 0, max = 1024 },
  },
  -- with parallel.pp > 1 (gen/parallel/pp_schedule.lua, pp_stages.lua): torch.distributed.pipelining's
  -- schedule class without "Schedule", the microbatches per step, and torchtitan's stage split options
  pipeline = {
    schedule = { "enum", enum = { "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                                  "ZBVZeroBubble", "DualPipeV",
                                  -- torch's multi-stage base class: the actions come from pipeline.csv alone
                                  -- (torchtitan's pipeline_parallel_schedule_csv, gen/parallel/pp_report.lua)
                                  "PipelineScheduleMulti" } },
    -- torchtitan's pipeline_parallel_microbatch_size: sequences per microbatch (microbatches =
    -- local_batch_size / it where microbatches is not given)
    microbatch_size = { "int", min = 1, max = 1 << 20 },
    microbatches = { "int", min = 1, max = LIM.pp_actions // 2,
                     why = "the generator's work grows with microbatches x stages, at most "
                       .. util.pow2_text(LIM.pp_actions) .. " (two stages or more); torchtitan runs tens to hundreds" },
    layers_per_stage = { "int", min = 1, max = LIM.units },
    first_stage_less_layers = { "int", min = 0, max = LIM.units },
    last_stage_less_layers = { "int", min = 0, max = LIM.units },
    -- torch's CSV schedule (_load_csv's compute_only rows), a path relative to the plan file: the
    -- actions of the schedule class `schedule` names (a multi-stage one, or "PipelineScheduleMulti")
    -- come from it; torchtitan's parallelism.pipeline_parallel_schedule_csv
    csv = { "string" },
  },
  parallel = {
    dp_replicate = { "int" }, dp_shard = { "int" }, cp = { "int" }, tp = { "int" },
    pp = { "int" }, ep = { "int" }, etp = { "int" }, ulysses_degree = { "int" },
    dp = { "int" },
    -- with tp > 1: activations between blocks sharded on the sequence (torchtitan's default)
    sequence_parallel = { "bool" },
    loss_parallel = { "bool" }, -- torchtitan's default with TP (parallelism.disable_loss_parallel = false)
    -- torchtitan's parallelism.enable_async_tensor_parallel: each sequence-parallel all-gather and
    -- reduce-scatter fused with the matmul it feeds or follows (torch's micro-pipeline TP)
    async_tp = { "bool" },
  },
  fsdp = {
    -- true / false, or an int k: fully_shard(reshard_after_forward=k), the post-forward reshard to
    -- groups of k ranks (torch 2.15 _fsdp_init.py:152-195; gen/parallel/fsdp_layout.lua post_forward)
    reshard_after_forward = { "bool_or_int", max = LIM.world },
    -- torchtitan's parallelism.fsdp_reshard_after_forward (config/configs.py:136, resolved by
    -- distributed/fsdp.py:54-77 and applied at :183-204): "always" reshards every unit but the root,
    -- [norm, lm_head] too; "never" none; "default" the blocks and the embedding (not under PP), never
    -- [norm, lm_head] (FSDP would all-gather it again at once for backward)
    reshard_after_forward_policy = { "enum", enum = { "default", "always", "never" } },
    -- false: FSDPModule.set_reshard_after_backward(False) on every micro-step's backward but the last
    -- (units stay unsharded into the next micro-step's forward; the last reshards, as FSDP2 needs
    -- before the optimizer step: torch 2.15 _fully_shard.py:687-712)
    reshard_after_backward = { "bool" },
    micro_steps = { "int", min = 1, max = LIM.micro_steps,
                    why = "the generator holds units x micro-steps in memory, at most "
                      .. util.pow2_text(LIM.unit_steps) .. " of them" },
    reduce_op = { "enum", enum = { "avg", "sum" } },
    param_dtype = { "enum", enum = DTYPES }, reduce_dtype = { "enum", enum = DTYPES },
    -- FSDPModule.set_gradient_divide_factor(f) and set_force_sum_reduction_for_comms(True) on every
    -- unit (torch 2.15 _fully_shard.py:846-878; a unit may override either): gen/parallel/fsdp_layout.lua
    gradient_divide_factor = { "num", gt = 0, max = LIM.model_int,
                               why = "a divide factor is a data-parallel size or a token count" },
    force_sum_reduction_for_comms = { "bool" },
    -- gradient accumulation over micro-steps: "fsdp2_default" reduces on every backward and adds into
    -- the sharded grads; "sync_last" is set_requires_gradient_sync(False) before all but the last;
    -- "all_reduce_last" is HSDP's set_requires_all_reduce(False) before all but the last
    -- "step_end" is torch.distributed.pipelining's: no reshard or sync per backward, one reduction at the end
    grad_accumulation = { "enum", enum = { "fsdp2_default", "sync_last", "all_reduce_last", "step_end" } },
    -- fully_shard(offload_policy=CPUOffloadPolicy(pin_memory=...)) on every unit (torchtitan's
    -- training.enable_cpu_offload, distributed/fsdp.py:173-174): sharded parameters and gradients in host
    -- memory, copied H2D before each all-gather and D2H after each reduction (gen/parallel/fsdp_schedule.lua)
    cpu_offload = { "bool" }, pin_memory = { "bool" },
    -- torchtitan's parallelism.enable_fsdp_symm_mem (distributed/fsdp.py:44-51): every unit's
    -- set_force_sum_reduction_for_comms(True) and set_symm_mem_for_comm(): the all-gather output and
    -- the reduce-scatter input and output in one symmetric window per rank (gen/memplan.lua, gen/symm.lua)
    symm_mem = { "bool" },
  },
  topology = {
    gpus_per_node = { "int", min = 1, max = LIM.world },
    -- the hardware (gen/hardware.lua): GPU figures and the node's network, each overridable below
    preset = { "enum", enum = require("gen.hardware").PRESET_NAMES },
    -- how collectives are priced: "nccl" (gen/nccl_model.lua, NCCL's own tuning model) or
    -- "alpha_beta" (one bandwidth inside a node, one across, a latency per log2 step)
    collectives = { "enum", enum = { "nccl", "alpha_beta" } },
    -- (every number's bounds: gen/hardware.lua's BOUNDS, documented there and filled in below;
    -- the network's lower bounds are the slowest links NCCL's graph search has speeds for)
    nics_per_node = { "int" }, nic_Gbps = { "num" }, nvlink_GBps = { "num" }, nvlinks = { "int" }, nvls = { "bool" },
    pci_GBps = { "num" }, net_latency_us = { "num" }, sharp = { "bool" },
    -- collectives = "alpha_beta" only
    intra_node_GBps = { "num" }, inter_node_GBps = { "num" }, latency_us = { "num" },
    -- audit only (gen/compute.lua): the GPU's memory, peak dense rate, MFU and HBM rate
    gpu_memory_GB = { "num" }, gpu_TFLOPS = { "num" }, mfu = { "num" }, hbm_GBps = { "num" },
    -- CPU offload's host link (gen/hardware.lua host_GBps)
    host_GBps = { "num" },
  },
  -- audit only (gen/compute.lua, gen/memory.lua): activation checkpointing, optimizer state
  training = {
    activation_checkpointing = { "enum", enum = { "none", "full", "selective" } },
    optimizer = { "enum", enum = { "adamw", "sgd", "none" } }, fp32_master = { "bool" },
    -- torchtitan's optimizer.implementation (components/optimizer/optimizer.py:109-124): "fused_opt_states_bf16"
    -- keeps AdamW's moments in bf16 (gen/compute.lua optimizer_state_bytes); the others change nothing planned
    optimizer_implementation = { "enum", enum = { "fused", "foreach", "for-loop", "fused_opt_states_bf16" } },
    -- sequences per rank per micro-step (torchtitan's training.local_batch_size): sizes the TP activations
    local_batch_size = { "int", min = 1, max = 1 << 20 },
    -- the loss's chunks (torchtitan's ChunkedLossWrapper num_chunks; 1: CrossEntropyLoss): the output unit's activations
    loss_chunks = { "int", min = 1, max = 1 << 20 },
    -- how compute runs (gen/compute.lua prices it from shapes): torch.compile (torchtitan's
    -- compile.enable; default: async TP's setting) and torchao's float8 Linear recipe
    compile = { "bool" }, float8 = { "enum", enum = { "none", "tensorwise", "rowwise", "rowwise_with_gw_hp" } },
  },
  model = {
    family = { "enum", enum = { "llama", "generic", "qwen3", "mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss" } }, size = { "string" },
    dtype = { "enum", enum = DTYPES }, seq_len = { "int", min = 1, max = LIM.model_int },
    dim = { "int", min = 1, max = LIM.model_int },
    n_layers = { "int", min = 1, max = LIM.units - 3,
                 why = "one unit per layer and up to three more (embedding, norm and output, root), at most "
                   .. LIM.units .. " units" },
    n_heads = { "int", min = 1, max = LIM.model_int },
    n_kv_heads = { "int", min = 1, max = LIM.model_int }, vocab_size = { "int", min = 1, max = LIM.model_int },
    ffn_dim_multiplier = { "num", gt = 0, max = 64 }, multiple_of = { "int", min = 1, max = LIM.model_int },
    num_experts = { "int", min = 1, max = LIM.model_int },
    -- the MoE families (gen/models/moe.lua; docs/expert-parallel.md): the experts and the router, the
    -- attention's head_dim and fused qkv (mixtral, qwen3_moe), DeepSeek-V3's MLA and dense first layers
    top_k = { "int", min = 1, max = LIM.model_int }, moe_hidden_dim = { "int", min = 1, max = LIM.model_int },
    head_dim = { "int", min = 1, max = LIM.model_int }, fuse_qkv = { "bool" },
    n_dense_layers = { "int", min = 0, max = LIM.units - 3 }, dense_hidden_dim = { "int", min = 1, max = LIM.model_int },
    num_shared_experts = { "int", min = 0, max = LIM.model_int },
    q_lora_rank = { "int", min = 0, max = LIM.model_int }, kv_lora_rank = { "int", min = 1, max = LIM.model_int },
    qk_nope_head_dim = { "int", min = 1, max = LIM.model_int }, qk_rope_head_dim = { "int", min = 1, max = LIM.model_int },
    v_head_dim = { "int", min = 1, max = LIM.model_int },
    -- the generic family: whether the first unit's input requires grad (default true; false for token
    -- ids, as plan_from_titan writes): false lets a leading run of all-frozen units run no pre-backward
    -- (gen/parallel/fsdp_layout.lua frozen_prefix)
    input_requires_grad = { "bool" },
    -- DeepSeek-V3's router: top-k weights renormalised, node-limited routing's groups
    route_norm = { "bool" }, n_expert_groups = { "int", min = 0, max = LIM.model_int },
    n_limited_groups = { "int", min = 0, max = LIM.model_int },
    -- DeepSeek-V3's multi-token prediction blocks (torchtitan's num_mtp_layers; gen/models/deepseek_v3.lua)
    num_mtp_layers = { "int", min = 0, max = LIM.units - 4 },
    -- gpt-oss (gen/models/gpt_oss.lua): the even blocks' causal sliding window, in tokens
    sliding_window = { "int", min = 1, max = LIM.model_int },
    -- the attention backend torchtitan's registry builds (model_registry's attn_backend: "flex" by default for
    -- llama3, qwen3, deepseek_v3, "varlen" for gpt_oss; each family's config resolves it; a generic model's
    -- as given); context parallel needs flex (gen/parallel/cp.lua cp.rules)
    attn_backend = { "enum", enum = { "varlen", "flex" } },
    -- the qwen3 family (gen/models/qwen3.lua): the FFN's hidden size as given, and torchtitan's
    -- enable_weight_tying (tok_embeddings.weight and lm_head.weight tied; one unit holds both ends)
    hidden_dim = { "int", min = 1, max = LIM.model_int }, enable_weight_tying = { "bool" },
    -- torchtitan's fused layouts (its override.imports: "swiglu", "grouped_experts", "mla";
    -- gen/models/fused.lua checks the names against the family)
    fused = { "list", max = 3 },
    units = { "list", max = LIM.units,
              why = "the generator holds units x micro-steps in memory, at most "
                .. util.pow2_text(LIM.unit_steps) .. " of them" },
  },
  unit = { name = { "name" }, params = { "list", max = LIM.params },
           -- overrides fsdp.reshard_after_forward for this unit (the root never reshards after forward);
           -- an int as fsdp's
           reshard_after_forward = { "bool_or_int", max = LIM.world },
           -- overrides fsdp.reshard_after_backward for this unit (set_reshard_after_backward(False, recurse=False))
           reshard_after_backward = { "bool" },
           -- false: FSDPModule.set_unshard_in_backward(False) (torch 2.15 _fully_shard.py:1000-1009): the
           -- unit's backward runs without its parameters (an embedding's; the live peer's taps), so its
           -- pre-backward gathers nothing (_fsdp_param_group.py:463-467); its grads still reduce-scatter
           unshard_in_backward = { "bool" },
           -- FSDPModule.set_modules_to_forward_prefetch / _backward_prefetch: the units (by name) whose
           -- all-gathers this unit issues after its own (gen/parallel/fsdp_layout.lua checks the names)
           forward_prefetch = { "list", max = LIM.units }, backward_prefetch = { "list", max = LIM.units },
           -- this unit's MixedPrecisionPolicy (fully_shard's mp_policy), overriding fsdp's
           param_dtype = { "enum", enum = DTYPES }, reduce_dtype = { "enum", enum = DTYPES },
           -- this unit's set_gradient_divide_factor / set_force_sum_reduction_for_comms (per
           -- FSDPModule, not recursive: _fully_shard.py:846-878), overriding fsdp's
           gradient_divide_factor = { "num", gt = 0, max = LIM.model_int,
                                      why = "a divide factor is a data-parallel size or a token count" },
           force_sum_reduction_for_comms = { "bool" },
           -- this unit's own gradient accumulation (its set_requires_gradient_sync /
           -- set_requires_all_reduce(False, recurse=False) before all micro-steps but the last),
           -- overriding fsdp.grad_accumulation (gen/parallel/fsdp_layout.lua unit_accumulation)
           grad_accumulation = { "enum", enum = { "fsdp2_default", "sync_last", "all_reduce_last" } },
           -- this unit's offload_policy (fully_shard's, per call): CPUOffloadPolicy(pin_memory) or none
           cpu_offload = { "bool" }, pin_memory = { "bool" },
           -- the generic family: this unit is torchtitan's [norm, lm_head] (its fully_shard of the
           -- decoder's head, distributed/fsdp.py:202-207), which its ChunkedLossWrapper runs
           -- (training.loss_chunks, gen/parallel/fsdp.lua chunked_loss)
           loss_head = { "bool" } },
  param = { name = { "name" }, shape = { "list", max = LIM.dims, why = "runtime/commplan.h CP_MAX_DIMS is 8" },
            dtype = { "enum", enum = DTYPES }, shard_dim = { "int", min = 0, max = LIM.dims - 1 },
            -- this parameter's all-gather / compute dtype: its unit's param_dtype or its own dtype
            -- (MixedPrecisionPolicy.param_dtype_override_fn; gen/parallel/fsdp_layout.lua)
            param_dtype = { "enum", enum = DTYPES },
            -- fully_shard(module, ignored_params={...}): neither sharded nor communicated, kept whole on
            -- every rank (torch 2.15 _fully_shard.py:239-241; gen/models/generic.lua)
            ignored = { "bool" },
            -- requires_grad = False (torchtitan's LoRA converter freezes the base weights,
            -- components/lora.py:80-81): all-gathered, never reduced, no gradient or optimizer state
            -- (torch 2.15 _fsdp_param_group.py:972-1001; gen/parallel/fsdp_layout.lua)
            frozen = { "bool" },
            -- tensor-parallel placement (gen/parallel/tp.lua): colwise = Shard(0), rowwise = Shard(1)
            tp = { "enum", enum = { "colwise", "rowwise", "replicate", "shard(0)", "shard(1)", "shard(2)", "shard(3)",
                                    "shard(4)", "shard(5)", "shard(6)", "shard(7)" } } },
}
-- The topology's figures: one set of documented bounds (gen/hardware.lua).
for field, b in pairs(require("gen.hardware").BOUNDS) do
  local spec = SCHEMA.topology[field]
  spec.min, spec.max = b.min, b.max
  spec.why = "the documented range (gen/hardware.lua's BOUNDS) keeps every predicted time finite"
end
-- Parallel degrees: -1 (dp_shard only) .. world limit; dims.infer gives
-- torchtitan's messages for the values below 1.
for _, spec in pairs(SCHEMA.parallel) do
  spec.min, spec.max, spec.why = -LIM.world, LIM.world, WORLD_WHY
end
load_plan.SCHEMA = SCHEMA
load_plan.DTYPES = DTYPES

-- Model keys that only one family reads; the other refuses them (a key
-- accepted and ignored would be a silent lie).
local LLAMA_ONLY = { size = true, dim = true, n_layers = true, vocab_size = true, ffn_dim_multiplier = true,
                     multiple_of = true }
-- The model keys each family reads besides family, dtype and seq_len (the
-- MoE families: gen/models/moe.lua's FIELDS); any other is refused.
local FAMILY_KEYS = {
  llama = { "size", "dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim_multiplier", "multiple_of",
            "fused", "attn_backend" },
  -- (a generic model's attention shape, for the audit's model FLOPs per token, tokens/s and MFU:
  -- n_heads, head_dim, n_layers, enable_weight_tying; gen/compute.lua's model_flops_per_token)
  generic = { "n_heads", "n_kv_heads", "num_experts", "units", "head_dim", "n_layers", "enable_weight_tying",
               "attn_backend", "input_requires_grad" },
}
for fam, keys in pairs(require("gen.models.moe").FIELDS) do FAMILY_KEYS[fam] = keys end
FAMILY_KEYS.qwen3 = require("gen.models.qwen3").FIELDS
FAMILY_KEYS.gpt_oss = require("gen.models.gpt_oss").FIELDS

-- A model key the family does not read: refused, naming the family and the keys it reads.
local function check_family_keys(ctx, model)
  local fam = model.family
  local reads = {}
  for _, k in ipairs(FAMILY_KEYS[fam]) do reads[k] = true end
  for _, k in ipairs(util.sorted_keys(model)) do
    if not reads[k] and k ~= "family" and k ~= "dtype" and k ~= "seq_len" then
      local others = {}
      for _, f in ipairs(util.sorted_keys(FAMILY_KEYS)) do
        for _, x in ipairs(FAMILY_KEYS[f]) do
          if x == k then others[#others + 1] = f end
        end
      end
      util.field_error(ctx, "model." .. k, string.format("the %s family does not read %s (%s); remove it%s", fam, k,
        #others > 0 and ("a setting of family " .. table.concat(others, " | ")) or "no family reads it",
        string.format(" (it reads %s)", table.concat(FAMILY_KEYS[fam], ", "))))
    end
  end
end

local function type_name(v)
  if math.type(v) then return math.type(v) == "integer" and "integer" or "number" end
  return type(v)
end

local function range_text(spec)
  if spec.gt then return string.format("> %s", util.show(spec.gt)) end
  return string.format("%s..%s", util.show(spec.min), util.show(spec.max))
end

-- A number within the spec's bounds; integers from exactly-integral floats
-- (2^10 is the float 1024.0 in Lua 5.4).
local function check_number(ctx, path, spec, v)
  local function bad(msg) util.field_error(ctx, path, msg) end
  if type(v) ~= "number" then return nil end
  if v ~= v then bad("NaN is not a value; fix the arithmetic that made it") end
  if v == math.huge or v == -math.huge then bad(util.show(v) .. " is not a value; give a finite number") end
  if spec[1] == "int" then
    local i = math.tointeger(v)
    if not i then
      bad(string.format("expected an integer, got %s; give a whole number in %s", util.show(v), range_text(spec)))
    end
    v = i
  end
  if spec.min and v < spec.min then
    bad(string.format("%s must be >= %s; fix the value", util.show(v), util.show(spec.min)))
  end
  if spec.gt and v <= spec.gt then
    bad(string.format("%s must be > %s; fix the value", util.show(v), util.show(spec.gt)))
  end
  if spec.max and v > spec.max then
    bad(string.format("%s is above the limit %s%s; fix the value", util.show(v),
      math.type(spec.max) == "integer" and util.pow2_text(spec.max) or util.show(spec.max),
      spec.why and (": " .. spec.why) or ""))
  end
  return v
end

-- A list's length, refusing named keys, holes and too many entries.
local function check_list(ctx, path, spec, v)
  local n, maxk = 0, 0
  -- the named key reported is the same every run (pairs' order is not):
  -- the first by type, then by its text
  local named
  for k in pairs(v) do
    if math.type(k) ~= "integer" or k < 1 then
      local key = type(k) .. "\0" .. tostring(k)
      if not named or key < named.key then named = { key = key, k = k } end
    end
  end
  if named then
    local k = named.k
    util.field_error(ctx, path, "expected a list { ... } with no named keys; found key " .. util.show(k)
      .. "; remove it or move it out of the list", type(k) == "string" and k or nil)
  end
  for k in pairs(v) do
    n = n + 1
    if k > maxk then maxk = k end
    if spec.max and n > spec.max then
      util.field_error(ctx, path, string.format("more than %d entries%s; shorten the list", spec.max,
        spec.why and (": " .. spec.why) or ""))
    end
  end
  if maxk ~= n then
    local hole = 1
    while v[hole] ~= nil do hole = hole + 1 end
    util.field_error(ctx, string.format("%s[%d]", path, hole), string.format(
      "entry %d is nil but the list has entries up to %d: a hole, usually an undefined variable or a "
      .. "misspelled field inside { ... }; fix or remove it", hole, maxk))
  end
  return n
end

local function check_name(ctx, path, v)
  if #v == 0 then util.field_error(ctx, path, "empty name; give a non-empty name") end
  if #v > LIM.name_len then
    util.field_error(ctx, path, string.format("name of %d bytes; at most %d: shorten it", #v, LIM.name_len))
  end
  local bad = v:find("[^ -~]")
  if bad then
    util.field_error(ctx, path, string.format("name %s holds byte %d at %d; names are printable ASCII "
      .. "(no control characters, no UTF-8): rename it", util.show(v), v:byte(bad), bad))
  end
  -- SCHEDULE.md shows names in Markdown tables and text: characters that
  -- would end a cell or open HTML or code are refused.
  local md = v:find("[|<>`]")
  if md then
    util.field_error(ctx, path, string.format("name %s holds %q at %d, which SCHEDULE.md's Markdown would read "
      .. "as markup; names use letters, digits and . _ - / : and the like: rename it", util.show(v),
      v:sub(md, md), md))
  end
end

local function check_value(ctx, path, spec, v)
  local kind = spec[1]
  local bad = function(want)
    util.field_error(ctx, path, string.format("expected %s, got %s %s; fix the value", want, type_name(v),
      util.show(v)))
  end
  if kind == "int" then
    if type(v) ~= "number" then bad("an integer") end
    v = check_number(ctx, path, spec, v)
  elseif kind == "num" then
    if type(v) ~= "number" then bad("a number") end
    v = check_number(ctx, path, spec, v)
  elseif kind == "string" or kind == "name" then
    if type(v) ~= "string" then bad("a string") end
    if kind == "name" then check_name(ctx, path, v)
    elseif #v > LIM.name_len then
      util.field_error(ctx, path, string.format("string of %d bytes; at most %d", #v, LIM.name_len))
    end
  elseif kind == "bool" then
    if type(v) ~= "boolean" then bad("true or false") end
  elseif kind == "bool_or_int" then
    -- (FSDP2's own: a bool or an int, torch 2.15 _fsdp_init.py:156-160)
    if type(v) ~= "boolean" then
      if type(v) ~= "number" then bad("true, false or an integer (the post-forward group size)") end
      v = check_number(ctx, path, { "int", max = spec.max, why = "a group size is at most the world" }, v)
    end
  elseif kind == "enum" then
    if type(v) ~= "string" then bad("one of " .. table.concat(spec.enum, ", ")) end
    local ok = false
    for _, e in ipairs(spec.enum) do ok = ok or e == v end
    if not ok then
      local hint
      for _, e in ipairs(spec.enum) do if e:lower() == v:lower() then hint = e end end
      hint = hint or util.did_you_mean(v, spec.enum)
      util.field_error(ctx, path, string.format("%s is not one of %s%s", util.show(v),
        table.concat(spec.enum, ", "), hint and ("; did you mean \"" .. hint .. "\"?") or ""))
    end
  elseif kind == "table" or kind == "list" then
    if type(v) ~= "table" then bad("a table") end
    if kind == "list" then check_list(ctx, path, spec, v) end
  end
  return v
end

-- Check every key of tbl against SCHEMA[section]; returns a shallow copy with
-- integer-valued numbers normalized.
local function check_table(ctx, path, section, tbl)
  local schema = SCHEMA[section]
  local known = util.sorted_keys(schema)
  local out = {}
  for _, k in ipairs(util.sorted_keys(tbl)) do
    local field = util.join_field(path, k)
    if type(k) ~= "string" then
      util.field_error(ctx, path == "" and "plan" or path, "unexpected list entry " .. util.show(k) ..
        "; use named fields (" .. table.concat(known, ", ") .. ")")
    end
    local spec = schema[k]
    if not spec then
      local hint = util.did_you_mean(k, known)
      util.field_error(ctx, field, "unknown key" .. (hint and ("; did you mean '" .. hint .. "'?")
        or ("; known keys: " .. table.concat(known, ", "))), k)
    end
    out[k] = check_value(ctx, field, spec, tbl[k])
  end
  return out
end

-- The shape's numel, each dim and the product bounded (no wrap).
function load_plan.check_shape(ctx, path, name, shape)
  local numel = 1
  for i, d in ipairs(shape) do
    numel = util.mul_within(numel, d, LIM.numel)
    if not numel then
      util.field_error(ctx, path, string.format("%s has more than %s elements (shape %s); "
        .. "shrink the shape", util.show(name), util.pow2_text(LIM.numel), table.concat(shape, " x ", 1, i)))
    end
  end
  return numel
end

local function check_params(ctx, upath, params, n, default_dtype, budget)
  local out = {}
  for j = 1, n do
    local p = params[j]
    local ppath = string.format("%s.params[%d]", upath, j)
    budget.params = budget.params + 1
    if budget.params > LIM.params then
      util.field_error(ctx, ppath, string.format("more than %d parameters in the model; the generator's "
        .. "time and the C tables grow with the count: merge parameters or split the plan", LIM.params))
    end
    check_value(ctx, ppath, { "table" }, p)
    local q = check_table(ctx, ppath, "param", p)
    if not q.name then util.field_error(ctx, ppath, "missing name; add name = \"...\"") end
    if not q.shape then util.field_error(ctx, ppath .. ".shape", "missing shape; add shape = { d0, d1, ... }") end
    local ndim = check_list(ctx, ppath .. ".shape", SCHEMA.param.shape, q.shape)
    if ndim == 0 then
      util.field_error(ctx, ppath .. ".shape", "scalar (0-dim) parameters cannot be sharded by FSDP; use shape = { 1 }")
    end
    local shape = {}
    for i = 1, ndim do
      local dpath = string.format("%s.shape[%d]", ppath, i)
      local d = check_value(ctx, dpath, { "int", max = LIM.numel }, q.shape[i])
      if d <= 0 then
        util.field_error(ctx, dpath, string.format("size %d of %s must be positive; fix the shape", d, q.name))
      end
      shape[i] = d
    end
    local numel = load_plan.check_shape(ctx, ppath .. ".shape", q.name, shape)
    budget.numel = util.add_within(budget.numel, numel, LIM.numel)
    if not budget.numel then
      util.field_error(ctx, ppath .. ".shape", string.format("the model has more than %s elements in all; "
        .. "shrink the shapes", util.pow2_text(LIM.numel)))
    end
    q.shape = shape
    if q.dtype then budget.own_dtype = budget.own_dtype + 1 end
    q.dtype = q.dtype or default_dtype
    if q.ignored and q.shard_dim ~= nil then
      util.field_error(ctx, ppath .. ".shard_dim", string.format("parameter %q is ignored by FSDP (ignored = true), "
        .. "which never shards it, so shard_dim changes nothing: remove it", q.name))
    end
    q.shard_dim = q.shard_dim or 0
    if q.shard_dim >= #shape then
      util.field_error(ctx, ppath .. ".shard_dim", string.format("shard_dim=%d but %s has %d dims; use 0..%d",
        q.shard_dim, q.name, #shape, #shape - 1))
    end
    if q.tp then
      if budget.tp_degree == 1 then
        util.field_error(ctx, ppath .. ".tp", string.format("tp = %q places %s over tensor parallel, but "
          .. "parallel.tp is 1, so it changes nothing: remove it or set parallel.tp", q.tp, util.show(q.name)))
      end
      local tdim = q.tp == "colwise" and 0 or q.tp == "rowwise" and 1 or tonumber(q.tp:match("^shard%((%d)%)$"))
      if tdim and tdim >= #shape then
        util.field_error(ctx, ppath .. ".tp", string.format("tp = %q shards dim %d, but %s has %d dim%s; "
          .. "use a placement on dims 0..%d or replicate", q.tp, tdim, util.show(q.name), #shape,
          #shape == 1 and "" or "s", #shape - 1))
      end
    end
    out[j] = q
  end
  return out
end

-- The plan's name is its file stem (the Makefile, the output directory and
-- the C prefix all use it): a C identifier that cannot collide with the
-- runtime's cp_* / CP_* names or reserved identifiers.
-- CPUOffloadPolicy (torch 2.15 _fsdp_api.py:239-255): pin_memory is a field
-- of the policy, so without an offloading unit it would be ignored; a unit
-- without parameters has no FSDP param group (_fsdp_init.py) and offloads
-- nothing.
local function check_unit_offload(ctx, upath, q, np, f)
  if q.cpu_offload ~= nil and np == 0 then
    util.field_error(ctx, upath .. ".cpu_offload", "the unit has no parameters, so its offload_policy moves "
      .. "nothing: remove it")
  end
  local offloads = q.cpu_offload
  if offloads == nil then offloads = f.cpu_offload end
  if q.pin_memory ~= nil and not offloads then
    util.field_error(ctx, upath .. ".pin_memory", "pin_memory is CPUOffloadPolicy's (torch _fsdp_api.py:255) and "
      .. "this unit does not offload: remove it or set cpu_offload = true")
  end
end

local function check_offload(ctx, model, f, topo)
  local any = f.cpu_offload
  for _, u in ipairs(model.units or {}) do any = any or u.cpu_offload end
  if f.pin_memory ~= nil and not any then
    util.field_error(ctx, "fsdp.pin_memory", "pin_memory is CPUOffloadPolicy's (torch _fsdp_api.py:255) and no "
      .. "unit offloads: remove it or set fsdp.cpu_offload = true")
  end
  if topo and topo.host_GBps ~= nil and not any then
    util.field_error(ctx, "topology.host_GBps", "the host link prices CPU offload's copies only and no unit "
      .. "offloads: remove it or set fsdp.cpu_offload = true")
  end
end

-- set_reshard_after_backward(False) (fsdp.reshard_after_backward, a unit's
-- own): kept on every micro-step's backward but the last, whose reshard
-- FSDP2 needs before the optimizer updates the shards (torch 2.15
-- _fully_shard.py:687-712: "Call reshard on each FSDP module ... before
-- updating its sharded parameters"). Refused where it changes nothing or
-- where the accumulation sets it itself.
-- torchtitan's reshard policy (fsdp.reshard_after_forward_policy) decides every unit's
-- reshard_after_forward (distributed/fsdp.py:54-77, 183-204): refused beside a setting it overrides;
-- "always" / "never" resolve fsdp.reshard_after_forward here, and gen/parallel/fsdp_layout.lua
-- reshards the family's [norm, lm_head] unit under "always" alone.
local function check_reshard_policy(ctx, f, model)
  local pol = f.reshard_after_forward_policy
  if pol == nil then return end
  if f.reshard_after_forward ~= nil then
    util.field_error(ctx, "fsdp.reshard_after_forward", string.format("fsdp.reshard_after_forward_policy = %q "
      .. "already decides it (torchtitan's distributed/fsdp.py:54-77): remove one of them", pol))
  end
  local units = model.family == "generic" and model.units or {}
  if pol ~= "default" then
    for i, u in ipairs(units) do
      if type(u) == "table" and u.reshard_after_forward ~= nil then
        util.field_error(ctx, string.format("model.units[%d].reshard_after_forward", i), string.format(
          "fsdp.reshard_after_forward_policy = %q sets every unit's (torchtitan's distributed/fsdp.py:183-204, "
          .. "[norm, lm_head] included): remove it or the policy", pol))
      end
    end
    if #units == 1 then
      util.field_error(ctx, "fsdp.reshard_after_forward_policy", "the model has only the root unit, which never "
        .. "reshards after forward (FSDP2), so this setting changes nothing: remove it or add units")
    end
    f.reshard_after_forward = pol == "always"
  end
end

local function check_reshard_after_backward(ctx, f, model, pp)
  local given = f.reshard_after_backward == false and "fsdp.reshard_after_backward" or nil
  for i, u in ipairs(model.family == "generic" and model.units or {}) do
    if u.reshard_after_backward ~= nil then
      given = given or string.format("model.units[%d].reshard_after_backward", i)
    end
  end
  if not given then return end
  if f.grad_accumulation == "step_end" or (pp or 1) > 1 then
    util.field_error(ctx, given, string.format("%s already runs every backward with "
      .. "set_reshard_after_backward(False) (torch 2.15 pipelining/stage.py backward_maybe_with_nosync): remove it",
      (pp or 1) > 1 and "a pipeline stage (parallel.pp > 1)" or "grad_accumulation = \"step_end\""))
  end
  if f.micro_steps == 1 then
    util.field_error(ctx, given, "with fsdp.micro_steps = 1 the one backward is the step's last, which reshards "
      .. "before the optimizer step (torch 2.15 _fully_shard.py:697), so this changes nothing: remove it or set "
      .. "fsdp.micro_steps > 1")
  end
end

local function check_plan_name(ctx, given)
  local stem = ctx.stem
  local field = "name"
  local function bad(msg) util.field_error(ctx, field, msg) end
  if given ~= nil and given ~= stem then
    bad(string.format("name = %s differs from the file stem %s; the name is the file's: remove name = "
      .. "or rename the file to %s.lua", util.show(given), util.show(stem), util.show(given, 40)))
  end
  local what = given and "name" or string.format("the plan's name (its file stem %s)", util.show(stem))
  if not stem:match("^[%a][%w_]*$") then
    bad(string.format("%s is not a C identifier; use a letter, then letters, digits and _ (rename the file)", what))
  end
  if #stem > LIM.plan_name_len then
    bad(string.format("%s has %d bytes; at most %d (it prefixes every C name); rename the file", what, #stem,
      LIM.plan_name_len))
  end
  if stem:find("__", 1, true) then
    bad(string.format("%s holds \"__\", reserved in C++ identifiers (the CUDA kernels file); rename the file", what))
  end
  local low = stem:lower()
  if low == "cp" or low:sub(1, 3) == "cp_" or low:sub(1, 8) == "commplan" then
    bad(string.format("%s would make C names like %s_plan that collide with the runtime's cp_*/CP_*/commplan "
      .. "names; rename the file", what, stem))
  end
end

function load_plan.normalize(ctx, raw)
  if type(raw) ~= "table" then
    util.plan_error(string.format("%s:%d: plan: the plan file must return a table, got %s; end it with "
      .. "return { world_size = ..., model = ... }", ctx.file, util.return_line(ctx.source), util.show(raw)))
  end
  local plan = check_table(ctx, "", "top", raw)
  if not plan.world_size then util.field_error(ctx, "world_size", "missing; add world_size = <number of GPUs>") end
  if not plan.model then util.field_error(ctx, "model", "missing; add model = { family = \"llama\", size = \"8b\" } or a generic units list") end
  check_plan_name(ctx, plan.name)
  plan.name = ctx.stem
  plan.parallel = check_table(ctx, "parallel", "parallel", plan.parallel or {})
  plan.fsdp = check_table(ctx, "fsdp", "fsdp", plan.fsdp or {})
  plan.topology = check_table(ctx, "topology", "topology", plan.topology or {})
  plan.training = check_table(ctx, "training", "training", plan.training or {})
  plan.pipeline = plan.pipeline and check_table(ctx, "pipeline", "pipeline", plan.pipeline)
  plan.expert_parallel = plan.expert_parallel and check_table(ctx, "expert_parallel", "expert_parallel",
    plan.expert_parallel)
  local model = check_table(ctx, "model", "model", plan.model)
  load_plan.pipeline_defaults(ctx, plan)
  load_plan.check_sizes(ctx, plan, model)
  -- Judged on the sequence length the rest of the plan assumes: the plan's,
  -- else torchtitan's default training.seq_len (gen/compute.lua's DEFAULTS,
  -- which the memory model and EP's token buffers take too), so a plan
  -- without seq_len is refused exactly where the same plan with it is.
  load_plan.check_compute(ctx, plan)
  local chunks = plan.training.loss_chunks
  local seq = model.seq_len or require("gen.compute").DEFAULTS.seq_len
  if chunks and seq % chunks ~= 0 then
    util.field_error(ctx, "training.loss_chunks", string.format("loss_chunks=%d does not divide seq_len=%d%s "
      .. "(torchtitan's ChunkedLossWrapper splits each sequence into equal chunks); pick a divisor of %d%s",
      chunks, seq, model.seq_len and "" or " (model.seq_len not set: torchtitan's default)", seq,
      model.seq_len and "" or " or set model.seq_len"))
  end
  model.family = model.family or (model.units and "generic" or nil)
  if not model.family then util.field_error(ctx, "model.family", "missing; set family = \"llama\" or give units = { ... }") end
  local dtype_given = model.dtype ~= nil
  model.dtype = model.dtype or "fp32"
  if model.family == "generic" then
    for _, k in ipairs(util.sorted_keys(LLAMA_ONLY)) do
      if model[k] ~= nil and k ~= "n_layers" then -- (n_layers: the attention shape's, for the audit)
        util.field_error(ctx, "model." .. k, string.format("a generic model takes its shapes from units; "
          .. "%s is a llama setting it would ignore: remove it", k))
      end
    end
    -- (the attention shape is read whole or not at all: a part alone would be ignored)
    for _, k in ipairs({ "head_dim", "n_layers", "enable_weight_tying" }) do
      if model[k] ~= nil and not (model.n_heads and model.head_dim and model.n_layers) then
        util.field_error(ctx, "model." .. k, "a generic model's attention shape (for the audit's FLOPs per token and "
          .. "MFU) is n_heads, head_dim and n_layers together; give all three or remove it")
      end
    end
    local n = model.units and #model.units or 0
    if n == 0 then
      util.field_error(ctx, "model.units", "a generic model needs a non-empty units list (root last)")
    end
    local units = {}
    local tp_degree = plan.parallel.tp or 1
    local budget = { params = 0, numel = 0, own_dtype = 0, tp_degree = tp_degree }
    for i = 1, n do
      local u = model.units[i]
      local upath = string.format("model.units[%d]", i)
      check_value(ctx, upath, { "table" }, u)
      local q = check_table(ctx, upath, "unit", u)
      if not q.name then util.field_error(ctx, upath, "missing name; add name = \"layers.0\"") end
      local np = q.params and #q.params or 0
      -- Only the root (last) may own none, as torchtitan's does: it then issues nothing.
      if np == 0 and (i < n or n == 1) then
        util.field_error(ctx, upath .. ".params", "unit " .. util.show(q.name) .. " has no parameters; give at least "
          .. "one (only the root, the last unit of several, may have none)")
      end
      if i == n and q.reshard_after_forward ~= nil then
        util.field_error(ctx, upath .. ".reshard_after_forward", "the root (last unit) never reshards after "
          .. "forward (FSDP2), so this setting changes nothing: remove it")
      end
      -- the parameters FSDP2 manages: fully_shard's ignored_params leave the
      -- unit's parameter group (a unit of ignored ones alone has none)
      local managed = 0
      for _, p in ipairs(type(q.params) == "table" and q.params or {}) do
        if not (type(p) == "table" and p.ignored == true) then managed = managed + 1 end
      end
      for _, k in ipairs({ "gradient_divide_factor", "force_sum_reduction_for_comms", "grad_accumulation",
                           "reshard_after_backward" }) do
        if managed == 0 and q[k] ~= nil then
          util.field_error(ctx, upath .. "." .. k, "unit " .. util.show(q.name) .. " has no parameters FSDP2 "
            .. "manages (none, or only ignored ones), so this setting changes nothing: remove it")
        end
      end
      q.params = check_params(ctx, upath, q.params, np, model.dtype, budget)
      check_unit_offload(ctx, upath, q, managed, plan.fsdp)
      units[i] = q
    end
    if dtype_given and budget.own_dtype == budget.params then
      util.field_error(ctx, "model.dtype", "every parameter sets its own dtype, so model.dtype (the default "
        .. "for parameters without one) is unused: remove it")
    end
    if n == 1 and plan.fsdp.reshard_after_forward ~= nil then
      util.field_error(ctx, "fsdp.reshard_after_forward", "the model has only the root unit, which never "
        .. "reshards after forward (FSDP2), so this setting changes nothing: remove it or add units")
    end
    model.units = units
  else
    if model.units then
      util.field_error(ctx, "model.units", "units are only for family = \"generic\"; remove them or change the family")
    end
    if model.num_experts ~= nil and model.family == "llama" then
      util.field_error(ctx, "model.num_experts", "Llama 3 is a dense model (no experts), so num_experts would "
        .. "be ignored: remove it, or use family = \"mixtral\" | \"qwen3_moe\" | \"deepseek_v3\" (or \"generic\")")
    end
    if model.num_experts ~= nil and model.family == "qwen3" then
      util.field_error(ctx, "model.num_experts", "family \"qwen3\" is torchtitan's dense Qwen3 (no experts), so "
        .. "num_experts would be ignored: remove it, or use family = \"qwen3_moe\" for the Qwen3 MoE flavours")
    end
  end
  check_family_keys(ctx, model)
  -- DeepSeek-V3's multi-token prediction trains with MTPLoss (torchtitan's deepseek_v3_debugmodel_mtp,
  -- models/deepseek_v3/config_registry.py:73-79), whose lm_head the decoder runs on every depth: the
  -- ChunkedLossWrapper (training.loss_chunks >= 2) is refused there (mtp.py:271-275), so 1 is the default
  if (model.num_mtp_layers or 0) > 0 then
    if chunks and chunks > 1 then
      util.field_error(ctx, "training.loss_chunks", string.format("%d with model.num_mtp_layers=%d: torchtitan "
        .. "refuses ChunkedLossWrapper with MTP (\"skip_lm_head is not supported with MTP decoder\", "
        .. "models/deepseek_v3/mtp.py:271-275; MTPLoss is not chunked, :323); set loss_chunks = 1", chunks,
        model.num_mtp_layers))
    end
    plan.training.loss_chunks = 1
  end
  plan.model = model
  local f = plan.fsdp
  check_offload(ctx, model, f, plan.topology)
  check_reshard_policy(ctx, f, model)
  -- (as given, before the defaults: a module whose own setting differs refuses a given one)
  ctx.fsdp_given = { reshard_after_forward = f.reshard_after_forward, grad_accumulation = f.grad_accumulation,
                     reshard_after_forward_policy = f.reshard_after_forward_policy }
  f.reshard_after_forward_policy = f.reshard_after_forward_policy or "default"
  if f.reshard_after_forward == nil then f.reshard_after_forward = true end
  f.micro_steps = f.micro_steps or 1
  if f.gradient_divide_factor ~= nil and f.reduce_op ~= nil then
    util.field_error(ctx, "fsdp.gradient_divide_factor", "reduce_op = " .. util.show(f.reduce_op) .. " already "
      .. "decides the divide factor (\"sum\" is set_gradient_divide_factor(1.0), \"avg\" FSDP2's default): "
      .. "remove one of them")
  end
  f.reduce_op = f.reduce_op or "avg"
  f.grad_accumulation = f.grad_accumulation or "fsdp2_default"
  check_reshard_after_backward(ctx, f, model, plan.parallel and plan.parallel.pp)
  if f.reshard_after_backward == nil then f.reshard_after_backward = true end
  local t = plan.topology
  ctx.nodes_given = t.gpus_per_node ~= nil
  t.gpus_per_node = t.gpus_per_node or 8
  t.preset = t.preset or "h100"
  t.collectives = t.collectives or "nccl"
  load_plan.check_cost_fields(ctx, t)
  if t.collectives == "alpha_beta" then
    t.intra_node_GBps = t.intra_node_GBps or 360   -- NVLink4 busbw seen by nccl-tests on H100 SXM
    t.inter_node_GBps = t.inter_node_GBps or 45    -- 400 Gb/s NIC per GPU, ~90% efficiency
    t.latency_us = t.latency_us or 10
  end
  return plan
end

-- A plan with pp > 1 runs torchtitan's defaults where it gives less: the
-- 1F1B schedule and microbatches of one sequence (config/configs.py:210
-- and :226, pipeline_parallel_schedule = "1F1B",
-- pipeline_parallel_microbatch_size = 1), so local_batch_size /
-- microbatch_size microbatches (distributed/pipeline_parallel.py:303-311,
-- which refuses a batch the microbatch size does not divide).
function load_plan.pipeline_defaults(ctx, plan)
  if (plan.parallel.pp or 1) <= 1 then return end
  local pl = plan.pipeline or {}
  -- (a CSV names its schedule class: without one it is refused as such, gen/parallel/pp_report.lua)
  if not pl.csv then pl.schedule = pl.schedule or "1F1B" end
  local lbs, size = plan.training.local_batch_size, pl.microbatch_size
  if size and not lbs then
    util.field_error(ctx, "pipeline.microbatch_size", "divides training.local_batch_size, which the plan does not "
      .. "give; set training.local_batch_size")
  end
  if size and lbs % size ~= 0 then
    util.field_error(ctx, "pipeline.microbatch_size", string.format("%d does not divide local_batch_size=%d "
      .. "(torchtitan refuses it: pipeline_parallel.py:306); give a divisor of %d", size, lbs, lbs))
  end
  if size and pl.microbatches and pl.microbatches ~= lbs // size then
    util.field_error(ctx, "pipeline.microbatches", string.format("%d microbatches, while local_batch_size=%d / "
      .. "microbatch_size=%d makes %d; give one of the two", pl.microbatches, lbs, size, lbs // size))
  end
  -- (without a batch it stays unset: refused with the other pipeline checks, naming
  -- training.local_batch_size, after the plan's other refusals: gen/parallel/pp_report.lua)
  if not pl.microbatches and lbs then
    local n = lbs // (size or 1)
    if not util.mul_within(n, plan.parallel.pp, LIM.pp_actions) then
      util.field_error(ctx, size and "pipeline.microbatch_size" or "training.local_batch_size", string.format(
        "local_batch_size=%d / microbatch_size=%d makes %d microbatches, x pp=%d more than %s microbatch-stages, "
        .. "the most the generator plans; %s", lbs, size or 1, n, plan.parallel.pp, util.pow2_text(LIM.pp_actions),
        size and "give a larger microbatch_size" or "set pipeline.microbatch_size (sequences per microbatch)"))
    end
    pl.microbatches = n
  end
  plan.pipeline = pl
end

-- Sizes whose product drives the generator's work, refused here before
-- anything is built (docs/plan-files.md, "Numbers"). Under expert
-- parallelism each MoE layer's dispatched tokens stay live until its
-- backward, so the memory plan's work grows with the square of the layers
-- (512 layers: ~8 s, ~1 GiB). A pipeline's work grows with microbatches x
-- stages, and there are at least pp stages (the bound with the stage count
-- and the data-parallel copies: pp_stages.check_size).
function load_plan.check_sizes(ctx, plan, model)
  local ep = plan.parallel.ep
  if ep and ep > 1 and model.n_layers and model.n_layers > LIM.ep_layers then
    util.field_error(ctx, "model.n_layers", string.format("%d layers with parallel.ep=%d: above the limit %s for "
      .. "expert parallelism (its memory plan's work grows with the square of the MoE layers); use at most %d "
      .. "layers", model.n_layers, ep, util.pow2_text(LIM.ep_layers), LIM.ep_layers))
  end
  local pp, n = plan.parallel.pp, plan.pipeline and plan.pipeline.microbatches
  if not (pp and pp > 1 and n) then return end
  if not util.mul_within(n, pp, LIM.pp_actions) then
    util.field_error(ctx, "pipeline.microbatches", string.format("%d microbatches x pp=%d (at least %d stages) is "
      .. "more than %s microbatch-stages, the most the generator plans (its work and memory grow with them); "
      .. "%s", n, pp, pp, util.pow2_text(LIM.pp_actions), pp > LIM.pp_actions // 2 and "use a smaller pp"
      or string.format("use at most %d microbatches, or a smaller pp", LIM.pp_actions // pp)))
  end
end

-- The compute settings torchtitan itself refuses: async TP without
-- torch.compile (config/configs.py:304-310, CompileConfig.__post_init__),
-- float8 on a GPU without FP8 tensor cores (components/quantization/
-- float8.py:86-96: SM89 or later).
function load_plan.check_compute(ctx, plan)
  local tr, par = plan.training, plan.parallel or {}
  if par.async_tp and tr.compile == false then
    util.field_error(ctx, "training.compile", "async TP runs only compiled (torchtitan's CompileConfig: \"Async TP "
      .. "requires 'model' in --compile.components and --compile.enable\", config/configs.py:304-310); remove "
      .. "compile = false or async_tp")
  end
  local preset = plan.topology and plan.topology.preset or require("gen.hardware").DEFAULT_PRESET
  if tr.float8 and tr.float8 ~= "none" and require("gen.kernel_tables")[preset].fp8 == 0 then
    util.field_error(ctx, "training.float8", string.format("the %s has no FP8 tensor cores (torchtitan: \"float8 is "
      .. "only supported on NVIDIA SM89 or later\", components/quantization/float8.py:86-96); remove float8 or pick "
      .. "an H100, H200 or B200 preset", preset))
  end
  -- torchtitan registers its bf16-state hook on Adam/AdamW alone (components/optimizer/optimizer.py:369-371)
  if tr.optimizer_implementation == "fused_opt_states_bf16" and (tr.optimizer or "adamw") ~= "adamw" then
    util.field_error(ctx, "training.optimizer_implementation", string.format("\"fused_opt_states_bf16\" keeps "
      .. "Adam/AdamW's moments in bf16 (torchtitan's components/optimizer/optimizer.py:369-371) and optimizer = %q "
      .. "has none, so it changes nothing: remove it or set optimizer = \"adamw\"", tr.optimizer))
  end
end

-- Each cost model reads its own fields: a field of the other one would be
-- silently ignored, so it is refused.
local ALPHA_BETA_ONLY = { "intra_node_GBps", "inter_node_GBps", "latency_us" }
local NCCL_ONLY = { "nics_per_node", "nic_Gbps", "nvlink_GBps", "nvlinks", "nvls", "pci_GBps", "net_latency_us", "sharp" }
function load_plan.check_cost_fields(ctx, t)
  -- NVLS needs NVLink SHARP: NVSwitch and sm90+ (NCCL's graph search, search.cc:1036); the A100 has neither,
  -- and SHARP (CollNet) only reaches the model through NVLS across nodes
  if t.preset == "a100" and t.collectives == "nccl" then
    for _, k in ipairs({ "nvls", "sharp" }) do
      if t[k] then
        util.field_error(ctx, "topology." .. k, string.format("the A100 (sm80) has no NVLink SHARP, so NCCL runs no "
          .. "NVLS%s and %s = true would change nothing; remove it or pick an H100, H200 or B200 preset", k == "sharp"
          and " (the only algorithm SHARP reaches in this model: CollNet's own are not modelled)" or "", k), k)
      end
    end
  end
  local wrong = t.collectives == "nccl" and ALPHA_BETA_ONLY or NCCL_ONLY
  for _, k in ipairs(wrong) do
    if t[k] ~= nil then
      util.field_error(ctx, "topology." .. k, string.format(
        "applies to topology.collectives = \"%s\" only, and this plan prices collectives with \"%s\"%s; "
        .. "remove %s or set collectives = \"%s\"", t.collectives == "nccl" and "alpha_beta" or "nccl",
        t.collectives, t.collectives == "nccl" and " (the default)" or "", k,
        t.collectives == "nccl" and "alpha_beta" or "nccl"), k)
    end
  end
end

-- Ranks fill nodes in order (rank // gpus_per_node is the node, as torchrun
-- with one --nproc-per-node lays them out), so a world of several nodes is
-- whole nodes. A world inside one node may use part of it (a 4-GPU job on
-- an 8-GPU node): SCHEDULE.md says so among its warnings.
-- (gen/plan.lua calls it after the dims stage, whose refusals come first.)
function load_plan.check_nodes(ctx, world, gpus_per_node, given)
  if world > gpus_per_node and world % gpus_per_node ~= 0 then
    util.field_error(ctx, given and "topology.gpus_per_node" or "world_size", string.format(
      "world_size %d is not a whole number of nodes of %d GPUs (topology.gpus_per_node%s); "
      .. "set gpus_per_node to the GPUs each node runs, or world_size to a multiple of it",
      world, gpus_per_node, given and "" or ", the default"), given and "gpus_per_node" or nil)
  end
end

-- ---- the sandbox -----------------------------------------------------------
-- A plan file sees only pure functions: no io, os, require, load, debug,
-- collectgarbage, setmetatable/getmetatable, rawset/rawget, coroutines or
-- string patterns (find/gsub/match can backtrack for a long time inside one
-- C call). Strings' methods ("x"):rep(...) reach the same safe table while
-- the plan runs. Functions whose C work grows with their arguments are
-- wrapped: their results are capped and their work counted. Reading an
-- undefined global is an error naming it (a strict _ENV), which catches
-- typos such as shape = { 8, dimm } at the source.

local LimitError = {} -- metatable of the error that stops a runaway plan
local Undefined = {}  -- metatable of the strict _ENV's error

local function run_error(msg) error(msg, 0) end

-- Library tables whose missing names are errors that say why.
local function strict_library(lib, name, why)
  return setmetatable(lib, { __index = function(_, k)
    error(string.format("%s.%s is not available in plan files%s", name, tostring(k), why), 2)
  end })
end

local PLAIN = { string = true, number = true, boolean = true, ["nil"] = true }

local function sandbox_env(budget)
  local function charge(n)
    budget.work = budget.work + n
  end
  local function strlen_ok(len, what)
    if len > LIM.plan_string then
      run_error(string.format("%s would make a string of %.0f bytes; plan files build strings of at most %d bytes",
        what, len, LIM.plan_string))
    end
  end
  local function no_address(v, what)
    local t = type(v)
    if t == "table" or t == "function" or t == "thread" or t == "userdata" then
      run_error(string.format("%s of a %s gives its address, which changes from run to run; use a string or number",
        what, t))
    end
  end
  local env = {}
  for _, k in ipairs({ "ipairs", "pairs", "tonumber", "type", "select", "error", "assert", "next" }) do
    env[k] = _G[k]
  end
  env.tostring = function(v)
    no_address(v, "tostring")
    return tostring(v)
  end
  -- A plan's pcall cannot swallow the limit errors.
  env.pcall = function(f, ...)
    local r = table.pack(pcall(f, ...))
    if not r[1] and getmetatable(r[2]) == LimitError then error(r[2], 0) end
    return table.unpack(r, 1, r.n)
  end
  env.math = { floor = math.floor, ceil = math.ceil, max = math.max, min = math.min,
               abs = math.abs, tointeger = math.tointeger, huge = math.huge,
               maxinteger = math.maxinteger, mininteger = math.mininteger, type = math.type }
  local S = string
  env.string = {
    format = function(fmt, ...)
      local n = select("#", ...)
      if type(fmt) ~= "string" then run_error("string.format: the format must be a string") end
      if S.find(fmt, "%p", 1, true) then run_error("string.format: %p prints an address, which changes from run to run") end
      local len = #fmt + 64 * n
      if n > 0 then
        local args = { ... }
        for i = 1, n do
          local a = args[i]
          if type(a) == "string" then len = len + #a elseif not PLAIN[type(a)] then no_address(a, "string.format") end
        end
      end
      strlen_ok(len, "string.format")
      budget.work = budget.work + len // 64
      return S.format(fmt, ...)
    end,
    rep = function(s, n, sep)
      if type(s) ~= "string" and type(s) ~= "number" then run_error("string.rep: expected a string") end
      if math.type(n) ~= "integer" then
        n = math.tointeger(n) or run_error("string.rep: the count must be an integer")
      end
      sep = sep or ""
      if type(sep) ~= "string" and type(sep) ~= "number" then run_error("string.rep: the separator must be a string") end
      if n <= 0 then return "" end
      -- In floats: the byte count of a huge n must not wrap.
      local len = #tostring(s) * (n + 0.0) + #tostring(sep) * (n - 1.0)
      strlen_ok(len, "string.rep")
      charge(math.floor(len / 64))
      return S.rep(s, n, sep)
    end,
    sub = function(s, i, j)
      if type(s) == "string" then charge(#s // 64) end
      return S.sub(s, i, j)
    end,
    upper = function(s)
      if type(s) == "string" then charge(#s // 64) end
      return S.upper(s)
    end,
    lower = function(s)
      if type(s) == "string" then charge(#s // 64) end
      return S.lower(s)
    end,
    len = function(s) return S.len(s) end,
  }
  strict_library(env.string, "string", " (only format, rep, sub, upper, lower and len are: "
    .. "patterns can run for minutes inside one call)")
  strict_library(env.math, "math", "")
  env.table = {
    insert = function(t, ...)
      if type(t) == "table" and select("#", ...) == 2 then
        local pos = ...
        local n = #t
        if math.type(pos) == "integer" and pos >= 1 and pos <= n + 1 then charge(n - pos + 1) end
      end
      return table.insert(t, ...)
    end,
    concat = function(t, sep, i, j)
      if type(t) ~= "table" then run_error("table.concat: expected a table") end
      i, j = i or 1, j or #t
      if math.type(i) ~= "integer" or math.type(j) ~= "integer" then
        run_error("table.concat: indices must be integers")
      end
      if j >= i and (j - i >= 1000000 or j - i < 0) then run_error("table.concat: more than 1000000 entries") end
      local len = 0
      for k = i, j do
        local v = t[k]
        len = len + (type(v) == "string" and #v or 24) + (sep and #tostring(sep) or 0)
      end
      strlen_ok(len, "table.concat")
      charge(j - i + 1 + len // 64)
      return table.concat(t, sep, i, j)
    end,
    unpack = function(t, i, j)
      if type(t) ~= "table" then run_error("table.unpack: expected a table") end
      i, j = i or 1, j or #t
      if math.type(i) ~= "integer" or math.type(j) ~= "integer" then
        run_error("table.unpack: indices must be integers")
      end
      if j >= i and (j - i >= 100000 or j - i < 0) then run_error("table.unpack: more than 100000 values") end
      charge(math.max(0, j - i + 1))
      return table.unpack(t, i, j)
    end,
  }
  strict_library(env.table, "table", " (only insert, concat and unpack are)")
  -- Strict globals: defining one is fine; reading one never defined is an error.
  setmetatable(env, { __index = function(_, k) error(setmetatable({ name = k }, Undefined), 2) end })
  return env
end

-- Runs chunk with the hook and the string metatable swapped; restores both.
-- Returns ok, value-or-error, line of the error in the plan (or nil).
local function run_limited(chunk, env, budget)
  local string_mt = getmetatable("")
  local saved_index = string_mt.__index
  local saved_hook = table.pack(debug.gethook())
  local count, stopped = 0, nil
  collectgarbage("collect")
  local base_kib = collectgarbage("count")
  local t0 = os.clock()
  local function stop(msg)
    stopped = stopped or setmetatable({ msg = msg }, LimitError)
    error(stopped, 0)
  end
  local function hook()
    if stopped then error(stopped, 0) end
    count = count + 1
    if count + budget.work > LIM.plan_instructions then
      stop(string.format("the plan file ran more than %d Lua instructions (an endless loop?); plan files "
        .. "describe the model and must finish quickly", LIM.plan_instructions))
    end
    if collectgarbage("count") - base_kib > LIM.plan_memory_kib then
      collectgarbage("collect")
      if collectgarbage("count") - base_kib > LIM.plan_memory_kib then
        stop(string.format("the plan file uses more than %d MiB of memory (unbounded tables or strings?)",
          LIM.plan_memory_kib // 1024))
      end
    end
    if count & 63 == 0 and os.clock() - t0 > LIM.plan_seconds then
      stop(string.format("the plan file ran for more than %d s of CPU time", LIM.plan_seconds))
    end
  end
  local err_line
  local function restore()
    debug.sethook(table.unpack(saved_hook, 1, saved_hook.n))
    string_mt.__index = saved_index
  end
  local function handler(e)
    debug.sethook()
    string_mt.__index = saved_index
    -- The innermost frame of the plan chunk holds the failing line.
    for level = 2, 200 do
      local info = debug.getinfo(level, "Sl")
      if not info then break end
      if info.source == "=plan" and info.currentline and info.currentline > 0 then
        err_line = info.currentline
        break
      end
    end
    return e
  end
  string_mt.__index = env.string
  debug.sethook(hook, "", 1)
  local ok, res = xpcall(chunk, handler)
  restore()
  return ok, res, err_line
end

local function run_message(res)
  local mt = getmetatable(res)
  if mt == LimitError then return "plan", res.msg end
  if mt == Undefined then
    local name = type(res.name) == "string" and res.name:match("^[%a_][%w_]*$") and res.name or "plan"
    return name, string.format("undefined variable %s in the plan file: define it first (local %s = ...), "
      .. "fix its spelling, or quote it if a string was meant", util.show(res.name), util.key_text(res.name))
  end
  if type(res) == "string" then
    -- The line comes from the stack; drop Lua's "where:" prefix.
    return "plan", (res:gsub("^[^%s]-:%d+: ", "", 1)) .. " (error while running the plan file)"
  end
  if type(res) == "number" then return "plan", tostring(res) .. " (error while running the plan file)" end
  return "plan", string.format("the plan file raised an error object (%s) instead of a message", util.show(res))
end

-- Load and normalize a plan file. `path` is shown in messages as given.
function load_plan.file(path)
  local source, why = require("gen.fsio").read_regular(path, LIM.plan_source + 1)
  if not source then
    util.plan_error(string.format("%s: the plan file %s; give the path of a plan file (plans/<name>.lua)",
      (path:gsub("[%c]", "?")), why))
  end
  return load_plan.source(source, path)
end

-- read_beside(rel, max_bytes): how the plan's own files (pipeline.csv) are
-- read, text or nil and why; by default below the plan file's directory
-- on disk (gen/fsio.lua's read_below), for a plan at a git revision from
-- that revision (gen/plandiff.lua).
function load_plan.source(source, path, read_beside)
  local stem = path:match("([^/]+)%.lua$") or path:match("([^/]+)$") or path
  local ctx = { file = path, source = source, stem = stem, read_beside = read_beside }
  if #source > LIM.plan_source then
    util.plan_error(string.format("%s:1: plan: the file has more than %d MiB; plan files are small Lua programs",
      path, LIM.plan_source >> 20))
  end
  local budget = { work = 0 }
  local env = sandbox_env(budget)
  -- The chunk is named "plan" so Lua's messages never cut a long path.
  local chunk, err = load(source, "=plan", "t", env)
  if not chunk then
    local line, msg = tostring(err):match("^plan:(%d+): (.*)$")
    util.plan_error(string.format("%s:%s: plan: syntax error: %s; fix the plan file", path, line or "1",
      msg or tostring(err)))
  end
  local ok, raw, line = run_limited(chunk, env, budget)
  if not ok then
    local field, msg = run_message(raw)
    if not line and type(raw) == "string" then line = tonumber(raw:match("^plan:(%d+): ")) end
    util.plan_error(string.format("%s:%d: %s: %s", path, line or util.return_line(source), field, msg))
  end
  local plan = load_plan.normalize(ctx, raw)
  plan.source_file = path
  plan.ctx = ctx
  return plan
end

return load_plan
