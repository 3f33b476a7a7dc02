"""One PPO iteration on a learner: advantages, then minibatch epochs with synced gradients."""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from walle_ray.algos.ppo.config import PPOConfig
from walle_ray.algos.ppo.loss import adapt_kl_beta, ppo_clip_loss, ppo_kl_loss
from walle_ray.batch import Rollout, concat_rollouts
from walle_ray.learners.collective import Collective
from walle_ray.learners.optim import make_optimizer, scheduled_lr, set_lr
from walle_ray.learners.reward_scale import update_obs_norm
from walle_ray.learners.update_rule import UpdateRule
from walle_ray.models import ActorCritic
from walle_ray.ops import gae, next_values


@torch.no_grad()
def chunk_sequences(model, state_b: torch.Tensor, L: int, obs_t: torch.Tensor,
                    first_t: torch.Tensor, *step_t: torch.Tensor) -> tuple:
    """A recurrent batch [T, B, ...] cut into sequences of ``L`` steps, [L, B * C, ...] with
    C = ceil(T / L), sequence c of column b at b * C + c, as RLlib's ``max_seq_len`` does.
    Returns (each sequence's state at its start [B * C, S], the mask of steps that are not
    padding [L, B * C], the chunked ``obs_t``, ``first_t`` and ``step_t``).

    The states come from one unroll of ``model`` over the whole batch from the state each
    sampler stored (``state_b``), so a sequence unrolled from its start state gives the
    steps the full unroll gives; a fragment whose length L does not divide is padded at
    its end, and the padding never reaches a real step (a core runs forward in time)."""
    T, B = obs_t.shape[:2]
    C = -(-T // L)
    _, _, states_t = model.unroll(obs_t, state_b, first_t)
    starts = torch.stack([state_b if c == 0 else states_t[c * L - 1] for c in range(C)], 1)

    def chunk(x: torch.Tensor) -> torch.Tensor:
        pad = C * L - T
        if pad:
            x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])
        # [C * L, B, ...] -> [L, B * C, ...]: sequence c of column b at b * C + c
        return x.reshape(C, L, B, *x.shape[2:]).transpose(0, 1).transpose(1, 2).reshape(
            L, B * C, *x.shape[2:])

    valid = chunk(torch.ones(T, B, dtype=torch.bool, device=obs_t.device))
    return (starts.reshape(B * C, -1), valid,
            (chunk(obs_t), chunk(first_t), *(chunk(x) for x in step_t)))


class PPOUpdate(UpdateRule):
    """Minibatch epochs over one batch; keeps the adaptive KL coefficient."""

    def __init__(self, cfg: PPOConfig, model: ActorCritic, collective: Collective,
                 normalize_reward: bool, total_env_steps: int, device: torch.device,
                 seq_len: int = 32):
        """``seq_len``: ``model.seq_len``, the steps of each sequence a recurrent core learns
        on (``chunk_sequences``)."""
        self.seq_len = seq_len
        optimizer = make_optimizer(model.parameters(), "adam", cfg.lr, cfg.adam_eps)
        super().__init__(model, collective, optimizer, normalize_reward, total_env_steps, device)
        # A plain PPOConfig: a DictConfig's attribute reads cost more than a minibatch's
        # arithmetic on a small MLP (docs/performance.md, "PPO's learner step").
        self.cfg = OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg
        self.beta = cfg.kl_beta_init
        # algo.compile: one torch.compile'd function for a minibatch's forward pass and loss
        # (feed-forward models; ``validate`` refuses a recurrent core), eager until it compiles.
        compiles = cfg.compile and compiler_found(device)
        self.compiled = torch.compile(self._forward_loss, dynamic=False) if compiles else None
        self.backward_compiled = False  # AOTAutograd compiles the backward on its first call

    def update(self, rollouts: list[Rollout], env_steps: int) -> dict[str, float]:
        cfg = self.cfg
        batch = concat_rollouts(rollouts)
        reward_t = (self.reward_scaler(batch, self.collective) if self.reward_scaler
                    else batch.reward_t)
        v_tp1 = next_values(batch.v_t, batch.last_v, batch.truncated_t, batch.final_v_t)
        adv_t, target_t = gae(reward_t, batch.v_t, v_tp1, batch.terminated_t, batch.truncated_t,
                              cfg.gamma, cfg.gae_lambda)
        dev = self.device
        # A minibatch is a set of steps; for a recurrent core, a set of sequences of
        # ``seq_len`` steps, each unrolled from its state at its start (``chunk_sequences``;
        # ``forward``, ``pick``).
        recurrent = getattr(self.model, "recurrent", False)
        shape = (lambda x: x) if recurrent else (lambda x: x.reshape(-1, *x.shape[2:]))
        tensor = lambda x: torch.as_tensor(shape(x)).to(dev)  # noqa: E731
        obs, actions = tensor(batch.obs_t), tensor(batch.action_t)
        old_logp, old_dist, old_v = tensor(batch.logp_t), tensor(batch.dist_t), tensor(batch.v_t)
        adv, target = tensor(adv_t), tensor(target_t)
        if recurrent:
            first_t = torch.as_tensor(batch.first_t()).to(dev)
            L = min(self.seq_len, obs.shape[0])
            state_b, valid, (obs, first_t, actions, old_logp, old_dist, old_v, adv, target) = \
                chunk_sequences(self.model, torch.as_tensor(batch.state_b).to(dev), L,
                                obs, first_t, actions, old_logp, old_dist, old_v, adv, target)
            forward = lambda idx: [x.flatten(0, 1)[valid[:, idx].flatten()] for x in  # noqa: E731
                                   self.model.unroll(obs[:, idx], state_b[idx], first_t[:, idx])[:2]]
            pick = lambda x, idx: x[:, idx].flatten(0, 1)[valid[:, idx].flatten()]  # noqa: E731
            n, unit = obs.shape[1], L
        else:
            forward = lambda idx: self.model(obs[idx])  # noqa: E731
            pick = lambda x, idx: x[idx]  # noqa: E731
            n, unit = obs.shape[0], 1
        lr = scheduled_lr(cfg.lr, cfg.lr_schedule, env_steps, self.total_env_steps)
        set_lr(self.optimizer, lr)

        # Every learner must take the same number of steps (each one all-reduces), so they
        # agree on the count; a learner holding more rows uses larger minibatches.
        per_epoch = max(1, n // max(1, cfg.minibatch_size // unit))
        per_epoch = int(self.collective.all_reduce_min(torch.tensor([per_epoch]))[0])
        mb = n // per_epoch
        beta = torch.tensor(self.beta, device=dev)  # a tensor: a compiled loss does not specialise on it
        sums: dict[str, float] = {}
        steps = 0
        epochs_done = 0
        for _ in range(cfg.epochs):
            perm = torch.randperm(n, device=dev)
            epoch_kl = []
            for start in range(0, per_epoch * mb, mb):
                idx = perm[start:start + mb]
                rows = [pick(x, idx) for x in (actions, old_logp, old_dist, old_v, adv, target)]
                terms = self._step(forward, idx, obs, rows, beta)
                epoch_kl.append(terms.get("kl", terms.get("approx_kl")))
                for k, v in terms.items():
                    sums[k] = sums.get(k, 0.0) + v
                steps += 1
            epochs_done += 1
            kl = self.collective.all_reduce_mean(torch.tensor([float(np.mean(epoch_kl))]))[0].item()
            if cfg.objective == "kl_penalty" and kl > cfg.kl_early_stop * cfg.kl_target:
                break
        metrics = {k: v / steps for k, v in sums.items()}
        if cfg.objective == "kl_penalty":
            # The PPO paper adapts beta to the KL after the iteration's updates, over the
            # whole batch; the minibatch KLs above were each measured before their own step.
            kl = self._batch_kl(forward, pick, n, old_dist, mb)
            metrics.update(kl_beta=self.beta, kl_after=kl)
            self.beta = adapt_kl_beta(self.beta, kl, cfg.kl_target)
        update_obs_norm(self.model, batch, self.collective)
        var_y = float(np.var(target_t))
        metrics.update(lr=lr, epochs=epochs_done, grad_steps=steps,
                       explained_variance=float("nan") if var_y == 0 else
                       1.0 - float(np.var(target_t - batch.v_t)) / var_y)
        return metrics

    @torch.no_grad()
    def _batch_kl(self, forward, pick, n: int, old_dist: torch.Tensor, chunk: int) -> float:
        """Mean KL(behaviour || current) over every row of every learner, ``chunk`` of the
        batch's ``n`` units (steps, or a recurrent core's sequences of ``model.seq_len``) at a time."""
        head, total, rows = self.model.head, 0.0, 0
        for start in range(0, n, chunk):
            idx = torch.arange(start, min(n, start + chunk), device=old_dist.device)
            params, _ = forward(idx)
            total += float(head.kl(pick(old_dist, idx), params).sum())
            rows += params.shape[0]
        total, rows = self.collective.all_reduce_sum(torch.tensor([total, float(rows)]))
        return float(total / rows)

    def _step(self, forward, idx: torch.Tensor, obs: torch.Tensor, rows: list[torch.Tensor],
              beta: torch.Tensor) -> dict[str, float]:
        """One gradient step on the minibatch ``idx``; ``rows`` are its actions, behaviour
        log-probabilities, distributions and values, advantages and value targets."""
        loss, terms = self._minibatch_loss(forward, idx, obs, rows, beta)
        grad_norm = self.guard.step(self.optimizer, list(self.model.parameters()), loss,
                                    self.collective, self.cfg.max_grad_norm, terms)
        out = {k: float(v) for k, v in terms.items()}
        out["grad_norm"] = float(grad_norm)
        return out

    def _minibatch_loss(self, forward, idx, obs, rows, beta):
        """The minibatch's loss and terms: compiled with ``algo.compile``, else eager. The
        first compiled call also runs a backward of its own, which makes AOTAutograd compile
        the backward here; where compiling fails (no C++ compiler, say), one line says so and
        the run goes on eager."""
        if self.compiled is not None:
            try:
                if not self.backward_compiled:
                    params = [p for p in self.model.parameters() if p.requires_grad]
                    probe, _ = self.compiled(obs[idx], *rows, beta)
                    torch.autograd.grad(probe, params, allow_unused=True)
                    self.backward_compiled = True
                return self.compiled(obs[idx], *rows, beta)
            except Exception as e:  # noqa: BLE001 - any compiler failure falls back to eager
                cause = getattr(e, "inner_exception", None) or e  # inductor's own error, unwrapped
                text = str(cause).strip().splitlines()
                print(f"walle_ray: learner: algo.compile: torch.compile failed "
                      f"({type(cause).__name__}: {text[0] if text else ''}); PPO's update runs "
                      "eager (set algo.compile=false to skip trying)", file=sys.stderr, flush=True)
                self.compiled = None
        return self._loss(*forward(idx), *rows, beta)

    def _forward_loss(self, obs, *rows):
        """A feed-forward model's minibatch: forward pass and loss in one function."""
        return self._loss(*self.model(obs), *rows)

    def _loss(self, params, v, actions, old_logp, old_dist, old_v, adv, target,
              beta) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The minibatch's loss and its named terms, from its forward pass (``params``, ``v``)."""
        cfg = self.cfg
        if cfg.normalize_advantages and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        dist = self.model.head.dist(params)
        logp, entropy = dist.log_prob(actions), dist.entropy()
        common = dict(vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef, old_v=old_v, vf_clip=cfg.vf_clip)
        if cfg.objective == "kl_penalty":
            kl = self.model.head.kl(old_dist, params)
            return ppo_kl_loss(logp, old_logp, adv, kl, v, target, entropy, beta=beta, **common)
        return ppo_clip_loss(logp, old_logp, adv, v, target, entropy, clip=cfg.clip, **common)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "beta": self.beta}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.beta = float(state["beta"])


def compiler_found(device) -> bool:
    """Whether torch.compile can build kernels for ``device``: on a CPU its back end needs a
    C++ compiler (``CXX`` or ``c++``/``g++`` on PATH). Without one, says once what to do."""
    if torch.device(device).type != "cpu":
        return True
    if any(shutil.which(c) for c in (os.environ.get("CXX", ""), "c++", "g++") if c):
        return True
    print("walle_ray: learner: algo.compile: no C++ compiler here, which torch.compile needs on "
          "a CPU; PPO's update runs eager (install g++, or build the CPU image with "
          "--build-arg WITH_COMPILER=1; algo.compile=false skips this line)",
          file=sys.stderr, flush=True)
    return False
