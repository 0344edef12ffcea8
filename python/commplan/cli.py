"""The `commplan` command (and python3 -m commplan): a model's communication plan, from its
config.json to a reviewed, generated, checked plan (commplan/command.py; docs/your-repository.md).

    commplan write CONFIG.json --name NAME --world-size N [--dp-replicate R] [--dp-shard S] [--tp T]
        [--cp C] [--pp P] [--ep E] [--schedule NAME] [--microbatches M] [--seq-len L]
        [--local-batch-size B] [--ac none|selective|full] [--dtype D] [--preset P] [--family F]
        [--job-config TOML] -o PLAN.lua        (or --titan MODEL:FLAVOR instead of CONFIG.json)
    commplan generate PLAN.lua      writes PLAN's output beside it: <dir>/<name>/ (SCHEDULE.md ...)
    commplan audit PLAN.lua         prints the summary (SCHEDULE.md's first section)
    commplan diff OLD.lua NEW.lua
    commplan advise PLAN.lua
    commplan check PLAN.lua         exit 1 with one line if <dir>/<name>/ is stale or the config changed

    commplan hf CONFIG --name NAME --world-size N [--dtype D] [--seq-len N] [--family F]
                          [--options OPTIONS.json] [-o OUT.lua]
    commplan units UNITS.json --name NAME --world-size N [--family F] [--options OPTIONS.json] [-o OUT.lua]

`commplan VERB --help` lists a verb's flags. CONFIG: a config.json or a directory holding one.
UNITS.json: {"units": [...]}, the units as plan_from_named_parameters takes them
(tests/python/fixtures/*_named_params.json). OPTIONS.json: {"parallel": {...}, "fsdp": {...},
"topology": {...}, "training": {...}, "pipeline": {...}} (and, for units, "model": {"n_heads": ...,
"seq_len": ...}), as docs/plan-files.md describes them. A plan goes to stdout, or to OUT through a
temporary file and a rename.

Exit status: 0 done; 1 check: stale (one line saying what and the command that fixes it), or the
output could not be written (a full disk, a closed pipe, /dev/full); 2 bad input (one line on
stderr naming the flag, file or field and the fix, nothing written). `check PLAN...` checks every
plan, a line for each that is stale or bad, and exits 2 if any was bad input, else 1 if any stale.
"""

import argparse
import os
import sys

from . import safeio, validate
from .errors import OutputError, PlanError

PROG = "commplan"
OPTION_KEYS = ("parallel", "fsdp", "topology", "training", "pipeline", "model")
UNITS_KEYS = ("units", "source")


class _Usage(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Usage(message)

    def print_help(self, file=None):
        safeio.write_stdout(self.format_help())


VERBS = ("write", "generate", "audit", "diff", "advise", "check")


def _add_verbs(sub):
    """commplan write / generate / audit / diff / advise / check (commplan/command.py)."""
    from . import jobconfig
    w = sub.add_parser("write", help="write a plan file from a config.json, a torchtitan model or job config",
                       allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Write PLAN.lua from a Hugging Face config.json (or --titan MODEL:FLAVOR), the "
                                   "settings as flags, named as torchtitan's job config names them, or read from a "
                                   "torchtitan TOML job config (--job-config; a flag overrides it). The plan's "
                                   "header records the source, its sha256, the settings and the command.")
    w.add_argument("config", metavar="CONFIG", nargs="?", help="a config.json or a directory holding one")
    w.add_argument("--titan", metavar="MODEL:FLAVOR", help="torchtitan's own model instead (llama3:8B; needs torch)")
    w.add_argument("--name", required=True, help="the plan's name (its file stem and C prefix)")
    for s in jobconfig.SETTINGS:
        meta = "{%s}" % ",".join(s.enum) if s.enum else {"int": "N", "bool": "true|false", "dtype": "DTYPE",
                                                           "family": "FAMILY", "path": "FILE", "fused": "LAYOUTS", "names": "NAMES"}[s.kind]
        w.add_argument(s.flag, dest=s.key, metavar=meta,
                       help=s.what + ("; torchtitan's %s" % s.toml[0] if s.toml else ""))
    w.add_argument("--job-config", metavar="TOML", help="a torchtitan job config (train_configs/*.toml)")
    w.add_argument("-o", "--out", metavar="PLAN.lua", help="write here (<dir>/<name>.lua) instead of stdout")
    g = sub.add_parser("generate", help="generate PLAN's output beside it: <dir>/<name>/", allow_abbrev=False)
    g.add_argument("plan", metavar="PLAN.lua")
    g.add_argument("--strict", action="store_true", help="refuse a plan that does not fit its GPU")
    g.add_argument("--ignored-ok", action="store_true", help="write even where git ignores the output")
    a = sub.add_parser("audit", help="print the plan's summary (SCHEDULE.md's first section)", allow_abbrev=False)
    a.add_argument("plan", metavar="PLAN.lua")
    a.add_argument("--full", action="store_true", help="all of SCHEDULE.md")
    d = sub.add_parser("diff", help="what changed between two plans (plan files, plan.json or REV:path)",
                       allow_abbrev=False)
    d.add_argument("old", metavar="OLD")
    d.add_argument("new", metavar="NEW")
    d.add_argument("--svg", metavar="DIR", help="also write DIR/before.svg and DIR/after.svg")
    v = sub.add_parser("advise", help="rank the meshes torchtitan accepts for PLAN's model", allow_abbrev=False)
    v.add_argument("plan", metavar="PLAN.lua")
    for flag in ("--world-size", "--gpus-per-node", "--global-batch", "--top"):
        v.add_argument(flag, metavar="N")
    c = sub.add_parser("check", help="exit 1 with one line when <dir>/<name>/ is stale or the config changed",
                       allow_abbrev=False)
    c.add_argument("plan", metavar="PLAN.lua", nargs="+", help="one or more plan files (CI: plans/*.lua)")
    # issue 40's verbs: main() hands them to commplan/diagnose.py before this parser runs; listed here
    # so --help names them (their own --help has the flags)
    sub.add_parser("expect", help="the expected trace of a step in Flight Recorder's terms (PLAN [--rank R])",
                   add_help=False)
    sub.add_parser("diagnose", help="a hang or mismatch: Flight Recorder dumps (or the runtime's cursors) "
                                    "against the plan (DUMP_DIR PLAN)", add_help=False)


def _parser():
    p = _Parser(prog=PROG, description="commplan: plan a model's FSDP2 / torchtitan communication. Write a plan file "
                                       "from a Hugging Face config.json, generate it, audit it, diff two, check "
                                       "the committed output.", epilog=__doc__.split("\n\n", 1)[1],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="verb", metavar="{write,generate,audit,diff,advise,check,expect,diagnose,hf,units}")
    _add_verbs(sub)
    for verb, operand, text in (("hf", "CONFIG", "a config.json (Llama, Mistral, Qwen2, Mixtral, Qwen3-MoE, DeepSeek-V3) or a directory holding one"),
                                ("units", "UNITS", 'a JSON file {"units": [...]} of named parameters')):
        s = sub.add_parser(verb, help=text, formatter_class=argparse.RawDescriptionHelpFormatter)
        s.add_argument(operand.lower(), metavar=operand, help=text)
        s.add_argument("--name", required=True, help="the plan's name (its file stem and C prefix)")
        s.add_argument("--world-size", required=True, type=int, help="ranks (GPUs) the plan is for")
        s.add_argument("--family", default="auto", choices=("auto", "llama", "generic") + (
            ("qwen3", "mixtral", "qwen3_moe", "deepseek_v3") if verb == "hf" else ()))
        s.add_argument("--options", metavar="OPTIONS.json", help="parallel / fsdp / topology / training%s"
                       % (" / model" if verb == "units" else ""))
        s.add_argument("-o", "--out", metavar="OUT.lua", help="write here (<dir>/<name>.lua) instead of stdout")
        if verb == "hf":
            s.add_argument("--dtype", default="fp32", help="the parameters' training dtype (fp32, bf16, fp16)")
            s.add_argument("--seq-len", type=int, help="sequence length, for the audit and TP")
    return p


def _options(path, verb):
    if path is None:
        return {}
    doc, src = safeio.read_json(path, "the options file", safeio.OPTIONS_JSON_MAX)
    doc = validate.check_dict(doc, src, "", js=True, what="of parallel, fsdp, topology, training, pipeline")
    allowed = OPTION_KEYS if verb == "units" else OPTION_KEYS[:-1]
    for k in doc:
        if k not in allowed:
            hint = validate.did_you_mean(k, allowed)
            fix = "did you mean %s?" % hint if hint else "the options are %s" % ", ".join(allowed)
            if k == "model" and verb == "hf":
                fix = "config.json gives the model; use --seq-len for the sequence length"
            raise PlanError("%s: %s: unknown key; %s" % (src, k, fix))
    sections = validate.check_sections(src, True, **{k: doc.get(k) for k in OPTION_KEYS[:-1]})
    if "model" in doc:
        sections["model"] = validate.check_dict(doc["model"], src, "model", js=True)
    return sections


def _units(path):
    doc, src = safeio.read_json(path, "the units file", safeio.UNITS_JSON_MAX)
    doc = validate.check_dict(doc, src, "", js=True, what='{"units": [...]}')
    for k in doc:
        if k not in UNITS_KEYS:
            raise PlanError("%s: %s: unknown key; a units file holds \"units\" (and an optional \"source\" note)"
                            % (src, k))
    if "units" not in doc:
        raise PlanError("%s: units: missing; give \"units\": [{\"name\": ..., \"params\": [[name, shape, dtype], "
                        "...]}, ...], the root last" % src)
    validate.check_value(doc["units"], validate.Spec("list"), src, "units", js=True)
    return doc["units"], src


def run(argv):
    import commplan  # the package's public functions, as a user calls them
    args = _parser().parse_args(argv)
    if args.verb is None:
        raise _Usage("give a verb: write, generate, audit, diff, advise, check (or hf, units)")
    if args.verb in VERBS:
        from . import command
        return command.run_verb(args.verb, args, lambda a: _parser().parse_args(["write"] + list(a)))
    opts = _options(args.options, args.verb)
    kw = {k: opts.get(k) for k in ("parallel", "fsdp", "topology", "training", "pipeline")}
    if args.verb == "hf":
        model = commplan.hf_config(args.config, dtype=args.dtype, seq_len=args.seq_len, family=args.family)
        text = commplan.plan_text(args.name, args.world_size, model, **kw)
    else:
        units, src = _units(args.units)
        try:
            commplan.normalize_units(units)  # so that a unit's error names the file it came from
        except PlanError as e:
            raise PlanError("%s: %s" % (src, e)) from None
        text = commplan.plan_from_named_parameters(args.name, units, args.world_size, model=opts.get("model"),
                                                   family=args.family, **kw)
    if args.out is not None and args.out != "-":
        path = safeio.fspath(args.out, "--out")
        if os.path.isdir(path):
            path = os.path.join(path, args.name + ".lua")
        commplan.write_plan(path, text)
    else:
        safeio.write_stdout(text, close=True)
    return 0


def _line(msg):
    return " ".join(str(msg).split("\n")).replace("\r", " ")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] in (["diagnose"], ["expect"]):  # issue 40's verbs (commplan/diagnose.py)
            from . import diagnose
            return diagnose.main(argv[1:] if argv[0] == "diagnose" else argv)
        return run(argv)
    except _Usage as e:
        msg, rc = "%s; see %s --help" % (e, PROG), 2
    except OutputError as e:
        msg, rc = str(e), 1
    except PlanError as e:
        msg, rc = str(e), 2
    except KeyboardInterrupt:
        msg, rc = "interrupted", 130
    except (MemoryError, RecursionError) as e:
        msg, rc = "out of %s reading the input; is it the right file?" % (
            "memory" if isinstance(e, MemoryError) else "stack"), 2
    except Exception as e:  # a bug: still one line, with what it was
        msg, rc = "internal error: %s: %s (a bug in commplan's Python package; please report it)" % (
            type(e).__name__, e), 3
    try:
        sys.stderr.write("commplan: %s\n" % _line(msg))
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return rc
