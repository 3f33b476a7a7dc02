"""Typed configuration: one dataclass per component, registered with Hydra's ConfigStore.

YAML files under ``walle_ray/conf/`` only select and override these; a misspelled key or a value of
the wrong type is rejected by Hydra with the key named. ``validate`` adds the range checks
that types cannot express.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


CONF_DIR = Path(__file__).resolve().parent / "conf"  # the shipped configs, inside the package


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and the fix."""


@dataclass
class RunConfig:
    """Budgets, seeding, checkpointing and resumption of one run."""

    seed: int = 0  # seed for envs, networks and sampling
    total_env_steps: int = 100_000  # stop after this many env steps
    max_wall_s: Optional[float] = None  # stop after this many seconds of wall clock
    # Stop once the windowed mean return reaches this (a synchronous run before the update
    # after the episodes that reached it, so that its checkpoint keeps the weights that
    # played them; with algo.overlap its learners go back one update)
    stop_at_return: Optional[float] = None
    return_window: int = 20  # episodes in the mean return that is reported and compared
    # Returns whose first crossing (the windowed mean) the run records with its wall minutes,
    # agent steps and core-hours so far; run.stop_at_return is always one. Shipped envs set
    # their own (conf/env/*.yaml), e.g. [0, 10, 17, 20] for Pong
    milestones: List[float] = field(default_factory=list)
    checkpoint_every: int = 25  # iterations between checkpoints (one is always written at the end)
    resume: Optional[str] = None  # run directory to continue from its last checkpoint
    checkpoint: Optional[str] = None  # checkpoint file for mode=eval
    # Import and call the code that a checkpoint's config or a resumed run's stored overrides
    # name (CODE_KEYS, a module:EnvId id, config directories); false: only the code this
    # command names itself (docs/faults.md, "Files from elsewhere")
    trust_code: bool = False
    report_every_s: float = 5.0  # seconds between metrics records of asynchronous algorithms
    role_timeout_s: float = 600.0  # longest wait for any role's answer before the run stops
    max_restarts: int = 3  # learner/memory deaths survived by rebuilding from the last checkpoint
    # A role whose own work (env steps, updates) makes no progress for this long is stalled:
    # named, its threads' stacks written to <run dir>/stalls/, restarted like a dead one
    # (docs/faults.md, "Stalled roles"); null: never, and samplers step on their process's
    # main thread. Until a process's first call has ended with progress (envs made, the first
    # update compiled) it gets stall_start_s, as do memories and the parameter server.
    stall_s: Optional[float] = 120.0
    stall_start_s: float = 300.0
    ray_address: Optional[str] = None  # Ray cluster to join; None: RAY_ADDRESS or a local instance
    ray_num_cpus: Optional[int] = None  # CPUs of a local Ray instance; None: all cores
    # Start samplers and learners with torch imported before they join Ray: their loops run
    # faster that way (walle_ray/runtime/preload.py, docs/performance.md)
    ray_preload: bool = True


@dataclass
class EnvConfig:
    """Which environment, and how each sampler steps its vector of copies."""

    name: str = "cartpole"  # short name, used in run directory names
    id: str = "CartPole-v1"  # gymnasium id; ids starting with ALE/ use ale_py.AtariVectorEnv
    envs_per_sampler: int = 4  # environments each sampler steps as one batch
    max_episode_steps: Optional[int] = None  # time limit; None keeps the env's own
    normalize_obs: bool = False  # running mean/std observation normalisation in the model
    normalize_reward: bool = False  # scale rewards by the std of the discounted return
    kwargs: Any = field(default_factory=dict)  # extra keyword arguments for gymnasium.make
    # Your own envs (docs/user_code.md, "Your own environment"): modules every process
    # imports before it makes envs, e.g. [my_pkg.envs]; gymnasium's 'my_pkg.envs:Corridor-v0'
    # in env.id does the same for one module.
    imports: list = field(default_factory=list)
    entry_point: Optional[str] = None  # 'my_pkg.envs:Corridor': made with env.kwargs, no registration
    # gymnasium wrappers put around each env, innermost first, in every process that makes
    # envs: [{_target_: gymnasium.wrappers.ClipReward, max_reward: 1.0}, ...]; '_target_' is
    # 'package.module.Name' or 'package.module:Name', the other keys its keyword arguments.
    # Not for ALE ids (ale_py's C++ vector env has no gymnasium env to wrap).
    wrappers: list = field(default_factory=list)
    # Where the env says which actions are allowed (docs/user_code.md, "Action masks"): obs
    # (a Dict observation's 'action_mask' entry), info (info['action_mask']), none, or auto:
    # whichever of the two the env has. Policies act, learn and evaluate over allowed actions.
    action_mask: str = "auto"
    # Atari only (ale_py.AtariVectorEnv)
    obs_size: int = 84  # square frame size: 84 (Nature DQN) or 42 (EasyRL)
    frame_stack: int = 4  # frames stacked per observation
    frame_skip: int = 4  # emulator frames per agent step
    episodic_life: bool = False  # end an episode (for learning) at each life lost
    repeat_action_probability: float = 0.0  # sticky actions
    noop_max: int = 30  # random no-ops at reset
    clip_rewards: bool = True  # learn from sign(reward); metrics keep the raw score
    env_threads: int = 1  # C++ threads per AtariVectorEnv


@dataclass
class TopologyConfig:
    """Role counts as ``<A>a<M>m<L>l[<P>p]`` or ``local``, plus optional CPU shares."""

    spec: str = "2a1m1l"  # e.g. 32a4m4l; ``local`` runs every role in this process; ``auto`` chooses
    sampler_cpus: Optional[float] = None  # CPUs per sampler actor; None: fit the cluster
    learner_cpus: Optional[float] = None  # CPUs per learner actor; None: fit the cluster
    # With at least one CPU per sampler in the cluster, pin sampler actor i and the env
    # threads it starts to CPU i mod (its node's usable CPUs); Linux only. An Atari sampler
    # hands every step to its env thread and back: on one CPU, neither migrates. Turn it
    # off when several runs share a machine, or they pin to the same CPUs.
    pin_samplers: bool = True
    # Logical roles packed into fewer processes when the cluster has fewer CPUs than the
    # topology has samplers and learners: auto, off (one process per role), or a number of
    # sampler processes (README, "Topology")
    pack: str = "auto"
    # A sampler process that runs 2 or more logical samplers of an algorithm that deals
    # fragments' rows across memories (IMPALA) steps them together: one vector env of
    # env.envs_per_sampler envs (rounded up to a multiple of the memories), one policy call
    # a step: few CPUs then step as many envs as one sampler per CPU would, episodes end as
    # often, and the data is as fresh. false: each runs its
    # env.envs_per_sampler envs in turn (docs/performance.md, "Many envs on few cores")
    lanes: bool = True
    # Custom Ray resources each role process asks for, by role, to place roles on chosen
    # nodes: topology.resources={learner: {trainer: 1}} puts learner processes only on nodes
    # started with ray start --resources='{"trainer": 1}' (README, "Cluster"); roles are
    # sampler, memory, learner and ps
    resources: Any = None
    # topology=auto: seconds its calibration may measure the costs on this machine, when the
    # cache has none for this CPU, algorithm, env and network (docs/topology_auto.md)
    auto_calibrate_s: float = 10.0


@dataclass
class LearnerConfig:
    """Where learners run."""

    num_gpus: float = 0.0  # GPUs per learner actor; >0 fails fast when the cluster has none
    # Intra-op threads of a learner; 0: its CPU share, at least 1, where a synchronous CPU
    # learner (one, not compiled) times its first updates with those and with one and keeps
    # the faster (runtime/threads.py)
    torch_threads: int = 0
    group_timeout_s: float = 120.0  # how long learners wait for each other in a collective
    on_nonfinite: str = "skip"  # a NaN/inf loss or gradient: skip that step, or stop the run


@dataclass
class ModelConfig:
    """Network shape shared by the algorithms."""

    hidden: List[int] = field(default_factory=lambda: [64, 64])  # MLP layer widths
    activation: str = "tanh"  # tanh | relu
    log_std_init: float = 0.0  # initial log-std of a Gaussian policy
    ortho_init: bool = True  # orthogonal init with small policy-head gain
    # Image torso under bfloat16 autocast: auto (only where the CPU or GPU computes bfloat16
    # natively; elsewhere it is emulated and much slower), true or false
    bf16: str = "auto"
    # A recurrent core between torso and heads (PPO, PPO-KL, IMPALA): lstm | gru | None
    core: Optional[str] = None
    core_size: int = 256  # the core's hidden units
    # PPO with a core learns on sequences of this many steps, each unrolled from its state at
    # its start, so minibatches follow algo.minibatch_size as for a feed-forward network
    seq_len: int = 32
    # Replayed rows: unroll the core over their first burn_in steps from the stored state,
    # without gradient, and learn from the rest (R2D2); 0: start from the stored state
    burn_in: int = 0
    # Your own network (docs/user_code.md, "Your own network"): 'my_pkg.nets:MyActorCritic'
    # (or Hydra's 'my_pkg.nets.MyActorCritic'), called as target(obs_space, action_space, model_cfg,
    # **model.kwargs) in every process that builds the model; None: the built-in network
    _target_: Optional[str] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)  # extra keyword arguments for _target_


@dataclass
class LoggerConfig:
    """Console progress and metrics.jsonl always; W&B with ``logger=wandb``; TensorBoard with
    ``logger=tensorboard``, or both with ``logger=[wandb,tensorboard]``."""

    name: str = "console"  # console | wandb
    tensorboard: bool = False  # also TensorBoard event files in <run dir>/tensorboard
    progress: str = "auto"  # auto | line | off: live line on a TTY, periodic lines otherwise
    print_every_s: float = 10.0  # seconds between progress lines when not on a TTY
    ray_metrics: bool = True  # Ray gauges (walle_*) for the dashboard's Prometheus/Grafana
    # W&B (logger=wandb)
    mode: str = "auto"  # auto (online with a key, else offline) | online | offline | disabled
    project: str = "walle_ray"
    entity: Optional[str] = None  # team or user; None: the key's default
    group: Optional[str] = None  # groups seeds of one setting in the W&B UI
    tags: List[str] = field(default_factory=list)
    run_name: Optional[str] = None  # None: the run directory's name
    init_timeout_s: float = 90.0  # give up on reaching W&B after this long


@dataclass
class MemoryConfig:
    """What happens to the memories' contents across checkpoints."""

    checkpoint: bool = False  # snapshot replay shards into each checkpoint; restored on resume


@dataclass
class EvalConfig:
    """Greedy evaluation: mode=eval from a checkpoint, or periodically during training."""

    episodes: int = 10  # episodes to run
    deterministic: bool = True  # greedy actions (argmax or the Gaussian mean)
    # One MP4 per episode. mode=eval: into eval.video_dir. Training with eval.every_env_steps:
    # each evaluation's into <eval.video_dir>/<env_steps>/, also logged to W&B (logger=wandb)
    video: bool = False
    video_dir: Optional[str] = None  # where the MP4s go; None: the (checkpoint's) run dir's videos/
    every_env_steps: Optional[int] = None  # training: evaluate every this many env steps (eval/return)


@dataclass
class DatasetConfig:
    """Recorded episodes the offline algorithms (algo=bc, algo=marwil) learn from."""

    # A Minari dataset: its directory (what mode=collect wrote, or its data/ folder), the id
    # of one Minari holds locally (mujoco/halfcheetah/expert-v0), or a list of them read as one
    path: Any = None


@dataclass
class CollectConfig:
    """mode=collect: episodes of a checkpoint's policy (or of random actions) into a Minari
    dataset."""

    episodes: Optional[int] = None  # whole episodes to record (or collect.steps, or both:
    steps: Optional[int] = None  # whichever comes first), stopping at an episode's end
    out: Optional[str] = None  # the dataset directory; None: <the checkpoint's run dir>/dataset
    deterministic: bool = False  # greedy actions (the head's mode) instead of sampled ones
    random: bool = False  # uniform random actions on env=..., no checkpoint
    random_prob: float = 0.0  # each of the checkpoint's actions is a random one with this probability
    envs: int = 4  # envs stepped as one batch
    name: Optional[str] = None  # the dataset's Minari id; None: walle_ray/<env>/<out's name>-v0


@dataclass
class Config:
    """The root of every run's configuration."""

    algo: Any = MISSING  # one of the algorithm configs, chosen by ``algo=<name>``
    env: EnvConfig = field(default_factory=EnvConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    run: RunConfig = field(default_factory=RunConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    mode: str = "train"  # train | eval | collect


# The keys whose values name code that building an env or a network imports and calls;
# env.id does too when it is gymnasium's 'module:EnvId', and so may an env's keyword
# argument written that way (an env that makes another by id: ``MODULE_REF``).
CODE_KEYS = ("env.imports", "env.entry_point", "env.wrappers", "model._target_")
# 'module:...': gymnasium imports the module before it reads what follows the colon
MODULE_PREFIX = r"[A-Za-z_][\w.]*:"
MODULE_REF = re.compile(r"\s*" + MODULE_PREFIX)


def env_name(env_id: str, entry_point: Optional[str] = None) -> str:
    """A short name for an env that has no config file: ``my_pkg.envs:Corridor-v0``,
    ``ALE/Breakout-v5`` and the entry point ``my_pkg.envs:Corridor`` give ``corridor``,
    ``breakout`` and ``corridor``."""
    name = entry_point or env_id or "env"
    name = re.split(r"[:/.]", name)[-1]
    name = re.sub(r"-v\d+$", "", name)
    return re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_") or "env"


# conf/env/custom.yaml names an env by its id. Registered on import, so any process that reads
# a config (a learner receives the driver's) can resolve it.
OmegaConf.register_new_resolver("walle_env_name", lambda env_id, entry_point=None:
                                env_name(env_id, entry_point), replace=True)


def register_schema() -> None:
    """Register the root schema with Hydra (``algos.register_configs`` adds each
    algorithm's)."""
    ConfigStore.instance().store(name="walle_config", node=Config)


ROLE_KINDS = ("sampler", "memory", "learner", "ps")  # topology.resources' keys


def validate_role_resources(resources) -> None:
    """``topology.resources``: a mapping from role to a mapping of custom resource name to
    amount (CPUs and GPUs have settings of their own)."""
    key = "topology.resources"
    example = "e.g. topology.resources={learner: {trainer: 1}}"
    if resources is None:
        return
    require(isinstance(resources, Mapping), key, f"got {resources!r}; {example}")
    for role, asks in resources.items():
        require(role in ROLE_KINDS, f"{key}.{role}", f"is not a role; use {', '.join(ROLE_KINDS)}")
        require(isinstance(asks, Mapping), f"{key}.{role}", f"got {asks!r}; {example}")
        for name, amount in asks.items():
            require(name not in ("CPU", "GPU", "memory", "object_store_memory"),
                    f"{key}.{role}.{name}", "is Ray's own; CPUs and GPUs come from "
                    "topology.sampler_cpus, topology.learner_cpus and learner.num_gpus")
            require(isinstance(amount, (int, float)) and not isinstance(amount, bool)
                    and amount > 0, f"{key}.{role}.{name}", f"got {amount!r}; use a positive number")


def require(ok: bool, key: str, message: str) -> None:
    """Raise ConfigError("<key>: <message>") unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}: {message}")


def validate(cfg: DictConfig) -> None:
    """The schema's range checks, those that the types cannot express and that need no
    algorithm; raises ConfigError naming the key. ``algos.validate`` adds the checks that
    need the algorithm."""
    require(cfg.mode in ("train", "eval", "collect"), "mode",
            f"got {cfg.mode!r}; use train, eval or collect")
    require(cfg.run.total_env_steps > 0, "run.total_env_steps", "must be positive")
    require(cfg.run.max_wall_s is None or cfg.run.max_wall_s > 0, "run.max_wall_s",
            "must be positive (or null for no limit)")
    require(cfg.run.return_window > 0, "run.return_window", "must be positive")
    require(all(math.isfinite(m) for m in cfg.run.milestones), "run.milestones",
            f"got {list(cfg.run.milestones)}; list finite returns, e.g. [0, 10, 17]")
    require(cfg.run.report_every_s > 0, "run.report_every_s", "must be positive")
    require(cfg.run.role_timeout_s > 0, "run.role_timeout_s", "must be positive")
    require(cfg.run.max_restarts >= 0, "run.max_restarts", "must be zero or positive")
    require(cfg.run.stall_s is None or cfg.run.stall_s > 0, "run.stall_s",
            "must be positive, or null to never look for stalled roles")
    require(cfg.run.stall_s is None or cfg.run.stall_s <= cfg.run.stall_start_s
            < cfg.run.role_timeout_s, "run.stall_start_s",
            "must be at least run.stall_s and below run.role_timeout_s, which stops the run "
            "when a role does not answer")
    require(cfg.run.checkpoint_every > 0, "run.checkpoint_every", "must be positive")
    require(cfg.env.envs_per_sampler > 0, "env.envs_per_sampler", "must be positive")
    require(cfg.env.max_episode_steps is None or cfg.env.max_episode_steps > 0,
            "env.max_episode_steps", f"got {cfg.env.max_episode_steps}; use a positive number "
            "of steps, or null to keep the env's own time limit")
    require(cfg.env.action_mask in ("auto", "obs", "info", "none"), "env.action_mask",
            f"got {cfg.env.action_mask!r}; use auto, obs (a Dict observation's 'action_mask'), "
            "info (info['action_mask']) or none")
    require(cfg.env.obs_size in (42, 84), "env.obs_size", f"got {cfg.env.obs_size}; use 42 or 84")
    require(cfg.env.frame_stack > 0, "env.frame_stack", "must be positive")
    require(cfg.env.frame_skip > 0, "env.frame_skip", "must be positive")
    require(cfg.learner.num_gpus >= 0, "learner.num_gpus", "must be zero or positive")
    require(cfg.learner.on_nonfinite in ("skip", "stop"), "learner.on_nonfinite",
            f"got {cfg.learner.on_nonfinite!r}; use skip or stop")
    require(cfg.model.activation in ("tanh", "relu"), "model.activation",
            f"got {cfg.model.activation!r}; use tanh or relu")
    require(len(cfg.model.hidden) > 0 and all(h > 0 for h in cfg.model.hidden),
            "model.hidden", "needs one or more positive layer widths")
    require(cfg.model.burn_in >= 0, "model.burn_in", "must be zero or positive")
    require(cfg.model.core in (None, "lstm", "gru"), "model.core",
            f"got {cfg.model.core!r}; use lstm, gru or null")
    require(cfg.model.core_size > 0, "model.core_size", "must be positive")
    require(cfg.model.seq_len > 0, "model.seq_len", "must be positive")
    target = cfg.model._target_
    require(target is None or (bool(target.strip()) and ("." in target or ":" in target)
                                and not target.startswith((".", ":"))),
             "model._target_", f"got {target!r}; write it as 'package.module:ClassOrFunction'")
    require(target is not None or not cfg.model.kwargs, "model.kwargs",
            "are arguments for your own network; set model._target_ too, or leave them out")
    require(cfg.logger.name in ("console", "wandb"), "logger.name",
            f"got {cfg.logger.name!r}; use console (metrics.jsonl and the progress line) "
            "or wandb (the same, plus Weights & Biases); for TensorBoard choose "
            "logger=tensorboard or logger=[wandb,tensorboard] (logger.tensorboard=true)")
    require(cfg.logger.mode in ("auto", "online", "offline", "disabled"), "logger.mode",
            f"got {cfg.logger.mode!r}; use auto, online, offline or disabled")
    require(cfg.logger.progress in ("auto", "line", "off"), "logger.progress",
            f"got {cfg.logger.progress!r}; use auto, line or off")
    require(cfg.eval.episodes > 0, "eval.episodes", "must be positive")
    require(cfg.eval.every_env_steps is None or cfg.eval.every_env_steps > 0,
            "eval.every_env_steps", "must be positive (or null for no evaluation in training)")
    for key in ("sampler_cpus", "learner_cpus"):
        value = cfg.topology[key]
        require(value is None or value > 0, f"topology.{key}", "must be positive (or null)")
    pack = str(cfg.topology.pack)
    require(pack in ("auto", "off") or (pack.isdigit() and int(pack) > 0), "topology.pack",
            f"got {pack!r}; use auto, off or a positive number of sampler processes")
    require(0 < cfg.topology.auto_calibrate_s <= 120, "topology.auto_calibrate_s",
            f"got {cfg.topology.auto_calibrate_s}; use seconds in (0, 120]")
    validate_role_resources(cfg.topology.resources)


def to_container(cfg: DictConfig) -> dict:
    """The config as plain dicts and lists (for checkpoints and metadata)."""
    return OmegaConf.to_container(cfg, resolve=True)
