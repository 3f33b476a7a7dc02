"""The one place that turns role classes into Ray actors: the sampler, learner, memory
and parameter-server processes (``runtime/sampler_worker.py``, ``learner_worker.py``, and
``memory_worker.py`` for the last two).

Weights are put in the object store once per version and passed by reference; fragments
travel as task results and arguments, read zero-copy from the object store where they land.
"""

from __future__ import annotations

import ray

from walle_ray.runtime.learner_worker import LearnerWorker
from walle_ray.runtime.memory_worker import AsyncMemoryWorker, ParameterServerWorker
from walle_ray.runtime.role_process import MemoryRef
from walle_ray.runtime.sampler_worker import MainThreadSamplerWorker, SamplerWorker, SlotSpec

__all__ = ["MemoryRef", "SlotSpec", "RemoteSampler", "RemoteMainThreadSampler", "RemoteLearner",
           "RemoteAsyncMemory", "RemoteParameterServer"]


RemoteSampler = ray.remote(concurrency_groups={"watch": 1})(SamplerWorker)
RemoteMainThreadSampler = ray.remote(MainThreadSamplerWorker)
RemoteLearner = ray.remote(concurrency_groups={"weights": 1, "watch": 1})(LearnerWorker)
# Defined in a light module of their own, so memory and parameter-server processes import
# neither torch nor the environments.
RemoteAsyncMemory = ray.remote(AsyncMemoryWorker)
RemoteParameterServer = ray.remote(ParameterServerWorker)
