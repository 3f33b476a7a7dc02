"""Envs whose actions are not all allowed in every state (``env.action_mask``).

``walle/Othello-v0``: Othello on a 6x6 board against a fixed greedy opponent, where which
moves are legal takes the rules to work out (a move must flip stones); ``walle/RandomMask-v0``:
a fresh random mask every step, for checking that a policy never takes a forbidden action.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from walle_ray.envs.spaces import MASK_KEY

class ForbiddenAction(RuntimeError):
    """A policy took an action its mask forbade (``RandomMaskEnv``)."""


def _rays(size: int) -> list[list[list[int]]]:
    """For each cell, the cells along each of the 8 directions from it, nearest first."""
    rays = []
    for r in range(size):
        for c in range(size):
            cell = []
            for dr, dc in ((-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)):
                ray, rr, cc = [], r + dr, c + dc
                while 0 <= rr < size and 0 <= cc < size:
                    ray.append(rr * size + cc)
                    rr, cc = rr + dr, cc + dc
                if len(ray) >= 2:
                    cell.append(ray)
            rays.append(cell)
    return rays


class OthelloEnv(gym.Env):
    """Othello on a ``size`` x ``size`` board. The agent plays black and moves first
    against a fixed white that plays the move flipping the most stones (ties at random).

    A move is legal where it flips at least one line of the opponent's stones. The last
    action is "pass", legal only when no move is. The game ends when neither side can move.

    Observation: a Dict of ``board`` (the agent's stones, then the opponent's) and
    ``action_mask`` (the legal moves and pass). Reward at the end: +1 for more stones, -1
    for fewer, 0 for a tie. An illegal move loses at once: -1, the episode ends."""

    def __init__(self, size: int = 6):
        self.size = size
        cells = size * size
        self.rays = _rays(size)
        self.observation_space = gym.spaces.Dict({
            "board": gym.spaces.Box(0.0, 1.0, (2 * cells,), np.float32),
            MASK_KEY: gym.spaces.MultiBinary(cells + 1)})
        self.action_space = gym.spaces.Discrete(cells + 1)
        self.board = [0] * cells  # 1: the agent's, -1: the opponent's

    def _flips(self, cell: int, player: int) -> list[int]:
        """The stones a move of ``player`` at ``cell`` would flip (none: not a legal move)."""
        if self.board[cell]:
            return []
        board, flips = self.board, []
        for ray in self.rays[cell]:
            run = []
            for i in ray:
                if board[i] == -player:
                    run.append(i)
                    continue
                if board[i] == player and run:
                    flips += run
                break
        return flips

    def _moves(self, player: int) -> dict[int, list[int]]:
        moves = {}
        for cell in range(len(self.board)):
            flips = self._flips(cell, player)
            if flips:
                moves[cell] = flips
        return moves

    def _play(self, player: int, cell: int, flips: list[int]) -> None:
        self.board[cell] = player
        for i in flips:
            self.board[i] = player

    def _obs(self, moves: dict) -> dict:
        board = np.asarray(self.board)
        mask = np.zeros(len(self.board) + 1, np.int8)
        mask[list(moves) or [len(self.board)]] = 1
        return {"board": np.concatenate([board == 1, board == -1]).astype(np.float32),
                MASK_KEY: mask}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        n, h = self.size, self.size // 2
        self.board = [0] * (n * n)
        self.board[(h - 1) * n + h - 1] = self.board[h * n + h] = -1
        self.board[(h - 1) * n + h] = self.board[h * n + h - 1] = 1
        self.moves = self._moves(1)
        return self._obs(self.moves), {}

    def _end(self) -> tuple[dict, float, bool, bool, dict]:
        score = sum(self.board)
        return self._obs({}), float(np.sign(score)), True, False, {}

    def step(self, action):
        action = int(action)
        if action in self.moves:
            self._play(1, action, self.moves[action])
        elif action != len(self.board) or self.moves:  # a taken cell, a move that flips nothing,
            return self._obs(self.moves), -1.0, True, False, {"illegal": True}  # or passing
        replies = self._moves(-1)
        if replies:
            most = max(len(f) for f in replies.values())
            best = [cell for cell, f in replies.items() if len(f) == most]
            cell = best[int(self.np_random.integers(len(best)))]
            self._play(-1, cell, replies[cell])
        self.moves = self._moves(1)
        if not self.moves and not replies and not self._moves(-1):
            return self._end()
        return self._obs(self.moves), 0.0, False, False, {}


class RandomMaskEnv(gym.Env):
    """A fresh random mask every step (each action allowed with probability ``p``, at least
    one per component); a forbidden action raises ``ForbiddenAction``. Discrete(n) actions,
    or MultiDiscrete(``nvec``). The observation is a Dict of ``x`` (4 random numbers) and
    ``action_mask``, or with ``info_mask`` ``x`` alone and the mask in ``info``. Reward 1 when
    the action is each component's first allowed one; ``length`` steps (truncated). With
    ``empty_at``, the mask at that step of each episode allows nothing (a broken env)."""

    def __init__(self, n: int = 6, nvec=None, p: float = 0.3, length: int = 50,
                 info_mask: bool = False, empty_at: int | None = None):
        self.action_space = (gym.spaces.MultiDiscrete(list(nvec)) if nvec is not None
                             else gym.spaces.Discrete(n))
        self.nvec = np.asarray(nvec if nvec is not None else [n])
        self.p, self.length, self.info_mask, self.empty_at = p, length, info_mask, empty_at
        x = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.observation_space = (x if info_mask else gym.spaces.Dict(
            {"x": x, MASK_KEY: gym.spaces.MultiBinary(int(self.nvec.sum()))}))
        self.starts = np.cumsum(self.nvec) - self.nvec  # each component's first mask entry
        self.t, self.mask = 0, np.ones(int(self.nvec.sum()), np.int8)
        self.first = np.zeros(len(self.nvec), np.int64)  # each component's first allowed action

    def _obs(self):
        parts = []
        for n in self.nvec:
            part = self.np_random.random(n) < self.p
            part[self.np_random.integers(n)] = True
            parts.append(part)
        self.first = np.array([part.argmax() for part in parts])
        self.mask = np.concatenate(parts).astype(np.int8)
        if self.t == self.empty_at:
            self.mask[:] = 0
        x = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        if self.info_mask:
            return x, {MASK_KEY: self.mask.copy()}
        return {"x": x, MASK_KEY: self.mask.copy()}, {}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs()

    def step(self, action):
        chosen = np.atleast_1d(np.asarray(action))
        if not self.mask[self.starts + chosen].all():
            raise ForbiddenAction(f"action {action!r} is forbidden by the mask {self.mask.tolist()}")
        reward = float((chosen == self.first).mean())
        self.t += 1
        obs, info = self._obs()
        return obs, reward, False, self.t >= self.length, info
