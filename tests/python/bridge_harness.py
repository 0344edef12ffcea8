"""What the bridge's torchrun tests share (tests/python/test_bridge_*.py, train_titan_matrix.py):
the torch / torchrun check that prints one SKIP line (exit 77), the plans' builds, the torchrun
launch of the script's own workers, a worker's process-group setup and its gather to rank 0.

One launch for several scripts (make test's quick tier, tests/run.sh):

    tests/python/bridge_harness.py suite TORCHRUN DIR SCRIPT...

runs each SCRIPT (tests/python/<SCRIPT>) as it runs alone, its output in DIR/<name>.log and its
exit status in DIR/<name>.exit, but where a script would start torchrun (launch() below) it hands
its worker's command line to the suite instead and waits: once every script is waiting (or has
ended), one torchrun per world size runs the workers one after another in the same ranks (the
torch / torchtitan imports and the launch paid once), rank 0's output of each worker handed back
to its script, which goes on as if torchrun had returned. A worker failing on a rank ends that
rank (torchrun stops the others, as it does alone) and the workers after it run again in a fresh
torchrun. DIR/<name>.secs: the seconds the script took to prepare, and its worker's.
(tests/python/test_bridge_harness.py checks this on toy scripts.)
"""
import contextlib
import importlib
import json
import os
import runpy
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
QUICK = os.environ.get("COMMPLAN_TEST_TIER", "full") == "quick"
SUITE = "COMMPLAN_BRIDGE_SUITE"  # set by the suite for its scripts: DIR/<name>, where launch() asks
SHARED = "COMMPLAN_BRIDGE_SHARED_PG"  # set in the suite's ranks: one process group for every worker


def skip(tag, why):
    print("SKIP %s: %s" % (tag, why))
    sys.exit(77)


def parser(doc):
    """A script's argument parser: its docstring's first paragraph, TORCHRUN optional."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("torchrun", nargs="?", help="torch's torchrun (default: beside this python)")
    return ap


def parse(ap, worker):
    """AP's arguments; with --worker (the ranks' side, as launch() starts them) WORKER(args) runs
    and its value is the exit status."""
    import argparse
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        sys.exit(worker(args))
    return args


def torchrun_for(tag, given, imports=("torch", "torch.distributed.fsdp"), what="torch with FSDP2"):
    """torchrun's path (GIVEN, or beside this python) once IMPORTS import; else SKIP TAG, exit 77."""
    try:
        for m in imports:
            importlib.import_module(m)
    except Exception as e:  # noqa: BLE001
        skip(tag, "%s is not importable by %s (%s); make torch-env builds it" % (what, sys.executable, e))
    torchrun = given or os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.access(torchrun, os.X_OK):
        skip(tag, "no torchrun at %s" % torchrun)
    return torchrun


def make(build, name):
    """make PLAN=BUILD/NAME.lua: (name, returncode, output)."""
    r = subprocess.run(["make", "--no-print-directory", "-s", "PLAN=%s/%s.lua" % (build, name)], cwd=REPO,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    return name, r.returncode, r.stdout


def build_all(tag, build, names):
    """The plans BUILD/<name>.lua built, the first alone (it may build the shared runtime objects),
    the others two at a time; the first failure ends the script naming the plan."""
    names = list(names)
    if not names:
        return
    results = [make(build, names[0])]
    with ThreadPoolExecutor(2) as ex:
        results += list(ex.map(lambda n: make(build, n), names[1:]))
    for name, rc, out in results:
        if rc != 0:
            print(out)
            sys.exit("%s: make PLAN=%s/%s.lua failed" % (tag, build, name))


def pick(script, given, known):
    """The comma-separated names GIVEN, each one of KNOWN (else SCRIPT exits naming it)."""
    names = given.split(",")
    unknown = [n for n in names if n not in known]
    if unknown:
        sys.exit("%s: unknown name %r; known: %s" % (script, unknown[0], ", ".join(known)))
    return names


def module_plans(script, build, plans):
    """PLANS {name: (model, units, plan_from_module's keywords)} written under BUILD by
    commplan.plan_from_module, then built (build_all)."""
    import commplan
    os.makedirs(os.path.join(REPO, build), exist_ok=True)
    for name, (model, units, kw) in plans.items():
        commplan.plan_from_module(model, units, name, out=os.path.join(REPO, build, name + ".lua"), **kw)
    build_all(script, build, plans)


def env(paths=()):
    """The workers' environment: one thread each, python/, tests/python/ and PATHS importable."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [os.path.join(REPO, "python"), HERE] + list(paths) + [os.environ.get("PYTHONPATH", "")]))


def launch(torchrun, script, world, args, timeout, paths=()):
    """torchrun --standalone with WORLD ranks of SCRIPT ARGS (its --worker side): its exit status.
    Under a suite, the suite runs it (with the other scripts' workers) and this waits for it."""
    argv = [os.path.abspath(script)] + [str(a) for a in args]
    where = os.environ.get(SUITE)
    if where:
        return _ask_suite(where, dict(world=world, argv=argv, paths=list(paths), timeout=timeout))
    return subprocess.run([torchrun, "--standalone", "--nproc-per-node", str(world)] + argv, cwd=REPO,
                          env=env(paths), timeout=timeout).returncode


def init_rank():
    """A worker's start: deterministic algorithms, one thread, the gloo process group (in a suite's
    ranks the one the first worker made: gloo's default group is not made twice in one process
    under torchrun); its rank."""
    import torch
    import torch.distributed as dist
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return int(os.environ["RANK"])


_PD = {}


def parallel_dims(parallelism, world):
    """torchtitan's ParallelDims of PARALLELISM (its ParallelismConfig) on WORLD ranks, its meshes
    built, one per layout and process: torchtitan's spmd_types state keeps the first mesh of a
    layout it built, and fully_shard refuses a parameter on another mesh object
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py:609, "different mesh objects"), so every
    script in one process (a suite's ranks run several) takes the same one."""
    from torchtitan.distributed.parallel_dims import ParallelDims
    key = (world, parallelism.spmd_backend) + tuple(getattr(parallelism, f) for f in (
        "data_parallel_replicate_degree", "data_parallel_shard_degree", "context_parallel_degree",
        "tensor_parallel_degree", "pipeline_parallel_degree", "expert_parallel_degree"))
    if key not in _PD:
        _PD[key] = ParallelDims.from_config(parallelism, world)
        _PD[key].build_mesh()
    return _PD[key]


def failure(e):
    """An exception as one report line: its type and first line."""
    return "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")


def gather(obj, world):
    """Every rank's OBJ on every rank (all_gather_object), then the process group destroyed (in a
    suite's ranks kept for the next worker)."""
    import torch.distributed as dist
    out = [None] * world
    dist.all_gather_object(out, obj)
    if not os.environ.get(SHARED):
        dist.destroy_process_group()
    return out


# ---- the suite: several scripts' workers in one torchrun --------------------------------------

def _ask_suite(where, req):
    rc_file = where + ".rc"
    with open(where + ".req.tmp", "w") as f:
        json.dump(req, f)
    os.replace(where + ".req.tmp", where + ".req")
    deadline = time.time() + req["timeout"] + 3600  # the others' workers run first
    while not os.path.exists(rc_file):
        if time.time() > deadline:
            print("bridge_harness: the suite never ran this worker")
            return 1
        time.sleep(0.2)
    with open(rc_file) as f:
        rc = int(f.read().strip() or 1)
    os.remove(rc_file)
    out = where + ".wout"
    if os.path.exists(out):
        with open(out) as f:
            sys.stdout.write(f.read())
        sys.stdout.flush()
        os.remove(out)
    return rc


def _run_workers(d, names):
    """In each rank: the named scripts' workers one after another, rank 0's output to <name>.wout,
    each rank's exit status to <name>.rc.<rank>."""
    rank = os.environ["RANK"]
    os.environ[SHARED] = "1"
    saved = list(sys.argv)
    for name in names:
        with open(os.path.join(d, name + ".req")) as f:
            req = json.load(f)
        for p in reversed(req["paths"]):
            if p not in sys.path:
                sys.path.insert(0, p)
        sink = open(os.path.join(d, name + ".wout"), "w") if rank == "0" else None
        t0 = time.time()
        rc = 0
        with contextlib.ExitStack() as st:
            if sink:
                st.enter_context(sink)
                st.enter_context(contextlib.redirect_stdout(sink))
                st.enter_context(contextlib.redirect_stderr(sink))
            sys.argv = list(req["argv"])
            try:
                runpy.run_path(req["argv"][0], run_name="__main__")
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001 - the worker's failure, reported as a torchrun rank's
                traceback.print_exc()
                rc = 1
            finally:
                sys.argv = saved
                sys.stdout.flush()
        with open(os.path.join(d, "%s.rc.%s" % (name, rank)), "w") as f:
            f.write("%d %.1f\n" % (rc, time.time() - t0))
        if rc != 0:  # this rank ends as a failed rank under torchrun alone does: torchrun stops the
            sys.stdout.flush()  # others (maybe inside a collective this rank left), and the suite runs
            sys.stderr.flush()  # the later workers in a fresh torchrun
            os._exit(rc)
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def _suite(torchrun, d, scripts):
    os.makedirs(d, exist_ok=True)
    procs, logs, t0 = {}, {}, {}
    for i, s in enumerate(scripts):
        name = os.path.splitext(os.path.basename(s))[0]
        for f in os.listdir(d):
            if f.startswith(name + "."):
                os.remove(os.path.join(d, f))
        logs[name] = open(os.path.join(d, name + ".log"), "w")
        t0[name] = time.time()
        procs[name] = subprocess.Popen([sys.executable, os.path.join(HERE, s), torchrun], cwd=REPO,
                                       stdout=logs[name], stderr=subprocess.STDOUT,
                                       env=dict(os.environ, **{SUITE: os.path.join(d, name)}))
        # the first script's plans built alone (they may build the shared runtime objects), then
        # the others' side by side
        while i == 0 and procs[name].poll() is None and not os.path.exists(os.path.join(d, name + ".req")):
            time.sleep(0.2)
    worker_secs = dict.fromkeys(procs, 0.0)
    prep = {}  # a script's seconds until it first asked for its workers
    while True:
        alive = [n for n, p in procs.items() if p.poll() is None]
        waiting = [n for n in alive if os.path.exists(os.path.join(d, n + ".req"))]
        for n in waiting:
            prep.setdefault(n, time.time() - t0[n])
        if not alive:
            break
        if len(waiting) < len(alive):
            time.sleep(0.2)
            continue
        reqs = {}
        for n in waiting:
            with open(os.path.join(d, n + ".req")) as f:
                reqs[n] = json.load(f)
        for world in sorted({r["world"] for r in reqs.values()}):
            group = [n for n in waiting if reqs[n]["world"] == world]
            pending, rcs = list(group), {}
            while pending:  # after a worker fails, the ones after it in a fresh torchrun
                paths = [p for n in pending for p in reqs[n]["paths"]]
                t1 = time.time()
                try:
                    rc_all = subprocess.run([torchrun, "--standalone", "--nproc-per-node", str(world),
                                             os.path.abspath(__file__), "workers", d] + pending, cwd=REPO,
                                            env=env(paths), timeout=sum(reqs[n]["timeout"] for n in pending)).returncode
                except subprocess.TimeoutExpired:
                    rc_all = 124
                print("bridge suite: torchrun with %d ranks ran %s in %.0f s (exit %d)"
                      % (world, ", ".join(pending), time.time() - t1, rc_all), flush=True)
                left, failed = [], False
                for n in pending:
                    got = []
                    for k in range(world):
                        f = os.path.join(d, "%s.rc.%d" % (n, k))
                        if os.path.exists(f):
                            with open(f) as fh:
                                rc, secs = fh.read().split()
                            got.append(int(rc))
                            worker_secs[n] = max(worker_secs[n], float(secs))
                            os.remove(f)
                    if failed or (not got and n == pending[0]):
                        # after a failed worker the ranks were stopped (those still running saw their
                        # peers go): the later ones again in a fresh torchrun; nothing at all from the
                        # first one: torchrun itself failed
                        if failed:
                            left.append(n)
                        else:
                            rcs[n], failed = rc_all or 1, True
                    elif len(got) == world:
                        rcs[n] = max(got)
                        failed = rcs[n] != 0
                    else:  # some ranks ended it: a crash
                        rcs[n], failed = rc_all or 1, True
                pending = left
            for n in group:
                os.remove(os.path.join(d, n + ".req"))
                with open(os.path.join(d, n + ".rc.tmp"), "w") as f:
                    f.write("%d\n" % rcs[n])
                os.replace(os.path.join(d, n + ".rc.tmp"), os.path.join(d, n + ".rc"))
            # the scripts go on once they have read their status (and may ask again)
            while any(os.path.exists(os.path.join(d, n + ".rc")) and procs[n].poll() is None for n in group):
                time.sleep(0.1)
    for name, p in procs.items():
        logs[name].close()
        with open(os.path.join(d, name + ".exit"), "w") as f:
            f.write("%d\n" % p.returncode)
        # the script's own seconds: its preparation and its worker's (the launch is shared)
        with open(os.path.join(d, name + ".secs"), "w") as f:
            f.write("%d\n" % (prep.get(name, time.time() - t0[name]) + worker_secs[name]))
        print("bridge suite: %s exit %d (worker %.0f s)" % (name, p.returncode, worker_secs[name]))
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "suite":
        sys.exit(_suite(sys.argv[2], os.path.abspath(sys.argv[3]), sys.argv[4:]))
    if len(sys.argv) >= 3 and sys.argv[1] == "workers":
        sys.exit(_run_workers(sys.argv[2], sys.argv[3:]))
    sys.exit("usage: bridge_harness.py suite TORCHRUN DIR SCRIPT... (tests/run.sh)")
