"""The contracts between roles, as Protocols: what the runtime calls on an algorithm's parts.

A built-in part and a user's own meet the same contract; the parts need not import this
module (they match structurally).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import gymnasium as gym
    import torch
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
        for replay shards), or None; each feedback is returned once. After an update on
        several batches (a packed learner), its ``split(sizes)`` gives each batch's part."""

    def state_dict(self) -> dict:
        """Optimizer state and whatever else a checkpoint must restore (target networks,
        counters, running statistics), but not the model's weights."""

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""


@runtime_checkable
class ActingPolicy(Protocol):
    """How a sampler acts: the algorithm's policy copy and its exploration
    (``ActorCriticActing`` for policy-gradient methods, an ``Explorer`` for replay ones).
    Built in the sampler's process by the factory its ``Algorithm.sampler_spec`` names."""

    def set_weights(self, weights: dict) -> None:
        """Load the learner's published weights (numpy arrays by parameter name)."""

    def act(self, obs: Any, env_steps: int) -> tuple[Any, Any]:
        """Actions for a batch of observations [B, *obs_shape] as numpy, and the extras the
        writer keeps of this step (log-probabilities, values), or None. ``env_steps``: the
        sampler's steps so far, for exploration schedules."""

    def stats(self) -> dict[str, float]:
        """Exploration settings of the moment (e.g. epsilon), logged as ``explore/<key>``."""

    # Optional: ``reset(done)``, done [B] bool: the episodes of these envs ended (after the
    # writer's ``add`` for the step); a recurrent policy zeroes their state.


@runtime_checkable
class WeightsFeed(Protocol):
    """Where a sampler's weights come from (``SamplerRole.collect``). Before a fragment the
    sampler calls ``refresh(sampler)``, which hands it the newest weights the feed has
    (``sampler.set_weights``); ``lead`` steps before the fragment ends it calls ``ahead()``,
    so a feed that asks over the network (a Ray sampler process,
    ``runtime/sampler_worker.py``) has its answer by the next fragment. A test feeds a sampler
    with any object that has these; ``LocalFleet`` feeds its samplers from its parameter
    server."""

    lead: int  # steps before a fragment ends at which ``ahead`` is called; 0: never

    def refresh(self, sampler: Any) -> None:
        """Give ``sampler`` the newest weights, if it has older ones."""

    def ahead(self) -> None:
        """The fragment ends in ``lead`` steps: prepare the next weights."""


@runtime_checkable
class SamplerRole(Protocol):
    """What a sampler process (``runtime/sampler_worker.py`` ``SamplerWorker``) calls a
    logical sampler by. ``Sampler`` (``actors/sampler.py``), the one acting loop, meets it for every
    algorithm that acts in fragments or transitions; ES's ``ESSampler`` meets it with
    whole episodes of perturbed policies instead (``algos/es/sampler.py``)."""

    index: int  # the sampler's topology index
    version: int  # the version of the weights it holds (-1 before the first)
    fragment_length: int  # steps per env in one call (the asynchronous loop asks ahead by it)

    def set_weights(self, weights: dict, version: int) -> None:
        """Take the learner's published weights and their version."""

    def collect(self, feed: WeightsFeed | None = None) -> tuple[Any, dict]:
        """One item for the memories and the call's report: ``env_steps``,
        ``episode_returns``, ``episode_lengths``, ``policy_version`` and the timings
        ``env_s``, ``act_s``, ``collect_s``; the weights come from ``feed`` (none: the ones
        it holds)."""

    def close(self) -> None:
        """Close its envs."""


@runtime_checkable
class Writer(Protocol):
    """How a sampler packs its steps for the memories (Acme's adders): ``FragmentWriter``
    keeps ``[T, B]`` fragments, ``TransitionWriter`` n-step transitions
    (``walle_ray/actors/writers.py``). The acting loop (``Sampler.collect``) calls, per
    fragment: ``start`` once, then for each step t ``slots``, the env step into those
    arrays, and ``add``; then ``finish`` once."""

    def start(self, obs: Any) -> None:
        """A fragment begins from observations ``obs`` [B, *obs_shape]."""

    def slots(self, t: int) -> tuple[Any, Any, Any, Any]:
        """The arrays step t's env writes into: next observations [B, *obs_shape], rewards
        [B] float32, terminated and truncated [B] bool. The next observations must be a new
        array each step (they are what the next step acts on, and the writer may keep views
        of them); the reward and flag arrays may be reused."""

    def add(self, t: int, obs: Any, action: Any, extras: Any, next_obs: Any, ended: Any) -> None:
        """Step t: what was acted on, the actions and the policy's extras, the next
        observations (the array ``slots`` gave), and the episodes that ended (``Ended``,
        with their final observations) or None."""

    def finish(self, last_obs: Any, version: int) -> tuple[Any, dict]:
        """The fragment's data for a memory (a ``Rollout`` or ``Transitions``), stamped
        with the policy ``version`` that acted, and counters for the sampler's report."""


# A user's own network (``model._target_``, ``walle_ray/models/user.py``). Every family's is
# built the same way, in every process that builds a model (driver, samplers, learners,
# evaluator):
#
#     target(obs_space, action_space, model_cfg, **model.kwargs) -> nn.Module
#
# ``obs_space`` and ``action_space`` are the env's (observations may be a ``FlatSpace``, a Box
# that also knows its ``source`` space and can ``unflatten``), ``model_cfg`` is the
# ``ModelConfig`` dataclass (``hidden``, ``activation``, ... for the user to read or ignore),
# and ``model.kwargs`` are the config's extra keyword arguments. The module is plain torch: the
# framework wraps it (action head, observation normalisation, action bounds, weights for the
# object store, checkpoints as state dicts) and checks it against its contract before the run
# starts. Every build from the same arguments must have the same parameters and buffers,
# since each role loads the learner's weights into its own copy.


@runtime_checkable
class ActorCriticNet(Protocol):
    """A user's network for PPO, PPO-KL and IMPALA.

    ``forward(obs)``: observations [N, *obs_shape] as the env gives them (their dtype; after
    the running normaliser, float, with ``env.normalize_obs``) -> ``(params, value)``:

    - ``params`` [N, P]: the action head's distribution parameters, where
      ``P = make_action_head(action_space).param_dim`` (``walle_ray/models/heads.py``):
      logits [N, n] for ``Discrete(n)``; for a 1-D ``Box`` of d dims the means, then the
      log-stds, [N, 2d] (a state-independent log-std is an ``nn.Parameter`` expanded to N);
      for ``MultiDiscrete(nvec)`` each component's logits concatenated, [N, sum(nvec)]; for
      ``MultiBinary(n)`` one logit per bit, [N, n];
    - ``value`` [N] (or [N, 1]): the state value.

    Both must depend on parameters (gradients flow into them). The network computes both in
    one pass; samplers keep the value of each step.
    """

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [N, *obs_shape] -> (distribution params [N, P], value [N])."""


@runtime_checkable
class QNet(Protocol):
    """A user's network for DQN and Ape-X DQN (``Discrete(n)`` actions).

    ``forward(obs)``: observations [N, *obs_shape] as the env gives them (their dtype) ->
    Q-values [N, n], one per action. A target network is a ``copy.deepcopy`` of it.
    """

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [N, *obs_shape] -> Q [N, num_actions]."""


@runtime_checkable
class DeterministicNet(Protocol):
    """A user's network for DDPG, TD3 and Ape-X DDPG (float vector observations, a bounded
    1-D ``Box`` of d action dims).

    - ``act(obs)``: obs [N, obs_dim] float32 -> actions [N, d] inside the action bounds, in
      the env's units (e.g. a tanh scaled and shifted to ``action_space.low``/``high``);
    - ``q(obs, action)``: obs [N, obs_dim], actions [N, d] in the env's units -> Q [N, K]
      for K critics: K = 1 for DDPG (Q [N] also does), K = 2 for TD3 (``algo.twin_critics``;
      the update bootstraps from the smaller, the actor climbs the first);
    - ``actor`` and ``critic``: submodules holding every parameter of the actor and of the
      critics respectively, none in both: two optimizers step them apart. A target network is
      a ``copy.deepcopy`` of the whole.
    """

    actor: nn.Module
    critic: nn.Module

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [N, obs_dim] -> deterministic actions [N, act_dim] within the bounds."""

    def q(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """(obs [N, obs_dim], action [N, act_dim]) -> Q [N, K], one column per critic."""


class UserNetFactory(Protocol):
    """What ``model._target_`` names: a class or function building one of the networks
    above."""

    def __call__(self, obs_space: gym.Space, action_space: gym.Space, model_cfg: Any,
                 **kwargs: Any) -> nn.Module:
        """``model_cfg``: the ``ModelConfig`` dataclass; ``kwargs``: ``model.kwargs``."""
