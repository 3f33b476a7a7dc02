"""Videos of evaluation episodes: frames from the env, one MP4 per episode.

A frame source's ``take(obs, ended)`` returns the frames produced since its last call,
oldest first, as uint8 [H, W, 3]; after a step that ended an episode the last of them is
the first frame of the next episode (the env resets inside the same step).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import imageio_ffmpeg
import numpy as np
from gymnasium.wrappers import RenderCollection

from walle_ray.config import ConfigError
from walle_ray.envs import Ended
from walle_ray.envs.gym_vector import GymVectorEnv
from walle_ray.runtime.checkpoint import first_line

DEFAULT_FPS = 30.0
MIN_ATARI_SIZE = 168  # pixels; the agent's 84x84 or 42x42 frames are too small to watch


class GymFrames:
    """Frames of the first env of a GymVectorEnv made with ``render_mode="rgb_array"``.

    That env is replaced by itself wrapped in gymnasium's RenderCollection, which renders
    after every step and every reset, so the last frame of an episode survives the reset
    that GymVectorEnv does in the same step. Observations pass through unchanged.
    """

    def __init__(self, vector_env: GymVectorEnv, env_id: str):
        self.env = RenderCollection(vector_env.envs[0], pop_frames=True, reset_clean=False)
        vector_env.envs[0] = self.env
        self.fps = float(self.env.metadata.get("render_fps") or DEFAULT_FPS)
        self._check_render(env_id)

    def take(self, obs: np.ndarray, ended: Ended | None) -> list[np.ndarray]:
        return self.env.render()

    def _check_render(self, env_id: str) -> None:
        """Render one frame now, so a missing display library fails before any episode runs."""
        try:
            with warnings.catch_warnings():  # glfw warns before it fails; the error says it all
                warnings.simplefilter("ignore")
                self.env.reset()
                self.env.render()
        except Exception as exc:  # renderers fail in many ways: ImportError, FatalError, ...
            detail = f"{type(exc).__name__}: {first_line(exc)}"
            if hasattr(self.env.unwrapped, "mujoco_renderer"):
                tried = (f"MUJOCO_GL={os.environ['MUJOCO_GL']}" if os.environ.get("MUJOCO_GL")
                         else "MUJOCO_GL unset, so glfw")
                raise ConfigError(
                    f"eval.video: MuJoCo needs an offscreen OpenGL backend to render {env_id}; "
                    "set MUJOCO_GL=egl (with a GPU driver or Mesa's EGL) or MUJOCO_GL=osmesa "
                    "(apt install libosmesa6), or run with eval.video=false "
                    f"({tried}: {detail})") from None
            raise ConfigError(f"eval.video: cannot render {env_id} ({detail}); "
                              "run with eval.video=false") from None


class AtariFrames:
    """The agent's preprocessed view of an Atari game, not the emulator screen.

    ``ale_py.AtariVectorEnv`` cannot render, so each frame is the newest grayscale frame of
    the agent's stacked observation, repeated to at least 168 pixels a side and to RGB.
    """

    def __init__(self, obs_size: int):
        self.scale = -(-MIN_ATARI_SIZE // obs_size)
        self.fps = DEFAULT_FPS

    def take(self, obs: np.ndarray, ended: Ended | None) -> list[np.ndarray]:
        frames = [obs[0]] if ended is None else [ended.final_obs[0], obs[0]]
        return [self._rgb(stack[-1]) for stack in frames]

    def _rgb(self, gray: np.ndarray) -> np.ndarray:
        big = gray.repeat(self.scale, axis=0).repeat(self.scale, axis=1)
        return np.repeat(big[:, :, None], 3, axis=2)


class Mp4Writer:
    """One H.264 MP4 written frame by frame through imageio-ffmpeg's bundled ffmpeg.

    The size is taken from the first frame; odd widths or heights are padded by one
    repeated edge pixel, since yuv420p needs even sizes.
    """

    def __init__(self, path: Path, fps: float):
        self.path = Path(path)
        self.fps = fps
        self._writer = None

    def add(self, frames: list[np.ndarray]) -> None:
        for frame in frames:
            frame = even_sized(frame)
            if self._writer is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                height, width = frame.shape[:2]
                self._writer = imageio_ffmpeg.write_frames(
                    str(self.path), (width, height), fps=self.fps, codec="libx264",
                    macro_block_size=2, ffmpeg_log_level="error")
                self._writer.send(None)  # start ffmpeg
            self._writer.send(np.ascontiguousarray(frame))

    def close(self) -> Path:
        """Finish the file (ffmpeg writes the index on exit) and return its path."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        return self.path


def even_sized(frame: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3] padded to even H and W by repeating the last row or column."""
    pad_h, pad_w = frame.shape[0] % 2, frame.shape[1] % 2
    if pad_h or pad_w:
        frame = np.pad(frame, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return frame.astype(np.uint8, copy=False)


class EpisodeVideos:
    """Splits a frame source's frames into one MP4 per episode: ``episode-000.mp4``, ...

    The first frame of the episode after the last one wanted is held back, never written,
    so a run leaves exactly one file per finished episode.
    """

    def __init__(self, source: GymFrames | AtariFrames, video_dir: Path):
        self.source = source
        self.video_dir = Path(video_dir)
        self.paths: list[Path] = []
        self._writer: Mp4Writer | None = None
        self._held: list[np.ndarray] = []

    def reset(self, obs: np.ndarray) -> None:
        """Start over after the env was reset; ``obs`` is its first observation."""
        self.close()
        self.paths = []
        # Only the newest frame is the reset's; older ones are of an episode cut off before.
        self._held = self.source.take(obs, None)[-1:]

    def step(self, obs: np.ndarray, ended: Ended | None) -> None:
        """Record the frames of one env step; ``ended`` is what the step returned."""
        frames = self._held + self.source.take(obs, ended)
        self._held = []
        if ended is None or not ended.episode_returns:  # an Atari life lost is no episode end
            self._current().add(frames)
            return
        self._current().add(frames[:-1])
        self.paths.append(self._writer.close())
        self._writer = None
        self._held = frames[-1:]

    def _current(self) -> Mp4Writer:
        if self._writer is None:
            path = self.video_dir / f"episode-{len(self.paths):03d}.mp4"
            self._writer = Mp4Writer(path, self.source.fps)
        return self._writer

    def close(self) -> None:
        """Finish a video cut off mid-episode (a run that raised)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
