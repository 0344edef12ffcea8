"""python3 -m commplan: write a plan file from a Hugging Face config.json or named-parameter lists.

    python3 -m commplan hf CONFIG --name NAME --world-size N [--dtype D] [--seq-len N] [--family F]
                          [--options OPTIONS.json] [-o OUT.lua]
    python3 -m commplan units UNITS.json --name NAME --world-size N [--family F]
                          [--options OPTIONS.json] [-o OUT.lua]

CONFIG: a config.json or a directory holding one. UNITS.json: {"units": [...]}, the units as
plan_from_named_parameters takes them (tests/python/fixtures/*_named_params.json).
OPTIONS.json: {"parallel": {...}, "fsdp": {...}, "topology": {...}, "training": {...}} (and, for
units, "model": {"n_heads": ..., "seq_len": ...}), as docs/plan-files.md describes them.
The plan goes to stdout, or to OUT through a temporary file and a rename.

Exit status: 0 written; 2 bad input (one line on stderr naming the file, the field and the fix,
nothing written); 1 the output could not be written (a full disk, a closed pipe, /dev/full).
"""

import argparse
import os
import sys

from . import safeio, validate
from .errors import OutputError, PlanError

PROG = "python3 -m commplan"
OPTION_KEYS = ("parallel", "fsdp", "topology", "training", "model")
UNITS_KEYS = ("units", "source")


class _Usage(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Usage(message)

    def print_help(self, file=None):
        safeio.write_stdout(self.format_help())


def _parser():
    p = _Parser(prog=PROG, description="Write a commplan plan file (Lua) from a Hugging Face config.json or "
                                       "named-parameter lists.", epilog=__doc__.split("\n\n", 1)[1],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="verb", metavar="{hf,units}")
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
    doc = validate.check_dict(doc, src, "", js=True, what="of parallel, fsdp, topology, training")
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
        raise _Usage("give a verb: hf or units")
    opts = _options(args.options, args.verb)
    kw = {k: opts.get(k) for k in ("parallel", "fsdp", "topology", "training")}
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
    if argv[:1] in (["diagnose"], ["expect"]):  # issue 40's verbs (commplan/diagnose.py)
        from . import diagnose
        return diagnose.main(argv[1:] if argv[0] == "diagnose" else argv)
    try:
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
