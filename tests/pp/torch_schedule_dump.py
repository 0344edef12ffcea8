#!/usr/bin/env python3
"""Dump torch.distributed.pipelining's schedules as JSON (issue 22).

For each (schedule, pp, microbatches, stages_per_rank) case this builds the
torch schedule class with stub stages (no process group, no tensors) and
records, per pipeline rank:

  compute  torch's own ``pipeline_order`` (action strings, "" for None);
  lowered  what the rank issues, in order:
           - multi-stage schedules (``_PipelineScheduleRuntime``): the
             class's ``pipeline_order_with_comms``, which ``_step_microbatches``
             executes one action at a time;
           - single-stage schedules (GPipe, 1F1B): a trace of the class's real
             ``_step_microbatches`` run against stub stages with the module's
             ``_batch_p2p`` / ``_wait_batch_p2p`` replaced by recorders. Each
             ``_batch_p2p`` call is one batch; a send's wait becomes
             WAIT_SEND_F / WAIT_SEND_B; a receive's wait is dropped after
             checking that the next compute action consumes it (the runtime IR
             has no receive waits: compute waits on its own receive);
  groups   per rank, the lowered indices (0-based) of each coalesced batch
           (a mixed send+recv ``_batch_p2p`` call, which torch issues through
           ``dist.batch_isend_irecv``);
  csv_compute  multi-stage: ``_dump_csv(format="compute_only")``'s text;
  torch_simulate  whether torch's ``_simulate_comms_compute`` accepts the
           lowered lists (P2P and compute actions only: it refuses the FSDP
           actions), "ok" or its error; "skipped" where pp * v * n > 256;
  error    instead of the above when the class refuses the case (its message).

Usage: torch_schedule_dump.py [--small] [--out FILE]
  --small  the matrix of tests/pp/recorded/ (pp 2 and 4, microbatches <= 9,
           3 stages per rank only at pp 2, csv_compute only at pp 2)
"""
import argparse
import contextlib
import io
import json
import os
import sys
import tempfile

import torch  # noqa: F401  (imported for its version)
from torch.distributed.pipelining import schedules as S
from torch.distributed.pipelining._utils import generate_rank_to_stage_mapping

SINGLE = {"GPipe": S.ScheduleGPipe, "1F1B": S.Schedule1F1B}
MULTI = {
    "Interleaved1F1B": S.ScheduleInterleaved1F1B,
    "LoopedBFS": S.ScheduleLoopedBFS,
    "InterleavedZeroBubble": S.ScheduleInterleavedZeroBubble,
    "ZBVZeroBubble": S.ScheduleZBVZeroBubble,
    "DualPipeV": S.ScheduleDualPipeV,
}
V_STYLE = {"ZBVZeroBubble", "DualPipeV"}


class Op:
    def __init__(self, kind, stage, mb, peer):
        self.kind, self.stage, self.mb, self.peer = kind, stage, mb, peer

    def label(self):
        return f"{self.stage}{self.kind}{self.mb}"


class Work:
    def __init__(self, ops):
        self.ops = list(ops)


class Stub:
    """Just what the schedule classes read from a _PipelineStageBase."""

    def __init__(self, stage_index, num_stages, group_size, group_rank, trace=None):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.submod = None
        self.trace = trace
        self.stage_index_to_group_rank = {}

    def get_fwd_recv_ops(self, i):
        return [] if self.is_first else [Op("RECV_F", self.stage_index, i, self.stage_index - 1)]

    def get_fwd_send_ops(self, i):
        return [] if self.is_last else [Op("SEND_F", self.stage_index, i, self.stage_index + 1)]

    def get_bwd_recv_ops(self, i):
        return [] if self.is_last else [Op("RECV_B", self.stage_index, i, self.stage_index + 1)]

    def get_bwd_send_ops(self, i):
        return [] if self.is_first else [Op("SEND_B", self.stage_index, i, self.stage_index - 1)]

    def forward_one_chunk(self, i, *args, **kwargs):
        self.trace.append(("compute", f"{self.stage_index}F{i}"))

    def backward_one_chunk(self, i, loss=None, full_backward=True, last_backward=False):
        self.trace.append(("compute", f"{self.stage_index}{'B' if full_backward else 'I'}{i}"))

    def release_fwd_send_outputs(self, i):
        pass

    def perform_reduce_grad(self, scale):
        self.trace.append(("compute", f"{self.stage_index}REDUCE_GRAD"))

    def scale_grads(self, scale):
        pass


def fmt(order):
    return {r: ["" if a is None else str(a) for a in order[r]] for r in sorted(order)}


TRACE = []


def fake_batch_p2p(ops, desc=None):
    if not ops:
        return []
    TRACE.append(("post", [o.label() for o in ops]))
    return [Work(ops)]


def fake_wait_batch_p2p(work):
    labels = [o.label() for w in work for o in w.ops]
    if labels:
        TRACE.append(("wait", labels))


def lower_trace(trace):
    """The recorded calls as a lowered action list and its coalesced groups."""
    out, groups = [], []
    for idx, (kind, what) in enumerate(trace):
        if kind == "compute":
            out.append(what)
        elif kind == "post":
            first = len(out)
            out.extend(what)
            kinds = {("SEND" if "SEND" in a else "RECV") for a in what}
            if len(what) > 1 and len(kinds) > 1:  # _batch_p2p: mixed -> batch_isend_irecv
                groups.append(list(range(first, len(out))))
            elif len(what) > 1:
                raise AssertionError(f"homogeneous multi-op batch {what}: not modelled")
        else:  # wait
            for a in what:
                if "SEND_" in a:
                    out.append(a.replace("SEND_", "WAIT_SEND_"))
                else:  # a receive: the next compute must consume it
                    stage, rest = a.split("RECV_")
                    want = f"{stage}{'F' if rest[0] == 'F' else 'B'}{rest[1:]}"
                    nxt = next((w for k, w in trace[idx + 1:] if k == "compute"), None)
                    if nxt != want:
                        raise AssertionError(f"wait on {a} is not followed by its consumer {want} but {nxt}")
    return out, groups


def single_case(name, pp, n):
    cls = SINGLE[name]
    compute, lowered, groups = {}, {}, {}
    for rank in range(pp):
        trace = []
        stage = Stub(rank, pp, pp, rank, trace)
        sched = cls(stage, n)
        compute[rank] = sched.pipeline_order[rank]
        sched._initialize_stage = lambda *a, **k: None
        TRACE.clear()
        # The stub's compute calls and the recorders share one ordered trace.
        stage.trace = TRACE
        sched._step_microbatches()
        lowered[rank], groups[rank] = lower_trace(list(TRACE))
    return {"compute": fmt(compute), "lowered": lowered, "groups": groups,
            "stage_to_rank": list(range(pp))}


def multi_case(name, pp, n, v, defer=False):
    style = "v" if name in V_STYLE else "loop"
    num_stages = pp * v
    stages = [Stub(s, num_stages, pp, 0) for s in generate_rank_to_stage_mapping(pp, num_stages, style)[0]]
    sched = MULTI[name](stages, n, defer_pp_recv=defer)
    m = sched.stage_index_to_group_rank
    with tempfile.TemporaryDirectory() as d:
        sched._dump_csv(os.path.join(d, "c.csv"), format="compute_only")
        with open(os.path.join(d, "c.csv"), newline="") as fh:
            csv_compute = fh.read()
    return {"csv_compute": csv_compute,"compute": fmt(sched.pipeline_order), "lowered": fmt(sched.pipeline_order_with_comms),
            "groups": {r: [] for r in range(pp)}, "stage_to_rank": [m[s] for s in range(num_stages)],
            "_sched": sched}


SIM_TYPES = {"F", "I", "W", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "WAIT_SEND_F", "WAIT_SEND_B"}


def torch_simulate(lowered, stage_to_rank, num_stages):
    order = {}
    for r, acts in lowered.items():
        order[r] = []
        for s in acts:
            a = S._Action.from_str(s)
            parts = a.sub_actions if a.sub_actions is not None else (a,)
            order[r].extend(p for p in parts if p.computation_type.value in SIM_TYPES)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            S._simulate_comms_compute(order, lambda s: stage_to_rank[s], num_stages)
        return "ok"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}".splitlines()[0]


def run_case(name, pp, n, v, defer=False):
    case = {"schedule": name, "pp": pp, "microbatches": n, "stages_per_rank": v}
    if defer:
        case["defer_pp_recv"] = True
    try:
        body = single_case(name, pp, n) if name in SINGLE else multi_case(name, pp, n, v, defer)
    except Exception as e:  # noqa: BLE001
        case["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
        return case
    body.pop("_sched", None)
    if "csv_compute" in body and not (SMALL and pp > 2) and not defer:
        case["csv_compute"] = body["csv_compute"]
    case["stage_to_rank"] = body["stage_to_rank"]
    case["compute"] = [body["compute"][r] for r in range(pp)]
    case["lowered"] = [body["lowered"][r] for r in range(pp)]
    case["groups"] = [body["groups"][r] for r in range(pp)]
    # torch's simulator is quadratic; the larger cases are left to the P2P proof.
    case["torch_simulate"] = (torch_simulate(body["lowered"], body["stage_to_rank"], pp * v)
                              if pp * v * n <= 256 else "skipped")
    return case


SMALL = False  # --small: csv_compute only where pp == 2 (keeps the recording small)


def matrix(small):
    cases = []
    pps = (2, 4) if small else (1, 2, 4, 8)
    for name in list(SINGLE) + list(MULTI):
        vs = (1,) if name in SINGLE else ((2,) if name in V_STYLE else (2, 3, 4))
        for pp in pps:
            for v in vs:
                if v == 4 and pp != 2 or small and v > 2 and pp != 2:
                    continue
                if small:
                    ns = {1, pp - 1, pp, pp + 1, 2 * pp, 2 * pp + 1}
                else:
                    ns = {1, pp - 1, pp, pp + 1, 2 * pp, 2 * pp + 1, 3, 16, 64 if pp * v <= 8 else 32}
                for n in sorted(x for x in ns if x >= 1):
                    cases.append((name, pp, n, v))
        if name in MULTI:  # defer_pp_recv=True (_defer_recv_ops)
            cases.extend((name, pp, 2 * pp, 2, True) for pp in (2, 4))
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--out", default="-")
    args = ap.parse_args()
    global SMALL
    SMALL = args.small
    S._batch_p2p = fake_batch_p2p
    S._wait_batch_p2p = fake_wait_batch_p2p
    S.logger.disabled = True
    cases = [run_case(*c) for c in matrix(args.small)]
    # One case a line, so a recording's diff names the cases that changed.
    text = ('{"torch":%s,"cases":[\n' % json.dumps(torch.__version__.split("+")[0])
            + ",\n".join(json.dumps(c, separators=(",", ":")) for c in cases) + "\n]}")
    if args.out == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
