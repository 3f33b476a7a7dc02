"""IMPALA: asynchronous samplers and learners, V-trace, replay mixing, CLEAR and LASER."""

from __future__ import annotations

from functools import partial

import torch
from omegaconf import DictConfig

from walle_ray.algos.impala.config import IMPALAConfig
from walle_ray.algos.impala.update import IMPALAUpdate
from walle_ray.algos.spec import (Algorithm, check_learner_batch, check_policy_spaces,
                                  configured_fragment_length, fragment_sampler_spec,
                                  learner_batch, packed_as_is, require_algo)
from walle_ray.buffers.mixed import BufferSpec, MixedMemory, every_count, most_rows, update_rows
from walle_ray.buffers.ranked import DIST_FUNCTIONS, STRATEGIES
from walle_ray.config import ConfigError

REPLAY_TYPES = ("queue", "uniform", "elite", "attentive")
RANKED = ("elite", "attentive")


def make_update(cfg: DictConfig, model, collective, device: torch.device) -> IMPALAUpdate:
    return IMPALAUpdate(cfg.algo, model, collective, cfg.env.normalize_reward,
                        cfg.run.total_env_steps, device, cfg.model.burn_in)


def buffer_specs(algo_cfg, batch_rows: int, fragment_rows: int, memories: int = 1,
                 anneal_rows: float = float("inf"), learners: int = 1) -> list[BufferSpec]:
    """The memory mix of each of ``memories`` memory actors, each serving batches of
    ``batch_rows`` rows to its learner shard and taking fragments of ``fragment_rows``; a
    ranked buffer anneals over ``anneal_rows``, the rows its memory stores in the whole run.

    ``capacity`` and ``start_rows`` are the whole run's, split across the memories, so the
    replay spans the same stretch of the run whatever the topology (docs/algorithms.md,
    "One update, however many learners"); each memory holds at least a fragment beside its
    type's rows of a batch, so a fragment always fits. Capacity 0 holds four batches'
    worth of the type's rows."""
    specs = []
    for r, rows in zip(algo_cfg.replay, batch_most(algo_cfg.replay, batch_rows, learners)):
        ranking = {}
        if r.type in RANKED:
            ranking = dict(dist_function=r.dist_function, p=float(r.p),
                           lambda_batch_multiplier=float(r.lambda_batch_multiplier),
                           alpha_annealing_factor=float(r.alpha_annealing_factor),
                           anneal_rows=anneal_rows, reference_rows=int(r.reference_rows),
                           steps=int(r.steps), strategy=str(r.strategy),
                           replacement=bool(r.replacement))
        specs.append(BufferSpec(type=r.type, ratio=r.ratio,
                                capacity=buffer_capacity(r.capacity, rows, fragment_rows,
                                                         memories),
                                start_rows=-(-r.start_rows // memories), ranking=ranking))
    return specs


def batch_most(replay, batch_rows: int, learners: int) -> list[int]:
    """The most rows of each type of the mix ``replay`` that one batch of ``batch_rows``
    takes, with ``learners`` sharing each update (``buffers/mixed.most_rows``)."""
    whole = update_rows([r.ratio for r in replay], batch_rows * learners)
    return most_rows([r.type for r in replay], whole, batch_rows, learners)


def buffer_capacity(capacity: int, rows: int, fragment_rows: int, memories: int) -> int:
    """The rows one memory's buffer holds (``buffer_specs``): its share of the whole run's
    ``capacity`` (0: four batches of its rows), and at least a fragment beside ``rows``,
    the most of its type that one batch takes (``buffers/mixed.most_rows``)."""
    share = -(-capacity // memories) if capacity else 4 * rows
    return max(share, fragment_rows + rows)


def sampler_spec(algo, cfg: DictConfig, topo, i: int) -> tuple[type, tuple, dict]:
    """Sampler i: V-trace bootstraps from the learner's own value of each fragment's last
    observation, so samplers skip it; elite replay by ln_norm or cosine compares each step's
    encoding, which samplers then keep."""
    return fragment_sampler_spec(algo, cfg, topo, i, bootstrap_value=False,
                                 encode=stores_encodings(cfg))


def memory_spec(algo, cfg: DictConfig, k: int) -> tuple[type, tuple, dict]:
    """Memory k: the on-policy queue and replay buffers, mixed by ratio into each batch;
    with a ranked buffer, the policy it ranks with (built in the memory's process)."""
    encoder = None
    if ranks(cfg):
        from walle_ray.algos.spec import role_sections
        from walle_ray.buffers.encoder import PolicyEncoder

        encoder = partial(PolicyEncoder, role_sections(cfg), algo.make_model)
    from walle_ray.topology import parse_topology, piece_rows

    topo = parse_topology(cfg.topology.spec)
    memories, learners = max(1, topo.memories), max(1, topo.learners)
    anneal_rows = cfg.run.total_env_steps / (cfg.algo.fragment_length * memories)
    rows, piece = learner_batch(cfg), piece_rows(cfg.env.envs_per_sampler, memories)
    specs = buffer_specs(cfg.algo, rows, piece, memories, anneal_rows, learners)
    # Memory k serves learner shard k mod L (``Topology.memories_of``).
    return MixedMemory, (specs, rows, cfg.run.seed + k, encoder, k % learners, learners), {}


def memory_needs(algo, cfg: DictConfig, obs_space, action_space) -> list:
    """What each memory's mix holds once full (``MixedMemory.planned_bytes``), sized by the
    capacity of its largest buffer, ``algo.replay[i].capacity`` (the rows it holds by
    default where that is 0)."""
    from dataclasses import replace

    from walle_ray.algos.spec import actor_critic_model
    from walle_ray.batch import rollout_row_bytes
    from walle_ray.envs.spaces import stored_action, stored_obs
    from walle_ray.memory_plan import MemoryNeed
    from walle_ray.models.heads import make_action_head
    from walle_ray.topology import parse_topology, piece_rows

    topo = parse_topology(cfg.topology.spec)
    memories, learners = max(1, topo.memories), max(1, topo.learners)
    rows, piece = learner_batch(cfg), piece_rows(cfg.env.envs_per_sampler, memories)
    specs = buffer_specs(cfg.algo, rows, piece, memories, learners=learners)
    most = batch_most(cfg.algo.replay, rows, learners)
    i = max(range(len(specs)), key=lambda k: specs[k].capacity)
    state = features = 0
    if cfg.model.core or stores_encodings(cfg):  # widths the network decides
        model = actor_critic_model(obs_space, action_space, cfg)
        state = model.state_size
        if stores_encodings(cfg):
            with torch.no_grad():
                features = model.encode(torch.zeros(1, *obs_space.shape)).shape[-1]
    row = rollout_row_bytes(cfg.algo.fragment_length, stored_obs(obs_space),
                            stored_action(action_space), make_action_head(action_space).param_dim,
                            state, features)

    def held(capacity: int) -> float:
        one = buffer_capacity(capacity, most[i], piece, memories)
        resized = [replace(spec, capacity=one) if k == i else spec for k, spec in enumerate(specs)]
        return memories * MixedMemory.planned_bytes(resized, row, piece)

    return [MemoryNeed(f"algo.replay[{i}].capacity", int(cfg.algo.replay[i].capacity), held,
                       memories)]


def ranks(cfg: DictConfig) -> bool:
    """Whether a buffer of the mix ranks rows with the current policy (elite, attentive)."""
    return any(r.type in RANKED for r in cfg.algo.replay)


def stores_encodings(cfg: DictConfig) -> bool:
    """Samplers keep each step's state encoding for elite replay by ln_norm or cosine."""
    return any(r.type == "elite" and r.dist_function != "kl" for r in cfg.algo.replay)


def check_replay(algo_cfg, n: int, learners: int = 1) -> None:
    """Ratios sum to 1 and give whole rows of the update's ``n * learners``; a ranked type
    whole rows of every learner's ``n`` (the others are dealt in turn: ``batch_counts``);
    known types; one queue at most; ranking settings that can work."""
    replay = algo_cfg.replay
    whole = n * learners
    if not replay:
        raise ConfigError("algo.replay: list at least one memory type, e.g. [{type: queue, ratio: 1.0}]")
    for i, r in enumerate(replay):
        if r.type not in REPLAY_TYPES:
            raise ConfigError(f"algo.replay[{i}].type: got {r.type!r}; use one of {', '.join(REPLAY_TYPES)}")
        if not 0 < r.ratio <= 1:
            raise ConfigError(f"algo.replay[{i}].ratio: got {r.ratio}; must be in (0, 1]")
        rows = r.ratio * whole
        if abs(rows - round(rows)) > 1e-6:
            raise ConfigError(
                f"algo.replay[{i}].ratio: {r.ratio} of algo.batch_size={whole} is {rows:g} rows, "
                f"not a whole number; pick ratios that are multiples of 1/{whole}")
        if r.type in RANKED and round(rows) % learners:
            raise ConfigError(
                f"algo.replay[{i}].ratio: {r.type} replay ranks a fixed number of rows per "
                f"learner, and {round(rows)} rows of algo.batch_size={whole} do not split over "
                f"{learners} learners; pick a ratio whose rows {learners} divides")
        if r.capacity < 0 or r.start_rows < 0:
            raise ConfigError(f"algo.replay[{i}]: capacity and start_rows must be zero or positive")
        if r.capacity and r.capacity < -(-round(rows) // learners):
            raise ConfigError(f"algo.replay[{i}].capacity: {r.capacity} rows cannot serve "
                              f"{-(-round(rows) // learners)} rows per batch")
        if r.type in RANKED:
            check_ranking(f"algo.replay[{i}]", r)
    total = sum(r.ratio for r in replay)
    if abs(total - 1.0) > 1e-6:
        raise ConfigError(f"algo.replay: the ratios sum to {total:g}; they must sum to 1")
    if sum(r.type == "queue" for r in replay) > 1:
        raise ConfigError("algo.replay: list the on-policy queue once")
    # Rows dealt in turn (``batch_counts``): the type that fills each batch must not go short.
    counts = every_count([r.type for r in replay], update_rows([r.ratio for r in replay], whole),
                         n, learners)
    if any(k < 0 for batch in counts for k in batch):
        raise ConfigError(f"algo.replay: the mix's rows do not fit batches of {n} rows on "
                          f"each of {learners} learners; raise algo.batch_size")


def check_ranking(where: str, r) -> None:
    if r.strategy not in STRATEGIES:
        raise ConfigError(f"{where}.strategy: got {r.strategy!r}; use one of "
                          f"{', '.join(STRATEGIES)}")
    if r.dist_function not in DIST_FUNCTIONS[r.type]:
        raise ConfigError(f"{where}.dist_function: got {r.dist_function!r}; {r.type} replay ranks "
                          f"by {' or '.join(DIST_FUNCTIONS[r.type])}")
    if r.lambda_batch_multiplier < 1:
        raise ConfigError(f"{where}.lambda_batch_multiplier: got {r.lambda_batch_multiplier}; it is "
                          "the candidates drawn per row served, at least 1 (1: uniform replay)")
    if r.alpha_annealing_factor <= 0:
        raise ConfigError(f"{where}.alpha_annealing_factor: got {r.alpha_annealing_factor}; must be "
                          "positive (the multiplier falls to 1 over this many runs)")
    if r.p <= 0:
        raise ConfigError(f"{where}.p: got {r.p}; the order of ln_norm must be positive")
    if r.steps < 0:
        raise ConfigError(f"{where}.steps: got {r.steps}; the steps of each row a distance "
                          "reads, 0 for all of them")
    if r.type == "attentive" and r.reference_rows < 1:
        raise ConfigError(f"{where}.reference_rows: got {r.reference_rows}; attentive replay "
                          "needs at least one reference state")


def validate(cfg: DictConfig) -> None:
    a = cfg.algo
    checks = [
        (a.fragment_length > 0, "fragment_length", "must be positive"),
        (a.batch_size > 0, "batch_size", "must be positive"),
        (a.optimizer in ("rmsprop", "adam", "amsgrad"), "optimizer",
         f"got {a.optimizer!r}; use rmsprop, adam or amsgrad"),
        (a.lr_schedule in ("constant", "linear"), "lr_schedule", f"got {a.lr_schedule!r}; use constant or linear"),
        (a.lr > 0, "lr", "must be positive"),
        (a.eps > 0, "eps", "must be positive"),
        (0 < a.gamma <= 1, "gamma", "must be in (0, 1]"),
        (min(a.rho_bar, a.c_bar, a.pg_rho_bar) > 0, "rho_bar", "rho_bar, c_bar and pg_rho_bar must be positive"),
        (0 <= a.vtrace_lambda <= 1, "vtrace_lambda", "must be in [0, 1]"),
        (a.max_grad_norm > 0, "max_grad_norm", "must be positive"),
        (min(a.clear_policy_coef, a.clear_value_coef) >= 0, "clear_policy_coef",
         "CLEAR weights must be zero (off) or positive"),
        (a.laser_kl_threshold is None or a.laser_kl_threshold > 0, "laser_kl_threshold",
         "must be positive (or null for off)"),
        (min(a.fragments_per_call, a.updates_per_call, a.prefetch, a.publish_every) > 0,
         "fragments_per_call", "fragments_per_call, updates_per_call, prefetch and publish_every "
         "must be positive"),
    ]
    require_algo(checks)
    check_learner_batch(cfg)
    from walle_ray.topology import parse_topology

    check_replay(a, learner_batch(cfg), parse_topology(cfg.topology.spec).learners)
    if cfg.model.get("_target_") and any(r.type in RANKED and r.dist_function != "kl" for r in a.replay):
        raise ConfigError("algo.replay: ranking by ln_norm or cosine compares the built-in "
                          "network's state encodings, which model._target_ does not define; "
                          "use {type: elite, dist_function: kl}")
    if cfg.memory.checkpoint and all(r.type == "queue" for r in a.replay):
        raise ConfigError("memory.checkpoint: this memory mix holds only the on-policy queue, "
                          "whose fragments are used once; snapshots keep replay buffers")
    # The running statistics count fresh (queue) rows only, so each row counts once.
    if not any(r.type == "queue" for r in a.replay):
        for key in ("normalize_obs", "normalize_reward"):
            if cfg.env[key]:
                raise ConfigError(f"env.{key}: the running statistics count fresh rows, and a "
                                  "memory mix without a queue has none; add "
                                  "{type: queue, ratio: ...} to algo.replay or set "
                                  f"env.{key}=false")


IMPALA = Algorithm(name="impala", config_cls=IMPALAConfig, loop="async", make_update=make_update,
                   fragment_length=configured_fragment_length, validate=validate,
                   check_spaces=check_policy_spaces("IMPALA"), sampler_spec=sampler_spec,
                   memory_spec=memory_spec, packed_learner=packed_as_is, recurrent=True,
                   deals_rows=True, estimate_memory=memory_needs)
