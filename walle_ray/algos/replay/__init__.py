"""What the replay-based algorithms (DQN, Ape-X, DDPG, TD3) share: settings, checks, wiring."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from typing import Protocol

import numpy as np


class Explorer(Protocol):
    """A replay algorithm's acting policy on a sampler (e.g. epsilon-greedy Q, noisy actor).

    ``act`` gets the sampler's own env steps so far, for exploration schedules; a greedy
    explorer (for evaluation) acts without exploration noise; ``td_error`` gives the initial
    priorities of new transitions under the sampler's copy of the network, as Ape-X
    computes them. ``cfg`` holds the env, model and algo sections as dataclasses.
    """

    def __init__(self, obs_space, action_space, cfg, index: int, num_samplers: int, seed: int,
                 greedy: bool = False): ...

    def set_weights(self, weights: dict[str, np.ndarray]) -> None: ...

    def act(self, obs: np.ndarray, env_steps: int) -> np.ndarray: ...

    def td_error(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
                 discount: np.ndarray, next_obs: np.ndarray) -> np.ndarray: ...

    def stats(self) -> dict[str, float]: ...


class ExplorerActing:
    """The ``ActingPolicy`` of a replay sampler: the algorithm's explorer (its exploration
    schedule reads the sampler's own env steps), with no extras for the writer."""

    def __init__(self, explorer):
        self.explorer = explorer

    def set_weights(self, weights) -> None:
        self.explorer.set_weights(weights)

    def act(self, obs, env_steps: int):
        return self.explorer.act(obs, env_steps), None

    def stats(self) -> dict[str, float]:
        return self.explorer.stats()


def _explorer_acting(explorer_cls: type, sections, num_samplers: int, obs_space, action_space,
                     index: int, seed: int) -> ExplorerActing:
    return ExplorerActing(explorer_cls(obs_space, action_space, sections, index, num_samplers, seed))


def _transition_writer(n_step: int, gamma: float, prioritized: bool, policy, env,
                       fragment_length: int):
    """Initial priorities cost a forward pass over every transition; only prioritized
    shards use them, so others get none."""
    from walle_ray.actors.writers import TransitionWriter

    return TransitionWriter(env, n_step, gamma,
                            policy.explorer.td_error if prioritized else None)


def replay_sampler_args(env_cfg, model_cfg, algo_cfg, explorer_cls: type, fragment_length: int,
                        index: int = 0, num_samplers: int = 1, seed: int = 0) -> tuple:
    """``Sampler``'s arguments for a replay-based algorithm: its explorer acting, a
    ``TransitionWriter`` keeping n-step transitions."""
    sections = SimpleNamespace(env=env_cfg, model=model_cfg, algo=algo_cfg)
    policy = partial(_explorer_acting, explorer_cls, sections, num_samplers)
    writer = partial(_transition_writer, int(algo_cfg.n_step), float(algo_cfg.gamma),
                     bool(algo_cfg.prioritized))
    return env_cfg, policy, writer, fragment_length, index, seed


def replay_sampler_spec(algo, cfg, topo, i: int, explorer: type) -> tuple[type, tuple, dict]:
    """Sampler i of a replay-based algorithm acting with its ``explorer`` class
    (``replay_sampler_args``); an algorithm names ``partial(replay_sampler_spec,
    explorer=...)``."""
    from walle_ray.actors.sampler import Sampler
    from walle_ray.algos.spec import role_sections

    s = role_sections(cfg)
    return Sampler, replay_sampler_args(s.env, s.model, s.algo, explorer,
                                        algo.fragment_length(cfg, topo), i, topo.samplers,
                                        cfg.run.seed), {}


def shard_capacity(cfg, capacity: int | None = None) -> tuple[int, int]:
    """(transitions each replay shard holds, shards): the replay's capacity
    (``algo.capacity``, or ``capacity``) is the whole run's, each shard holding its share, at
    least a batch (docs/algorithms.md, "One update, however many learners")."""
    from walle_ray.algos.spec import learner_batch
    from walle_ray.topology import parse_topology

    memories = parse_topology(cfg.topology.spec).memories
    capacity = cfg.algo.capacity if capacity is None else capacity
    return max(learner_batch(cfg), -(-capacity // memories)), memories


def replay_memory_spec(algo, cfg, k: int) -> tuple[type, tuple, dict]:
    """Memory k of a replay-based algorithm: one prioritized (or uniform) replay shard."""
    from walle_ray.buffers.prioritized import PrioritizedReplay

    from walle_ray.algos.spec import learner_batch

    a = cfg.algo
    capacity, memories = shard_capacity(cfg)
    batch = learner_batch(cfg)
    return PrioritizedReplay, (capacity, batch), dict(
        prioritized=a.prioritized, alpha=a.priority_alpha, beta=a.priority_beta,
        beta_anneal_updates=a.beta_anneal_updates, eps=a.priority_eps,
        learning_starts=min(capacity, -(-a.learning_starts // memories)),
        replay_ratio=a.replay_ratio,
        max_lead=a.max_lead, seed=cfg.run.seed + k)


def replay_memory_needs(algo, cfg, obs_space, action_space) -> list:
    """What the replay shards hold once full (``PrioritizedReplay.planned_bytes``), sized by
    ``algo.capacity``."""
    from walle_ray.buffers.prioritized import PrioritizedReplay
    from walle_ray.envs.spaces import stored_action, stored_obs
    from walle_ray.memory_plan import MemoryNeed

    obs, action = stored_obs(obs_space), stored_action(action_space)

    def held(capacity: int) -> float:
        shard, shards = shard_capacity(cfg, capacity)
        return shards * PrioritizedReplay.planned_bytes(shard, obs, action, cfg.algo.prioritized)

    return [MemoryNeed("algo.capacity", int(cfg.algo.capacity), held, shard_capacity(cfg)[1])]


# Explorers anneal their exploration over a run's env steps; a stochastic evaluation acts
# with the exploration that a finished run ends with.
PAST_SCHEDULES = 2**62


class ExplorerPolicy(ExplorerActing):
    """Evaluation for a replay algorithm: acts with its explorer, the class its samplers
    act with; greedy when deterministic, else with the exploration noise the
    run ends with. An algorithm names ``functools.partial(ExplorerPolicy, its_explorer)``."""

    def __init__(self, explorer_cls: type, obs_space, action_space, cfg, seed: int,
                 deterministic: bool):
        super().__init__(explorer_cls(obs_space, action_space, cfg, 0, 1, seed,
                                      greedy=deterministic))

    def act(self, obs):
        return self.explorer.act(obs, PAST_SCHEDULES)
