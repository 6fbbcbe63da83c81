"""The few collectives a federated round needs across processes, and the balanced split of clients over ranks.

Every function is a no-op (or the identity) in a single process, so the callback reads the same in both cases.
"""

from __future__ import annotations

import atexit
import copy
import heapq
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from fl_lightning.core.messages import option


def is_distributed() -> bool:
    """Whether a process group with more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


#: The process groups (by ``id``) that :func:`end_process_group` waited for in vain and left.
_LEFT: set[int] = set()


def end_process_group(wait_s: float = 60.0) -> bool:
    """After a finished fit, destroy a gloo process group once every process has got here; whether it was destroyed.

    Lightning destroys only an NCCL group at exit; a gloo group (CPU processes) left to the interpreter's shutdown
    can abort a process that has finished its run (``terminate called without an active exception``). The processes
    wait for each other at most ``wait_s`` seconds: destroying the group while another process is still in one of its
    collectives would block until that process leaves, so then (or on any error) the group is left as it is, and a
    second call (the one at exit, :func:`end_process_group_at_exit`) does not wait for it again.
    """
    try:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_backend() != "gloo":
            return False
        group = id(dist.group.WORLD)
        if group in _LEFT:  # waited for once already (the command's end, then the exit): left as it is
            return False
        _LEFT.add(group)
        if dist.get_world_size() > 1:
            dist.barrier(async_op=True).wait(timeout=timedelta(seconds=wait_s))
        dist.destroy_process_group()
        _LEFT.discard(group)
        return True
    except Exception:  # noqa: BLE001 - a process that failed or left: its end is not this process's to decide
        return False


def leave_process_group() -> None:
    """Leave this process's group as it is, now and at exit: a process whose fit failed or was interrupted.

    The other processes are not coming to :func:`end_process_group`'s barrier (they are in a round's collective,
    or gone), so waiting for them there only held this process (a Ctrl-C under ``torchrun`` until the launcher
    killed it, 30 s later).
    """
    if dist.is_available() and dist.is_initialized():
        _LEFT.add(id(dist.group.WORLD))


def end_process_group_at_exit() -> None:
    """Run :func:`end_process_group` when this process exits (once, however many fits call this).

    The command line ends the group after its fit; a fit from Python (a script under ``torchrun``) gets the same end
    here: without it such a script's processes could abort at exit after all their fits had ended.
    """
    atexit.unregister(end_process_group)
    atexit.register(end_process_group)


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of processes (0, 1 without a process group)."""
    if not is_distributed():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def assign_clients(steps: Sequence[int], world_size: int) -> list[list[int]]:
    """Split a round's client slots over ranks so that ranks finish together.

    Longest-processing-time-first: slots in decreasing order of local steps, each to the rank with the least work so
    far (ties to the lower rank). Each rank's slots are returned in increasing order; every slot appears once.

    >>> assign_clients([10, 2, 7, 3], 2)
    [[0, 1], [2, 3]]
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if len(steps) < world_size:
        raise ValueError(
            f"{len(steps)} clients per round cannot be shared by {world_size} processes; "
            f"raise {option('federation.sample_ratio')} or use fewer devices"
        )
    heap = [(0, rank) for rank in range(world_size)]
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for slot in sorted(range(len(steps)), key=lambda s: (-steps[s], s)):
        load, rank = heapq.heappop(heap)
        shares[rank].append(slot)
        heapq.heappush(heap, (load + steps[slot], rank))
    return [sorted(share) for share in shares]


def all_reduce_sum_(tensors: dict[str, Tensor]) -> None:
    """Sum each tensor over all processes, in place (keys must match on every process)."""
    if not is_distributed():
        return
    for name in sorted(tensors):
        dist.all_reduce(tensors[name], op=dist.ReduceOp.SUM)


def all_gather_object(obj: Any) -> list[Any]:
    """Every process's ``obj``, in rank order (``[obj]`` in a single process)."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def agreed_min(value: int | None) -> int | None:
    """The smallest of the processes' ``value`` (all processes must call it together; ``None`` stays ``None``).

    A group size fitted to a process's own GPU memory can differ between processes; with different sizes they train
    different numbers of training batches per round, and Lightning's per-batch broadcast (its SIGTERM check) then
    meets another process's end-of-round gather: the fit hangs.
    """
    if value is None or not is_distributed():
        return value
    return min(all_gather_object(value))


def to_device(tree: Any, device: torch.device | str) -> Any:
    """``tree`` (dicts, lists, tuples and named tuples of tensors) with every tensor moved to ``device``.

    Containers keep their type: a ``defaultdict`` keeps its factory, an ``OrderedDict`` its order, a named tuple its
    class, so that a method's state works the same after the move.

    >>> from collections import defaultdict, namedtuple
    >>> Pair = namedtuple("Pair", "a b")
    >>> to_device({"p": Pair(torch.zeros(1), [torch.ones(1)])}, "cpu")
    {'p': Pair(a=tensor([0.]), b=[tensor([1.])])}
    >>> to_device(defaultdict(list, {"a": [torch.zeros(1)]}), "cpu")["new"]
    []
    """
    if isinstance(tree, Tensor):
        return tree.to(device)
    if type(tree) is dict:
        return {k: to_device(v, device) for k, v in tree.items()}
    if isinstance(tree, dict):  # a subclass: a shallow copy keeps its type and what it holds besides items
        moved = copy.copy(tree)
        for k, v in tree.items():
            moved[k] = to_device(v, device)
        return moved
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a named tuple takes its fields as arguments
        return type(tree)(*(to_device(v, device) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_device(v, device) for v in tree)
    return tree
