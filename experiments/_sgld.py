"""Shared pieces of the CG-DSGLD experiments: centralised SGLD on pooled data (the baseline) and the
quick-mode jit (one home for each)."""

from __future__ import annotations

import blackjax
import jax
import jax.numpy as jnp

from jaxsub.subsample import permutation_indices

__all__ = ["pooled_sgld_round", "jit", "quick_compiler_options"]


#: Quick mode compiles with XLA's backend (LLVM) optimisation level 1 instead of the default 2: the quick runs
#: are short and compile time dominates them. Measured on the quick programs (CPU-s, compile / one run): logistic
#: sample_rounds 3.4 / 0.22 at level 2, 2.5 / 0.25 at level 1, 1.5 / 1.4 at level 0; toy sample_rounds
#: 4.1 / 0.15, 2.6 / 0.14, 1.6 / 0.25. Level 0 pays only where the run is negligible (``level=0``, the toy).
#: Full mode keeps the default. The level changes code generation, not the HLO program, so the same
#: operations run (results may differ in the last bits).
def quick_compiler_options(quick: bool, level: int = 1):
    """XLA compiler options for :func:`jit` (``None`` in full mode)."""
    return {"xla_backend_optimization_level": level} if quick else None


def jit(fn, *, quick: bool, level: int = 1, **kwargs):
    """``jax.jit(fn)`` compiled at backend optimisation ``level`` in quick mode (see above)."""
    return jax.jit(fn, compiler_options=quick_compiler_options(quick, level), **kwargs)


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
