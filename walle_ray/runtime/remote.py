"""The one place that turns role classes into Ray actors.

Workers here only move references: weights and fragments stay in the object store and are
read zero-copy where they are used.
"""

from __future__ import annotations

import socket

import ray

from walle_ray.actors.param_server import ParameterServer
from walle_ray.actors.sampler import Sampler
from walle_ray.buffers.fifo import FIFOMemory
from walle_ray.learners import Learner


class SamplerWorker:
    """A Sampler that pulls newer weights from the parameter server before each fragment."""

    def __init__(self, weights_source, *sampler_args, **sampler_kwargs):
        self.source = weights_source
        self.sampler = Sampler(*sampler_args, **sampler_kwargs)

    def _pull(self) -> None:
        latest = ray.get(self.source.latest.remote(self.sampler.version))
        if latest is not None:
            version, box = latest
            self.sampler.set_weights(ray.get(box[0]), version)

    @ray.method(num_returns=2)
    def collect(self):
        self._pull()
        return self.sampler.collect()


class LearnerWorker:
    """A Learner that reads fragments from its memories and publishes weights by reference.

    It also serves as the parameter server when the topology has none (``...0p``).
    """

    def __init__(self, *learner_args, **learner_kwargs):
        self.learner = Learner(*learner_args, **learner_kwargs)
        self.ps = ParameterServer()

    def group_address(self) -> tuple[str, int]:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def join_group(self, address: str, port: int, rank: int, world_size: int) -> None:
        self.learner.join_group(address, port, rank, world_size)

    def learn(self, memories: list, env_steps: int) -> dict:
        taken = ray.get([m.take.remote() for m in memories])
        refs = [box[0] for items in taken for box in items]
        return self.learner.update(ray.get(refs), env_steps)

    def publish(self, ps=None) -> int:
        version, weights = self.learner.weights()
        box = [ray.put(weights)]
        if ps is None:
            self.ps.publish(version, box)
        else:
            ray.get(ps.publish.remote(version, box))
        return version

    def latest(self, have_version: int = -1):
        return self.ps.latest(have_version)

    def state_dict(self) -> dict:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state)

    def close(self) -> None:
        self.learner.close()


RemoteSampler = ray.remote(SamplerWorker)
RemoteLearner = ray.remote(LearnerWorker)
# Defined from their own light modules, so memory and parameter-server processes import
# neither torch nor the environments.
RemoteMemory = ray.remote(FIFOMemory)
RemoteParameterServer = ray.remote(ParameterServer)
