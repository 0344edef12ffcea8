"""Overlap as FSDP2 does it, from the plan: the library's split calls (runtime/cp_gpu.h
cp_gpu_unshard_issue / _wait, cp_gpu_reduce_issue / _wait; runtime/cp_hostlib.h's twins) made
by CommplanFSDP's hooks at the places of the plan's op order.

torch 2.15's FSDP2 (torch/distributed/fsdp/_fully_shard/), which the plan's op order already is:

* pre-forward of a unit: ``unshard(async_op)`` (:458) then ``wait_for_unshard()`` (:505)
  (_fsdp_param_group.py:637-651): the all-gather on its own streams, the copy-out on the current
  stream; the next unit's all-gather is issued by the next pre-forward (implicit prefetch: on a
  GPU the host runs ahead of the compute), or earlier where the plan has an explicit forward
  prefetch list (_fsdp_state.py:346, set_modules_to_forward_prefetch): here, every unshard issue
  the plan places before the unit's forward is made in its pre-forward;
* pre-backward: ``unshard`` (a no-op if prefetched), ``wait_for_unshard``, then
  ``_backward_prefetch`` of the unit that runs backward next (_fsdp_param_group.py:679-693,
  1061-1097; the explicit list _fsdp_state.py:407-420): here, every unshard issue the plan places
  before the unit's backward;
* post-backward: the reduce-scatter (and HSDP all-reduce) on their own streams, after waiting for
  the unit's previous reduction (_wait_for_post_backward, _fsdp_param_group.py:759, 1050-1059);
  the root's final callback waits for them all before the optimizer
  (_fsdp_state.py:422-460, wait_for_gradient_reduction :568 -> _end_backward_iteration :547:
  current_stream.wait_event of every post-reduce event): here, reduce_issue in post-backward, reduce_wait before the unit's next
  reduction and in the final callback;
* the step's first all-gather after the current stream (_root_pre_forward,
  _fsdp_state.py:161-162): the library's issue that starts a step forks its side streams from
  the caller's.

The calls follow the plan's op order (split_calls): each unshard issue at its all-gather, its wait
at its copy-out, each reduction at its last op; CommplanFSDP's order check holds them to it, and
the library itself refuses an issue the plan's waits do not cover (arena.c cp_order_call).

On the host library the collectives of an issue go to torch.distributed with async_op=True (gloo
runs them on its own threads) and are waited for when the plan orders something after them, so
the overlap is real on CPU too: a prefetched all-gather runs during the unit's neighbour's
backward, a reduce-scatter during the next unit's backward.
"""

import collections
import ctypes

from .runtime import CALL_KINDS, group_calls

# The split calls' op groups (runtime/cp_gpu.h): an unshard's issue and wait, a reduction's issue.
SPLIT_KINDS = (
    ("unshard_issue", ("h2d", "copy_in", "all_gather")),
    ("unshard_wait", ("copy_out",)),
    ("reshard", CALL_KINDS["reshard"]),
    ("reduce", CALL_KINDS["reduce"]),
)

# lib.call name -> the library's function suffix
_SPLIT_FNS = {"unshard_issue": "unshard_issue", "unshard_wait": "unshard_wait", "reduce_issue": "reduce_issue",
              "reduce_wait": "reduce_wait"}

_SYNC_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_long)


def split_calls(plan):
    """The plan's step as split calls: [(call, unit_name, micro_step, phase, position)], position
    the plan op (seq) at which the call is made (runtime.group_calls with SPLIT_KINDS)."""
    return group_calls(plan, SPLIT_KINDS)


def bind(library, prefix, with_stream):
    """The library's split functions (if it has them: a library built before them has not) into
    library._fns under the bridge's call names. True when bound."""
    lib = library.lib
    if not all(hasattr(lib, prefix + f) for f in _SPLIT_FNS.values()):
        return False
    vp, ci = ctypes.c_void_p, ctypes.c_int
    for name, f in _SPLIT_FNS.items():
        fn = getattr(lib, prefix + f)
        fn.argtypes = [vp, ci, vp] if with_stream else [vp, ci]
        fn.restype = ci
        library._fns[name] = fn
    return True


class AsyncCollectives:
    """The host library's asynchronous collectives (cp_hostlib_set_async): each collective the
    library hands out with a ticket runs as torch.distributed's async_op=True work, kept with the
    tensors it uses until the library waits for its ticket. log: when a list, ("issue", ticket,
    collective) and ("wait", ticket) entries in the order they happen (tests)."""

    def __init__(self, hostlib):
        self.h = hostlib
        lib = hostlib.lib
        lib.cp_hostlib_async_ticket.argtypes = [ctypes.c_void_p]
        lib.cp_hostlib_async_ticket.restype = ctypes.c_long
        lib.cp_hostlib_set_async.argtypes = [ctypes.c_void_p, _SYNC_CB, ctypes.c_void_p]
        lib.cp_hostlib_set_async.restype = None
        self.ticket = lib.cp_hostlib_async_ticket
        self.pending = collections.deque()
        self.log = None
        self._cb = _SYNC_CB(self._sync)  # kept alive as long as the library
        lib.cp_hostlib_set_async(hostlib.g, self._cb, None)

    def add(self, t, work, keep, coll):
        self.pending.append((t, work, keep))
        if self.log is not None:
            self.log.append(("issue", t, coll))

    def drain(self):
        """Waits for every collective still in flight (before the library frees its buffers)."""
        while self.pending:
            self.pending.popleft()[1].wait()

    def _sync(self, user, t):
        try:
            while self.pending and self.pending[0][0] <= t:
                tk, work, _ = self.pending.popleft()
                work.wait()
                if self.log is not None:
                    self.log.append(("wait", tk))
            return 0
        except Exception as e:  # noqa: BLE001 - reported through last_error, never across the C frame
            self.h._error = "waiting for torch.distributed's asynchronous collective failed: %s: %s" % (
                type(e).__name__, e)
            return -1


class Overlap:
    """CommplanFSDP's split calls: prefetching unshards and reductions left in flight, at the places
    of the plan's op order (module docstring). log: when a list, each library call made, in order."""

    def __init__(self, fsdp):
        self.f = fsdp
        calls = split_calls(fsdp.plan)
        ui = fsdp._unit_index
        fsdp._calls = [(c, ui[u], m) for c, u, m, _, _ in calls]
        self.pos = [p for _, _, _, _, p in calls]
        fsdp._micro_end = [sum(1 for c in fsdp._calls if c[2] <= m) for m in range(fsdp._micro_steps)]
        # (unit, micro-step, phase) -> the plan ops of its computes, in order (one, but the loss
        # head's under ChunkedLossWrapper: the norm's, then lm_head's in the loss; commplan.chunked_loss)
        self.compute = {}
        for op in fsdp.plan["ops"]:
            if op["kind"] in ("forward", "backward"):
                self.compute.setdefault((ui[op["unit"]], op.get("micro_step", 0), op["kind"]), []).append(op["seq"])
        n = len(fsdp.units)
        self.prefetched = [False] * n
        self.reducing = [None] * n  # the params of each unit's reduction in flight
        self.log = None

    def _make(self, call, u, lib_call=None):
        self.f._call(call, u, lib_call)
        if self.log is not None:
            self.log.append((lib_call or call, self.f.units[u]["name"]))

    def unshard(self, u, phase):
        """The unit's pre-forward / pre-backward: its unshard (issued here unless prefetched), its
        wait, then the unshard issues the plan makes before the unit's compute (prefetch)."""
        f = self.f
        unit = f.units[u]
        if not f.live[u]:
            if unit["params"]:
                if not self.prefetched[u]:
                    self._make("unshard_issue", u)
                self.prefetched[u] = False
                self._make("unshard_wait", u)
            f.live[u] = True
        f._use(unit, True)
        self.prefetch(u, phase)

    def prefetch(self, u, phase):
        """The unshard issues the plan makes before unit u's next compute (a unit backwarding on its
        sharded parameters, set_unshard_in_backward(False), issues only these in its pre-backward)."""
        f = self.f
        calls, pos = f._calls, self.pos
        # the unit's next compute after the calls made so far
        done = pos[f._pos - 1] if 0 < f._pos <= len(pos) else -1
        limit = next((s for s in self.compute.get((u, f._micro, phase), ()) if s > done), None)
        while limit is not None and f._pos < len(calls) and calls[f._pos][0] == "unshard_issue" \
                and pos[f._pos] < limit:
            v = calls[f._pos][1]
            self._make("unshard_issue", v)
            self.prefetched[v] = True

    def reduce(self, u, params):
        """post-backward's reduction of `params` (the unit's, or the part the plan reduces), issued
        and left in flight (after the unit's previous one)."""
        self.wait_reduce(u)
        adds = (u, self.f._micro) in self.f._reduce_adds
        self.f._before_reduce(u, adds, params)
        self._make("reduce", u, "reduce_issue")
        self.reducing[u] = params

    def wait_reduce(self, u):
        params = self.reducing[u]
        if params is None:
            return
        self.reducing[u] = None
        self.f.lib.call("reduce_wait", u)
        if self.log is not None:
            self.log.append(("reduce_wait", self.f.units[u]["name"]))
        self.f._after_reduce(u, params)

    def finish(self):
        """The root's final callback: every reduction waited for, before the optimizer."""
        for u in range(len(self.reducing)):
            self.wait_reduce(u)
