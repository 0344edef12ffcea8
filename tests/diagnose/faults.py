"""The provoked-fault matrix (issue 40): real FSDP2 jobs on gloo under
torchrun (4 ranks, tests/diagnose/fault_job.py) and real torchtitan 0.3 jobs
(tests/diagnose/titan_fault_job.py: its expert parallel, its pipeline_llm;
4 ranks forked, gloo) with Flight Recorder on, each with one fault; their
dumps diagnosed against the plan (python/commplan/diagnose.py), and torch's
own analyzer fr_trace.py run on the same dumps, its verdict printed beside.

  faults.py [--tier quick|full] [--keep DIR] [NAME...]

quick: skip_unit and kill (one "quick tier:" line); full: every case below
(the torchtitan jobs 15-40 s each). Each case's check: the
diagnosis names the right rank, the plan's op and the cause. fr_trace.py
cannot read gloo's dumps as torch 2.15 writes them (their pg_config keys
the groups by '' while the entries name them '0', '1', ...: a KeyError in
builder.py's build_collectives); it is run on them as written, and on a
copy whose pg_config is written from the entries (each group's ranks the
plan's instance), and that verdict is the one printed.

First, torch-free, tests/diagnose/setup_check.py (the rule that leaves a
job's setup collectives out of the step count, and its mutants).
Closing line: "diagnose faults: P provoked, D diagnosed right, fr_trace: ...; setup rule ok"
Exit status 0 when every case was provoked and diagnosed right and the setup rule holds.
"""
import argparse
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
from commplan import diagnose  # noqa: E402

LUA = os.environ.get("LUA", "lua5.4")
HERE = os.path.dirname(os.path.abspath(__file__))

# name -> (plan, env, checks on the report: regexes every one of which must match a line)
CASES = {
    "none": ("fr4.lua", {}, [r"agree with the plan everywhere they reach; nothing is pending"]),
    "skip_unit": ("fr4.lua", {"FAULT_RANK": "1"},
                  [r"first departure from the plan: rank 1 posted all_gather 82 -> 328 .*\(step 1\) where the plan has "
                   r"all-gather of layers\.1's parameters \(forward.*skipped"]),
    "shape": ("fr4.lua", {"FAULT_RANK": "2"},
              [r"first departure from the plan: rank 2 posted all_gather 58 -> 232 .*\(step 0\) where the plan has "
               r"all-gather of layers\.0's parameters \(forward.*a wrong size"]),
    "micro": ("fr4_sync.lua", {"FAULT_RANK": "1", "FAULT_RANK2": "2"},
              [r"first departure from the plan: rank 2 posted all_reduce 328 -> 328 .*#25 \(step 1\) where the plan "
               r"has all-gather of layers\.0's parameters \(backward, micro-step 0.*a collective the plan does not "
               r"have there; the plan issues all_reduce of this size as reduce-scatter of layers\.2's gradients "
               r"\(backward, micro-step 1"]),
    "slow": ("fr4.lua", {"FAULT_RANK": "1", "SLOW_S": "10"},
             [r"ranks 0,2,3 wait in #14 \(all-gather of layers\.1's parameters \(forward.* for rank 1 \(last posted "
              r"#13, all-gather of layers\.0's parameters, completed\)",
              r"the dumps agree with the plan everywhere they reach: the plan cannot see"]),
    "kill": ("fr4.lua", {"FAULT_RANK": "3"},
             [r"rank 3: no dump", r"wait in #\d+ \(.*layers\.2's parameters \(backward.* for rank 3 \(no dump\)"]),
    # real torchtitan 0.3 jobs (tests/diagnose/titan_fault_job.py: 4 ranks forked, gloo, Flight Recorder on):
    # its expert parallel (DeepSeek-V3, dp_shard 4 x ep 2), rank 1 withholding the expert-count all-to-all
    "withhold_counts": ("ep4.lua", {"FAULT_RANK": "1", "JOB": "titan_fault_job.py", "EP_CASE": "dp4_ep2"},
                        [r"first departure from the plan: rank 1 posted all_to_all \d+ -> \d+ Float as ep #17 "
                         r"\(step 1\) where the plan has expert-count exchange of layers\.1\.experts \(forward.*: "
                         r"all_to_all 8 -> 8 Long; it skipped the plan's expert-count exchange of "
                         r"layers\.1\.experts",
                         r"before the plan's step 0, the job's setup .*24 on world"]),
    # its pipeline_llm (Qwen3, pp 2 x dp_shard 2, 1F1B over 2 microbatches): rank 2 (pipeline rank 1) runs 4
    "pp_schedule": ("pp4.lua", {"FAULT_RANK": "2", "JOB": "titan_fault_job.py", "PP_CASE": "qwen3_pp2",
                                "FAULT": "pp_microbatches"},
                    [r"ranks 0-3: the plan has 4 sends and receives per step; the dump records none",
                     r"fsdp group 1 \[ranks 2,3\]: rank 3 waits in #7 \(reduce-scatter of norm_lm_head's gradients "
                     r".* for rank 2 \(last posted #6, all-gather of norm_lm_head's parameters, completed\); between "
                     r"them rank 2's plan has only 3 sends and receives"]),
    # the same jobs without a fault (full tier): the setup and the pipeline's shape inference left out, the
    # rest agrees with the plan
    "ep_none": ("ep4.lua", {"JOB": "titan_fault_job.py", "EP_CASE": "dp4_ep2", "FAULT": "none"},
                [r"agree with the plan everywhere they reach; nothing is pending"]),
    "pp_none": ("pp4.lua", {"JOB": "titan_fault_job.py", "PP_CASE": "qwen3_pp2", "FAULT": "none"},
                [r"shape inference before step 0 all-gathered the step's first 3 units on fsdp \[ranks 2,3\]",
                 r"agree with the plan everywhere they reach; nothing is pending"]),
}
QUICK = ["skip_unit", "kill"]
CLEAN = {"none", "ep_none", "pp_none"}
# provoked, the rank behind named, the cause invisible in gloo's dumps (torch 2.15's gloo Flight
# Recorder records no sends or receives): the check is that the diagnosis names the rank and says
# what it cannot see; counted apart from "diagnosed right"
BLIND = {"pp_schedule"}
# the rank at fault: the one fr_trace.py must blame alone to count as right
CULPRIT = {"skip_unit": 1, "shape": 2, "micro": 2, "slow": 1, "kill": 3, "withhold_counts": 1, "pp_schedule": 2}


def generate(plan, out):
    d = os.path.join(out, "plans", os.path.splitext(os.path.basename(plan))[0])
    if not os.path.exists(os.path.join(d, "plan.json")):
        subprocess.run([LUA, os.path.join(ROOT, "gen", "commplan.lua"), os.path.join(HERE, plan), d],
                       check=True, capture_output=True)
    return os.path.join(d, "plan.json")


def provoke(name, plan_json, env, dumps, log):
    os.makedirs(dumps)
    env = dict(env)
    job = env.pop("JOB", "fault_job.py")
    e = dict(os.environ, FAULT=name, PLAN_JSON=plan_json, DUMP_DIR=dumps, TORCH_FR_BUFFER_SIZE="2000",
             TORCH_FR_DUMP_TEMP_FILE=os.path.join(dumps, "rank_"), GLOO_TIMEOUT_S="3", DEADLINE_S="30",
             OMP_NUM_THREADS="1")
    e.update(env)
    if job == "titan_fault_job.py":
        # torchtitan's jobs fork their 4 ranks themselves (torch and torchtitan imported once)
        e["DEADLINE_S"] = "120"
        cmd = ["timeout", "240", sys.executable, os.path.join(HERE, job)]
    else:
        port = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "free_port.py")], capture_output=True,
                              text=True).stdout.strip() or "29655"
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        cmd = ["timeout", "90", torchrun, "--nproc-per-node", "4", "--master-port", port, os.path.join(HERE, job)]
    with open(log, "w") as f:
        p = subprocess.run(cmd, env=e, stdout=f, stderr=subprocess.STDOUT)
    return p.returncode


def fr_trace(args, timeout):
    """python -m torch.distributed.flight_recorder.fr_trace ARGS: returncode, stdout, stderr. Run in a child forked
    from this process with fr_trace imported once, here (a python importing torch for each of the two runs a fault
    was seconds of CPU each); FR_START=spawn runs it as a python of its own."""
    import types
    if os.environ.get("FR_START", "fork") != "fork":
        p = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"] + args,
                           capture_output=True, text=True, timeout=timeout)
        return types.SimpleNamespace(returncode=p.returncode, stdout=p.stdout, stderr=p.stderr)
    import runpy
    import signal
    # (imported once, before the fork; with sys.stderr as it is: its logger's StreamHandler keeps the stream it
    # finds at import, so the children's verdicts reach their stderr)
    import torch.distributed.flight_recorder.fr_trace  # noqa: F401
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: fr_trace's __main__ with these arguments, its exit status ours
            code = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.argv = ["fr_trace.py"] + args
                runpy.run_module("torch.distributed.flight_recorder.fr_trace", run_name="__main__")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001 (a traceback, as python -m would print it)
                import traceback
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        deadline = time.time() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.time() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired("fr_trace " + " ".join(args), timeout)
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        return types.SimpleNamespace(returncode=os.waitstatus_to_exitcode(status),
                                     stdout=out.read().decode(errors="replace"),
                                     stderr=err.read().decode(errors="replace"))


def fr_trace_verdict(dumps, exp, work):
    """fr_trace.py's verdict on the dumps as written, and on a copy with pg_config from the entries."""
    raw = fr_trace([dumps, "-p", "rank_"], 120)
    raw_v = _verdict(raw)[0]
    fixed = os.path.join(work, "fr_fixed")
    os.makedirs(fixed)
    loaded = diagnose.read_dir(dumps)
    place = diagnose.place_groups(loaded, {x["rank"]: x["rows"] for x in exp["ranks"]}, exp["world_size"])
    for r, d in loaded.items():
        cfg = {}
        for e in d["entries"]:
            name, desc = e["process_group"]
            ranks = (place.get((r, name)) or ("world", tuple(range(exp["world_size"]))))[1]
            cfg[name] = {"name": name, "desc": desc, "ranks": str(list(ranks))}
        d = dict(d, pg_config=cfg)
        with open(os.path.join(fixed, f"rank_{r}"), "wb") as f:
            pickle.dump(d, f)
    fixed_p = fr_trace([fixed, "-p", "rank_", "--allow-incomplete-ranks"], 120)
    return raw_v, _verdict(fixed_p), fixed_p.stdout + fixed_p.stderr


def _verdict(p):
    """fr_trace's finding in one line, and the ranks it blames (culprits or missing ranks)."""
    text = (p.stdout + "\n" + p.stderr).strip()
    if p.returncode != 0:
        last = [x for x in text.splitlines() if x.strip()][-1:] or ["(no output)"]
        return "fails: " + last[0][:160], set()
    culprits = list(dict.fromkeys(re.findall(r"Culprit rank (\d+); Error type: (\w+)", text)))
    if culprits:
        seq = re.search(r"Collective sequence number: (\d+) has errors", text)
        return (f"#{seq.group(1) if seq else '?'} has errors: blames " +
                ", ".join(f"rank {r} ({t})" for r, t in culprits)), {int(r) for r, _ in culprits}
    m = re.search(r"Not all ranks joining collective, sequence number: (\d+).*?missing ranks: \{([\d, ]*)\}", text,
                  re.S)
    if m:
        ranks = {int(x) for x in m.group(2).split(",") if x.strip()}
        return f"not all ranks joined #{m.group(1)}: missing ranks {sorted(ranks)}", ranks
    m = re.search(r"missed FR dumps from ranks \(\{([\d, ]*)\}\)", text)
    if m:
        return f"cannot decide: no dumps from ranks {{{m.group(1)}}}", set()
    return "no finding", set()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tier", default=os.environ.get("COMMPLAN_TEST_TIER", "quick"))
    ap.add_argument("--keep")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    names = a.names or (QUICK if a.tier == "quick" else list(CASES))
    if not a.names and a.tier == "quick":
        print(f"quick tier: {', '.join(QUICK)} of {len(CASES)} cases; COMMPLAN_TEST_TIER=full runs all "
              f"({', '.join(n for n in CASES if n not in QUICK)}: withhold_counts, pp_schedule and their clean runs "
              "are real torchtitan jobs)")
    # the setup rule without torch first (tests/diagnose/setup_check.py: its checks and mutants)
    setup = subprocess.run([sys.executable, os.path.join(HERE, "setup_check.py")], capture_output=True, text=True)
    print(setup.stdout, end="")
    work = a.keep or tempfile.mkdtemp(prefix="commplan-faults.")
    provoked = right = fr_named = blind_said = 0
    for name in names:
        plan, env, checks = CASES[name]
        t0 = time.time()
        case = os.path.join(work, name)
        shutil.rmtree(case, ignore_errors=True)
        os.makedirs(case)
        plan_json = generate(plan, work)
        dumps = os.path.join(case, "dumps")
        rc = provoke(name, plan_json, env, dumps, os.path.join(case, "job.log"))
        try:
            loaded = diagnose.read_dir(dumps)
            exp = diagnose.expected(plan_json, list(range(4)))
            lines, _ = diagnose.diagnose(loaded, exp)
        except diagnose.BadInput as e:
            print(f"fault {name}: FAIL no diagnosis ({e}); job exit {rc}, log {case}/job.log")
            continue
        ok_provoked = (rc == 0) if name in CLEAN else rc != 0
        provoked += ok_provoked
        report = "\n".join(lines)
        good = ok_provoked and all(re.search(c, report) for c in checks)
        right += good and name not in BLIND
        blind_said += good and name in BLIND
        raw_v, fixed_v, fr_full = fr_trace_verdict(dumps, exp, case)
        with open(os.path.join(case, "diagnosis.txt"), "w") as f:
            f.write(report + "\n")
        with open(os.path.join(case, "fr_trace.txt"), "w") as f:
            f.write(fr_full)
        fixed_v, blamed = fixed_v
        fr_named += blamed == {CULPRIT[name]} if name in CULPRIT else not blamed
        print(f"fault {name}: {('ok (the rank named; the cause not visible in the dumps, said so)' if name in BLIND else 'ok') if good else 'FAIL'} (job exit {rc}, {time.time() - t0:.0f} s, "
              f"{len(loaded)} dumps)")
        for x in lines:
            print("    " + x)
        print(f"    fr_trace.py on the dumps as written: {raw_v}")
        print(f"    fr_trace.py with pg_config from the entries: {fixed_v}")
        if not good:
            print(f"    expected lines matching: {checks}; files in {case}")
    blind = [n for n in names if n in BLIND]
    print(f"diagnose faults: {len(names)} cases, {provoked} provoked, {right} diagnosed right"
          + (f", {blind_said} of {len(blind)} with the rank named and its cause not visible in gloo's dumps said so "
             f"({', '.join(blind)})" if blind else "")
          + ", "
          f"fr_trace.py's verdict right (the culprit alone, or nothing where nothing failed) in {fr_named}"
          f"; setup rule {'ok' if setup.returncode == 0 else 'FAILED'}")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if right + blind_said == len(names) and setup.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
