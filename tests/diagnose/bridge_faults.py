#!/usr/bin/env python3
"""The provoked faults under the bridge (issue 40): the plan's library driven
from Python (python/commplan/runtime.py HostLibrary: the plan's executor in
each rank's process, every collective torch.distributed on gloo) under
torchrun, 4 ranks, the library calls made in the plan's order; a fault
provoked in one rank's executor (COMMPLAN_TEST_FAULT, docs/diagnosis.md);
each process's cursor file (COMMPLAN_CURSOR_DUMP: written on its first
failure, a gloo timeout's included, or as torchrun stops it with SIGTERM once
a rank died) read by `python -m commplan diagnose DIR PLAN`, and the
diagnosis checked to name the rank, the op and the cause.

    tests/diagnose/bridge_faults.py [--tier quick|full] [--only NAME,...] [--torchrun PATH]

Prints "fault NAME: ..." per case and "bridge faults: N faults, P provoked, D
diagnosed right"; exit 1 on a case not provoked or not diagnosed right, 77
when torch or torchrun is missing (SKIP).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "diagnose"))

# name, fault, what the diagnosis must say, what the case is
CASES = [
    ("kill", "kill:3:1:11",
     ["rank 3: no cursor", "ranks 0-2 wait in all-gather of layers.2's parameters (forward, micro-step 0",
      "for rank 3 (no cursor: killed?)"],
     "rank 3 SIGKILLs itself before layers.2's forward all-gather of step 1; torchrun stops the others"),
    ("skip_unit", "skip:1:1:7",
     ["first departure from the plan: rank 1 is in op 11 (all-gather of layers.2's",
      "it skipped 1 of the group's collectives: op 7 (all-gather of layers.1's parameters (forward"],
     "rank 1 skips layers.1's forward all-gather in step 1 (gloo fails on the sizes)"),
    ("shape", "count:2:0:3",
     ["rank 2 issued op 3 (all-gather of layers.0's parameters", "with 49 elements per rank where the plan has "
      "50: a wrong size"],
     "rank 2 all-gathers layers.0 with one element fewer per rank"),
]
QUICK = ("kill",)


def worker():
    import datetime
    import torch
    import torch.distributed as dist
    from commplan.runtime import HostLibrary

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ["RTF_GLOO_TIMEOUT"])))
    name = os.environ["RTF_PLAN"]
    with open(os.path.join(ROOT, "build", name, "gen", "plan.json")) as f:
        pj = json.load(f)
    lib = HostLibrary(os.path.join(ROOT, "build", name, "lib%s.so" % name), name, plan_json=pj)
    lib.init()
    units = {u["name"]: u["index"] for u in pj["units"]}
    calls = {"copy_out": "unshard", "reshard": "reshard", "pack": "reduce"}
    try:
        for _ in range(2):
            for op in pj["ops"]:
                if op["kind"] in calls:
                    lib.call(calls[op["kind"]], units[op["unit"]])
    except RuntimeError as e:
        print("rank %d: %s" % (dist.get_rank(), e), flush=True)
        time.sleep(1)  # the failure's cursor is written; torchrun stops the others as this one ends
        os._exit(1)
    lib.close()
    dist.destroy_process_group()
    return 0


def main(argv):
    if "--worker" in argv:
        return worker()
    tier = argv[argv.index("--tier") + 1] if "--tier" in argv else "quick"
    torchrun = argv[argv.index("--torchrun") + 1] if "--torchrun" in argv else \
        os.path.join(os.path.dirname(sys.executable), "torchrun")
    try:
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_gloo_available():
            raise ImportError("no gloo")
    except Exception as e:  # noqa: BLE001
        print(f"SKIP bridge_faults: torch with gloo is not importable by {sys.executable} ({e})")
        return 77
    if not os.access(torchrun, os.X_OK):
        print(f"SKIP bridge_faults: no torchrun at {torchrun}")
        return 77
    import runtime_faults
    _, lua = runtime_faults.build("rtf_fr4")
    only = set(argv[argv.index("--only") + 1].split(",")) if "--only" in argv else None
    cases = [c for c in CASES if (tier == "full" or c[0] in QUICK) and (only is None or c[0] in only)]
    provoked = right = 0
    for name, fault, want, what in cases:
        d = tempfile.mkdtemp(prefix="commplan-bf.")
        try:
            env = dict(os.environ, COMMPLAN_CURSOR_DUMP=os.path.join(d, "cursor_"), COMMPLAN_TEST_FAULT=fault,
                       RTF_PLAN="rtf_fr4", RTF_GLOO_TIMEOUT="5", OMP_NUM_THREADS="1",
                       PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")]))
            t0 = time.time()
            p = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "4", os.path.abspath(__file__),
                                "--worker"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            files = os.listdir(d)
            ok = p.returncode != 0 and bool(files)
            if not ok:
                print(f"fault {name}: {what}: FAIL: not provoked (torchrun exit {p.returncode}, {len(files)} cursor "
                      f"files): {p.stderr.strip()[-400:]}")
                continue
            provoked += 1
            rc, out = runtime_faults.diagnose(d, lua)
            missing = [w for w in want if w not in out]
            good = rc == 1 and not missing
            right += good
            print(f"fault {name}: {what} ({fault}, {len(files)} cursor files, {time.time() - t0:.0f} s): provoked, "
                  f"{'diagnosed right' if good else 'NOT diagnosed right'}")
            for line in out.splitlines():
                print(f"    {line[:600]}")
            if missing:
                print(f"    (missing: {missing}; diagnose exit {rc})")
        finally:
            shutil.rmtree(d, ignore_errors=True)
    print(f"bridge faults: {len(cases)} faults, {provoked} provoked, {right} diagnosed right (HostLibrary under "
          "torchrun, 4 ranks on gloo; each process's cursor file)")
    return 0 if provoked == right == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
