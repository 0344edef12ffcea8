"""Shared set-up for the torchtitan agreement tests (tests/titan/).

torch and torchtitan come from the live environment (tests/live/torch_env.sh,
make torch-env); without them a test prints one SKIP line and exits 77, never
passes. Everything runs on CPU in one process: torchtitan's meshes are built
over a fake process group (torch.testing._internal.distributed.fake_pg), the
model on the meta device.
"""

import contextlib
import logging
import os
import subprocess
import sys

SKIP_RC = 77
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LUA = os.environ.get("LUA", "lua5.4")


def skip(name, why):
    print(f"SKIP {name}: {why}")
    sys.exit(SKIP_RC)


def need_titan(name):
    """Import torch and torchtitan or SKIP; then make torchtitan run on CPU."""
    try:
        import torch  # noqa: F401
        import torchtitan  # noqa: F401
        import torchtitan.distributed.parallel_dims  # noqa: F401
        from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        skip(name, f"torch and torchtitan are not importable by {sys.executable} "
                   f"({type(e).__name__}: {e}); make torch-env builds them")
    cpu_titan()


def versions():
    import torch
    from importlib.metadata import version
    return torch.__version__, version("torchtitan")


def cpu_titan():
    """torchtitan 0.3 picks its device type once at import:
    torch._utils._get_available_device_type() or "cuda", so on a machine
    without a GPU it is "cuda" and fully_shard asks the CUDA driver for a
    device. Every module that copied the name gets "cpu"; and its INFO logs
    are quieted."""
    import torchtitan.tools.utils as tu
    import torchtitan.distributed.parallel_dims as pd
    import torchtitan.distributed.utils as du
    import torch
    if torch.cuda.is_available():
        return
    for m in (tu, pd, du):
        m.device_type = "cpu"
    from torchtitan.tools.logging import logger
    logger.setLevel(logging.WARNING)
    logging.getLogger("torchtitan").setLevel(logging.WARNING)


def cpu_training():
    """What a real training step of torchtitan's llama3 needs on CPU, beyond
    cpu_titan: the "fake" backend registered (torchtitan builds its degree-1
    mesh dims over it), and FlexAttention, which has no backward on CPU,
    replaced by causal SDPA on the same (B, L, N, H) tensors. The attention's
    maths moves no data: every collective, shard and copy stays as it is."""
    import torch
    import torch.testing._internal.distributed.fake_pg  # noqa: F401 - registers the "fake" backend
    from torchtitan.models.common.attention import FlexAttention
    cpu_titan()

    def sdpa_inner(self, q_BLNH, k_BLNH, v_BLNH, *args, scale=None, enable_gqa=False, **kwargs):
        out = torch.nn.functional.scaled_dot_product_attention(
            q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2), is_causal=True, scale=scale,
            enable_gqa=enable_gqa)
        return out.transpose(1, 2)
    FlexAttention.forward = sdpa_inner


@contextlib.contextmanager
def fake_world(world_size, rank=0):
    """A fake default process group of world_size ranks, this process one of them (rank)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def no_process_groups():
    """DeviceMesh without its process groups: torch creates one group per
    mesh row with new_group (O(world) calls per mesh dim, ~18 s for one
    131,072-rank torchtitan mesh, ~5 ms of ~15 for a small one). The mesh
    layouts, which hold every rank list, are torch's own either way; only
    the ProcessGroup objects (never used here) are left out."""
    from torch.distributed.device_mesh import DeviceMesh
    saved = DeviceMesh.__dict__["_init_process_groups"]
    DeviceMesh._init_process_groups = staticmethod(lambda *a, **k: [])
    try:
        yield
    finally:
        DeviceMesh._init_process_groups = saved


def rank_lists(mesh):
    """Every group's rank list along a 1-D DeviceMesh (the rows of its
    layout over the root mesh's rank map, as DeviceMesh creates its process
    groups): a (groups, group size) int64 tensor."""
    from torch.distributed._mesh_layout import _MeshLayout
    assert mesh.ndim == 1, mesh
    return _MeshLayout([mesh._layout[0]]).remap_to_tensor(mesh._rank_map)


def lua(args, stdin=None):
    """Run the Lua generator side; returns stdout (raises with stderr)."""
    p = subprocess.run([LUA] + args, input=stdin, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{LUA} {' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
    return p.stdout


@contextlib.contextmanager
def member_groups_only():
    """new_group as DeviceMesh calls it for every row of every mesh dim,
    answered for this rank only: the groups it belongs to are created (real
    fake-backend groups, which fully_shard and parallelize_module use), the
    others are GroupMember.NON_GROUP_MEMBER, what torch returns on a rank
    outside them, without the per-group bookkeeping (a 16,384-rank mesh:
    ~1 s instead of ~3)."""
    import torch.distributed as dist
    import torch.distributed.device_mesh as dm
    real = dm.new_group

    def new_group(ranks=None, *args, **kwargs):
        if ranks is not None and dist.get_rank() not in ranks:
            return dist.GroupMember.NON_GROUP_MEMBER
        return real(ranks, *args, **kwargs)

    dm.new_group = new_group
    try:
        yield
    finally:
        dm.new_group = real
