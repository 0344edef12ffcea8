"""Every input of the plan writer checked for type and shape in one place.

A Hugging Face config.json (check_hf_config), the writer's options -- parallel, fsdp, topology,
training (check_sections, mirroring gen/load.lua's SCHEMA: tests/python/test_input_validation.py
compares them), the model table and model numbers, family, world_size, comment, out -- the CLI's
options and units files, and the shape of a generated plan.json (check_plan_json). Booleans are
strictly booleans (the string "false", 0 and 1 are refused, never read as truthy), integers
strictly integers (not booleans, not floats, not strings of digits), tables are dicts with string
keys. Each failure is one PlanError line:

    <file or "writer options">: <field path>: expected <what>, got <what it is>; <the fix>

JSON sources (config.json, the CLI's files) are described in JSON's words (true, null, string
"32", array), Python arguments in Python's (True, None, str '32', list).
"""

import math
import numbers
import operator

from .errors import PlanError

__all__ = ["Spec", "SECTIONS", "CONFIG_FIELDS", "describe", "check_value", "check_dict", "check_sections",
           "check_hf_config", "check_world_size", "check_family", "check_optional_int", "check_bool_or_none",
           "check_raf_or_none", "same_raf", "check_plan_json", "OPTIONS_SRC", "did_you_mean", "check_expert_counts",
           "INT64_MAX"]

OPTIONS_SRC = "writer options"
MODEL_INT = (1 << 31) - 1          # gen/util.lua LIMITS.model_int
MAX_LAYERS = (1 << 12) - 3         # gen/load.lua: n_layers <= units - 3 (2^12 units, gen/util.lua)
DTYPES = ("fp32", "bf16", "fp16")
INT64_MAX = (1 << 63) - 1          # the libraries' count type (int64_t): cp_*_set_expert_counts
MAX_EXPERT_COUNTS = 1 << 20        # far above any plan's experts; bounds the work before the length check


class Spec:
    """One field: kind int | num | bool | enum | string | dict | list; lo/hi bounds (gt: exclusive
    lower bound); enum: the values an enum takes; null: None / JSON null allowed (the default
    applies); why: the reason for the bound, shown with it."""

    def __init__(self, kind, lo=None, hi=None, gt=None, enum=None, null=False, why=None, required=False):
        self.kind, self.lo, self.hi, self.gt, self.enum = kind, lo, hi, gt, enum
        self.null, self.why, self.required = null, why, required


# gen/load.lua SCHEMA's option sections: keys, kinds and enums (the generator checks the ranges).
SECTIONS = {
    "parallel": dict({k: Spec("int") for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "etp",
                                                "ulysses_degree", "dp")},
                     sequence_parallel=Spec("bool"), loss_parallel=Spec("bool"), async_tp=Spec("bool")),
    "fsdp": {
        # an int k too: fully_shard(reshard_after_forward=k), the post-forward groups of k ranks
        "reshard_after_forward": Spec("bool_or_int"),
        # torchtitan's parallelism.fsdp_reshard_after_forward (gen/load.lua)
        "reshard_after_forward_policy": Spec("enum", enum=("default", "always", "never")),
        "reshard_after_backward": Spec("bool"),
        "micro_steps": Spec("int"),
        "reduce_op": Spec("enum", enum=("avg", "sum")),
        "param_dtype": Spec("enum", enum=DTYPES),
        "reduce_dtype": Spec("enum", enum=DTYPES),
        "grad_accumulation": Spec("enum", enum=("fsdp2_default", "sync_last", "all_reduce_last", "step_end")),
        "gradient_divide_factor": Spec("num", gt=0),
        "force_sum_reduction_for_comms": Spec("bool"),
        # fully_shard(offload_policy=CPUOffloadPolicy(pin_memory=...)) on every unit
        "cpu_offload": Spec("bool"), "pin_memory": Spec("bool"),
        # torchtitan's enable_fsdp_symm_mem: FSDP2's collective buffers in one symmetric window
        "symm_mem": Spec("bool"),
    },
    "topology": dict({"gpus_per_node": Spec("int"), "nics_per_node": Spec("int"), "nvlinks": Spec("int"),
                      "nvls": Spec("bool"), "sharp": Spec("bool"),
                      "preset": Spec("enum", enum=("h100", "h200", "b200", "a100", "h100_hbm2e")),
                      "collectives": Spec("enum", enum=("nccl", "alpha_beta"))},
                     **{k: Spec("num") for k in ("intra_node_GBps", "inter_node_GBps", "latency_us", "gpu_memory_GB",
                                                 "gpu_TFLOPS", "mfu", "hbm_GBps", "host_GBps", "nic_Gbps", "nvlink_GBps",
                                                 "pci_GBps", "net_latency_us")}),
    # with parallel.pp > 1 (docs/pipeline.md): torch.distributed.pipelining's schedule class without
    # "Schedule", torchtitan's microbatch size or the microbatches, and its stage split options
    "pipeline": {
        "schedule": Spec("enum", enum=("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                                       "ZBVZeroBubble", "DualPipeV", "PipelineScheduleMulti")),
        "microbatch_size": Spec("int"),
        "microbatches": Spec("int"),
        "layers_per_stage": Spec("int"),
        "first_stage_less_layers": Spec("int"),
        "last_stage_less_layers": Spec("int"),
        "csv": Spec("string"),  # torch's CSV schedule, a path relative to the plan file
    },
    "training": {
        "activation_checkpointing": Spec("enum", enum=("none", "full", "selective")),
        "optimizer": Spec("enum", enum=("adamw", "sgd", "none")),
        "fp32_master": Spec("bool"),
        # torchtitan's optimizer.implementation: "fused_opt_states_bf16" keeps AdamW's moments in bf16
        "optimizer_implementation": Spec("enum", enum=("fused", "foreach", "for-loop", "fused_opt_states_bf16")),
        "local_batch_size": Spec("int"),
        "loss_chunks": Spec("int"),
        "compile": Spec("bool"),
        "float8": Spec("enum", enum=("none", "tensorwise", "rowwise", "rowwise_with_gw_hp")),
    },
}

# The config.json fields hf_config reads; every other key is the checkpoint's business.
_POS = dict(lo=1, hi=MODEL_INT)
CONFIG_FIELDS = {
    "model_type": Spec("string", required=True),
    "hidden_size": Spec("int", required=True, **_POS),
    "intermediate_size": Spec("int", required=True, **_POS),
    "num_attention_heads": Spec("int", required=True, **_POS),
    "num_hidden_layers": Spec("int", required=True, lo=1, hi=MAX_LAYERS,
                              why="a plan has one unit per layer and up to three more, 2^12 units in all"),
    "vocab_size": Spec("int", required=True, **_POS),
    "num_key_value_heads": Spec("int", null=True, **_POS),
    "head_dim": Spec("int", null=True, **_POS),
    "tie_word_embeddings": Spec("bool"),
    "attention_bias": Spec("bool"),
    "mlp_bias": Spec("bool"),
}

_CONFIG_FIX = {
    "hidden_size": "the model's hidden size", "intermediate_size": "the MLP's hidden size",
    "num_attention_heads": "the attention heads per layer", "num_hidden_layers": "the decoder layers",
    "vocab_size": "the vocabulary size", "model_type": "the model family (llama, mistral, qwen2, qwen3, mixtral, qwen3_moe, deepseek_v2 or deepseek_v3)",
}


# ---- words ---------------------------------------------------------------------------------

def _short(text, n=40):
    return text if len(text) <= n else text[:n] + "..."


def describe(v, js):
    """v as an error line shows it: JSON's words (js) or Python's."""
    if js:
        import json
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return "%d" % v if abs(v) < 10 ** 30 else "an integer of %d bits" % v.bit_length()
        if isinstance(v, float):
            return "number %s" % _short(json.dumps(v) if math.isfinite(v) else repr(v))
        if isinstance(v, str):
            return "string %s" % _short(json.dumps(v))
        if isinstance(v, (list, tuple)):
            return "an array of %d" % len(v)
        if isinstance(v, dict):
            return "an object"
        return type(v).__name__
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "bool %r" % v
    if isinstance(v, int) and abs(v) >= 10 ** 30:
        return "int of %d digits" % len(str(abs(v)))
    if isinstance(v, (int, float, str, bytes)):
        return "%s %s" % (type(v).__name__, _short(repr(v)))
    if isinstance(v, (list, tuple, dict, set)):
        return "%s of %d" % (type(v).__name__, len(v))
    return type(v).__name__


def short_repr(v, n=80):
    """repr(v) cut to about n characters: a user's value inside a one-line message."""
    try:
        text = repr(v)
    except Exception:
        text = "<%s>" % type(v).__name__
    return _short(text, n)


def printable(text, n=60):
    """text as it may appear inside a one-line message: as is when it is printable, else repr()."""
    text = text if isinstance(text, str) else str(text)
    shown = text if text.isprintable() else repr(text)
    return _short(shown, n)


def _bool_words(js):
    return "true or false" if js else "True or False (a bool)"


def did_you_mean(key, known):
    """The known key nearest to key (edit distance <= 3 and under half its length), or None."""
    if not isinstance(key, str):
        return None

    def dist(a, b):
        prev = list(range(len(b) + 1))
        for i, ca in enumerate(a, 1):
            cur = [i]
            for j, cb in enumerate(b, 1):
                cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
            prev = cur
        return prev[-1]
    best = min(known, key=lambda k: (dist(key.lower(), k.lower()), k), default=None)
    if best is not None and dist(key.lower(), best.lower()) <= max(1, min(len(key) // 3, 5)):
        return best
    return None


def _fail(src, path, msg):
    raise PlanError("%s: %s: %s" % (src, path, msg) if path else "%s: %s" % (src, msg))


# ---- values --------------------------------------------------------------------------------

def _range_text(spec):
    """'in 1..131069', '>= 1', '> 0'."""
    if spec.gt is not None:
        return "> %s" % spec.gt + (" and <= %s" % spec.hi if spec.hi is not None else "")
    if spec.lo is not None and spec.hi is not None:
        return "in %s..%s" % (spec.lo, spec.hi)
    if spec.lo is not None:
        return ">= %s" % spec.lo
    return "<= %s" % spec.hi


def _int_fix(v, spec, js):
    """The fix for a non-integer where an integer belongs."""
    if isinstance(v, str):
        try:
            i = int(v.strip(), 10)
        except ValueError:
            i = None
        if i is not None and abs(i) < 10 ** 30:
            return "write it as %d (no quotes)" % i if js else "pass the int %d, not a string" % i
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        return "write it as %d (no decimal point)" % int(v) if js else "pass the int %d" % int(v)
    if spec.lo is not None or spec.hi is not None:
        return "give a whole number %s" % _range_text(spec)
    return "give a whole number"


def _bounds(v, spec, src, path):
    bad = (spec.lo is not None and v < spec.lo) or (spec.hi is not None and v > spec.hi) or \
        (spec.gt is not None and v <= spec.gt)
    if bad:
        shown = ("%d" % v if abs(v) < 10 ** 30 else "an integer of %d bits" % v.bit_length()) \
            if isinstance(v, int) else repr(v)
        _fail(src, path, "%s is out of range; give %s %s%s" % (
            shown, "an integer" if spec.kind == "int" else "a number", _range_text(spec),
            " (%s)" % spec.why if spec.why else ""))


def check_value(v, spec, src, path, js=False):
    """v checked against spec; returns it (a dtype alias normalized to fp32 | bf16 | fp16)."""
    if v is None:
        if spec.null:
            return None
    kind = spec.kind
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            if not isinstance(v, bool) and isinstance(v, numbers.Integral):  # numpy ints and the like
                v = int(v)
            else:
                _fail(src, path, "expected an integer, got %s; %s" % (describe(v, js), _int_fix(v, spec, js)))
        _bounds(v, spec, src, path)
        return v
    if kind == "num":
        if not isinstance(v, bool) and not isinstance(v, (int, float)) and isinstance(v, numbers.Real):
            v = float(v)  # numpy floats and the like
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            fix = "give a number"
            if isinstance(v, str):
                try:
                    f = float(v)
                    if math.isfinite(f):
                        fix = "write it as %s (no quotes)" % v.strip() if js else "pass the number %r" % f
                except ValueError:
                    pass
            _fail(src, path, "expected a number, got %s; %s" % (describe(v, js), fix))
        if isinstance(v, float) and not math.isfinite(v):
            _fail(src, path, "%r is not a finite number; give a number" % v)
        _bounds(v, spec, src, path)
        return v
    if kind == "bool_or_int":  # fully_shard's reshard_after_forward: a bool or a group size (int >= 1)
        if isinstance(v, bool):
            return v
        if not isinstance(v, numbers.Integral):
            _fail(src, path, "expected %s or a group size (an integer), got %s; pass one of them"
                  % (_bool_words(js), describe(v, js)))
        return check_value(int(v), Spec("int", lo=1), src, path, js)
    if kind == "bool":
        if not isinstance(v, bool):
            if isinstance(v, str) and v.strip().lower() in ("true", "false"):
                word = v.strip().lower()
                fix = "write %s (no quotes)" % word if js else "pass the bool %s, not a string" % word.capitalize()
            elif isinstance(v, int) and v in (0, 1):
                fix = "write %s" % ("true" if v else "false") if js else "pass %s" % bool(v)
            else:
                fix = "write true or false" if js else "pass True or False"
            _fail(src, path, "expected %s, got %s; %s" % (_bool_words(js), describe(v, js), fix))
        return v
    if kind in ("enum", "string"):
        if spec.enum == DTYPES and not isinstance(v, (bool, int, float, list, tuple, dict)) and v is not None:
            from .planfile import _DTYPE_ALIASES
            try:
                key = v if isinstance(v, str) else str(v)  # torch.bfloat16 -> "torch.bfloat16"
            except Exception:
                key = None
            if key in _DTYPE_ALIASES:
                return _DTYPE_ALIASES[key]
        if not isinstance(v, str):
            want = "one of %s" % ", ".join(spec.enum) if spec.enum else "a string"
            _fail(src, path, "expected %s, got %s; %s" % (want, describe(v, js),
                                                          "write it in quotes" if js else "pass a str"))
        if spec.enum and v not in spec.enum:
            hint = did_you_mean(v, spec.enum)
            _fail(src, path, "%s is not one of %s%s" % (describe(v, js), ", ".join(spec.enum),
                                                        "; did you mean %s?" % hint if hint else ""))
        return v
    if kind == "dict":
        if not isinstance(v, dict):
            _fail(src, path, "expected %s, got %s" % ("an object { ... }" if js else "a dict", describe(v, js)))
        return v
    if kind == "list":
        if not isinstance(v, (list, tuple)):
            _fail(src, path, "expected %s, got %s" % ("an array [ ... ]" if js else "a list", describe(v, js)))
        return v
    raise AssertionError(kind)


def check_dict(v, src, path, js=False, what=None):
    """v is a dict with string keys; returns a shallow copy."""
    if not isinstance(v, dict):
        want = "an object { ... }" if js else "a dict"
        _fail(src, path, "expected %s%s, got %s" % (want, " (%s)" % what if what else "", describe(v, js)))
    for k in v:
        if not isinstance(k, str):
            _fail(src, path, "key %s is not a string; %s's keys are field names" % (describe(k, js), path or "it"))
    return dict(v)


def _check_fields(d, fields, src, prefix, js, unknown_ok=False):
    out = {}
    for k, v in d.items():
        path = "%s.%s" % (prefix, k) if prefix else k
        spec = fields.get(k)
        if spec is None:
            if unknown_ok:
                out[k] = v
                continue
            hint = did_you_mean(k, fields)
            _fail(src, path, "unknown key; %s" % ("did you mean %s?" % hint if hint else
                                                  "%s takes %s" % (prefix or "it", ", ".join(sorted(fields)))))
        out[k] = check_value(v, spec, src, path, js)
    return out


def check_sections(src=OPTIONS_SRC, js=False, **sections):
    """parallel / fsdp / topology / training: each None or a dict of gen/load.lua's keys with values
    of their kinds. Returns {section: checked copy or None}."""
    out = {}
    for name, v in sections.items():
        if v is None:
            out[name] = None
            continue
        d = check_dict(v, src, name, js)
        out[name] = _check_fields(d, SECTIONS[name], src, name, js)
    return out


# ---- single options ------------------------------------------------------------------------

def check_world_size(v, src=OPTIONS_SRC, js=False):
    return check_value(v, Spec("int", lo=1), src, "world_size", js)


def check_family(v, allowed, src=OPTIONS_SRC, path="family", js=False):
    return check_value(v, Spec("enum", enum=tuple(allowed)), src, path, js)


def check_optional_int(v, path, src=OPTIONS_SRC, js=False, lo=1, hi=MODEL_INT):
    return check_value(v, Spec("int", lo=lo, hi=hi, null=True), src, path, js)


def check_bool_or_none(v, path, src=OPTIONS_SRC, js=False):
    return check_value(v, Spec("bool", null=True), src, path, js)


def check_raf_or_none(v, path, src=OPTIONS_SRC, js=False):
    """fully_shard's reshard_after_forward: None, a bool, or an int group size (>= 1)."""
    return check_value(v, Spec("bool_or_int", null=True), src, path, js)


def same_raf(a, b):
    """Two reshard_after_forward values alike (the int 1 is not True: it is FSDP2's False)."""
    return type(a) is type(b) and a == b


# ---- config.json ---------------------------------------------------------------------------

def check_hf_config(cfg, src, supported=("llama", "mistral", "qwen2")):
    """A parsed Hugging Face config.json: a JSON object whose fields hf_config reads have their
    types (booleans true/false, integers whole and in range, model_type a string). Returns the
    fields hf_config reads, defaults filled: tie_word_embeddings, attention_bias, mlp_bias False;
    num_key_value_heads and head_dim None when absent or null."""
    if not isinstance(cfg, dict):
        raise PlanError("%s: expected a JSON object { ... } at the top level, got %s; a config.json is one "
                        "object of the model's fields (\"model_type\", \"hidden_size\", ...)"
                        % (src, describe(cfg, True)))
    if "model_type" in cfg:
        mt = check_value(cfg["model_type"], CONFIG_FIELDS["model_type"], src, "model_type", js=True)
        if mt not in supported:
            hint = did_you_mean(mt, supported)
            _fail(src, "model_type", "%s; hf_config reads %s%s (write other models' units with plan_from_module)"
                  % (describe(mt, True), ", ".join(supported), "; did you mean %s?" % hint if hint else ""))
    out = {}
    for k, spec in CONFIG_FIELDS.items():
        if k not in cfg:
            if spec.required:
                mt = cfg.get("model_type")
                _fail(src, k, "missing; a %sconfig.json gives %s" % (
                    "%s " % mt if isinstance(mt, str) and mt.isprintable() and len(mt) < 40 else "",
                    _CONFIG_FIX.get(k, "it")))
            out[k] = False if spec.kind == "bool" else None
            continue
        out[k] = check_value(cfg[k], spec, src, k, js=True)
    return out


# ---- plan.json (the generator's output, read back by match.py and runtime.py) ----------------

_PLAN_UNIT = {"name": Spec("string"), "index": Spec("int", lo=0), "params": Spec("list"),
              "reshard_after_forward": Spec("bool")}
_PLAN_PARAM = {"name": Spec("string"), "shape": Spec("list"), "dtype": Spec("string"), "shard_dim": Spec("int", lo=0)}


def check_plan_json(plan, src):
    """The fields of a plan.json that the model/plan check and the runtime read, with their types;
    the rest of plan.json is the generator's (docs/plan-json.md)."""
    if not isinstance(plan, dict):
        raise PlanError("%s: expected a JSON object { ... } at the top level, got %s; is it a plan.json "
                        "written by the generator?" % (src, describe(plan, True)))
    for k, spec in (("plan", Spec("string")), ("fingerprint", Spec("string")), ("parallel", Spec("dict")),
                    ("fsdp", Spec("dict")), ("ops", Spec("list"))):
        if k in plan:
            check_value(plan[k], spec, src, k, js=True)
    if "tp" in plan.get("parallel", {}):
        check_value(plan["parallel"]["tp"], Spec("int", lo=1), src, "parallel.tp", js=True)
    if "units" not in plan:
        _fail(src, "units", "missing; regenerate the plan (make PLAN=...)")
    units = check_value(plan["units"], Spec("list"), src, "units", js=True)
    for i, u in enumerate(units):
        up = "units[%d]" % i
        check_value(u, Spec("dict"), src, up, js=True)
        for k in ("name", "index", "params"):
            if k not in u:
                _fail(src, "%s.%s" % (up, k), "missing; regenerate the plan")
        _check_fields({k: u[k] for k in _PLAN_UNIT if k in u}, _PLAN_UNIT, src, up, True)
        for j, p in enumerate(u["params"]):
            pp = "%s.params[%d]" % (up, j)
            check_value(p, Spec("dict"), src, pp, js=True)
            for k in ("name", "shape", "dtype"):
                if k not in p:
                    _fail(src, "%s.%s" % (pp, k), "missing; regenerate the plan")
            _check_fields({k: p[k] for k in _PLAN_PARAM if k in p}, _PLAN_PARAM, src, pp, True)
            for d, n in enumerate(p["shape"]):
                check_value(n, Spec("int", lo=1), src, "%s.shape[%d]" % (pp, d), js=True)
    for i, op in enumerate(plan.get("ops", [])):
        check_value(op, Spec("dict"), src, "ops[%d]" % i, js=True)
    return executed_plan(plan, src)


def executed_plan(plan, src="plan.json"):
    """The plan with a repeated micro-step expanded (gen/repeat.lua): plan.json lists micro-steps
    micro_first .. micro_last once, as rows ops[first_seq .. first_seq + ops - 1] that run `times`
    times; the executor issues every repetition. Returns a copy whose "ops" are the ops as the
    executor issues them (seq its issue index, micro_step each repetition's, waits_for the ops of
    that issue order), or the plan itself when nothing repeats."""
    rep = plan.get("repeat")
    if rep is None:
        return plan
    ops = plan.get("ops", [])
    check_value(rep, Spec("dict"), src, "repeat", js=True)
    for k in ("first_seq", "ops", "times"):
        if k not in rep:
            _fail(src, "repeat." + k, "missing; regenerate the plan")
        check_value(rep[k], Spec("int", lo=1 if k != "first_seq" else 0), src, "repeat." + k, js=True)
    first, n, times = rep["first_seq"], rep["ops"], rep["times"]
    if first < 2 * n or first + n > len(ops):
        _fail(src, "repeat", "rows %d..%d with two copies before them are not in ops[] (%d ops); regenerate "
              "the plan" % (first, first + n - 1, len(ops)))
    shift = (times - 1) * n
    run = first - n  # waits for rows from here on mean the latest copy (shared events)

    def row(op, k, seq, waits):
        out = {key: val for key, val in op.items() if key != "times"}
        out["seq"] = seq
        out["micro_step"] = op.get("micro_step", 0) + k
        if waits is not None:
            out["waits_for"] = waits
        return out

    executed = [row(op, 0, op["seq"], None) for op in ops[:first + n]]
    for k in range(1, times):
        for op in ops[first:first + n]:
            waits = [w + k * n if w >= run else w for w in op.get("waits_for") or []]
            executed.append(row(op, k, op["seq"] + k * n, waits or None))
    for op in ops[first + n:]:
        waits = [w + shift if w >= first else w for w in op.get("waits_for") or []]
        executed.append(row(op, 0, op["seq"] + shift, waits or None))
    out = dict(plan)
    out["ops"] = executed
    del out["repeat"]
    return out


# ---- expert parallelism's token counts (the libraries' set_expert_counts) -------------------

def _count_kind(c):
    """None when c is an exact integer token count's type, else what it is instead."""
    if isinstance(c, bool) or type(c).__name__ in ("bool_", "bool"):
        return "bool %r" % c
    dtype = getattr(c, "dtype", None)  # a torch / numpy scalar: its dtype says what it is
    if dtype is not None and "bool" in str(dtype):
        return "a bool %s" % type(c).__name__
    try:
        operator.index(c)  # int, numpy and torch integers; never a float (2.0 included) or a string
    except TypeError:
        return describe(c, False) if isinstance(c, (float, str, bytes)) else \
            "%s %s" % (type(c).__name__, short_repr(c, 30))
    return None


def check_expert_counts(counts, where="set_expert_counts"):
    """This rank's tokens per global expert as a list of Python ints, each exact and in the
    libraries' int64 range; else one PlanError line naming the expert, the value and the fix.
    Accepted: a list or tuple of ints (numpy and torch integer scalars too), a 1-D integer torch
    tensor or numpy array. Refused: a bool (True is not 1 token), a float (2.5, and 2.0: a count
    computed in floating point may have been rounded), a string, a nested list, a count outside
    int64 (ctypes would keep its low 64 bits: 2^64 + 1 would route 1 token). Negative counts
    and a member's share past the plan's capacity are the library's to refuse (its line names
    the member and the capacity), as is a wrong length."""
    if hasattr(counts, "tolist") and getattr(counts, "ndim", 1) != 1:
        raise PlanError("%s: counts: expected a 1-D sequence (one count per global expert), got %d dimensions"
                        % (where, counts.ndim))
    if isinstance(counts, (str, bytes, dict)) or not hasattr(counts, "__len__") or not hasattr(counts, "__iter__"):
        raise PlanError("%s: counts: expected a list of token counts (one per global expert), got %s"
                        % (where, describe(counts, False)))
    # bounded before tolist() copies an array of any size into Python ints
    if len(counts) > MAX_EXPERT_COUNTS:
        raise PlanError("%s: counts: %d entries, more than any plan's experts (at most %d); give one count per "
                        "global expert" % (where, len(counts), MAX_EXPERT_COUNTS))
    vals = counts.tolist() if hasattr(counts, "tolist") else counts
    out = []
    for e, c in enumerate(vals):
        kind = _count_kind(c)
        if kind is not None:
            raise PlanError("%s: count for expert %d is %s, not a whole number of tokens; pass integers (int, "
                            "or an integer numpy/torch value)" % (where, e, kind))
        v = operator.index(c)
        if not -INT64_MAX - 1 <= v <= INT64_MAX:
            # (bit_length: str() of an int past 4,300 digits raises in Python 3.11+)
            shown = "%d" % v if abs(v) < 10 ** 30 else "an integer of %d bits" % v.bit_length()
            raise PlanError("%s: count for expert %d is %s, outside the libraries' int64 counts (|count| < 2^63) "
                            "and past any expert capacity; route 0 up to the plan's capacity (SCHEDULE.md, expert "
                            "parallelism) per ep member" % (where, e, shown))
        out.append(v)
    return out
