#!/usr/bin/env python3
"""The provoked-fault matrix under commplan's own runtime (issue 40): each
fault provoked in a plan binary's host backend (every rank a thread of
--simulate, its collectives' rendezvous bounded by --timeout, the pipeline's
receives by COMMPLAN_P2P_TIMEOUT) through the runtime's test-only fault
(COMMPLAN_TEST_FAULT=KIND:RANK:STEP:OP, runtime/executor.c, docs/diagnosis.md),
the cursor file the job's first failure writes (COMMPLAN_CURSOR_DUMP) read by
`python -m commplan diagnose DIR PLAN`, and the diagnosis checked to name the
rank, the op and the cause.

    python3 tests/diagnose/runtime_faults.py [--tier quick|full] [--only NAME,...]

Prints one line per case ("fault NAME: provoked, diagnosed right: ...") and
the closing line "runtime faults: N cases, P provoked, D diagnosed right";
exits 1 when a case is not provoked or not diagnosed right. No torch needed.
The plans are built here under names of their own (build/rtf_*), so that no
other test's build of the same plan races this one's.
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLANS = {  # our name -> the plan it copies
    "rtf_fr4": "tests/diagnose/fr4.lua",
    "rtf_fr4_sync": "tests/diagnose/fr4_sync.lua",
    "rtf_cppp": "tests/plans/llama_tiny_cppp.lua",
    "rtf_ep2": "tests/ep/plans/ep2_mixtral.lua",
}

# name, plan, fault, what the diagnosis must say (every line), what the case is
CASES = [
    ("none", "rtf_fr4", None, [],
     "no fault: the run passes and writes no cursor"),
    ("skip_unit", "rtf_fr4", "skip:1:1:7",
     ["rank 1 is in op 11 (all-gather of layers.2's", "it skipped 1 of the group's collectives: op 7 "
      "(all-gather of layers.1's parameters (forward"],
     "rank 1 skips layers.1's forward all-gather in step 1"),
    ("shape", "rtf_fr4", "count:2:0:3",
     ["first departure from the plan: rank 2 issued op 3 (all-gather of layers.0's parameters", "with 49 elements "
      "per rank where the plan has 50: a wrong size"],
     "rank 2 all-gathers layers.0 with one element fewer per rank"),
    ("micro", "rtf_fr4_sync", "skip:1:0:m0",
     ["first departure from the plan: rank 1 is in op 50", "rank 1 is in micro-step 1 where the others are in "
      "micro-step 0: its micro-steps differ from the plan's"],
     "rank 1 runs one micro-step of fr4_sync's two (skips micro-step 0's collectives)"),
    ("dead", "rtf_fr4", "stop:3:1:11",
     ["ranks 0-2 wait in all-gather of layers.2's parameters (forward", "for rank 3 (step 1, op 10) done with "
      "reshard of layers.1: in no collective", "the runtime's timeout on rank"],
     "rank 3 stops before layers.2's forward all-gather of step 1 (a dead rank among threads)"),
    ("pp_schedule", "rtf_cppp", "skip:0:1:15",
     ["first departure from the plan: rank 0 passed op 15 (send of layers.0's activations (micro-step 1",
      "rank 0 skipped its send, or its schedule differs from the plan's"],
     "pipeline rank 0 (rank 0) leaves out micro-step 1's send to rank 2"),
    ("withhold_counts", "rtf_ep2", "skip:1:0:11",
     ["first departure from the plan: rank 1 is in op 12 (expert all-to-all of layers.0.experts's tokens",
      "it skipped 1 of the group's collectives: op 11 (expert-count exchange of layers.0.experts"],
     "rank 1 withholds layers.0.experts' expert-count exchange"),
]
# The GPU path on the emulated CUDA and NCCL (tests/emu, docs/emulator.md): every rank a process
# (tests/gpu_ranks.sh), the cursor written as the runtime's --timeout or NCCL's error ends the step
# (cp_gpu_synchronize). A GPU rank's cursor is the op its host enqueued last, so the killed rank is
# what it can name. Run where build/emu/fsdp4/fsdp4 is built (make emu-build), not built here.
GPU_CASES = [
    ("gpu_kill", "kill:3:0:11", ["rank 3: no cursor", "ranks 0-2 stopped while rank 3 wrote no cursor (killed?)"],
     "rank 3 of fsdp4 on the emulated GPU SIGKILLs itself before layers.2's all-gather"),
]
QUICK = ("none", "skip_unit", "shape", "dead", "pp_schedule", "withhold_counts", "micro")


def build(name):
    """build/<name>/<name> from a copy of the plan under our name (the Makefile's NAME is the file's)."""
    d = os.path.join(ROOT, "build", "rtf_plans")
    os.makedirs(d, exist_ok=True)
    lua = os.path.join(d, name + ".lua")
    src = os.path.join(ROOT, PLANS[name])
    with open(src, "rb") as f:
        text = f.read()
    if not os.path.exists(lua) or open(lua, "rb").read() != text:
        with open(lua, "wb") as f:
            f.write(text)
    make = os.environ.get("MAKE", "make")
    p = subprocess.run([make, "-s", "NVCC=/nonexistent", f"PLAN={os.path.relpath(lua, ROOT)}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.stdout.write(p.stdout + p.stderr)
        raise SystemExit(f"runtime faults: building {name} failed")
    return os.path.join(ROOT, "build", name, name), lua


def diagnose(d, plan):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.run([sys.executable, "-m", "commplan", "diagnose", d, plan], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=env)
    return p.returncode, p.stdout + p.stderr


def run_case(name, plan, fault, want, what, built):
    binary, lua = built[plan]
    d = tempfile.mkdtemp(prefix="commplan-rtf.")
    try:
        env = dict(os.environ, COMMPLAN_CURSOR_DUMP=os.path.join(d, "cursor_"), COMMPLAN_P2P_TIMEOUT="2")
        env.pop("COMMPLAN_TEST_FAULT", None)
        if fault:
            env["COMMPLAN_TEST_FAULT"] = fault
        p = subprocess.run([binary, "--simulate", "--steps", "2", "--quiet", "--timeout", "2"], env=env,
                           capture_output=True, text=True, timeout=120)
        files = os.listdir(d)
        if fault is None:
            ok = p.returncode == 0 and not files
            print(f"fault {name}: {what}: {'passes, no cursor written (right)' if ok else 'FAIL: ' + p.stderr[-300:]}")
            return True, ok
        provoked = p.returncode == 2 and bool(files)
        if not provoked:
            print(f"fault {name}: {what}: FAIL: not provoked (exit {p.returncode}, {len(files)} cursor files): "
                  f"{p.stderr.strip()[-300:]}")
            return False, False
        rc, out = diagnose(d, lua)
        missing = [w for w in want if w not in out]
        right = rc == 1 and not missing
        print(f"fault {name}: {what} ({fault}): provoked, {'diagnosed right' if right else 'NOT diagnosed right'}")
        for line in out.splitlines():
            print(f"    {line[:600]}")
        if missing:
            print(f"    (missing: {missing}; diagnose exit {rc})")
        return True, right
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_gpu_case(name, fault, want, what, emu):
    d = tempfile.mkdtemp(prefix="commplan-rtf.")
    try:
        env = dict(os.environ, COMMPLAN_CURSOR_DUMP=os.path.join(d, "cursor_"), COMMPLAN_TEST_FAULT=fault,
                   COMMPLAN_EMU_DEADLOCK_S="3")
        p = subprocess.run([os.path.join(ROOT, "tests", "gpu_ranks.sh"), "4", emu, "--check", "--timeout", "6"],
                           env=env, capture_output=True, text=True, timeout=120)
        files = os.listdir(d)
        if p.returncode == 0 or not files:
            print(f"fault {name}: {what}: FAIL: not provoked (exit {p.returncode}, {len(files)} cursor files)")
            return False, False
        rc, out = diagnose(d, os.path.join(ROOT, "plans", "fsdp4.lua"))
        missing = [w for w in want if w not in out]
        right = rc == 1 and not missing
        print(f"fault {name}: {what} ({fault}): provoked, {'diagnosed right' if right else 'NOT diagnosed right'}")
        for line in out.splitlines():
            print(f"    {line[:600]}")
        if missing:
            print(f"    (missing: {missing}; diagnose exit {rc})")
        return True, right
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main(argv):
    tier = "quick"
    only = None
    if "--tier" in argv:
        tier = argv[argv.index("--tier") + 1]
    if "--only" in argv:
        only = set(argv[argv.index("--only") + 1].split(","))
    cases = [c for c in CASES if (only is None or c[0] in only) and (tier == "full" or c[0] in QUICK)]
    built = {}
    for plan in sorted({c[1] for c in cases}):
        built[plan] = build(plan)
    provoked = right = clean = 0
    faults = [c[0] for c in cases if c[2]]
    n_clean = len(cases) - len(faults)
    for c in cases:
        pv, rt = run_case(*c, built)
        if c[2]:
            provoked += pv
            right += rt
        else:
            clean += rt
    emu = os.path.join(ROOT, "build", "emu", "fsdp4", "fsdp4")
    gpu = [c for c in GPU_CASES if tier == "full" and (only is None or c[0] in only)]
    for name, fault, want, what in gpu:
        if not os.access(emu, os.X_OK):
            print(f"fault {name}: SKIP: {emu} not built (make emu-build)")
            continue
        faults.append(name)
        pv, rt = run_gpu_case(name, fault, want, what, emu)
        provoked += pv
        right += rt
    print(f"runtime faults: {len(faults)} faults, {provoked} provoked, {right} diagnosed right"
          + (f", the clean run {'right' if clean else 'WRONG'}" if n_clean else "")
          + " (host backend: every rank a thread of --simulate"
          + ("; the GPU path on the emulator: a process per rank" if gpu else "")
          + "; the cursor file of the job's first failure)")
    return 0 if provoked == right == len(faults) and clean == n_clean else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
