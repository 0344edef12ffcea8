"""One rank replaying a plan's expected trace on gloo (tests/diagnose/faults.py,
torchrun, 4 ranks): every collective of EXPECT_JSON's rows (gen/expect.lua)
issued with torch.distributed on the plan's group instances (new_group,
group_desc "mesh_<family>", as DeviceMesh names its groups), STEPS steps,
Flight Recorder on; for plans whose torchtitan job does not run here (the
expert all-to-alls of a MoE plan). Dumps as fault_job.py writes them.

Sends and receives (a pipeline plan's) are isend / irecv on the rank's
pipeline group, waited at the end of the step.

Faults (FAULT): none; withhold_counts: FAULT_RANK skips its first
expert-count exchange (a2a_counts) of FAULT_STEP; pp_schedule: FAULT_RANK's
2nd and 3rd messages of FAULT_STEP swapped (a schedule that differs).
"""
import datetime
import json
import os
import time

import torch
import torch.distributed as dist

import fault_job  # noqa: F401 -- dump_once, watcher, SIGTERM handling

RANK, WORLD = fault_job.RANK, fault_job.WORLD
DTYPES = {"Float": torch.float32, "BFloat16": torch.bfloat16, "Half": torch.float16}


def main():
    import signal
    import threading
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    exp = json.load(open(os.environ["EXPECT_JSON"]))
    timeout = datetime.timedelta(seconds=float(os.environ.get("GLOO_TIMEOUT_S", "3")))
    dist.init_process_group("gloo", timeout=timeout)
    threading.Thread(target=fault_job.watcher, daemon=True).start()
    # every rank creates every instance, in one order
    # a mesh dim's group per (family, ranks); every world-sized dim the
    # default group, as DeviceMesh reuses it (diagnose.group_key)
    def key(family, ranks):
        return ("world",) if len(ranks) == WORLD else (family, tuple(ranks))
    inst = set()
    for x in exp["ranks"]:
        for row in x["rows"]:
            if "ranks" in row:
                inst.add(key(row["group"], row["ranks"]))
            elif "pg_ranks" in row:
                inst.add(key(row["pg"], row["pg_ranks"]))
    groups = {("world",): dist.group.WORLD}
    for k in sorted(i for i in inst if i != ("world",)):
        g = dist.new_group(list(k[1]), timeout=timeout, group_desc="mesh_" + k[0])
        if RANK in k[1]:
            groups[k] = g
    rows = [x for x in exp["ranks"] if x["rank"] == RANK][0]["rows"]
    fault, faulty, fstep = fault_job.FAULT, fault_job.FAULTY, fault_job.FAULT_STEP
    try:
        for step in range(fault_job.STEPS):
            withheld = False
            order = list(rows)
            if fault == "pp_schedule" and faulty and step == fstep:
                # this pipeline rank's schedule differs: its 2nd and 3rd messages swapped
                msgs = [i for i, row in enumerate(order) if "peer" in row]
                a, b = msgs[1], msgs[2]
                order[a], order[b] = order[b], order[a]
            pending = []
            for row in order:
                if "peer" in row:
                    g = groups[key(row["pg"], row["pg_ranks"])]
                    t = torch.zeros(row["numel_in"], dtype=DTYPES.get(row["dtype"], torch.float32))
                    fn = dist.isend if row["op"] == "send" else dist.irecv
                    pending.append(fn(t, row["peer"], group=g))
                    continue
                for _ in range(row.get("times", 1)):
                    g = groups[key(row["group"], row["ranks"])]
                    dt = DTYPES.get(row["dtype"], torch.float32)
                    n = len(row["ranks"])
                    if (fault == "withhold_counts" and faulty and step == fstep and row["kind"] == "a2a_counts"
                            and not withheld):
                        withheld = True
                        continue
                    if row["op"] == "all_gather":
                        dist.all_gather_into_tensor(torch.zeros(row["numel_out"], dtype=dt),
                                                    torch.ones(row["numel_in"], dtype=dt), group=g)
                    elif row["op"] in ("reduce_scatter", "all_reduce"):
                        dist.all_reduce(torch.ones(row["numel_in"], dtype=dt), group=g)
                    elif row["op"] == "all_to_all":
                        k = row["numel_in"] if row.get("numel_in") is not None else 4 * n
                        dist.all_to_all_single(torch.zeros(k, dtype=dt), torch.ones(k, dtype=dt), group=g)
            for w in pending:
                w.wait()
    except Exception as e:  # noqa: BLE001
        open(fault_job.FLAG, "a").close()
        fault_job.dump_once()
        print(f"rank {RANK}: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
        time.sleep(1)
        os._exit(1)
    time.sleep(0.5)
    fault_job.dump_once()
    os._exit(0)


if __name__ == "__main__":
    main()
