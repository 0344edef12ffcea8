"""Fuzz the Python plan writer's JSON input: random and mutated config.json documents, named-
parameter unit lists and writer option sets, with a fixed seed and a fixed case count.

Pass: every case ends in a plan (ASCII text) or one PlanError line -- never another exception,
never a hang (each case runs under a 5 s alarm), never a multi-line message. Every 200th case
also runs through the CLI (python3 -m commplan), which must exit 0, or 2 with one line on stderr.

    python3 tests/python/fuzz_writer.py [--seed 20] [--cases 4000] [--seconds 20] [--cli-every 200]

Prints "fuzz_writer: N cases (...) in T s, seed S"; stops early (and says so) at --seconds.
"""
import argparse
import copy
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

import commplan  # noqa: E402
from commplan import PlanError  # noqa: E402

FIX = os.path.join(HERE, "fixtures")
CASE_ALARM_S = 5.0


def fixture(name):
    with open(os.path.join(FIX, name)) as f:
        return json.load(f)


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang("case ran past %.0f s" % CASE_ALARM_S)


# ---- random values -------------------------------------------------------------------------

# The writer's option sections and the config.json fields hf_config reads, with plausible values
# (kept here, not imported, so the fuzzer runs against any version of the package).
DT = ("fp32", "bf16", "fp16")
SECTIONS = {
    "parallel": dict({k: (1, 2, 4, -1) for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "etp",
                                                  "ulysses_degree", "dp")}, sequence_parallel=(True, False),
                     async_tp=(True, False)),
    "fsdp": {"reshard_after_forward": (True, False), "micro_steps": (1, 2, 4), "reduce_op": ("avg", "sum"),
             "param_dtype": DT, "reduce_dtype": DT},
    "topology": dict({"gpus_per_node": (1, 4, 8), "nics_per_node": (1, 4, 8), "nvlinks": (12, 18),
                      "nvls": (True, False), "sharp": (True, False), "preset": ("h100", "h200", "b200", "a100"),
                      "collectives": ("nccl", "alpha_beta")}, **{k: (0.4, 1, 45, 360.0, 3000) for k in (
        "intra_node_GBps", "inter_node_GBps", "latency_us", "gpu_memory_GB", "gpu_TFLOPS", "mfu", "hbm_GBps",
        "nic_Gbps", "nvlink_GBps", "pci_GBps", "net_latency_us")}),
    "training": {"activation_checkpointing": ("none", "full", "selective"), "optimizer": ("adamw", "sgd", "none"),
                 "fp32_master": (True, False), "local_batch_size": (1, 2, 8)},
}
CONFIG_FIELDS = dict({k: (1, 2, 3, 7, 8, 14, 64, 509, 510) for k in (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
    "num_key_value_heads", "head_dim")}, model_type=("llama", "mistral", "qwen2", "gpt2"),
    **{k: (True, False) for k in ("tie_word_embeddings", "attention_bias", "mlp_bias")})

SCALARS = [None, True, False, 0, 1, -1, 2, 3, 4, 8, 32, 4096, 2 ** 31 - 1, 2 ** 31, 2 ** 53 + 1, 2 ** 63, 10 ** 40,
           -(2 ** 63), 0.0, 0.5, 1.3, 32.0, -2.5, 1e300, 1e-300, float("nan"), float("inf"), "", "false", "true",
           "False", "0", "1", "32", " 32 ", "4096", "bf16", "fp32", "bfloat16", "torch.float16", "int8", "llama",
           "auto", "generic", "x" * 300, "a\nb", "caf\u00e9", "\u0000", "\ud800", "|", "<b>", "shard(1)", "colwise",
           "avg", "none"]
WORDS = ["name", "params", "shape", "dtype", "shard_dim", "tp", "units", "reshard_after_forward", "family", "size",
         "dim", "n_heads", "seq_len", "__proto__", "", "1", "model_type"]


def rand_scalar(r):
    k = r.random()
    if k < 0.7:
        return r.choice(SCALARS)
    if k < 0.85:
        return r.randint(-10, 10 ** r.randint(1, 20))
    return "".join(chr(r.randint(0, 0x2FF)) for _ in range(r.randint(0, 12)))


def rand_value(r, depth=0):
    k = r.random()
    if depth > 3 or k < 0.6:
        return rand_scalar(r)
    if k < 0.8:
        return [rand_value(r, depth + 1) for _ in range(r.randint(0, 4))]
    return {r.choice(WORDS) if r.random() < 0.7 else str(rand_scalar(r)): rand_value(r, depth + 1)
            for _ in range(r.randint(0, 4))}


RATE = [0.15]  # this case's chance of a random value where a plausible one belongs


def maybe_bad(r, good, p=None):
    return rand_value(r) if r.random() < (RATE[0] if p is None else p * RATE[0] / 0.15) else good


def rand_section(r, name):
    k = r.random()
    if k < 0.45:
        return None
    if k < 0.45 + RATE[0] / 3:
        return rand_value(r)
    d = {}
    for key, values in SECTIONS[name].items():
        if r.random() < 0.25:
            d[key] = maybe_bad(r, r.choice(values))
    if r.random() < RATE[0] * 0.7:
        d[r.choice(WORDS + [k + "x" for k in SECTIONS[name]])] = rand_value(r)
    return d


def rand_options(r):
    return {name: rand_section(r, name) for name in SECTIONS}


def rand_name(r):
    return maybe_bad(r, r.choice(["p", "llama8b", "fsdp4", "m_1", "cp_x", "a__b", "1x", "x" * 65]), 0.1)


def rand_world(r):
    return maybe_bad(r, r.choice([1, 2, 4, 8, 16, 64]), 0.1)


# ---- mutated documents ---------------------------------------------------------------------

def mutate_config(r, base, most):
    doc = copy.deepcopy(base)
    doc["num_hidden_layers"] = r.randint(1, 3)  # keep successful cases quick; the bound is fuzzed below
    for _ in range(r.randint(0, most)):
        k = r.random()
        key = r.choice(list(CONFIG_FIELDS)) if r.random() < 0.8 else r.choice(WORDS + list(base))
        if k < 0.45:
            doc[key] = rand_value(r)
        elif k < 0.6:
            doc.pop(key, None)
        elif k < 0.75 and key in CONFIG_FIELDS:
            doc[key] = r.choice(CONFIG_FIELDS[key])
        elif k < 0.85:
            doc["model_type"] = r.choice(["llama", "mistral", "qwen2", "gpt2", "LLAMA", None])
        else:
            doc[key] = str(doc.get(key))
    if r.random() < 0.05:
        doc = r.choice([[doc], rand_value(r), None, 3, "config"])
    return doc


def mutate_bytes(r, data):
    k = r.random()
    if k < 0.25:
        return data[:r.randint(0, len(data))]
    if k < 0.45:
        b = bytearray(data)
        for _ in range(r.randint(1, 4)):
            if b:
                b[r.randrange(len(b))] = r.randrange(256)
        return bytes(b)
    if k < 0.6:
        i = r.randint(0, len(data))
        return data[:i] + r.choice([b"NaN", b"Infinity", b"-Infinity", b"9" * 5000, b"\xff\xfe", b"\"", b",", b"}",
                                    b"[" * 3000, b"\\u0000", b'"hidden_size": 8, ']) + data[i:]
    if k < 0.7:
        return b"\xef\xbb\xbf" + data
    if k < 0.8:
        return data.replace(b'"vocab_size"', b'"vocab_size": 1, "vocab_size"', 1)
    return data


def mutate_units(r, base, most):
    units = copy.deepcopy(base)
    for _ in range(r.randint(0, most)):
        if not units:
            break
        u = r.choice(units)
        k = r.random()
        if isinstance(u, dict) and not isinstance(u.get("params"), list):
            u = None  # a unit mutated past having a params list: only whole-unit mutations below
        if k < 0.3 and isinstance(u, dict) and u.get("params"):
            p = r.choice(u["params"])
            if isinstance(p, list) and p:
                p[r.randrange(len(p))] = rand_value(r)
            else:
                u["params"][r.randrange(len(u["params"]))] = rand_value(r)
        elif k < 0.45 and isinstance(u, dict):
            u[r.choice(["name", "params", "reshard_after_forward", "extra"])] = rand_value(r)
        elif k < 0.55:
            units[r.randrange(len(units))] = rand_value(r)
        elif k < 0.65:
            units.pop(r.randrange(len(units)))
        elif k < 0.75 and isinstance(u, dict):
            u["reshard_after_forward"] = r.choice([True, False, None, "false", 0, 1])
        elif k < 0.85 and isinstance(u, dict) and u.get("params"):
            p = r.choice(u["params"])
            if isinstance(p, list) and len(p) >= 2:
                p[1] = r.choice([[], [0], [4, True], "32", [2 ** 63], [1] * 9, [4.0], None, [3, -1]])
        else:
            units.append(copy.deepcopy(r.choice(base)))
    if r.random() < RATE[0] / 3:
        units = rand_value(r)
    return units


# ---- one case ------------------------------------------------------------------------------

def check_outcome(result):
    kind, val = result
    if kind == "plan":
        if not isinstance(val, str) or not val.isascii():
            return "a plan that is not ASCII text: %r" % (val[:80],)
        return None
    if kind == "refused":
        if not val or "\n" in val or "\r" in val:
            return "a PlanError that is not one non-empty line: %r" % (val,)
        return None
    return val  # "crash": the traceback


def fresh(path, data):
    """Writes a new file at path (unlinked first: truncating a written file makes ext4 flush it)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    with open(path, "wb") as f:
        f.write(data)
    return path


def run_case(r, tmp, case, cfgs, unit_sets):
    RATE[0] = r.choice([0.0, 0.0, 0.03, 0.15, 0.3])
    light = RATE[0] == 0.0  # a third of the cases mutate only their document: the success path too
    opts = rand_options(r)
    name, world = rand_name(r), rand_world(r)
    files = {}
    try:
        signal.setitimer(signal.ITIMER_REAL, CASE_ALARM_S)
        if r.random() < 0.6:
            doc = mutate_config(r, r.choice(cfgs), 1 if light else 4)
            data = json.dumps(doc).encode("utf-8", "surrogatepass")
            if r.random() < (0.05 if light else 0.3):
                data = mutate_bytes(r, data)
            path = fresh(os.path.join(tmp, "config.json"), data)
            files = {"verb": "hf", "input": path}
            src = path if r.random() < 0.9 else (doc if isinstance(doc, dict) else path)
            model = commplan.hf_config(src, dtype=maybe_bad(r, r.choice(["fp32", "bf16", "torch.float16"]), 0.1),
                                       seq_len=maybe_bad(r, r.choice([None, 128, 8192]), 0.1),
                                       family=maybe_bad(r, r.choice(["auto", "auto", "llama", "generic"]), 0.05))
            text = commplan.plan_text(name, world, model, comment=maybe_bad(r, None, 0.05), **opts)
        else:
            units = mutate_units(r, r.choice(unit_sets), 1 if light else 4)
            path = fresh(os.path.join(tmp, "units.json"), json.dumps({"units": units}).encode("utf-8", "surrogatepass"))
            files = {"verb": "units", "input": path}
            model = maybe_bad(r, r.choice([None, {"n_heads": 4}, {"n_heads": 2, "seq_len": 64}]), 0.15)
            text = commplan.plan_from_named_parameters(name, units, world, model=model,
                                                       family=maybe_bad(r, "auto", 0.05), **opts)
        if r.random() < 0.05:
            commplan.write_plan(os.path.join(tmp, "out.lua"), text)
        result = ("plan", text)
    except PlanError as e:
        result = ("refused", str(e))
    except Hang:
        result = ("crash", "hang: %s" % traceback.format_exc(limit=-3))
    except Exception:
        result = ("crash", traceback.format_exc(limit=-4))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return result, opts, name, world, files


def run_cli(tmp, opts, name, world, files):
    """The same input through python3 -m commplan: exit 0, or 2 with one line on stderr."""
    opath = fresh(os.path.join(tmp, "options.json"),
                  json.dumps({k: v for k, v in opts.items() if v is not None}).encode("utf-8", "surrogatepass"))
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    args = [sys.executable, "-m", "commplan", files["verb"], files["input"], "--name", str(name), "--world-size",
            str(world), "--options", opath]
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, env=env,
                       timeout=30)
    if r.returncode == 0 and r.stdout and not r.stderr:
        return None
    if r.returncode == 2 and not r.stdout and r.stderr.count("\n") == 1 and r.stderr.startswith("commplan: "):
        return None
    return "CLI %s: exit %d, stdout %d bytes, stderr %r" % (" ".join(args[3:]), r.returncode, len(r.stdout),
                                                           r.stderr[-400:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--cases", type=int, default=4000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--cli-every", type=int, default=200)
    a = ap.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    r = random.Random(a.seed)
    cfgs = [fixture(n) for n in ("llama3_8b_config.json", "mistral_7b_config.json", "qwen2_0_5b_config.json")]
    unit_sets = [fixture(n)["units"] for n in ("fsdp4_named_params.json", "llama_tiny_named_params.json")]
    tmp = tempfile.mkdtemp(prefix="commplan-fuzz-")
    counts = {"plan": 0, "refused": 0, "cli": 0}
    failures = []
    t0 = time.monotonic()
    done = 0
    stopped = False
    try:
        for case in range(a.cases):
            if time.monotonic() - t0 > a.seconds:
                stopped = True
                break
            result, opts, name, world, files = run_case(r, tmp, case, cfgs, unit_sets)
            done += 1
            bad = check_outcome(result)
            if bad is None:
                counts[result[0]] += 1
            else:
                failures.append("case %d (seed %d): %s" % (case, a.seed, bad))
            if a.cli_every and case % a.cli_every == 0 and files:
                counts["cli"] += 1
                bad = run_cli(tmp, opts, name, world, files)
                if bad:
                    failures.append("case %d (seed %d): %s" % (case, a.seed, bad))
            if len(failures) >= 10:
                break
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    dt = time.monotonic() - t0
    print("fuzz_writer: %d cases (%d plans written, %d PlanError lines, %d through the CLI) in %.1f s, seed %d%s"
          % (done, counts["plan"], counts["refused"], counts["cli"], dt, a.seed,
             "; stopped at the %.0f s cap before case %d of %d" % (a.seconds, done, a.cases) if stopped else ""))
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
