"""`commplan write`'s settings: its flags and a torchtitan TOML job config, as one table.

Every setting has one flag, named as torchtitan's job config names it where it has one
(torchtitan 0.3's config/configs.py: TrainingConfig, ParallelismConfig; activation checkpointing
in distributed/activation_checkpoint.py), and is read from the TOML file at that name
(torchtitan <= 0.2's `--job.config_file` format: [model], [training], [parallelism],
[activation_checkpoint], [compile]; torchtitan 0.3 builds the same dataclasses from Python
config_registry functions, config/manager.py:48, and keeps these field names). A flag overrides
the file. docs/your-repository.md lists every key: read, refused (it would change the
communication and `commplan write` cannot write it), or ignored (it does not).

Every value is checked here: one PlanError line naming the flag (or FILE: section.key) and the
fix; nothing is written before all of them pass.
"""

import hashlib

from . import safeio, validate
from .errors import PlanError

__all__ = ["SETTINGS", "FLAG_OF", "parse_flag", "read_job_config", "plan_settings", "sha256_file",
           "JOB_CONFIG_MAX"]

JOB_CONFIG_MAX = 1 << 20  # a torchtitan job config is a few KiB

SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV",
             "PipelineScheduleMulti")
PRESETS = ("h100", "h200", "b200", "a100", "h100_hbm2e")
# --family: the writer's families (python3 -m commplan hf --family)
FAMILIES = ("auto", "llama", "generic", "qwen3", "mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss")
_TORCH_DTYPES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16", "bf16": "bf16", "fp32": "fp32",
                 "fp16": "fp16"}


class S:
    """A setting: its key, flag, kind, the TOML key(s) it is read from, and what it means."""

    def __init__(self, key, kind, toml=(), what="", lo=1, hi=1 << 30, enum=None):
        self.key, self.flag, self.kind, self.toml, self.what = key, "--" + key.replace("_", "-"), kind, toml, what
        self.lo, self.hi, self.enum = lo, hi, enum


# In the order the plan header lists them (and `commplan write --help`).
SETTINGS = (
    S("world_size", "int", (), "ranks (GPUs) the plan is for (torchrun's WORLD_SIZE)"),
    S("dp_replicate", "int", ("parallelism.data_parallel_replicate_degree",), "replicas of the model (HSDP / DDP)"),
    S("dp_shard", "int", ("parallelism.data_parallel_shard_degree",), "FSDP degree; -1 for the ranks left", lo=-1),
    S("tp", "int", ("parallelism.tensor_parallel_degree",), "tensor-parallel degree"),
    S("cp", "int", ("parallelism.context_parallel_degree",), "context-parallel degree"),
    S("pp", "int", ("parallelism.pipeline_parallel_degree",), "pipeline-parallel degree (stages' ranks)"),
    S("ep", "int", ("parallelism.expert_parallel_degree",), "expert-parallel degree (MoE models)"),
    S("etp", "int", ("parallelism.expert_tensor_parallel_degree",), "expert tensor-parallel degree (MoE models)"),
    S("schedule", "enum", ("parallelism.pipeline_parallel_schedule",), "pipeline schedule (with --pp > 1)",
      enum=SCHEDULES),
    S("schedule_csv", "path", ("parallelism.pipeline_parallel_schedule_csv",),
      "torch's CSV schedule (with --pp > 1 and a multi-stage --schedule, PipelineScheduleMulti among them); the plan "
      "reads it beside itself"),
    S("microbatches", "int", (), "pipeline microbatches per step (with --pp > 1)", hi=1 << 10),
    S("microbatch_size", "int", ("parallelism.pipeline_parallel_microbatch_size",),
      "sequences per pipeline microbatch (with --pp > 1)", hi=1 << 20),
    S("layers_per_stage", "int", ("parallelism.pipeline_parallel_layers_per_stage",),
      "layers per pipeline stage (with --pp > 1)", hi=1 << 12),
    S("first_stage_less_layers", "int", ("parallelism.pipeline_parallel_first_stage_less_layers",),
      "layers fewer in the first stage (with --pp > 1)", lo=0, hi=1 << 12),
    S("last_stage_less_layers", "int", ("parallelism.pipeline_parallel_last_stage_less_layers",),
      "layers fewer in the last stage (with --pp > 1)", lo=0, hi=1 << 12),
    S("seq_len", "int", ("training.seq_len",), "tokens per sequence", hi=(1 << 31) - 1),
    S("local_batch_size", "int", ("training.local_batch_size",), "sequences per data-parallel rank and micro-step"),
    S("global_batch_size", "int", ("training.global_batch_size",),
      "sequences per step; gradient accumulation = it / (local batch x data-parallel degree)", lo=-1),
    S("ac", "enum", ("activation_checkpoint.mode",), "activation checkpointing", enum=("none", "selective", "full")),
    S("dtype", "dtype", ("training.dtype",), "the parameters' stored dtype (fp32, bf16, fp16)"),
    S("param_dtype", "dtype", ("training.mixed_precision_param",), "FSDP's all-gather dtype (MixedPrecisionPolicy)"),
    S("reduce_dtype", "dtype", ("training.mixed_precision_reduce",), "FSDP's reduce-scatter dtype"),
    S("reshard_after_forward", "enum", ("parallelism.fsdp_reshard_after_forward",),
      "FSDP's reshard after forward", enum=("default", "always", "never")),
    S("async_tp", "bool", ("parallelism.enable_async_tensor_parallel", "compile.enable_async_tensor_parallel"),
      "async tensor parallel (with --tp > 1)"),
    S("sequence_parallel", "bool", ("parallelism.enable_sequence_parallel",), "sequence parallel (with --tp > 1)"),
    S("loss_parallel", "bool", (), "loss parallel (with --tp > 1); the TOML's parallelism.disable_loss_parallel is "
      "its negation"),
    S("compile", "bool", ("compile.enable",), "torch.compile"),
    S("symm_mem", "bool", ("parallelism.enable_fsdp_symm_mem",),
      "FSDP2's all-gather and reduce-scatter buffers in one symmetric window per rank (fsdp.symm_mem; "
      "torchtitan's distributed/fsdp.py:44-51)"),
    S("cpu_offload", "bool", ("training.enable_cpu_offload",),
      "FSDP2's CPUOffloadPolicy on every unit: sharded parameters, gradients and optimizer state in pinned host "
      "memory (fsdp.cpu_offload; torchtitan's distributed/fsdp.py:173-174)"),
    S("optimizer_implementation", "enum", ("optimizer.implementation",),
      "the optimizer's implementation; fused_opt_states_bf16 keeps AdamW's moments in bf16 (memory per rank)",
      enum=("fused", "foreach", "for-loop", "fused_opt_states_bf16")),
    S("preset", "enum", (), "the GPU (topology.preset)", enum=PRESETS),
    S("gpus_per_node", "int", (), "GPUs per node (topology.gpus_per_node)", hi=1 << 10),
    S("family", "family", (), "the plan family, overriding config.json's model_type where the structure is the same"),
    S("fused", "fused", ("override.imports",), "torchtitan's fused layouts, comma-separated: swiglu, grouped_experts, "
      "mla (or their override.imports targets)"),
    # issue 41 (hlora): torchtitan's LoRA job (components/lora.py LoRAConverter, set in a config_registry
    # function: model_registry(flavor, converters=[LoRAConverter.Config(rank=..., target_modules=...)]),
    # models/llama3/config_registry.py:155-171) and the backend that keeps its freeze
    S("spmd_backend", "enum", ("parallelism.spmd_backend",),
      "torchtitan's SPMD backend; with --lora-rank, partial_dtensor or full_dtensor keep LoRA's frozen base "
      "weights frozen, spmd_types (its default) trains them all (protocols/module.py:313-315)",
      enum=("spmd_types", "partial_dtensor", "full_dtensor")),
    S("lora_rank", "int", (), "torchtitan's LoRAConverter rank (with --titan llama3:FLAVOR): frozen base weights, "
      "trainable lora_a / lora_b adapters", hi=1 << 16),
    S("lora_target_modules", "names", (), "LoRAConverter's target_modules, comma-separated Linear names (wq, wo, "
      "w2, ...; default every Linear)"),
)
FLAG_OF = {s.key: s for s in SETTINGS}

# TOML keys read into a setting other than by name.
_NEGATED = {"parallelism.disable_loss_parallel": "loss_parallel"}
# [model]: the torchtitan model the plan is for, when no config.json or --titan is given.
_MODEL_KEYS = ("name", "flavor")
# Keys that change the communication but that `commplan write` cannot express: refused unless they
# hold torchtitan's default (the value that leaves the communication as planned).
_REFUSED = {
    "parallelism.pipeline_parallel_split_points": ([], None),
    "parallelism.module_fqns_per_model_part": (None,),
    "parallelism.context_parallel_rotate_method": ("allgather",),
    "parallelism.context_parallel_load_balancer": ("headtail", None),
    "parallelism.expert_parallel_comm_backend": ("standard",),
    "parallelism.enable_compiled_autograd": (False,),
    "float8.enable_fsdp_float8_all_gather": (False,),
    "float8.precompute_float8_dynamic_scale_for_fsdp": (False,),
}
# Sections read: an unknown key in [parallelism] is refused (everything there is communication);
# in the others it is ignored (steps, max_norm, gc_freq, ...: no communication). Other sections
# ([job], [metrics], [optimizer], [lr_scheduler], [checkpoint], [profiling], [comm], ...) are ignored.
_STRICT_SECTIONS = ("parallelism",)
# [parallelism] keys that change nothing planned (none now: spmd_backend is read, SETTINGS).
_PARALLELISM_IGNORED = ()


def _shown(v):
    """A TOML value as TOML writes it (true, "text", 3)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"%s"' % v if len(v) <= 40 and all(" " <= c <= "~" for c in v) else validate.short_repr(v)
    return validate.short_repr(v)


def _fail(where, msg):
    raise PlanError("%s: %s" % (where, msg))


# torchtitan 0.3's override.imports targets (torchtitan/overrides/): the fused layouts a plan's
# model.fused names (gen/models/fused.lua), and the overrides that change nothing commplan plans.
FUSED_TARGETS = {"torchtitan.overrides.fused_swiglu.fused_swiglu": "swiglu",
                 "torchtitan.overrides.fused_swiglu.fused_grouped_experts": "grouped_experts",
                 "torchtitan.overrides.fused_mla.fused_mla": "mla"}
# helion_rope.py: the RoPE rotation as a Helion kernel (exact=True on CosSinRoPE / ComplexRoPE configs, no
# parameters: helion_rope.py:987-1010); nothing communicated or held changes.
_OVERRIDES_IGNORED = ("torchtitan.overrides.helion_rope.helion_cos_sin_rope",
                      "torchtitan.overrides.helion_rope.helion_complex_rope")


def _fused(v, where, from_toml):
    """model.fused from override.imports (a TOML list of targets, each a string or [target, kwargs]) or
    from --fused's text (comma-separated names or targets)."""
    if from_toml:
        if not isinstance(v, list):
            _fail(where, "%s is not a list; give override.imports = [\"torchtitan.overrides....\", ...]"
                  % validate.short_repr(v))
        items = [x[0] if isinstance(x, list) and x and isinstance(x[0], str) else x for x in v]
    else:
        items = [x.strip() for x in v.split(",")] if isinstance(v, str) and v.strip() else [v]
    out = []
    for x in items:
        name = FUSED_TARGETS.get(x, x if x in FUSED_TARGETS.values() else None) if isinstance(x, str) else None
        if name is None:
            if from_toml and x in _OVERRIDES_IGNORED:
                continue
            _fail(where, "%s is not an override commplan plans; give %s (torchtitan/overrides/), or remove it and "
                  "write that part of the plan by hand (docs/plan-files.md)"
                  % (validate.short_repr(x), ", ".join(list(FUSED_TARGETS.values()) + list(FUSED_TARGETS))))
        if name in out:
            _fail(where, "%s named twice (torchtitan refuses it: config/override.py:361-364); give it once" % name)
        out.append(name)
    return out


def _convert(s, v, where, from_toml):
    """A setting's value from a flag's text (from_toml False) or a TOML value, checked."""
    if s.kind == "fused":
        return _fused(v, where, from_toml)
    src_hint = "" if not s.toml else " (torchtitan's %s)" % s.toml[0]
    if s.kind == "int":
        if from_toml:
            ok = isinstance(v, int) and not isinstance(v, bool)
        else:
            ok = isinstance(v, str) and (v.isdigit() or (v[:1] == "-" and v[1:].isdigit())) and len(v) < 12
            v = int(v) if ok else v
        if not ok or not (s.lo <= v <= s.hi) or (s.lo == -1 and v == 0):
            rng = "-1 or 1 .. %d" % s.hi if s.lo == -1 else "%d .. %d" % (s.lo, s.hi)
            _fail(where, "%s is not a whole number in %s; give the %s%s"
                  % (validate.short_repr(v), rng, s.what, src_hint))
        return v
    if s.kind == "bool":
        if from_toml:
            if not isinstance(v, bool):
                _fail(where, "%s is not true or false; give true or false%s" % (validate.short_repr(v), src_hint))
            return v
        if v not in ("true", "false"):
            _fail(where, "%s is not true or false; give %s true or %s false" % (validate.short_repr(v), s.flag, s.flag))
        return v == "true"
    if s.kind == "dtype":
        d = _TORCH_DTYPES.get(v) if isinstance(v, str) else None
        if d is None:
            _fail(where, "%s is not a dtype commplan plans; give fp32, bf16 or fp16 (torchtitan's float32, bfloat16)"
                  % validate.short_repr(v))
        return d
    if s.kind == "path":
        # torchtitan's "" (or None) is no CSV (distributed/pipeline_parallel.py:293)
        if from_toml and v in ("", None):
            return ""
        if not isinstance(v, str) or not v or len(v) > 4096 or not all(" " < c <= "~" for c in v):
            _fail(where, "%s is not a file path; give the CSV's path (printable ASCII, no spaces)%s"
                  % (validate.short_repr(v), src_hint))
        return v
    if s.kind == "names":  # (a comma-separated flag: module names, each an identifier)
        items = [x.strip() for x in v.split(",")] if isinstance(v, str) else []
        if not items or not all(x.isidentifier() and x.isascii() and len(x) <= 64 for x in items):
            _fail(where, "%s is not comma-separated module names; give e.g. wq,wo (the last segment of each "
                  "Linear's name)" % validate.short_repr(v))
        return items
    if s.kind == "family":
        if v not in FAMILIES:
            _fail(where, "%s is not a family; give one of %s" % (validate.short_repr(v), ", ".join(FAMILIES)))
        return v
    if not isinstance(v, str) or v not in s.enum:
        hint = validate.did_you_mean(v, s.enum) if isinstance(v, str) else None
        _fail(where, "%s is not one of %s; give %s" % (validate.short_repr(v), ", ".join(s.enum),
                                                        hint if hint else "one of them"))
    return v


def parse_flag(key, text):
    s = FLAG_OF[key]
    return _convert(s, text, s.flag, False)


def sha256_file(path, what):
    data = safeio.read_file(path, what, safeio.CONFIG_JSON_MAX)
    return hashlib.sha256(data).hexdigest()


def _toml_loads(data, src):
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib
        except ImportError:
            raise PlanError("%s: reading a TOML job config needs Python 3.11 (tomllib) or the tomli package; "
                            "install tomli or give the settings as flags" % src) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlanError("%s: not UTF-8 (byte %d); a TOML file is UTF-8 text" % (src, e.start)) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PlanError("%s: not TOML: %s; fix the file (torchtitan's train_configs/*.toml format)"
                        % (src, " ".join(str(e).split()))) from None
    except RecursionError:
        raise PlanError("%s: nested too deeply; a job config is a few flat tables" % src) from None


def read_job_config(path):
    """(settings, model) from a torchtitan TOML job config: settings {key: value} of SETTINGS,
    model {"name", "flavor"} or {} ([model])."""
    src = safeio.show_path(path)
    doc = _toml_loads(safeio.read_file(path, "the job config (TOML)", JOB_CONFIG_MAX), src)
    by_toml = {t: s for s in SETTINGS for t in s.toml}
    settings, model = {}, {}
    for section, table in doc.items():
        if not isinstance(table, dict):
            if section in ("model", "training", "parallelism", "activation_checkpoint", "compile"):
                _fail(src, "%s: expected a table [%s], got %s" % (section, section, validate.short_repr(table)))
            continue
        for k, v in table.items():
            key = "%s.%s" % (section, k)
            where = "%s: %s" % (src, validate.printable(key, 80))  # a TOML key may be any length
            if section == "model" and k in _MODEL_KEYS:
                if not isinstance(v, str) or not v:
                    _fail(where, "expected the model's %s as a string (torchtitan's model.%s)" % (k, k))
                model[k] = v
            elif key in by_toml:
                s = by_toml[key]
                settings[s.key] = _convert(s, v, where, True)
            elif key in _NEGATED:
                s = FLAG_OF[_NEGATED[key]]
                settings[s.key] = not _convert(s, v, where, True)
            elif key in _REFUSED:
                if not any(v == ok and type(v) is type(ok) for ok in _REFUSED[key] if ok is not None) and \
                        not (v is None and None in _REFUSED[key]):
                    _fail(where, "%s changes the communication in a way `commplan write` cannot write; set it to "
                          "torchtitan's default (%s) or remove it, and write that part of the plan by hand "
                          "(docs/plan-files.md)" % (_shown(v), _shown(_REFUSED[key][0])))
            elif section in _STRICT_SECTIONS and k not in _PARALLELISM_IGNORED:
                known = [t.split(".", 1)[1] for t in list(by_toml) + list(_NEGATED) + list(_REFUSED)
                         if t.startswith(section + ".")]
                hint = validate.did_you_mean(k, known)
                _fail(where, "unknown key, and [%s] is all communication; %s"
                      % (section, "did you mean %s?" % hint if hint else
                         "docs/your-repository.md lists the keys commplan reads"))
    return settings, model


def _degrees(st):
    return {k: st.get(k, 1) for k in ("dp_replicate", "tp", "cp", "pp", "ep", "etp")}


def plan_settings(st, from_toml=()):
    """The plan's sections from the settings (flags over the job config), each cross-check one
    line naming the flag: {"parallel", "fsdp", "topology", "training", "pipeline", "seq_len",
    "dtype", "family"}."""
    world = st["world_size"]
    d = _degrees(st)
    dp_shard = st.get("dp_shard", -1)
    rest = d["dp_replicate"] * d["cp"] * d["tp"] * d["pp"]
    # torchtitan's ParallelDims._validate (distributed/parallel_dims.py:179-189)
    if dp_shard == -1:
        if world % rest or world // rest < 1:
            _fail("--world-size", "%d ranks are not a multiple of dp_replicate %d x cp %d x tp %d x pp %d = %d "
                  "(torchtitan's ParallelDims, parallel_dims.py:182-189); give a multiple of %d or other degrees"
                  % (world, d["dp_replicate"], d["cp"], d["tp"], d["pp"], rest, rest))
        dp_shard_n = world // rest
    else:
        dp_shard_n = dp_shard
        if rest * dp_shard != world:
            _fail("--world-size", "%d ranks are not dp_replicate %d x dp_shard %d x cp %d x tp %d x pp %d = %d "
                  "(torchtitan's ParallelDims, parallel_dims.py:186); give --world-size %d, or --dp-shard -1 for "
                  "the ranks left" % (world, d["dp_replicate"], dp_shard, d["cp"], d["tp"], d["pp"],
                                      rest * dp_shard, rest * dp_shard))
    parallel = {}
    for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "etp"):
        if k == "dp_shard" and k not in st and world > 1:
            parallel[k] = -1  # torchtitan's default: FSDP over the ranks left
        elif k in st and (st[k] != 1 or k == "etp" or (k == "dp_shard" and world == 1)):  # 1: the generator's default
            parallel[k] = st[k]
    for k in ("async_tp", "sequence_parallel", "loss_parallel"):
        if k in st:
            if d["tp"] < 2 and st[k]:
                _fail(FLAG_OF[k].flag, "needs --tp 2 or more (it shapes tensor parallel's collectives); drop it "
                      "or set --tp")
            if d["tp"] >= 2:
                parallel[k] = st[k]
    pipeline = {}
    for k in ("schedule", "microbatches", "microbatch_size", "layers_per_stage", "first_stage_less_layers",
              "last_stage_less_layers", "schedule_csv"):
        if k == "schedule_csv" and st.get(k) == "":
            continue  # torchtitan's default: no CSV
        if k in st:
            if d["pp"] < 2:
                if k in ("schedule", "microbatch_size", "first_stage_less_layers", "last_stage_less_layers") and \
                        k in from_toml:
                    continue  # a job config's pipeline defaults without a pipeline: torchtitan ignores them too
                _fail(FLAG_OF[k].flag, "needs --pp 2 or more (a pipeline setting without pipeline stages); drop "
                      "it or set --pp")
            # the CSV as given (relative to the current directory, as torchtitan opens it); `commplan
            # write` makes it relative to the plan's directory (command.py)
            pipeline["csv" if k == "schedule_csv" else k] = st[k]
    training = {}
    if "local_batch_size" in st:
        training["local_batch_size"] = st["local_batch_size"]
    if st.get("ac") is not None:
        training["activation_checkpointing"] = st["ac"]
    if "compile" in st:
        training["compile"] = st["compile"]
    # torchtitan's components/optimizer/optimizer.py:109-124 ("fused" by default): only
    # "fused_opt_states_bf16" changes what commplan plans (AdamW's moments in bf16), so only it is written
    if st.get("optimizer_implementation") == "fused_opt_states_bf16":
        training["optimizer_implementation"] = st["optimizer_implementation"]
    fsdp = {}
    # torchtitan's MixedPrecisionPolicy defaults (job config training.mixed_precision_param = "bfloat16",
    # mixed_precision_reduce = "float32") for fp32-stored parameters: a job that sets neither all-gathers
    # in bf16, so the plan does too unless a flag or the job config says otherwise.
    if st.get("dtype") in (None, "fp32"):
        fsdp["param_dtype"], fsdp["reduce_dtype"] = "bf16", "fp32"
    if "param_dtype" in st:
        fsdp["param_dtype"] = st["param_dtype"]
    if "reduce_dtype" in st:
        fsdp["reduce_dtype"] = st["reduce_dtype"]
    if st.get("symm_mem"):
        # torchtitan's enable_fsdp_symm_mem: set_force_sum_reduction_for_comms(True) and
        # set_symm_mem_for_comm() on every FSDP module (distributed/fsdp.py:44-51); the plan's
        # fsdp.symm_mem forces the sums itself (gen/parallel/fsdp_layout.lua)
        fsdp["symm_mem"] = True
    if st.get("cpu_offload"):
        # torchtitan's enable_cpu_offload: offload_policy=CPUOffloadPolicy() (pin_memory=True) on every
        # fully_shard call (distributed/fsdp.py:173-174)
        fsdp["cpu_offload"] = True
    raf = st.get("reshard_after_forward", "default")
    if raf != "default":
        # the policy, not a bool: "always" reshards torchtitan's [norm, lm_head] unit too
        # (distributed/fsdp.py:196-204), which fsdp.reshard_after_forward = true leaves kept
        fsdp["reshard_after_forward_policy"] = raf
    gbs = st.get("global_batch_size", -1)
    if gbs != -1:
        lbs = st.get("local_batch_size", 1)
        batch_degree = d["dp_replicate"] * dp_shard_n
        # torchtitan's Trainer: gradient accumulation steps (trainer.py:415-433)
        if gbs % (lbs * batch_degree):
            _fail("--global-batch-size", "%d is not a multiple of local batch %d x data-parallel degree %d "
                  "(torchtitan refuses it, trainer.py:421-427); give a multiple of %d"
                  % (gbs, lbs, batch_degree, lbs * batch_degree))
        if gbs // (lbs * batch_degree) > 1:
            fsdp["micro_steps"] = gbs // (lbs * batch_degree)
    topology = {}
    if "preset" in st:
        topology["preset"] = st["preset"]
    if "gpus_per_node" in st:
        topology["gpus_per_node"] = st["gpus_per_node"]
    lora = None
    if "lora_rank" in st:
        lora = {"rank": st["lora_rank"]}
        if "lora_target_modules" in st:
            lora["target_modules"] = st["lora_target_modules"]
    elif "lora_target_modules" in st:
        _fail("--lora-target-modules", "needs --lora-rank (LoRAConverter's rank); give it or drop this flag")
    return {"parallel": parallel or None, "fsdp": fsdp or None, "topology": topology or None,
            "lora": lora, "spmd_backend": st.get("spmd_backend", "spmd_types"),
            "training": training or None, "pipeline": pipeline or None, "seq_len": st.get("seq_len"),
            "dtype": st.get("dtype"), "family": st.get("family", "auto"), "fused": st.get("fused") or None}
