"""What the replay-based algorithms (DQN, Ape-X, DDPG, TD3) share: settings, checks, wiring."""

from __future__ import annotations


def replay_sampler_spec(cfg, topo, i: int) -> tuple[type, tuple, dict]:
    """Sampler i of a replay-based algorithm: a ``ReplaySampler`` acting with the algorithm's
    explorer and writing n-step transitions."""
    from omegaconf import OmegaConf

    from walle_ray.actors.replay_sampler import ReplaySampler
    from walle_ray.algos import algorithm_for

    algo = algorithm_for(cfg.algo)
    env, model = OmegaConf.to_object(cfg.env), OmegaConf.to_object(cfg.model)
    return ReplaySampler, (env, model, OmegaConf.to_object(cfg.algo), algo.explorer,
                           algo.fragment_length(cfg, topo), i, topo.samplers, cfg.run.seed), {}


def replay_memory_spec(cfg, k: int) -> tuple[type, tuple, dict]:
    """Memory k of a replay-based algorithm: one prioritized (or uniform) replay shard."""
    from walle_ray.buffers.prioritized import PrioritizedReplay

    a = cfg.algo
    return PrioritizedReplay, (a.capacity, a.batch_size), dict(
        prioritized=a.prioritized, alpha=a.priority_alpha, beta=a.priority_beta,
        beta_anneal_updates=a.beta_anneal_updates, eps=a.priority_eps,
        learning_starts=a.learning_starts, replay_ratio=a.replay_ratio,
        max_lead=a.max_lead, seed=cfg.run.seed + k)


# Explorers anneal their exploration over a run's env steps; a stochastic evaluation acts
# with the exploration that a finished run ends with.
PAST_SCHEDULES = 2**62


class ExplorerPolicy:
    """Evaluation for a replay algorithm: acts with its explorer, the class its
    ReplaySampler acts with; greedy when deterministic, else with the exploration noise the
    run ends with. An algorithm names ``functools.partial(ExplorerPolicy, its_explorer)``."""

    def __init__(self, explorer_cls: type, obs_space, action_space, cfg, seed: int,
                 deterministic: bool):
        self.explorer = explorer_cls(obs_space, action_space, cfg, 0, 1, seed, greedy=deterministic)

    def set_weights(self, weights) -> None:
        self.explorer.set_weights(weights)

    def act(self, obs):
        return self.explorer.act(obs, PAST_SCHEDULES)
