"""Shared pieces of the CG-DSGLD experiments: centralised SGLD on pooled data (the baseline) and the
quick-mode jit (one home for each)."""
from __future__ import annotations

import blackjax
import jax
import jax.numpy as jnp

from jaxsub.subsample import permutation_indices

__all__ = ["pooled_sgld_round", "jit", "QUICK_COMPILER_OPTIONS"]

#: Quick mode compiles with XLA's backend (LLVM) optimisation level 0. The quick runs execute in well under a
#: second each while compiling a sampler program costs 2-4 CPU-s at the default level; level 0 cuts that by
#: about 2.5x (toy sample_rounds program: 3.6 -> 1.4 CPU-s) and at most doubles the run time (0.14 -> 0.32 s).
#: Full mode keeps the default optimisation. Level 0 changes code generation, not the
#: HLO program, so the same operations run (results may differ in the last bits).
QUICK_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


def jit(fn, *, quick: bool, **kwargs):
    """``jax.jit(fn)``, with :data:`QUICK_COMPILER_OPTIONS` in quick mode."""
    return jax.jit(fn, compiler_options=QUICK_COMPILER_OPTIONS if quick else None, **kwargs)


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
