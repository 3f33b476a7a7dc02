"""The contracts between roles, as Protocols: what the runtime calls on an algorithm's parts.

A built-in part and a user's own meet the same contract; nothing here is imported by the
parts themselves (they match structurally).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import nn

    from walle_ray.learners.collective import Collective
    from walle_ray.learners.guard import NonFiniteGuard


@runtime_checkable
class Memory(Protocol):
    """An asynchronous algorithm's memory role (``MixedMemory``, a ``PrioritizedReplay``
    shard): samplers put what they collect, learners take batches.

    The runtime never waits inside a memory: it asks ``has_room`` before ``put`` and
    ``can_sample`` before ``sample``, and holds the writer or reader until the answer is yes
    (that waiting is the back-pressure; ``runtime/memory_worker.py``).
    """

    free_running: bool  # whether can_sample stays true however many batches are taken

    def has_room(self, item: Any) -> bool:
        """Whether ``item`` (a sampler's fragment or transitions) may be put now."""

    def put(self, item: Any) -> None:
        """Store ``item``, copying what it keeps (the sender's arrays may be reused)."""

    def can_sample(self) -> bool:
        """Whether ``sample`` can compose a learner batch now."""

    def sample(self) -> Any:
        """One learner batch; called only after ``can_sample()`` said yes."""

    def stats(self) -> dict:
        """Counters for the metrics records (sizes, inserts, samples)."""


@runtime_checkable
class FeedbackMemory(Memory, Protocol):
    """A memory whose algorithm's updates send something back about the batches it served
    (``Update.memory_feedback``): a prioritized replay shard takes new priorities."""

    def feedback(self, item: Any) -> int:
        """Take what an update sent back about a batch this memory served."""


@runtime_checkable
class Update(Protocol):
    """An algorithm's learning step: owns the optimizer(s) and turns batches into one update
    of ``model``. Built by ``Algorithm.make_update`` inside each learner."""

    model: nn.Module
    collective: Collective  # replaced when learners form a group; all-reduce through it
    guard: NonFiniteGuard  # every optimizer step goes through it (skips NaN and inf)

    def update(self, batches: list, env_steps: int) -> dict[str, float]:
        """One update on ``batches`` (fragments or replay batches); returns named metrics.
        With several learners every learner calls the same collectives in the same order."""

    def memory_feedback(self) -> Any | None:
        """What the last update sends back to the memory that served its batch (``Priorities``
        for replay shards), or None; each feedback is returned once."""

    def state_dict(self) -> dict:
        """Optimizer state and whatever else a checkpoint must restore (target networks,
        counters, running statistics), but not the model's weights."""

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""
