"""Centralised SGLD on pooled data, the baseline of the CG-DSGLD experiments (one home for it)."""
from __future__ import annotations

import blackjax
import jax
import jax.numpy as jnp

from jaxsub.subsample import permutation_indices

__all__ = ["pooled_sgld_round"]


def pooled_sgld_round(logprior, loglik, px, py, *, batch: int, local_steps: int, step_size):
    """One round of ``blackjax.sgld`` on the pooled rows ``(px, py)``: ``local_steps`` steps on
    minibatches of ``batch`` rows drawn without replacement, returning ``(theta, theta)`` so that
    ``jax.lax.scan(round, theta0, keys)`` yields one draw per round. The SGLD step is
    ``0.5 * step_size``, the convention of the experiments' DSGLD/CG-DSGLD runs."""
    n_total = px.shape[0]
    sgld = blackjax.sgld(blackjax.sgmcmc.gradients.grad_estimator(logprior, loglik, n_total))

    def one_round(theta, key):
        def body(t, k):
            kb, kn = jax.random.split(k)
            idx = permutation_indices(kb, jnp.arange(batch), n_total)
            return sgld.step(kn, t, (px[idx], py[idx]), 0.5 * step_size), None

        theta = jax.lax.scan(body, theta, jax.random.split(key, local_steps))[0]
        return theta, theta

    return one_round
