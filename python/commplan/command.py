"""The `commplan` command's verbs (commplan/cli.py dispatches them; docs/your-repository.md).

    commplan write CONFIG.json --name NAME --world-size N [settings flags] [--job-config TOML] -o PLAN.lua
    commplan write --titan MODEL:FLAVOR --name NAME --world-size N ... -o PLAN.lua
    commplan generate PLAN.lua      the generated output beside the plan: <dir>/<name>/ (SCHEDULE.md ...)
    commplan audit PLAN.lua         SCHEDULE.md's summary
    commplan diff OLD NEW           what changed between two plans (gen/verbs.lua)
    commplan advise PLAN.lua        the meshes ParallelDims accepts, ranked (gen/advisor.lua)
    commplan check PLAN.lua         exit 1 and one line when <dir>/<name>/ is stale or the config changed

A written plan's header records its source (the config path, relative to the plan file, and its
sha256; or the torchtitan model:flavor), the job config and its sha256, the settings, and the
command, normalized: paths relative to the plan file's directory (absolute ones as given), flags
in one order, so that running it in that directory writes the file again byte for byte. `check`
reads that header back.
"""

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

from . import generator, jobconfig, safeio, validate
from .errors import PlanError

SOURCE_TAG = "-- source: config "
TITAN_TAG = "-- source: torchtitan "
JOB_TAG = "-- job config: "
SETTINGS_TAG = "-- settings: "
COMMAND_TAG = "-- command (run in this file's directory): "

# The generator's plan fields -> the flag that sets them (its refusals name the field).
FIELD_FLAG = {
    "world_size": "--world-size", "parallel.dp_replicate": "--dp-replicate", "parallel.dp_shard": "--dp-shard",
    "parallel.tp": "--tp", "parallel.cp": "--cp", "parallel.pp": "--pp", "parallel.ep": "--ep",
    "parallel.etp": "--etp", "pipeline.schedule": "--schedule", "pipeline.microbatches": "--microbatches",
    "pipeline.microbatch_size": "--microbatch-size", "pipeline.layers_per_stage": "--layers-per-stage",
    "pipeline.first_stage_less_layers": "--first-stage-less-layers",
    "pipeline.last_stage_less_layers": "--last-stage-less-layers", "model.seq_len": "--seq-len",
    "training.local_batch_size": "--local-batch-size", "training.activation_checkpointing": "--ac",
    "fsdp.micro_steps": "--global-batch-size", "fsdp.param_dtype": "--param-dtype",
    "fsdp.reduce_dtype": "--reduce-dtype", "topology.gpus_per_node": "--gpus-per-node",
    "topology.preset": "--preset", "parallel.async_tp": "--async-tp",
    "parallel.sequence_parallel": "--sequence-parallel", "parallel.loss_parallel": "--loss-parallel",
}


def out(text):
    safeio.write_stdout(text)


# ---- paths ---------------------------------------------------------------------------------

def _ascii_path(p, flag):
    if not all(" " <= c <= "~" for c in p):
        raise PlanError("%s: the path %s holds characters other than printable ASCII, which the plan's header "
                        "cannot record; rename or move it" % (flag, safeio.show_path(p)))
    return p


def _abs(p, base):
    return os.path.normpath(p if os.path.isabs(p) else os.path.join(base, p))


def _rel(p_abs, given, plan_dir):
    """A path for the header and its command: as given when absolute, else relative to the plan's dir."""
    if os.path.isabs(given):
        return given
    return os.path.relpath(p_abs, plan_dir).replace(os.sep, "/")


def plan_output_path(plan_path):
    """(name, <dir>/<name>): a plan file's name (its stem) and its output directory beside it."""
    base = os.path.basename(plan_path)
    if not base.endswith(".lua") or len(base) <= 4:
        raise PlanError("%s: a plan file is <name>.lua; give the path of one" % safeio.show_path(plan_path))
    name = base[:-4]
    return name, os.path.join(os.path.dirname(plan_path), name)


# ---- write ---------------------------------------------------------------------------------

def _titan_text(spec, args, sec, comment):
    model, _, flavor = spec.partition(":")
    if model not in ("llama3", "gpt_oss", "deepseek_v3") or not flavor:
        raise PlanError("--titan %s: give llama3:FLAVOR (torchtitan 0.3's llama3 model_registry flavors: "
                        "debugmodel, 1B, 3B, 8B, 70B, 405B), gpt_oss:FLAVOR (debugmodel, 20b, 120b) or "
                        "deepseek_v3:FLAVOR (debugmodel, 16B, 236B, 671B, deepseek_v3_debugmodel_mtp); for other "
                        "models give their config.json"
                        % validate.printable(spec, 80))
    if model == "gpt_oss":
        return _gpt_oss_text(spec, flavor, args, sec, comment)
    if model == "deepseek_v3":
        return _deepseek_v3_text(spec, flavor, args, sec, comment)
    try:
        from torchtitan.models.llama3 import model_registry
    except ImportError as e:
        raise PlanError("--titan: torchtitan is not importable in this Python (%s); install torch and torchtitan, "
                        "or give the model's config.json" % e) from None
    converters = []
    if sec.get("lora"):
        # torchtitan's LoRA job: its registry with the converter (models/llama3/config_registry.py:155-171);
        # alpha only scales the adapters' output, nothing communicated or held
        from torchtitan.components.lora import LoRAConverter
        converters.append(LoRAConverter.Config(**sec["lora"]))
    try:
        ms = model_registry(flavor, converters=converters) if converters else model_registry(flavor)
    except (KeyError, ValueError) as e:
        raise PlanError("--titan %s: torchtitan's llama3 has no flavor %s (%s); give one of its registry's"
                        % (validate.printable(spec, 80), validate.printable(flavor, 60),
                           " ".join(str(e).split())[:120])) from None
    from .titan import TITAN_FSDP, plan_from_titan
    if sec["dtype"] not in (None, "fp32"):
        raise PlanError("--dtype: a --titan plan stores the parameters as torchtitan's model builds them (fp32, "
                        "all-gathered in bf16 as its parallelize does); drop it, or set --param-dtype")
    if sec["family"] not in ("auto", "generic", "llama"):
        raise PlanError("--family: a --titan plan is generic (torchtitan's names) or llama (commplan's llama "
                        "family); give --family generic or llama, or drop it")
    fsdp = dict(TITAN_FSDP, **(sec["fsdp"] or {}))  # torchtitan's MixedPrecisionPolicy unless a flag says otherwise
    text = plan_from_titan(ms, args.name, sec["world_size"], parallel=sec["parallel"], fsdp=fsdp,
                           topology=sec["topology"], training=sec["training"], seq_len=sec["seq_len"],
                           pipeline=sec["pipeline"], family=sec["family"], fused=sec["fused"],
                           spmd_backend=sec["spmd_backend"])
    lines = text.split("\n")
    return "\n".join(lines[:1] + ["-- " + c for c in comment.split("\n")] + lines[1:])


def _gpt_oss_text(spec, flavor, args, sec, comment):
    """--titan gpt_oss:FLAVOR: torchtitan 0.3's gpt-oss registry flavor as commplan's gpt_oss family
    (commplan.titan.plan_from_titan; gen/models/gpt_oss.lua); FLAVOR_flex: the flavor with flex attention
    (model_registry(FLAVOR, attn_backend="flex"), as torchtitan's gpt_oss_debugmodel_flex builds it,
    models/gpt_oss/config_registry.py:66-67; context parallel needs it)."""
    try:
        from torchtitan.models.gpt_oss import model_registry
    except ImportError as e:
        raise PlanError("--titan: torchtitan is not importable in this Python (%s); install torch and torchtitan"
                        % e) from None
    base = flavor[:-len("_flex")] if flavor.endswith("_flex") else flavor
    try:
        ms = model_registry(base, **({"attn_backend": "flex"} if base != flavor else {}))
    except (KeyError, ValueError) as e:
        raise PlanError("--titan %s: torchtitan's gpt_oss has no flavor %s (%s); give debugmodel, 20b or 120b "
                        "(or one of them + _flex: flex attention)"
                        % (validate.printable(spec, 80), validate.printable(flavor, 60),
                           " ".join(str(e).split())[:120])) from None
    return _family_text(ms, "gpt_oss", args, sec, comment)


def _deepseek_v3_text(spec, flavor, args, sec, comment):
    """--titan deepseek_v3:FLAVOR: torchtitan 0.3's deepseek_v3 registry flavor, or one of its
    config_registry's Trainer configs (deepseek_v3_debugmodel_mtp: num_mtp_layers = 1,
    models/deepseek_v3/config_registry.py:73-79), as commplan's deepseek_v3 family
    (commplan.titan.plan_from_titan; gen/models/deepseek_v3.lua)."""
    try:
        from torchtitan.models.deepseek_v3 import config_registry, model_registry
    except ImportError as e:
        raise PlanError("--titan: torchtitan is not importable in this Python (%s); install torch and torchtitan"
                        % e) from None
    try:
        if flavor.startswith("deepseek_v3_") and callable(getattr(config_registry, flavor, None)):
            ms = getattr(config_registry, flavor)().model_spec
        else:
            ms = model_registry(flavor)
    except (KeyError, ValueError) as e:
        raise PlanError("--titan %s: torchtitan's deepseek_v3 has no flavor or config %s (%s); give debugmodel, "
                        "16B, 236B, 671B or deepseek_v3_debugmodel_mtp"
                        % (validate.printable(spec, 80), validate.printable(flavor, 60),
                           " ".join(str(e).split())[:120])) from None
    return _family_text(ms, "deepseek_v3", args, sec, comment)


def _family_text(ms, family, args, sec, comment):
    """A torchtitan 0.3 model spec ms written as commplan's family plan (commplan.titan.plan_from_titan),
    the settings a --titan family plan takes checked, the command's comment under its first line."""
    from .titan import TITAN_FSDP, plan_from_titan
    if sec["dtype"] not in (None, "fp32"):
        raise PlanError("--dtype: a --titan plan stores the parameters as torchtitan's model builds them (fp32, "
                        "all-gathered in bf16 as its parallelize does); drop it, or set --param-dtype")
    if sec["family"] not in ("auto", family):
        raise PlanError("--family: a --titan %s plan is commplan's %s family; drop --family" % (family, family))
    if sec.get("lora"):
        raise PlanError("--lora-rank: a --titan %s plan is commplan's %s family (its parameters are the "
                        "family's, gen/models/%s.lua, with no adapters); write a LoRA plan from --titan "
                        "llama3:FLAVOR, or from plan_from_module on the converted model" % (family, family, family))
    fsdp = dict(TITAN_FSDP, **(sec["fsdp"] or {}))
    text = plan_from_titan(ms, args.name, sec["world_size"], parallel=sec["parallel"], fsdp=fsdp,
                           topology=sec["topology"], training=sec["training"], seq_len=sec["seq_len"],
                           pipeline=sec["pipeline"])
    lines = text.split("\n")
    return "\n".join(lines[:1] + ["-- " + c for c in comment.split("\n")] + lines[1:])


def build_plan(args, base, beside=None):
    """(plan text, plan path or None): the plan `write` writes for parsed args, every relative
    path taken from base (the current directory, or the plan's for `check`). beside: a list that
    gets (path relative to the plan, absolute path) of each file the plan reads beside itself
    (pipeline.csv)."""
    import commplan
    sources = [x for x in (args.config, args.titan) if x is not None]
    if len(sources) > 1:
        raise PlanError("--titan: give a config.json or --titan MODEL:FLAVOR, not both")
    st, from_toml, toml_model, job_abs = {}, set(), {}, None
    if args.job_config is not None:
        job_abs = _abs(_ascii_path(args.job_config, "--job-config"), base)
        try:
            st, toml_model = jobconfig.read_job_config(job_abs)
        except PlanError as e:
            raise PlanError(str(e).replace(safeio.show_path(job_abs), args.job_config, 1)) from None
        from_toml = set(st)
    for s in jobconfig.SETTINGS:
        v = getattr(args, s.key, None)
        if v is not None:
            st[s.key] = jobconfig.parse_flag(s.key, v)
            from_toml.discard(s.key)
    if "world_size" not in st:
        raise PlanError("--world-size: missing; give the ranks (GPUs) the plan is for")
    sec = jobconfig.plan_settings(st, from_toml)
    sec["world_size"] = st["world_size"]
    titan = args.titan
    if not sources:
        if not toml_model.get("name"):
            raise PlanError("CONFIG: missing; give a config.json (or a directory holding one), --titan MODEL:FLAVOR, "
                            "or a job config with [model] name and flavor")
        titan = "%s:%s" % (toml_model["name"], toml_model.get("flavor", ""))
    plan_path = None
    if args.out is not None and args.out != "-":
        plan_path = _abs(safeio.fspath(args.out, "-o"), base)
        if os.path.isdir(plan_path):
            plan_path = os.path.join(plan_path, args.name + ".lua")
        _ascii_path(plan_path, "-o")
        if os.path.basename(plan_path) != args.name + ".lua":
            raise PlanError("-o: plan %s is written to %s.lua (the file's stem is the plan's name), not %s; give "
                            "-o DIR/%s.lua" % (args.name, args.name, safeio.show_path(args.out), args.name))
    plan_dir = os.path.dirname(plan_path) if plan_path else base
    # torchtitan's pipeline_parallel_schedule_csv (relative to the current directory, as torchtitan
    # opens it) -> pipeline.csv, which the generator reads below the plan's directory (gen/fsio.lua)
    pl = sec.get("pipeline") or {}
    if pl.get("csv"):
        csv_abs = _abs(_ascii_path(pl["csv"], "--schedule-csv"), base)
        rel = os.path.relpath(csv_abs, plan_dir).replace(os.sep, "/")
        if rel.startswith("../") or rel == ".." or os.path.isabs(rel):
            raise PlanError("--schedule-csv: %s is not below the plan's directory; the plan reads its CSV beside "
                            "itself (docs/pipeline.md): copy it there and give that path" % validate.printable(pl["csv"], 80))
        pl["csv"] = rel
        if beside is not None:
            beside.append((rel, csv_abs))
    # the header: the source, the settings and the command, paths relative to the plan's directory
    argv = ["commplan", "write"]
    header = []
    if args.config is not None:
        cfg_abs = _abs(_ascii_path(args.config, "CONFIG"), base)
        cfg_file = os.path.join(cfg_abs, "config.json") if os.path.isdir(cfg_abs) else cfg_abs
        given_file = args.config if cfg_file == cfg_abs else os.path.join(args.config, "config.json")
        try:
            sha = jobconfig.sha256_file(cfg_file, "config.json")
        except PlanError as e:
            raise PlanError(str(e).replace(safeio.show_path(cfg_file), given_file)) from None
        header.append("source: config %s sha256 %s" % (_rel(cfg_file, given_file, plan_dir), sha))
        argv.append(_rel(cfg_abs, args.config, plan_dir))
    else:
        header.append("source: torchtitan %s" % titan)
        if args.titan is not None:
            argv += ["--titan", args.titan]
    argv += ["--name", args.name]
    settings = []
    for s in jobconfig.SETTINGS:
        if s.key in st:
            v = st[s.key]
            text = ("true" if v else "false") if isinstance(v, bool) else ",".join(v) if isinstance(v, list) else str(v)
            settings.append("%s=%s" % (s.key, text))
            if getattr(args, s.key, None) is not None:
                # (a path flag as the command in the plan's directory takes it)
                argv += [s.flag, _rel(_abs(text, base), text, plan_dir) if s.kind == "path" else text]
    if job_abs is not None:
        rel = _rel(job_abs, args.job_config, plan_dir)
        header.append("job config: %s sha256 %s" % (rel, jobconfig.sha256_file(job_abs, "the job config")))
        argv += ["--job-config", rel]
    header.append("settings: " + " ".join(settings))
    if plan_path is not None:
        argv += ["-o", _rel(plan_path, args.out, plan_dir)]
    header.append("command (run in this file's directory): " + " ".join(shlex.quote(a) for a in argv))
    comment = "\n".join(header)
    if args.config is not None:
        cfg_abs = _abs(args.config, base)
        if sec.get("lora"):
            raise PlanError("--lora-rank: torchtitan's LoRAConverter converts torchtitan's own model config "
                            "(components/lora.py); give --titan llama3:FLAVOR instead of a config.json")
        try:
            model = commplan.hf_config(cfg_abs, dtype=sec["dtype"] or "fp32", seq_len=sec["seq_len"],
                                       family=sec["family"])
        except PlanError as e:  # named as the user gave it, not as this machine's absolute path
            raise PlanError(str(e).replace(safeio.show_path(cfg_abs), args.config)) from None
        if sec["fused"]:
            if model.get("family") in (None, "generic"):
                raise PlanError("--fused: torchtitan's fused layouts change a family's parameters (gen/models/"
                                "fused.lua); this config.json is written as a generic plan: give --family or drop it")
            model["fused"] = sec["fused"]
        text = commplan.plan_text(args.name, st["world_size"], model, parallel=sec["parallel"], fsdp=sec["fsdp"],
                                  topology=sec["topology"], training=sec["training"], pipeline=sec["pipeline"],
                                  comment=comment)
    else:
        text = _titan_text(titan, args, sec, comment)
    return text, plan_path


def _flag_of(msg):
    for m in re.finditer(r"([a-z_]+(?:\.[a-z_]+)?)", msg):
        if m.group(1) in FIELD_FLAG:
            return FIELD_FLAG[m.group(1)]
    return None


def validate_with_generator(text, name, shown, beside=()):
    """Runs the generator's checks on text (in memory: --check against an absent directory); a
    refusal is one PlanError line naming the plan's field and the flag that set it. beside: the
    files the plan reads beside itself (build_plan's), copied beside the checked copy."""
    tmp = tempfile.mkdtemp(prefix="commplan-write-")
    try:
        for rel, src in beside:
            if os.path.isfile(src) and not os.path.islink(src):  # else the generator names what is wrong
                os.makedirs(os.path.dirname(os.path.join(tmp, rel)) or tmp, exist_ok=True)
                shutil.copyfile(src, os.path.join(tmp, rel))
        path = os.path.join(tmp, name + ".lua")
        with open(path, "w", encoding="ascii") as f:
            f.write(text)
        rc, _, err = generator.run(["--check", path, os.path.join(tmp, "absent")], capture=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if rc == 2:
        line = (err.strip().splitlines() or ["the generator refused the plan"])[0].replace(path, shown)
        flag = _flag_of(line)
        raise PlanError(line + (" (set by %s)" % flag if flag else ""))


def verb_write(args):
    beside = []
    text, plan_path = build_plan(args, os.getcwd(), beside)
    shown = args.out if plan_path else args.name + ".lua"
    validate_with_generator(text, args.name, shown, beside)
    if plan_path is None:
        safeio.write_stdout(text, close=True)
    else:
        import commplan
        d = os.path.dirname(plan_path)
        if not os.path.isdir(d):
            try:
                os.makedirs(d)
            except OSError as e:
                raise PlanError("-o: cannot create the directory %s: %s; create it or give another -o"
                                % (safeio.show_path(d), e.strerror or e)) from None
        commplan.write_plan(plan_path, text)
        shown = os.path.relpath(plan_path) if not os.path.isabs(args.out) else plan_path
        out("wrote %s; next: commplan generate %s\n" % (shown, shlex.quote(shown)))
    return 0


# ---- generate / audit / diff / advise ------------------------------------------------------

def _plan_arg(p):
    p = safeio.fspath(p, "PLAN")
    kind = None
    try:
        import stat
        st = os.stat(p)
        kind = None if stat.S_ISREG(st.st_mode) else safeio.file_kind(st.st_mode)
    except OSError as e:
        raise PlanError("%s: cannot read the plan file: %s; give the path of a plan file (<dir>/<name>.lua)"
                        % (safeio.show_path(p), e.strerror or e)) from None
    if kind:
        raise PlanError("%s is %s, not a plan file; give the path of one (<dir>/<name>.lua)" % (safeio.show_path(p), kind))
    return p


def _git_ignored(path):
    d = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(d):
        d = os.path.dirname(d)
    try:
        r = subprocess.run(["git", "-C", d, "check-ignore", "-q", "--", os.path.abspath(path)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    except OSError:
        return False  # no git: nothing to be ignored by
    return r.returncode == 0


def verb_generate(args):
    plan = _plan_arg(args.plan)
    name, outdir = plan_output_path(plan)
    if not args.ignored_ok and _git_ignored(os.path.join(outdir, "SCHEDULE.md")):
        raise PlanError("%s: git ignores %s (a .gitignore), so the output beside the plan would never be committed "
                        "or checked; un-ignore it, or pass --ignored-ok to write there anyway"
                        % (safeio.show_path(plan), safeio.show_path(outdir)))
    rc = generator.run((["--strict"] if args.strict else []) + [plan, outdir], plan_path=plan)
    if rc == 0:
        out("wrote %s/ (SCHEDULE.md, timeline.svg, plan.json, plan.h, plan.c, ...); next: commplan audit %s\n"
            % (outdir, shlex.quote(plan)))
    return rc


def summary(schedule_md):
    """SCHEDULE.md's first section: its title and ## Summary, up to ## Details."""
    lines = schedule_md.split("\n")
    start = next((i for i, l in enumerate(lines) if l.startswith("# ")), 0)
    end = next((i for i, l in enumerate(lines) if l.startswith("## ") and i > start and
                not l.startswith("## Summary")), len(lines))
    return "\n".join(lines[start:end]).rstrip("\n") + "\n"


def verb_audit(args):
    plan = _plan_arg(args.plan)
    tmp = tempfile.mkdtemp(prefix="commplan-audit-")
    try:
        outdir = os.path.join(tmp, "out")
        rc = generator.run([plan, outdir], plan_path=plan)
        if rc != 0:
            return rc
        text = safeio.read_file(os.path.join(outdir, "SCHEDULE.md"), "SCHEDULE.md", safeio.PLAN_JSON_MAX)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    md = text.decode("utf-8", "replace")
    out(md if args.full else summary(md))
    return 0


def verb_diff(args):
    extra = ["--svg", args.svg] if args.svg else []
    return generator.run(["diff"] + extra + [args.old, args.new], plan_path=args.new if os.path.exists(args.new)
                         else None)


def verb_advise(args):
    plan = _plan_arg(args.plan)
    extra = []
    for key, flag in (("world_size", "--world-size"), ("gpus_per_node", "--gpus-per-node"),
                      ("global_batch", "--global-batch"), ("top", "--top")):
        v = getattr(args, key)
        if v is not None:
            if not (v.isdigit() and 1 <= int(v) <= 1 << 30):
                raise PlanError("%s: %s is not a whole number in 1 .. %d; give %s"
                                % (flag, validate.short_repr(v), 1 << 30, {
                                    "world_size": "the GPUs to rank meshes for",
                                    "gpus_per_node": "the GPUs per node",
                                    "global_batch": "the sequences per step",
                                    "top": "how many meshes to list"}[key]))
            extra += [flag, v]
    return generator.run(["advise", plan] + extra, plan_path=plan)


# ---- check ---------------------------------------------------------------------------------

def read_header(text):
    """{"config": (path, sha), "job": (path, sha), "titan": spec, "command": [argv]} from a written plan."""
    h = {}
    for line in text.split("\n")[:16]:
        if line.startswith(SOURCE_TAG):
            m = re.fullmatch(r"(.*) sha256 ([0-9a-f]{64})", line[len(SOURCE_TAG):])
            if m:
                h["config"] = (m.group(1), m.group(2))
        elif line.startswith(TITAN_TAG):
            h["titan"] = line[len(TITAN_TAG):]
        elif line.startswith(JOB_TAG):
            m = re.fullmatch(r"(.*) sha256 ([0-9a-f]{64})", line[len(JOB_TAG):])
            if m:
                h["job"] = (m.group(1), m.group(2))
        elif line.startswith(COMMAND_TAG):
            try:
                h["command"] = shlex.split(line[len(COMMAND_TAG):])
            except ValueError:
                pass
    return h


def verb_check(args, parser_for_write):
    """Each plan in turn, every one checked: 0 when every one is up to date; else a line for each
    that is not, and 2 if any could not be checked (bad input: PlanError, a header's command that
    does not parse), else 1 (stale)."""
    from .cli import PROG, _Usage
    rc = 0
    for plan in args.plan:
        try:
            check_one(plan, parser_for_write)
            continue
        except _Stale as e:
            msg, bad = str(e), 1
        except _Usage as e:
            msg, bad = "%s; see %s --help" % (e, PROG), 2
        except PlanError as e:
            msg, bad = str(e), 2
        shown = safeio.show_path(plan)
        if bad == 2 and not msg.startswith(shown):
            msg = "%s: %s" % (shown, msg)
        sys.stderr.write("commplan: %s\n" % " ".join(msg.replace("\r", " ").split("\n")))
        sys.stderr.flush()
        rc = max(rc, bad)
    return rc


def check_one(plan, parser_for_write):
    plan = _plan_arg(plan)
    name, outdir = plan_output_path(plan)
    text = safeio.read_file(plan, "the plan file", 16 << 20).decode("utf-8", "replace")
    h = read_header(text)
    plan_dir = os.path.dirname(os.path.abspath(plan))
    rewrite = None
    if h.get("command"):
        rewrite = "(cd %s && %s) and commplan generate %s" % (
            shlex.quote(os.path.dirname(plan) or "."), " ".join(shlex.quote(a) for a in h["command"]),
            shlex.quote(plan))
    for key, what in (("config", "config"), ("job", "job config")):
        if key in h:
            rel, sha = h[key]
            path = _abs(rel, plan_dir)
            if not os.path.isfile(path):
                raise _Stale("%s: its %s %s is gone; restore it, or rewrite the plan from where it is now"
                             % (plan, what, rel))
            now = hashlib.sha256(safeio.read_file(path, what, safeio.CONFIG_JSON_MAX)).hexdigest()
            if now != sha:
                raise _Stale("%s: its %s %s changed since the plan was written (sha256 %s..., now %s...); rewrite "
                             "it: %s" % (plan, what, rel, sha[:12], now[:12], rewrite or "commplan write ..."))
    if h.get("command") and h["command"][:2] == ["commplan", "write"] and ("titan" not in h or _have_torchtitan()):
        wargs = parser_for_write(h["command"][2:])
        again, _ = build_plan(wargs, plan_dir)
        if again != text:
            raise _Stale("%s: differs from what its command writes now (edited by hand, or written by another "
                         "commplan); rewrite it: %s" % (plan, rewrite))
    rc, _, err = generator.run(["--check", "--regen-command", "commplan generate " + shlex.quote(plan), plan, outdir],
                               plan_path=plan, capture=True)
    if rc != 0:
        line = (err.strip().splitlines() or ["the generator failed"])[0]
        if rc == 1:
            raise _Stale(line)
        raise PlanError(line)
    out("%s: up to date (%s/ as the generator writes it%s)\n" % (
        plan, outdir, ", the config unchanged" if "config" in h else ""))
    return 0


def _have_torchtitan():
    """A --titan plan is written again only where torchtitan can be imported (its model is read
    from torchtitan itself); elsewhere check compares the generated output alone."""
    try:
        import torchtitan  # noqa: F401
        return True
    except ImportError:
        return False


class _Stale(Exception):
    pass


def run_verb(verb, args, parser_for_write):
    try:
        if verb == "write":
            return verb_write(args)
        if verb == "generate":
            return verb_generate(args)
        if verb == "audit":
            return verb_audit(args)
        if verb == "diff":
            return verb_diff(args)
        if verb == "advise":
            return verb_advise(args)
        if verb == "check":
            return verb_check(args, parser_for_write)
    except _Stale as e:
        sys.stderr.write("commplan: %s\n" % " ".join(str(e).split("\n")))
        sys.stderr.flush()
        return 1
    raise PlanError("unknown verb %s" % verb)
