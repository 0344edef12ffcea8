"""Activation checkpointing under the bridge (CommplanFSDP), as torchtitan 0.3 applies it.

torchtitan wraps transformer blocks in torch's checkpoint_wrapper before fully_shard
(torchtitan/distributed/activation_checkpoint.py:152-163, FullAC :166-182 and per-op SelectiveAC
:185-287, applied by models/llama3/parallelize.py:59 ahead of its FSDP wrapping), so each
wrapped block's unit is the CheckpointWrapper and the block's parameters are named with the
wrapper's segment: ``layers.0._checkpoint_wrapped_module.attention.wq.weight``.

Names. The plan and every state dict hold the model's own FQNs: ``clean_fqn`` drops the
wrapper's segment wherever it appears, as torch's own wrapper does for its named_parameters and
state-dict hooks (torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py:16-17, :57-69,
:86) and torchtitan's checkpointer does (components/checkpointer/utils.py:16-25, canonical_fqn).
commplan.modules and commplan.titan name every parameter through it, so a plan written from the
model without AC drives the model with AC, and the reverse.

Recompute. In backward, the wrapper's checkpoint reruns the block's forward. When the bridge's
hooks sit on the wrapper (torchtitan's wrapping) the recompute calls the inner module and no
hook of the bridge fires. When they sit on a module inside a checkpointed region (a unit the
wrapper's inner block, or torch.distributed._composable.checkpoint on a unit's module) the
unit's forward hooks fire again during backward; then, as FSDP2's FSDPState._pre_forward in
PRE_BACKWARD state (torch 2.15 distributed/fsdp/_fully_shard/_fsdp_state.py:319-330: "the
pre-backward hook is responsible for the unshard") and its _post_forward (:356-359: "the
post-backward hook is responsible for the reshard"), the recompute makes no library call: the
unit's pre-backward hook already unsharded it, and its parameters are swapped in again. A
forward during backward of a unit whose pre-backward has not run, or whose post-backward has
already resharded it, would need an all-gather the plan does not hold; the bridge refuses it
(PlanOrderError) as it refuses every call out of the plan's order.

The plan's side: FSDP2's collectives do not change under AC (training.activation_checkpointing
sizes the memory model and, for EP, the recompute's all-to-alls; the FSDP op list is the same:
tests/python/test_bridge_ac.py checks both plans' ops equal and the run bit-identical to
fully_shard under full, per-op selective and every-k-th-block AC).
"""

__all__ = ["CHECKPOINT_SEGMENT", "clean_fqn", "recompute_pre_forward", "recompute_post_forward"]

# torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py:16 (_CHECKPOINT_WRAPPED_MODULE)
CHECKPOINT_SEGMENT = "_checkpoint_wrapped_module"


def clean_fqn(name):
    """A parameter's or module's FQN without the checkpoint wrapper's segment (torchtitan's
    canonical_fqn, components/checkpointer/utils.py:19-25)."""
    if CHECKPOINT_SEGMENT not in name:
        return name
    return ".".join(p for p in name.split(".") if p != CHECKPOINT_SEGMENT)


def is_recompute(fsdp, u):
    """Whether a forward of unit u now is activation checkpointing's recompute: the bridge is in
    backward and the unit's pre-backward has run (FSDP2's PRE_BACKWARD state)."""
    return fsdp._in_backward and fsdp._pre_bwd_done[u]


def recompute_pre_forward(fsdp, u):
    """The unit's forward pre-hook during backward (FSDP2's _pre_forward in PRE_BACKWARD): no
    library call; its unsharded parameters in place. Refuses a unit the plan has no gather for."""
    from .runtime import PlanOrderError
    unit = fsdp.units[u]
    if not fsdp._pre_bwd_done[u] or fsdp._post_bwd_done[u] or (unit["params"] and not fsdp.live[u]):
        why = ("its pre-backward has not run yet" if not fsdp._pre_bwd_done[u]
               else "its post-backward already resharded it")
        raise PlanOrderError("commplan: forward of %s during backward (activation-checkpoint recompute), but %s: "
                             "the recompute would need an all-gather plan %s does not hold (FSDP2 recomputes a "
                             "unit between its pre- and post-backward, torch 2.15 _fsdp_state.py:319-330); wrap "
                             "whole units in checkpoint_wrapper (torchtitan's activation_checkpoint.py:152-163)"
                             % (unit["name"], why, fsdp.name))
    fsdp._use(unit, True)


def recompute_post_forward(fsdp, u):
    """The unit's forward hook during backward (FSDP2's _post_forward in PRE_BACKWARD,
    _fsdp_state.py:356-359): nothing; the post-backward reshards."""
    return None
