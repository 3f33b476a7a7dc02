"""Recorded episodes as Farama Minari datasets: finding one (``dataset.path``), checking it
against the env, reading a shard of its episodes, and writing one (``mode=collect``).

A dataset is a Minari data directory (``metadata.json`` and the episodes beside it). It is
named by that directory, by the dataset directory above it (Minari's own layout,
``<dir>/data/``), or by the id of a dataset Minari holds locally
(``mujoco/halfcheetah/expert-v0`` after ``minari download``). ``minari`` is imported only
here, so that processes that never touch a dataset never load it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import gymnasium as gym
import numpy as np

from walle_ray.config import ConfigError

METADATA = "metadata.json"


def dataset_paths(path) -> list[str]:
    """``dataset.path`` as a list: one dataset, or several read as one (a list)."""
    if path is None:
        return []
    if isinstance(path, str):
        return [path]
    return [str(p) for p in path]


def data_dir(path: str) -> Path:
    """The Minari data directory ``path`` names (see the module docstring); ConfigError
    when there is none."""
    given = Path(path).expanduser()
    for candidate in (given, given / "data"):
        if (candidate / METADATA).is_file():
            return candidate.resolve()
    if not given.exists() and "/" in path and not path.startswith((".", "/", "~")):
        from minari.storage import get_dataset_path

        local = get_dataset_path(path) / "data"
        if (local / METADATA).is_file():
            return local
    raise ConfigError(f"dataset.path: no Minari dataset at {path!r} (no {METADATA} there or in "
                      f"its data/ folder, and no local Minari dataset of that id); record one with "
                      f"python -m walle_ray mode=collect run.checkpoint=<ckpt> collect.out=<dir>, "
                      f"or download one with minari download <id>")


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset says of itself, without reading its episodes."""

    path: Path
    observation_space: gym.Space
    action_space: gym.Space
    episodes: int
    steps: int
    env_id: str | None  # the id of the env it was recorded from, when it names one


def dataset_info(path: str) -> DatasetInfo:
    """What the dataset at ``path`` says of itself; ConfigError when it cannot be read (a
    storage backend that is not installed, metadata without its spaces)."""
    where = data_dir(path)
    try:
        storage = read_storage(where)  # imports the storage's backend (h5py, pyarrow)
        meta = json.loads((where / METADATA).read_text())
        env_id = json.loads(meta["env_spec"]).get("id") if meta.get("env_spec") else None
        return DatasetInfo(where, storage.observation_space, storage.action_space,
                           int(storage.total_episodes), int(storage.total_steps), env_id)
    except ConfigError:
        raise
    except ImportError as exc:
        raise ConfigError(f"dataset.path: reading {where} needs a package that is not "
                          f"installed ({first_line(exc)}); pip install 'minari[hdf5]' "
                          "(or 'minari[arrow]' for an arrow dataset)") from None
    except (KeyError, ValueError, TypeError, OSError) as exc:
        raise ConfigError(f"dataset.path: {where} is not a readable Minari dataset "
                          f"({type(exc).__name__}: {first_line(exc)})") from None


def read_storage(where: Path):
    """Minari's reader of the data directory ``where``, once its metadata holds both spaces
    as data: without one, Minari makes the env its stored ``env_spec`` names to learn it,
    which imports and runs whatever that spec's entry point is. A ConfigError names the
    key that is missing or unreadable."""
    from minari.dataset.minari_storage import MinariStorage
    from minari.serialization import deserialize_space

    try:
        meta = json.loads((where / METADATA).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"dataset.path: {where / METADATA} cannot be read "
                          f"({type(exc).__name__}: {first_line(exc)})") from None
    for key in ("observation_space", "action_space"):
        space = meta.get(key) if isinstance(meta, dict) else None
        if not isinstance(space, str):
            raise ConfigError(f"dataset.path: {where / METADATA} has no {key!r}; walle_ray reads "
                              "a dataset whose metadata holds both spaces, and makes no env to "
                              "learn them")
        try:
            deserialize_space(space)
        except Exception as exc:  # any failure of Minari's parser: not a space it can read
            raise ConfigError(f"dataset.path: {where / METADATA} holds a {key!r} that is not a "
                              f"space ({type(exc).__name__}: {first_line(exc)})") from None
    return MinariStorage.read(where)


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def same_space(a: gym.Space, b: gym.Space) -> bool:
    """Whether a policy for space ``a`` reads (or writes) values of space ``b``: the same
    kind, shape and size; float widths may differ (envs give float32 where Minari keeps the
    env's float64)."""
    if type(a) is not type(b) and not (isinstance(a, gym.spaces.Box) and isinstance(b, gym.spaces.Box)):
        return False
    if isinstance(a, gym.spaces.Discrete):
        return a.n == b.n and a.start == b.start
    if isinstance(a, gym.spaces.MultiDiscrete):
        return np.array_equal(a.nvec, b.nvec) and np.array_equal(a.start, b.start)
    return a.shape == b.shape


def check_datasets(paths: list[str], obs_space: gym.Space, action_space: gym.Space,
                   env_id: str, memories: int) -> list[DatasetInfo]:
    """The datasets ``dataset.path`` names, each checked against the env a run acts in and
    evaluates on (and its first episode for NaN or inf), and together against the memories
    that shard their episodes."""
    infos = [dataset_info(p) for p in paths]
    for info in infos:
        for what, theirs, ours in (("observations", info.observation_space, obs_space),
                                   ("actions", info.action_space, action_space)):
            if not isinstance(theirs, (gym.spaces.Box, gym.spaces.Discrete,
                                       gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
                raise ConfigError(f"dataset.path: {info.path} has {what} in {theirs}; walle_ray "
                                  "learns from arrays (Box, Discrete, MultiDiscrete, MultiBinary)")
            if not same_space(theirs, ours):
                source = f" (it was recorded on {info.env_id})" if info.env_id else ""
                masked = (" or, for a dataset recorded without its action mask, "
                          "env.action_mask=none" if what == "observations"
                          and getattr(obs_space, "action_mask", None) else "")
                raise ConfigError(f"dataset.path: {info.path} holds {what} in {theirs}, but "
                                  f"{env_id} has {ours}{source}; choose the env it was recorded "
                                  f"on (env=...){masked}, or record a dataset on this one with "
                                  "mode=collect")
    from minari.dataset.minari_storage import MinariStorage

    for info in infos:  # a whole broken dataset shows in its first episode; memories read all
        if info.episodes:
            first = next(iter(MinariStorage.read(info.path).get_episodes([0])))
            check_finite(first, [str(info.path)])
    if getattr(obs_space, "action_mask", None) is not None:
        check_masked_actions(paths, obs_space, action_space)
    episodes = sum(info.episodes for info in infos)
    if episodes < memories:
        raise ConfigError(f"dataset.path: {episodes} episodes cannot be shared among {memories} "
                          f"memories (each reads whole episodes); use at most {max(1, episodes)} "
                          "memories, or record more episodes")
    return infos


def check_masked_actions(paths: list[str], obs_space: gym.Space, action_space: gym.Space) -> None:
    """Every recorded action is one that its observation's action mask allows (a policy
    that learns from a forbidden one would put all its weight on a log-probability of
    -1e9); a ConfigError names the first that is not."""
    from walle_ray.envs.masks import allows_some, first_columns

    first_column = first_columns(action_space)
    start, stop = obs_space.action_mask
    for e, ep in enumerate(read_episodes(paths, 0, 1)):
        steps = len(ep["actions"])
        if not steps:
            continue
        allowed = np.asarray(ep["observations"][:steps], np.float32)[:, start:stop] > 0.5
        empty = ~allows_some(allowed, first_column).all(1)
        if empty.any():  # the env refuses such a state where a policy acts (envs/masks.py)
            t = int(np.flatnonzero(empty)[0])
            raise ConfigError(f"dataset.path: episode {e} records an action at step {t}, where "
                              "its observation's action_mask allows no action; fix the "
                              "dataset, or learn from it with env.action_mask=none")
        # every row allows some action in each component: the mask is as recorded
        columns = head_actions(np.asarray(ep["actions"]), action_space).reshape(steps, -1) + first_column
        ok = np.take_along_axis(allowed, columns, 1).all(1)
        if not ok.all():
            t = int(np.flatnonzero(~ok)[0])
            raise ConfigError(f"dataset.path: episode {e} takes an action at step {t} that its "
                              "observation's action_mask forbids (recorded with "
                              "env.action_mask=none?); learn from it with env.action_mask=none")


def head_actions(actions: np.ndarray, space: gym.Space) -> np.ndarray:
    """Recorded actions as the action heads take them: indices from 0 (int64) for Discrete
    and MultiDiscrete spaces (Minari stores the env's values, offset by the space's start),
    float32 for Box and MultiBinary."""
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return actions.astype(np.int64) - np.asarray(space.start, np.int64)
    return actions.astype(np.float32)


def read_episodes(paths: list[str], shard: int, shards: int) -> Iterator[dict]:
    """The episodes of shard ``shard`` of ``shards`` across the datasets, in order: episode
    i of their concatenation belongs to shard i mod ``shards``. Each is Minari's dict of
    arrays (``observations`` one longer than ``actions``, ``rewards``, ``terminations``,
    ``truncations``)."""
    offset = 0
    for path in paths:
        storage = read_storage(data_dir(path))
        total = storage.total_episodes
        mine = [i for i in range(total) if (offset + i) % shards == shard]
        for start in range(0, len(mine), 64):  # a few episodes per read
            yield from storage.get_episodes(mine[start:start + 64])
        offset += total


# What the offline algorithms learn from: NaN or inf in any of it is refused (check_finite).
LEARNED = ("observations", "actions", "rewards")


def check_finite(episode: dict, paths: list[str]) -> None:
    """Refuse an episode with NaN or inf in what is learned from (``LEARNED``): every loss
    on it is NaN, each such step is skipped, and the run would end with the policy it
    started with."""
    for key in LEARNED:
        values = np.asarray(episode[key])
        if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
            where = f"episode {episode['id']}" if "id" in episode else "an episode"
            raise ConfigError(f"dataset.path: {', '.join(paths)} holds NaN or inf {key} in "
                              f"{where}; clean the dataset or record it again with mode=collect")


class DatasetWriter:
    """Whole episodes into a new Minari dataset at ``out`` (its data in ``out/data``), a few
    at a time, so that a collection stopped early keeps the episodes it finished."""

    def __init__(self, out: Path, dataset_id: str, obs_space: gym.Space, action_space: gym.Space,
                 env_spec, description: str, algorithm: str):
        import minari
        from minari.dataset.minari_storage import MinariStorage

        self.path = Path(out).resolve() / "data"  # Minari joins a relative one twice
        if (self.path / METADATA).exists():
            raise ConfigError(f"collect.out: {out} already holds a dataset; choose another "
                              "directory or delete that one")
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            self.storage = MinariStorage.new(self.path, observation_space=obs_space,
                                             action_space=action_space, env_spec=env_spec,
                                             data_format="hdf5", jpeg_encoding=False)
        except ImportError as exc:  # Minari writes its metadata before it imports h5py
            (self.path / METADATA).unlink(missing_ok=True)
            raise ConfigError(f"mode=collect writes HDF5 and needs h5py ({first_line(exc)}): "
                              "pip install 'minari[hdf5]'") from None
        self.storage.update_metadata({
            "dataset_id": dataset_id, "minari_version": minari.__version__,
            "algorithm_name": algorithm, "description": description})
        self.pending: list = []
        self.episodes = self.steps = 0

    def add(self, observations: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            terminated: bool, seed: int | None = None) -> None:
        """One episode: T + 1 observations, T actions and rewards; ``terminated``: it ended in
        a terminal state (else a time limit, or the collection, cut it)."""
        from minari.data_collector.episode_buffer import EpisodeBuffer

        steps = len(rewards)
        if steps == 0 or len(observations) != steps + 1 or len(actions) != steps:
            raise ValueError(f"an episode needs T >= 1 actions and rewards and T + 1 "
                             f"observations; got {len(actions)}, {steps} and {len(observations)}")
        term = np.zeros(steps, bool)
        trunc = np.zeros(steps, bool)
        (term if terminated else trunc)[-1] = True
        self.pending.append(EpisodeBuffer(seed=seed, observations=observations, actions=actions,
                                          rewards=np.asarray(rewards, np.float64),
                                          terminations=term, truncations=trunc, infos={}))
        self.episodes += 1
        self.steps += steps
        if len(self.pending) >= 16:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            episodes, self.pending = self.pending, []  # never written twice, even if interrupted
            self.storage.update_episodes(episodes)
