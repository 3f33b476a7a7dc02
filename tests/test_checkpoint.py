"""Checkpoints are atomic, and anything but a whole walle_ray checkpoint is refused clearly."""

import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from walle_ray.runtime import checkpoint as ckpt
from walle_ray.runtime.files import temporary_path
from walle_ray.runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

PAYLOAD = {"learner": {"model": {"w": torch.arange(2000.0)}, "version": 3},
           "counters": {"env_steps": 10}, "config": {"env": {"id": "CartPole-v1"}}}


def test_round_trip(tmp_path):
    path = save_checkpoint(tmp_path / "checkpoints" / "last.pt", PAYLOAD)
    loaded = load_checkpoint(tmp_path)  # a run directory finds checkpoints/last.pt
    assert torch.equal(loaded["learner"]["model"]["w"], PAYLOAD["learner"]["model"]["w"])
    assert loaded["counters"] == {"env_steps": 10} and loaded["walle_ray_version"]
    assert path.name == "last.pt" and not list(path.parent.glob(".*tmp*"))


def test_memory_arrays_that_share_an_address_are_saved(tmp_path):
    """Arrays read from Ray's object store lie in one buffer, where the empty arrays of a
    memory that has had no data yet share an address; torch.save refuses two dtypes at one
    address, as it does two views of one array."""
    buffer = np.arange(8, dtype=np.int64)
    empty = {"storage": {}, "ids": buffer[:0], "priority": buffer.view(np.float32)[:0]}
    full = {"storage": {"obs": buffer.view(np.float32)}, "ids": buffer, "priority": buffer[:4]}
    memories = [empty, full]
    save_checkpoint(tmp_path / "last.pt",
                    {**PAYLOAD, "memories": ckpt.arrays_to_tensors(memories)})
    saved = ckpt.tensors_to_arrays(load_checkpoint(tmp_path / "last.pt")["memories"])
    for was, now in zip(memories, saved, strict=True):
        for array, back in ((was["ids"], now["ids"]), (was["priority"], now["priority"]),
                            *((was["storage"][k], now["storage"][k]) for k in was["storage"])):
            assert back.dtype == array.dtype and np.array_equal(back, array)


@settings(max_examples=25, deadline=None)
@given(fraction=st.floats(0.0, 0.999))
def test_truncated_files_are_refused(tmp_path_factory, fraction):
    tmp = tmp_path_factory.mktemp("trunc")
    data = save_checkpoint(tmp / "good.pt", PAYLOAD).read_bytes()
    bad = tmp / "bad.pt"
    bad.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(CheckpointError, match="bad.pt"):
        load_checkpoint(bad)


def test_foreign_files_are_refused(tmp_path):
    torch.save({"model": {}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a walle_ray checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(tmp_path / "text.pt")
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "empty_run")


def test_pickled_code_is_not_executed(tmp_path):
    class Evil:
        def __reduce__(self):
            return (exec, ("raise SystemExit('ran')",))

    import pickle

    (tmp_path / "evil.pt").write_bytes(pickle.dumps({"format": ckpt.FORMAT, "x": Evil()}))
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "evil.pt")


def test_crash_mid_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "last.pt", PAYLOAD)

    def crash(obj, f, *a, **k):
        f.write(b"partial")
        raise OSError("disk went away")

    monkeypatch.setattr(ckpt.torch, "save", crash)
    with pytest.raises(OSError):
        save_checkpoint(path, {**PAYLOAD, "counters": {"env_steps": 99}})
    monkeypatch.undo()
    assert load_checkpoint(path)["counters"] == {"env_steps": 10}
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left


def dead_pid() -> int:
    """The id of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_writers_temporary_file_is_removed_at_the_next_save(tmp_path):
    """One left by ``kill -9`` mid-save can be hundreds of MB (a replay snapshot)."""
    path = tmp_path / "checkpoints" / "last.pt"
    path.parent.mkdir()
    stale = temporary_path(path, dead_pid())
    writing = temporary_path(path, os.getppid())  # its writer still runs
    other = path.with_name(f".best.pt.tmp-{dead_pid()}")  # another file's
    for p in (stale, writing, other):
        p.write_bytes(b"x" * 1000)
    save_checkpoint(path, PAYLOAD)
    assert not stale.exists() and writing.exists() and other.exists()
    assert load_checkpoint(path)["counters"] == {"env_steps": 10}


def test_the_directory_is_fsynced_after_the_rename(tmp_path, monkeypatch):
    """Without it a power cut can leave the rename undone, or the directory without the file."""
    synced = []
    fsync = os.fsync

    def spy(fd):
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    save_checkpoint(tmp_path / "last.pt", PAYLOAD)
    assert synced == ["file", "dir"]
