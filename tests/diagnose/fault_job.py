"""One rank of a provoked fault (tests/diagnose/faults.py runs it under
torchrun, 4 ranks, gloo): FSDP2 (fully_shard on each unit, then the root)
on the model of a plan.json, Flight Recorder on (TORCH_FR_BUFFER_SIZE),
STEPS steps, the fault on FAULT_RANK at FAULT_STEP.

Dumps as a hang leaves them: the first rank whose collective fails (gloo's
timeout, GLOO_TIMEOUT_S, or a peer gone) touches DUMP_DIR/.dump-now and
every rank's watcher thread, seeing it, writes its Flight Recorder dump
once (torch._C._distributed_c10d._dump_fr_trace_file: TORCH_FR_DUMP_TEMP_FILE
+ rank), as torch's watchdog has every rank dump on one rank's timeout;
DEADLINE_S ends a rank that never sees it. A rank that finishes dumps too.

Faults (FAULT):
  none       the plan's step on every rank
  skip_unit  FAULT_RANK's forward skips layers.1 (the model branches on the rank)
  shape      FAULT_RANK's layers.0 has w1 of another shape (one row more)
  micro      sync_last plans: FAULT_RANK runs one micro-step more, FAULT_RANK2 one fewer
  slow       FAULT_RANK sleeps SLOW_S in layers.1's forward (every rank posts the same ops)
  kill       FAULT_RANK is killed (SIGKILL) in the backward of FAULT_STEP
"""
import datetime
import json
import os
import signal
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
FAULT = os.environ.get("FAULT", "none")
FAULT_RANK = int(os.environ.get("FAULT_RANK", "1"))
FAULT_RANK2 = int(os.environ.get("FAULT_RANK2", "2"))
FAULT_STEP = int(os.environ.get("FAULT_STEP", "1"))
STEPS = int(os.environ.get("STEPS", "2"))
DUMP_DIR = os.environ["DUMP_DIR"]
FLAG = os.path.join(DUMP_DIR, ".dump-now")
FAULTY = RANK == FAULT_RANK

_lock = threading.Lock()
_dumped = []


def dump_once():
    with _lock:
        if not _dumped:
            torch._C._distributed_c10d._dump_fr_trace_file(RANK)
            _dumped.append(time.time())


def watcher():
    # SIGTERM (torchrun ends the other ranks when one dies) is blocked in
    # every thread (main() blocks it before gloo starts its threads) and
    # taken here: the rank dumps before it goes, wherever its main thread is.
    deadline = time.time() + float(os.environ.get("DEADLINE_S", "40"))
    while not os.path.exists(FLAG) and time.time() < deadline:
        if signal.sigtimedwait([signal.SIGTERM], 0.05):
            dump_once()
            os._exit(4)
    dump_once()
    if time.time() >= deadline:
        os._exit(3)
    if signal.sigtimedwait([signal.SIGTERM], 60):
        os._exit(4)


class Unit(nn.Module):
    def __init__(self, params, bump=False):
        super().__init__()
        self.names = [p["name"] for p in params]
        ps = []
        for k, p in enumerate(params):
            shape = list(p["shape"])
            if bump and k == 0:
                shape[0] += 1
            ps.append(nn.Parameter(torch.full(shape, 0.01 * (k + 1))))
        self.ps = nn.ParameterList(ps)

    def forward(self, h):
        for p in self.ps:
            h = h + p.mean()
        return h


class Root(Unit):
    def __init__(self, units):
        root = [u for u in units if u["root"]][0]
        super().__init__(root["params"])
        self.layers = nn.ModuleList(
            Unit(u["params"], bump=(FAULT == "shape" and FAULTY and u["name"] == "layers.0"))
            for u in units if not u["root"])
        self.names_ = [u["name"] for u in units if not u["root"]]
        self.step = 0

    def forward(self, h):
        h = super().forward(h)
        for name, layer in zip(self.names_, self.layers):
            if FAULT == "skip_unit" and FAULTY and self.step == FAULT_STEP and name == "layers.1":
                continue
            if FAULT == "slow" and FAULTY and self.step == FAULT_STEP and name == "layers.1":
                time.sleep(float(os.environ.get("SLOW_S", "8")))
            h = layer(h)
        return h


def main():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    plan = json.load(open(os.environ["PLAN_JSON"]))
    timeout = datetime.timedelta(seconds=float(os.environ.get("GLOO_TIMEOUT_S", "3")))
    dist.init_process_group("gloo", timeout=timeout)
    threading.Thread(target=watcher, daemon=True).start()
    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("fsdp",))
    model = Root(plan["units"])
    raf = {u["name"]: u["reshard_after_forward"] for u in plan["units"]}
    for name, layer in zip(model.names_, model.layers):
        fully_shard(layer, mesh=mesh, reshard_after_forward=raf[name])
    fully_shard(model, mesh=mesh)  # the root: FSDP2 keeps it unsharded between forward and backward
    micro = plan["fsdp"]["micro_steps"]
    sync_last = plan["fsdp"].get("grad_accumulation") == "sync_last"
    try:
        for step in range(STEPS):
            model.step = step
            m = micro
            if FAULT == "micro" and step == FAULT_STEP:
                m = micro + 1 if FAULTY else (micro - 1 if RANK == FAULT_RANK2 else micro)
            for k in range(m):
                if sync_last:
                    model.set_requires_gradient_sync(k == m - 1)
                loss = model(torch.ones(4)).sum()
                if FAULT == "kill" and FAULTY and step == FAULT_STEP:
                    os.kill(os.getpid(), signal.SIGKILL)
                loss.backward()
            for p in model.parameters():
                p.grad = None
    except Exception as e:  # noqa: BLE001 -- a failed collective: every rank dumps
        open(FLAG, "a").close()
        dump_once()
        print(f"rank {RANK}: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
        time.sleep(1)
        os._exit(1)
    time.sleep(0.5)  # the step's last reduce-scatter completes in gloo's worker thread
    dump_once()
    os._exit(0)


if __name__ == "__main__":
    main()
