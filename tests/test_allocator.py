"""Role processes keep freed memory for reuse (runtime/process.py)."""

import subprocess
import sys

import pytest

PROBE = """
import resource, sys
import numpy as np
from walle_ray.runtime.process import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def step():  # like an update: a few large activations alive at once, then freed
    return [np.ones(16 << 20, np.uint8) for _ in range(4)]
for _ in range(3):  # let malloc settle
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def faults_per_step(how: str) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE, how], capture_output=True, text=True,
                         check=True)
    return float(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_freed_large_blocks_are_reused_rather_than_faulted_in_again():
    # By default part of the heap's freed top is given back after each step and its pages
    # fault in again on the next (4 KiB each: 4096 per 16 MiB block).
    assert faults_per_step("default") > 1000
    assert faults_per_step("keep") < 50
