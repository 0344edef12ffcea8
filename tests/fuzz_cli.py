#!/usr/bin/env python3
"""Fuzz the plan binary's argv and environment for a bounded time (issue 20).

  tests/fuzz_cli.py BINARY [--seconds S] [--min-cases N] [--seed N] [--jobs J] [--log FILE]

BINARY is a 4-rank plan's binary (fsdp4's), best built with ASan+UBSan
(make build/tests-asan/fsdp4_cli). Each case is a random command line (a
mode, flags with valid, huge, negative, empty, non-UTF-8 and multi-line
values, junk words) and a random launcher environment (torchrun, Slurm,
Open MPI variables, whole, partial or mixed; NCCL id channels pointing at a
FIFO, /dev/zero, a directory, a long path; init timeouts that are not
numbers). A case passes when the binary

  - exits 0, 1 or 2 (no signal, no sanitizer exit code) within its time
    (a simulation asked for many steps may be cut short; nothing else may),
  - prints no sanitizer report,
  - on exit 2, prints exactly one error line on stderr, "commplan: ...",
    besides any progress lines,
and when, after all cases, a file that symlinks in the dump directories
point at is unchanged and nothing was written beside it.

A fixed seed gives the same sequence of cases; the time bound decides how
many run. The last line: "fuzz-cli: N cases (...), F failures, seed S".
Failures are written to --log with a command that reproduces each.
"""
import argparse
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

PROGRESS = re.compile(rb"^([A-Za-z0-9_]+: step [0-9]+/[0-9]+( simulated on ([0-9]+ ranks|rank [0-9]+ alone)|, op [0-9]+/[0-9]+ )|note: --(simulate|dry-run) )")
SANITIZER = (b"AddressSanitizer", b"LeakSanitizer", b"runtime error:", b"UndefinedBehaviorSanitizer")

NUMBERS = ["0", "1", "2", "3", "4", "5", "-1", "-0", "+3", " 5", "5 ", "007", "1e3", "0x10", "3.5", "2147483647",
           "2147483648", "4294967296", "1073741824", "1073741825", "9223372036854775807", "9223372036854775808",
           "-9223372036854775809", "99999999999999999999999999", "", "nan", "inf", "-inf", "1e400", "x", "\t",
           "1\n2", "\xff", "٣"]
HOSTILE_WORDS = [b"", b"-", b"--", b"---simulate", b"--simulate=1", b"-h1", b"--SIMULATE", b"\xff\xfe", b"caf\xc3\xa9",
                 b"a\nb", b"\x1b[31mred", b"%s%s%n", b"--dump=", b"x" * 5000, b"--", b"--help\n"]


class Case:
    def __init__(self, argv, env, slow_ok):
        self.argv, self.env, self.slow_ok = argv, env, slow_ok

    def command(self, binary):
        env = " ".join(shlex.quote(k.decode("latin-1") + "=" + v.decode("latin-1")) for k, v in self.env.items())
        return "env -i %s %s %s" % (env, shlex.quote(binary),
                                    " ".join(shlex.quote(a.decode("latin-1")) for a in self.argv))


def b(s):
    return s if isinstance(s, bytes) else s.encode("utf-8", "surrogateescape")


def make_case(rng, work):
    paths = [work + "/dump", work + "/dump2/sub/dir", work + "/file", work + "/fifo", work + "/links", "/dev/null",
             "/dev/full", "/dev/full/x", work + "/" + "d" * 300, work + "/" + "/".join(["p"] * 1500), "",
             work + "/x/../dump", "rel-dump", work + "/nl\ndir", work + "/\xffdir"]
    files = [work + "/t.json", work + "/fifo", work + "/file", "/dev/full", work + "/links/trace.json", work + "/",
             work + "/missing/t.json", "", ".", ".."]

    def value(kind):
        if rng.random() < 0.6:
            return {"int": rng.choice(["1", "2", "3", "0", "4"]), "pattern": rng.choice(["unique", "oracle"]),
                    "arith": rng.choice(["gloo", "nccl"]), "dir": rng.choice(paths[:5]),
                    "file": rng.choice(files[:2])}[kind]
        return rng.choice(NUMBERS + paths + files + ["gloo", "nccl", "oracle", "Oracle", "gloo "])

    flags = [("--steps", "int"), ("--pattern", "pattern"), ("--arith", "arith"), ("--dump", "dir"),
             ("--warmup", "int"), ("--iters", "int"), ("--timeout", "int"), ("--trace", "file"),
             ("--world-size", "int"), ("--rank", "int"), ("--quiet", None), ("--graph", None), ("--standin", None)]
    argv = []
    mode = rng.choice([["--simulate"], ["--simulate"], ["--dry-run"], ["--check"], [], ["--standin"],
                       ["--simulate", "--dry-run"], ["--version"], ["--help"], ["--rendezvous-only"]])
    argv += mode
    for _ in range(rng.randrange(0, 5)):
        f, kind = rng.choice(flags)
        argv.append(f)
        if kind:
            if rng.random() < 0.95:
                argv.append(value(kind))
    if rng.random() < 0.2:
        argv.insert(rng.randrange(len(argv) + 1), rng.choice(HOSTILE_WORDS))
    if rng.random() < 0.1:
        rng.shuffle(argv)
    if "--simulate" in argv and "--quiet" not in argv and rng.random() < 0.7:
        argv.append("--quiet")

    env = {}
    launchers = [("RANK", "WORLD_SIZE", "LOCAL_RANK"),
                 ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
                 ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")]
    for names in launchers:
        if rng.random() < 0.3:
            world = rng.choice(["4", "4", "8", "1"] + NUMBERS)
            env[names[0]] = rng.choice(["0", "1", "3", "4"] + NUMBERS)
            env[names[1]] = world
            env[names[2]] = rng.choice(["0", "1", "7"] + NUMBERS)
            if rng.random() < 0.15:
                del env[rng.choice(names)]
    extra = {
        "COMMPLAN_ID_FILE": [work + "/fifo", "/dev/zero", work, work + "/idfile", work + "/missing/id", "",
                             "/" + "i" * 5000, work + "/links/fsdp4.rank0.json"],
        "COMMPLAN_ID_GENERATION": ["g1", "", "two words", "x" * 300, "\xff"],
        "COMMPLAN_INIT_TIMEOUT": ["0.5", "0", "-1", "nan", "inf", "1e400", "1e300", "soon", ""],
        "MASTER_ADDR": ["127.0.0.1", "", "::1", "h" * 400, "no such host"],
        "MASTER_PORT": ["29500", "0", "65536", "-1", "", "99999999999999999999"],
        "NCCL_COMM_ID": ["h:1", "", "x" * 400],
        "TORCHELASTIC_USE_AGENT_STORE": ["True", "False", "1", ""],
        "TORCHELASTIC_RUN_ID": ["none", "r1", "x" * 300, "a b"],
        "TORCHELASTIC_RESTART_COUNT": ["0", "-5", "\n"],
        "SLURM_JOB_ID": ["77", ""],
        "SLURM_STEP_ID": ["0"],
        "SLURM_RESTART_COUNT": ["1"],
        "OMPI_MCA_ess_base_jobid": ["123"],
        "PMIX_NAMESPACE": ["ns"],
    }
    for k, vals in extra.items():
        if rng.random() < 0.15:
            env[k] = rng.choice(vals)
    if "--rendezvous-only" in argv:
        # the launch path up to NCCL waits for peers that never come: bounded, not a hang
        env["COMMPLAN_INIT_TIMEOUT"] = "0.5"
    env = {b(k): b(v) for k, v in env.items()}
    argv = [b(a) for a in argv]
    # A simulation of many steps is a long run, not a hang.
    slow_ok = False
    for i, a in enumerate(argv[:-1]):
        if a == b"--steps":
            try:
                slow_ok = slow_ok or int(argv[i + 1]) > 20
            except ValueError:
                pass
    return Case(argv, env, slow_ok)


def run_case(binary, case, work, per_run):
    env = dict(case.env)
    env[b"PATH"] = b"/usr/bin:/bin"
    env[b"ASAN_OPTIONS"] = b"detect_leaks=1:exitcode=86:abort_on_error=0"
    env[b"UBSAN_OPTIONS"] = b"print_stacktrace=1:halt_on_error=1:exitcode=87"
    t0 = time.monotonic()
    try:
        p = subprocess.run([b(binary)] + case.argv, env=env, cwd=work, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=per_run)
    except subprocess.TimeoutExpired:
        if case.slow_ok:
            return "cut", None
        return "fail", "no exit within %.0f s (a hang)" % per_run
    secs = time.monotonic() - t0
    err = p.stderr
    if any(s in err for s in SANITIZER):
        return "fail", "sanitizer report: " + err.decode("latin-1")[-1500:]
    if p.returncode not in (0, 1, 2):
        return "fail", "exit status %d: %s" % (p.returncode, err.decode("latin-1")[-500:])
    lines = [ln for ln in err.split(b"\n") if ln and not PROGRESS.match(ln)]
    if not err.endswith(b"\n") and err:
        return "fail", "stderr does not end with a newline: %r" % err[-200:]
    if p.returncode == 2:
        if len(lines) != 1 or not lines[0].startswith(b"commplan: "):
            return "fail", "exit 2 with %d error lines: %r" % (len(lines), err[-600:])
    elif p.returncode == 1:
        return "fail", "exit 1 (a data mismatch): %r" % err[-600:]
    elif lines:
        return "fail", "exit 0 with error lines: %r" % err[-600:]
    if secs > per_run / 2 and not case.slow_ok:
        return "fail", "took %.1f s" % secs
    return "exit%d" % p.returncode, None


def setup(work):
    os.makedirs(work + "/outside")
    with open(work + "/outside/victim", "w") as f:
        f.write("precious\n")
    os.mkfifo(work + "/fifo")
    with open(work + "/file", "w") as f:
        f.write("not a directory\n")
    with open(work + "/idfile", "w") as f:
        f.write("commplan-nccl-id 1\njob gen:old\nkey x\nbytes 1\n00\n")
    for d in ("dump", "links"):
        os.makedirs(work + "/" + d)
        for r in range(4):
            os.symlink("../outside/victim", "%s/%s/fsdp4.rank%d.json" % (work, d, r))
    os.symlink("../outside/victim", work + "/links/trace.json")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--seconds", type=float, default=15)
    # at least this many cases whatever the clock says: a busy machine must not thin the check
    ap.add_argument("--min-cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--per-run", type=float, default=10)
    ap.add_argument("--log")
    args = ap.parse_args()
    binary = os.path.abspath(args.binary)
    work = tempfile.mkdtemp(prefix="commplan-fuzz-cli.")
    try:
        setup(work)
        rng = random.Random(args.seed)
        counts, failures = {}, []
        stop = time.monotonic() + args.seconds
        with ThreadPoolExecutor(args.jobs) as pool:
            while time.monotonic() < stop or sum(counts.values()) < args.min_cases:
                cases = [make_case(rng, work) for _ in range(args.jobs * 4)]
                for case, (kind, why) in zip(cases, pool.map(lambda c: run_case(binary, c, work, args.per_run),
                                                             cases)):
                    counts[kind] = counts.get(kind, 0) + 1
                    if kind == "fail":
                        failures.append((case, why))
        with open(work + "/outside/victim") as f:
            if f.read() != "precious\n":
                failures.insert(0, (None, "a symlink in a dump directory was written through: outside/victim changed"))
        if sorted(os.listdir(work + "/outside")) != ["victim"]:
            failures.insert(0, (None, "written outside the directories asked for: %s" % os.listdir(work + "/outside")))
        log = open(args.log, "w") if args.log else sys.stdout
        for case, why in failures[:20]:
            print("FAIL %s\n     %s" % (why, case.command(binary) if case else ""), file=log)
        if args.log:
            log.close()
            for case, why in failures[:5]:
                print("FAIL %s\n     %s" % (why[:300], case.command(binary)[:300] if case else ""))
        total = sum(counts.values())
        print("fuzz-cli: %d cases (%s), %d failures, seed %d" % (
            total, ", ".join("%s %d" % kv for kv in sorted(counts.items()) if kv[0] != "fail"), len(failures),
            args.seed))
        return 1 if failures else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
