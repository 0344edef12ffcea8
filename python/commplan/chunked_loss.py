"""torchtitan 0.3's ChunkedLossWrapper under the bridge (CommplanFSDP).

torchtitan's default loss (components/loss.py:567-775, num_chunks 8) runs the model forward with
``_skip_lm_head = True`` (models/common/decoder.py:242-247), so the decoder's [norm, lm_head]
unit (torchtitan's fully_shard([norm, lm_head]), distributed/fsdp.py:202-207) runs its norm alone;
then, when ``isinstance(lm_head, FSDPModule)`` (loss.py:655), it sets
``set_reshard_after_forward(False)``, ``set_reshard_after_backward(False)`` and
``set_requires_gradient_sync(False, recurse=False)`` on lm_head, calls ``lm_head.unshard()``
(:729-740), runs lm_head and the loss on each chunk of the sequence with a backward per chunk,
turning gradient sync back on before the last chunk (:743-747), restores the three settings and
calls ``lm_head.reshard()`` (:768-772); the decoder's backward then starts from the gradient the
chunks assembled (_DecoderOutputGradientBackProp, :838-862).

What fully_shard runs for it (torch 2.15; recorded on gloo by tests/titan/test_chunked_loss.py
and tests/python/test_bridge_ac.py) and what the plan holds with training.loss_chunks >= 2 (the
llama and MoE families, and a generic plan whose [norm, lm_head] unit says loss_head, as
commplan.titan.plan_from_titan writes it: gen/parallel/fsdp_schedule.lua): the norm's forward
gathers the unit; the root's post-forward completes the group whose lm_head did not run and
reshards it (FSDPState._force_complete_incomplete_states, _fsdp_state.py:382-397, with the
reshard-after-forward the wrapper's previous call left on); lm_head.unshard() gathers it again;
the chunks' backwards accumulate lm_head's unsharded gradient, the last one reduces it alone
(FSDP2 packs only the parameters with a gradient: plan.json's op "params"); lm_head.reshard();
the decoder's backward gathers the unit a third time at its pre-backward and reduces the
norm's gradient alone.

How the bridge answers it. ``attach`` finds the plan's loss head (the unit whose reductions
come in parts) and makes each module of that unit an FSDPModule, the way fully_shard itself
does (its class swapped for a subclass of FSDPModule and the module's class,
_fully_shard.py:330-345; torchtitan's isinstance check holds). FSDPModule is a plain class,
not an ABC, so a virtual subclass (ABCMeta.register) is not available; the subclass overrides
the five methods the wrapper calls, and every other FSDPModule method, which would reach
FSDP2's state through _get_fsdp_state, is refused there in one line (there is no FSDP2 state).
close() gives the modules their classes back. Between
``unshard()`` and ``reshard()`` (the loss), a forward of the unit makes no library call and
registers no pre-backward hook (FSDP2's group post-forward does not run in full for lm_head
alone, _fsdp_state.py:735-748), the chunks' backwards accumulate lm_head's gradient in the
plan's unsharded-grad buffer (as AccumulateGrad on FSDP2's unsharded parameter) without ending
the micro-step, and the gradient that arrives with sync on is reduced at once: the plan's
reduction of that part. The settings themselves issue nothing: the plan holds the order they
give, and a loss that runs otherwise is refused by the order check. Under no_grad (the wrapper's
validation path: pred without grad, chunked forward only, components/loss.py:656) unshard() /
reshard() hold and drop the unit's evaluation gather instead (commplan.training.EvalForward).
"""

import torch

from .errors import PlanError

__all__ = ["LossHead", "attach", "complete_forward"]


def _parts(fsdp):
    """{(unit index, micro-step): [[params of the unit's first reduction], [second], ...]} for
    units reduced in parts (plan.json's op "params" on their pack / view_out)."""
    by_name = {P.fqn: P for P in fsdp.params}
    parts = {}
    for op in fsdp.plan["ops"]:
        if op["kind"] == "pack" and op.get("params"):
            u = fsdp._unit_index[op["unit"]]
            parts.setdefault((u, op.get("micro_step", 0)), []).append([by_name[n] for n in op["params"]])
    return parts


def _fsdp_module(plan):
    """torch's FSDPModule class (torch >= 2.6 exports it where torchtitan imports it from)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        raise PlanError("plan %s follows torchtitan's ChunkedLossWrapper (training.loss_chunks >= 2), whose loss "
                        "head must be an FSDPModule (components/loss.py:655), which torch %s does not have; use torch "
                        ">= 2.6 or write the plan with training.loss_chunks = 1" % (plan, torch.__version__)) from None
    return FSDPModule


class _HeadCalls:
    """FSDPModule's interface on the loss head unit's modules, answered by the plan (LossHead);
    mixed in ahead of FSDPModule (attach)."""

    def unshard(self, async_op=False):
        self._commplan_head.unshard()
        return _Done() if async_op else None

    def reshard(self):
        self._commplan_head.reshard()

    def set_reshard_after_forward(self, reshard_after_forward, recurse=True):
        self._commplan_head.reshard_after_forward = bool(reshard_after_forward)

    def set_reshard_after_backward(self, reshard_after_backward, *, recurse=True):
        self._commplan_head.reshard_after_backward = bool(reshard_after_backward)

    def set_requires_gradient_sync(self, requires_gradient_sync, *, recurse=True):
        self._commplan_head.sync = bool(requires_gradient_sync)

    def _get_fsdp_state(self):
        raise PlanError("commplan: module %s is driven by plan %s, which answers ChunkedLossWrapper's FSDPModule calls "
                        "(unshard, reshard, set_reshard_after_forward / _backward, set_requires_gradient_sync) and no "
                        "other" % (self._commplan_head.unit["name"], self._commplan_head.fsdp.name))


class _Done:
    def wait(self):
        return None


class LossHead:
    """The plan's loss head unit under ChunkedLossWrapper's calls (module docstring)."""

    def __init__(self, fsdp, u, parts):
        self.fsdp, self.u, self.unit, self.parts = fsdp, u, fsdp.units[u], parts
        self.active = False     # between the loss's unshard() and reshard()
        self.sync = True
        self.reshard_after_forward = self.unit["reshard_after_forward"]
        self.reshard_after_backward = True
        self.done = 0           # the unit's reductions this micro-step
        self.classes = []
        fsdp_module = _fsdp_module(fsdp.name)
        for mod in self.unit["modules"]:
            cls = type(mod)
            # [Commplan<cls>, _HeadCalls, FSDPModule, cls, ...]: FSDPModule.__new__ finds cls at index 3
            sub = type("Commplan" + cls.__name__, (_HeadCalls, fsdp_module, cls), {"_orig_cls_mro_index": 3})
            self.classes.append((mod, cls))
            mod.__class__ = sub
            mod._commplan_head = self

    def in_loss(self, u):
        return self.active and u == self.u

    def unshard(self):
        if not torch.is_grad_enabled():  # the validation path: gathered apart from the plan (commplan.training)
            self.fsdp._eval.hold(self.u)
            return
        self.fsdp._unshard(self.u)
        self.active = True

    def reshard(self):
        if not torch.is_grad_enabled():
            self.fsdp._eval.release(self.u)
            return
        self.active = False
        self.fsdp._reshard(self.u, "backward")

    def pre_forward(self, u):
        """A chunk's lm_head forward: the unit is unsharded by the loss; no call."""
        self.fsdp._use(self.unit, True)

    def chunk_grad(self, P):
        """A chunk's gradient of P, already added into P's unsharded-grad buffer. With sync on
        (the last chunk) the part P belongs to is reduced now, as FSDP2's post-backward does."""
        if not self.sync:
            return
        part = self.next_part()
        if P not in part or any(not Q.accumulated for Q in part):
            return
        fsdp = self.fsdp
        for Q in part:
            if not Q.arrived:
                Q.arrived = True
                fsdp._arrived[self.u] += 1
        fsdp._reduce(self.u, part)

    def next_part(self):
        """The parameters of the unit's next reduction in this micro-step."""
        parts = self.parts.get((self.u, self.fsdp._micro))
        if not parts:
            return self.unit["params"]
        return parts[min(self.done, len(parts) - 1)]

    def reduced(self):
        self.done += 1

    def new_micro_step(self):
        self.done = 0
        self.active = False

    def close(self):
        for mod, cls in self.classes:
            mod.__class__ = cls
            mod.__dict__.pop("_commplan_head", None)
        self.classes = []


def attach(fsdp):
    """The LossHead of a plan that follows ChunkedLossWrapper, else None."""
    parts = _parts(fsdp)
    units = sorted({u for u, _ in parts})
    if not units:
        return None
    if len(units) > 1:
        raise PlanError("plan %s reduces units %s in parts; the bridge drives ChunkedLossWrapper's one loss head"
                        % (fsdp.name, [fsdp.units[u]["name"] for u in units]))
    return LossHead(fsdp, units[0], parts)


def complete_forward(fsdp, output, hook):
    """The root's post-forward: every unit whose forward began but not all of whose modules ran
    (the loss head's lm_head under _skip_lm_head) is completed as FSDP2's
    _force_complete_incomplete_states does (torch 2.15 _fsdp_state.py:382-397): its pre-backward
    hook on the root's output, and the reshard after forward the plan holds."""
    from .runtime import _tensors_in
    for unit in fsdp.units:
        u = unit["index"]
        if u == 0 or not fsdp._fwd_started[u] or fsdp._fwd_done[u] >= len(unit["modules"]):
            continue
        for t in _tensors_in(output, []):
            if t.requires_grad:
                t.register_hook(hook(u))
        fsdp._fwd_done[u] = len(unit["modules"])
        if ("reshard", u, fsdp._micro, "forward") in fsdp._plan_calls:
            fsdp._reshard(u, "forward")
