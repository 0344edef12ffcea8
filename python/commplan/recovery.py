"""Recovery after an exception mid-step: CommplanFSDP back at the step's start.

An exception raised in a forward or a backward (a unit's code, the loss, an out-of-memory) leaves
the bridge mid-pass: units unsharded, its position in the plan's calls, overlap's prefetched
all-gathers and reductions in flight, and the library's own cursors in the plan's op order
(each call runs its unit's next op group). torch 2.15's FSDP2 needs nothing from its user then:
its state is set again by the next forward (_fsdp_state.py:145-177 _root_pre_forward, each
group's pre_forward, _fsdp_param_group.py), so a training loop that catches the exception just
calls the model again. The bridge does the same: the root unit's next pre-forward that finds the
previous pass raised (unfinished()) calls reset_step() first (CommplanFSDP._pre_forward_hook; a root unit of
one module, as fully_shard(model) makes it); a caller may also call ``fsdp.reset_step()`` itself
(a root of several modules, or before an evaluation after a failed step).

reset_step() waits for every reduction in flight, then makes the rest of the step's calls in the
plan's order (its all-gathers, reshards and reductions, on buffers whose contents are dropped)
so that the library is back at the step's start, waits for all of it, reshards every unit and
clears the pass's state: the next forward is micro-step 0 of a new step. The parameters and
their .grad are left as they are (zero the gradients as after any failed step: the step's
earlier micro-batches' reductions are in them). The collectives pair up across ranks: every
rank must reset (an exception raised on one rank alone leaves the others waiting in a
collective, as it does under FSDP2).
"""


def unfinished(fsdp):
    """True when the previous pass raised (read at the root's training pre-forward): the root's
    forward started and never ended, or a backward began and its final callback never ran. A
    second forward after a finished one is no exception: it stays refused (one forward, one
    backward a micro-step), and a backward that raised before any unit's hook leaves nothing to
    see: fsdp.reset_step() then."""
    if len(fsdp.units[0]["modules"]) != 1 or (fsdp._head is not None and fsdp._head.in_loss(0)):
        return False  # a root of several modules (or the loss head's): its next module's forward is no new pass
    return fsdp._in_backward or fsdp._fwd_started[0] > fsdp._fwd_done[0]


def reset_step(fsdp):
    """The bridge and its library back at the step's start (module docstring)."""
    ov = fsdp._overlap
    lib = fsdp.lib
    if ov is not None:
        for u, params in enumerate(ov.reducing):
            if params is not None:
                ov.reducing[u] = None
                lib.call("reduce_wait", u)
        ov.prefetched = [False] * len(fsdp.units)
    for call, u, _ in fsdp._calls[fsdp._pos:]:
        if ov is not None and call == "reduce":
            lib.call("reduce_issue", u)
            lib.call("reduce_wait", u)
        else:
            lib.call(call, u)
    lib.synchronize(300.0)
    for unit in fsdp.units:
        fsdp.live[unit["index"]] = False
        fsdp._use(unit, False)
    for P in fsdp.params:
        P.arrived = False
        P.accumulated = False
    fsdp._reset_pass()
    fsdp._micro = 0
    fsdp._pos = 0
