"""The memory role of the offline algorithms (``algo=bc``, ``algo=marwil``): a shard of a
recorded dataset's episodes, served as learner batches. There are no samplers to write to
it; it reads its episodes once, when it is made, and refuses NaN or inf in what it learns
from."""

from __future__ import annotations

import numpy as np

from walle_ray.batch import OfflineBatch
from walle_ray.datasets import check_finite, dataset_info, head_actions, read_episodes


def discounted_to_end(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """``sum_{i>=t} gamma^(i-t) r_i`` for every step t of one episode."""
    out = np.empty(len(rewards), np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


class DatasetMemory:
    """The steps of every ``shards``-th episode of the datasets (``datasets.read_episodes``),
    in memory as flat arrays, served ``batch_size`` rows at a time: each epoch is a fresh
    permutation of the shard's steps, so every step is served once per epoch.

    With ``gamma`` (an advantage-weighted method) each row also gets its discounted return to
    its episode's recorded end and what a learner needs to complete it where a time limit
    cut the episode (``OfflineBatch``); BC passes None and those stay unread.
    """

    free_running = True  # a dataset never runs dry: it starts another epoch

    def __init__(self, paths: list[str], shard: int, shards: int, batch_size: int,
                 gamma: float | None, seed: int):
        obs, actions, ret, tail, episode, finals = [], [], [], [], [], []
        for e, ep in enumerate(read_episodes(paths, shard, shards)):
            steps = len(ep["rewards"])
            if steps == 0:
                continue
            check_finite(ep, paths)
            obs.append(np.asarray(ep["observations"][:steps]))
            actions.append(np.asarray(ep["actions"]))
            if gamma is not None:
                ret.append(discounted_to_end(np.asarray(ep["rewards"], np.float64), gamma))
                cut = not bool(ep["terminations"][-1])
                tail.append(gamma ** np.arange(steps, 0, -1, dtype=np.float64) * cut)
                episode.append(np.full(steps, len(finals), np.int64))
                finals.append(np.asarray(ep["observations"][steps]))
        if not obs:
            raise ValueError(f"dataset memory {shard} of {shards} got no steps from {paths}")
        floats = lambda x: x.astype(np.float32) if np.issubdtype(x.dtype, np.floating) else x  # noqa: E731
        self.obs = floats(np.concatenate(obs))
        self.action = head_actions(np.concatenate(actions), dataset_info(paths[0]).action_space)
        self.ret = np.concatenate(ret).astype(np.float32) if ret else None
        self.tail = np.concatenate(tail).astype(np.float32) if tail else None
        self.episode = np.concatenate(episode) if episode else None
        self.finals = floats(np.stack(finals)) if finals else None
        self.episodes = e + 1
        self.batch_size = batch_size
        self.rng = np.random.default_rng([seed, shard])
        self.order = self.rng.permutation(len(self.obs))
        self.at = 0
        self.served = 0

    def __len__(self) -> int:
        return len(self.obs)

    def has_room(self, item) -> bool:
        return False  # nothing writes to a dataset

    def put(self, item) -> None:
        raise TypeError("a dataset memory is read-only: offline algorithms have no samplers")

    def can_sample(self) -> bool:
        return True

    def sample(self) -> OfflineBatch:
        """The next ``batch_size`` rows of this epoch's permutation, then of the next's."""
        idx = self.order[self.at:self.at + self.batch_size]
        self.at += len(idx)
        while len(idx) < self.batch_size:
            self.order, self.at = self.rng.permutation(len(self.obs)), 0
            more = self.order[:self.batch_size - len(idx)]
            self.at = len(more)
            idx = np.concatenate([idx, more])
        self.served += len(idx)
        if self.ret is None:
            return OfflineBatch(obs=self.obs[idx], action=self.action[idx])
        return OfflineBatch(obs=self.obs[idx], action=self.action[idx], ret=self.ret[idx],
                            tail=self.tail[idx], final_obs=self.finals[self.episode[idx]])

    def stats(self) -> dict:
        rows = len(self.obs)
        return {"dataset_size": rows, "dataset_capacity": rows, "dataset_episodes": self.episodes,
                "sampled": self.served, "epochs": self.served / rows}

    def state_dict(self) -> dict:
        return {}  # the data is on disk; nothing of it is learned

    def load_state_dict(self, state: dict) -> None:
        pass
