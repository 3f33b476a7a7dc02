"""Gradient and statistics sync between learners (torch.distributed: gloo on CPU, NCCL on GPU)."""

from __future__ import annotations

import contextlib
import re
import time
from datetime import timedelta
from typing import Iterable

import torch

from walle_ray.pulse import PULSE


class GroupLost(RuntimeError):
    """A reduction of the learners' group failed in its transport: another learner of it
    died, or did not join the reduction within ``learner.group_timeout_s``. The group is
    broken, whatever this learner's state, and the run rebuilds every role from the last
    checkpoint (``runtime/fleet.py``, ``role_failed``)."""


# What gloo and NCCL say when the group itself broke: a peer gone, or a reduction it never
# joined. Any other error of a reduction (a tensor on the wrong device, out of memory) is the
# learner's own, and stays as it was raised.
_TRANSPORT = re.compile(r"(?<!launch )timed out|timeout|(closed|reset) by (remote )?peer|"
                        r"broken pipe|connection (refused|closed|reset)|communicator was aborted|"
                        r"remote process exited", re.IGNORECASE)


@contextlib.contextmanager
def _group_call():
    """A torch.distributed reduction or broadcast: a transport failure is the group's loss."""
    try:
        yield
    except RuntimeError as exc:
        network = getattr(torch.distributed, "DistNetworkError", ())
        if not (isinstance(exc, network) or _TRANSPORT.search(str(exc))):
            raise
        text = str(exc).strip().splitlines()
        raise GroupLost(f"{type(exc).__name__}: {text[0] if text else ''}") from exc


class Collective:
    """A group of one: every reduction is the identity."""

    rank = 0
    world_size = 1
    wait_s = 0.0  # seconds spent in reductions since the last ``take_wait_s``

    def take_wait_s(self) -> float:
        """The seconds spent in reductions (waiting for the other learners, and the
        transfer) since the last call; the learner reports them as ``sync_wait_s``."""
        wait_s, self.wait_s = self.wait_s, 0.0
        return wait_s

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def all_reduce_min(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def all_reduce_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Average gradients across learners so every learner takes the same step."""

    def broadcast_(self, tensors: Iterable[torch.Tensor]) -> None:
        """Copy rank 0's tensors to every learner, in place."""

    def close(self) -> None:
        """Leave the group."""


class TorchCollective(Collective):
    """A torch.distributed process group formed by the learners themselves."""

    def __init__(self, address: str, port: int, rank: int, world_size: int, backend: str,
                 timeout_s: float):
        import torch.distributed as dist

        self.dist = dist
        self.rank = rank
        self.world_size = world_size
        # Where the reductions happen: NCCL reduces CUDA tensors only, gloo (CPU learners, or
        # GPU learners that share a GPU, which NCCL refuses) CPU ones; tensors go over and back.
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s))

    def _all_reduce(self, t: torch.Tensor, **kwargs) -> None:
        """``dist.all_reduce``, timed: the learner that arrives first waits here for the
        others, which is what the bottleneck report calls waiting for the other learners,
        and the stall watch never counts against it. NCCL returns once the reduction is
        queued, so on a GPU the learner's own queued work is finished first, outside the
        wait, and the reduction inside it."""
        if t.is_cuda:
            torch.cuda.current_stream(t.device).synchronize()
        t0 = time.perf_counter()
        with PULSE.waiting("the other learners"):
            with _group_call():
                self.dist.all_reduce(t, **kwargs)
            if t.is_cuda:
                torch.cuda.current_stream(t.device).synchronize()
        self.wait_s += time.perf_counter() - t0

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        out = t.to(self.device, copy=True)
        self._all_reduce(out)
        return out.to(t.device)

    def all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        return self.all_reduce_sum(t) / self.world_size

    def all_reduce_min(self, t: torch.Tensor) -> torch.Tensor:
        out = t.to(self.device, copy=True)
        self._all_reduce(out, op=self.dist.ReduceOp.MIN)
        return out.to(t.device)

    def all_reduce_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        # One collective, not one per tensor, on the backend's device.
        flat = torch.cat([g.reshape(-1) for g in grads]).to(self.device)
        self._all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def broadcast_(self, tensors: Iterable[torch.Tensor]) -> None:
        for t in tensors:
            buf = t.to(self.device)
            with PULSE.waiting("the other learners"), _group_call():
                self.dist.broadcast(buf, src=0)
            if buf is not t:
                t.copy_(buf)

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()
