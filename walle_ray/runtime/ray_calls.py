"""The calls a ``RayFleet`` (``runtime/ray_fleet.py``) has in flight to its role processes,
the waits on them, and what the way a call ended means for the run.

Every call the fleet makes goes into ``Calls.pending`` with the kind of role it went to and
its process index. Ray's errors become the run's (``runtime/fleet.py``): one raised inside a
role is ``role_failed``'s, a ``RoleFailed`` that ends the run or a ``RoleDied`` that the
driver answers by rebuilding the roles from the last checkpoint; a learner process gone is
a ``RoleDied``; a sampler process gone is a death that ``SamplerRestarts`` counts and asks
about again, as is a sampler that lost its own node or cannot reach a role for now.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from walle_ray.runtime.checkpoint import first_line
from walle_ray.runtime.fleet import RoleDied, RoleTimeout, lost_its_node, role_failed
from walle_ray.runtime.sampler_restarts import SamplerRestarts


class Calls:
    """A fleet's calls in flight: ``pending`` maps each call's ObjectRef to (role kind,
    process index, the fragment refs a synchronous sampler call returns, or None). Kinds:
    ``sampler``, ``learner``, and ``restarted`` (asking a restarted sampler process whether
    it is back)."""

    def __init__(self, ray, timeout_s: float, restarts: SamplerRestarts,
                 look: Callable[[], None]):
        """``timeout_s``: how long ``get`` waits (``run.role_timeout_s``); ``look``: called
        each second of a wait, to look for stalled roles (it raises for one that is not a
        sampler, after setting ``stalled``)."""
        self.ray, self.timeout_s, self.restarts, self.look = ray, timeout_s, restarts, look
        self.pending: dict = {}
        self.stalled: str | None = None  # a role found stalled (not a sampler): no more waits

    def get(self, refs, role: str):
        """Results of calls to ``role``; a timeout, an error raised inside the role or its
        death becomes a RoleError that names it. Meanwhile, each second, stalled roles are
        looked for, and so are learner calls in flight that failed (``learner_failed``).
        Once a stalled role was found (a RoleDied), no call waits here again, so the final
        checkpoint after it fails at once rather than finding the same stall again."""
        if self.stalled is not None:
            raise RoleDied(f"{self.stalled} stalled")
        waiting = list(refs) if isinstance(refs, list) else [refs]
        deadline = time.monotonic() + self.timeout_s
        try:
            while waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RoleTimeout(f"{role} did not answer within {self.timeout_s:.0f} s "
                                      "(run.role_timeout_s)")
                ready, waiting = self.ray.wait(waiting, num_returns=len(waiting),
                                               timeout=min(left, 1.0))
                self.ray.get(ready)  # the first error, as soon as it is there
                if waiting:
                    self.look()
                    self.learner_failed()
            return self.ray.get(refs)
        except self.ray.exceptions.RayTaskError as exc:  # first: it may be its cause's class too
            raise role_failed(role, exc) from None
        except self.ray.exceptions.RayActorError as exc:
            raise RoleDied(f"{role} died ({type(exc).__name__})") from None

    def learner_failed(self) -> None:
        """What a learner's call in flight failed with, raised now as ``ended`` would raise
        it (once: the call is done with): a wait on another call (learner 0's state for a
        checkpoint) must not wait on learners held in their group's reduction by one that
        failed. Calls that ended well stay for ``ended``."""
        refs = [ref for ref, (kind, *_) in self.pending.items() if kind == "learner"]
        for ref in self.ray.wait(refs, num_returns=len(refs), timeout=0)[0] if refs else ():
            try:
                self.ray.get(ref)
            except self.ray.exceptions.RayError as exc:
                self.failed(*self.pending.pop(ref)[:2], exc)

    def ended(self, timeout_s: float) -> Iterator[tuple]:
        """(kind, process index, result, fragment refs) of each call that ended well within
        ``timeout_s``; one that failed is ``failed``'s. One at a time, so that the caller
        has taken in each call before it (a sampler's fault counts) when one fails."""
        if not self.pending:  # every sampler is restarting: nothing to wait on yet
            time.sleep(min(timeout_s, 0.05))
            return
        ready, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=timeout_s)
        if ready:
            ready, _ = self.ray.wait(list(self.pending), num_returns=len(self.pending), timeout=0)
        for ref in ready:
            kind, index, extra = self.pending.pop(ref)
            try:
                result = self.ray.get(ref)
            except self.ray.exceptions.RayError as exc:
                self.failed(kind, index, exc)
                continue
            yield kind, index, result, extra

    def failed(self, kind: str, index: int, exc: BaseException) -> None:
        """A call that ended with Ray's error ``exc``. One raised inside the role is
        ``role_failed``'s (its cause says whether the role lost another role, its node or an
        object, or failed on its own), but for a sampler that lost its own node or cannot
        reach a role for now. A role process gone, or its result lost with its node, is
        ``lost``'s."""
        errors = self.ray.exceptions
        if isinstance(exc, errors.RayTaskError):  # first: it may be its cause's class too (a
            # learner whose memory died raises RayTaskError(ActorDiedError)). A sampler that
            # lost its node, or cannot reach a role for now, is called again as after a death
            # (bounded by SamplerRestarts.MAX_DEATHS).
            again = kind == "sampler" and (isinstance(exc.cause, errors.ActorUnavailableError)
                                           or lost_its_node(exc, nested=False))
            if not again:
                raise role_failed(f"{kind}-{index}", exc) from None
        elif not isinstance(exc, (errors.RayActorError, errors.ObjectLostError)):
            raise exc
        self.lost(kind, index, exc)

    def lost(self, kind: str, index: int, exc: BaseException) -> None:
        """A call whose process died, or whose result was lost with its node: a learner's is
        a RoleDied, a sampler's a death (``SamplerRestarts.died``); a restarted sampler that
        is not back yet is asked again soon, and one that Ray will not start again makes a
        rebuild."""
        if kind == "learner":
            raise RoleDied(f"learner-{index} died ({type(exc).__name__})") from None
        if kind == "sampler":
            self.restarts.died(index, exc)
        elif getattr(exc, "actor_init_failed", False):  # Ray starts it no more: rebuild
            raise RoleDied(f"{self.restarts.names[index].removeprefix('walle/')} could not "
                           f"start again: {first_line(exc)}") from None
        else:
            self.restarts.not_back(index)

    def answers(self, refs: list, timeout_s: float) -> tuple[list, list]:
        """What the calls ``refs`` returned within ``timeout_s``, leaving out those that
        ended in an error, and the calls still in flight."""
        if not refs:
            return [], []
        ready, waiting = self.ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        answers = []
        for ref in ready:
            try:
                answers.append(self.ray.get(ref))
            except self.ray.exceptions.RayError:
                pass
        return answers, waiting

    def drain(self, kinds: tuple | None, timeout_s: float) -> None:
        """Fetch (and drop) what the calls in flight to roles of ``kinds`` (all: None) ended
        with, within ``timeout_s``."""
        refs = [ref for ref, (kind, *_) in self.pending.items() if kinds is None or kind in kinds]
        if not refs:
            return
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for ref in ready:
            self.pending.pop(ref, None)
            try:
                self.ray.get(ref)
            except self.ray.exceptions.RayError:
                pass
