"""Safe defaults of jaxsub.compress: second-order log-densities, radius choices that say whether the
target was met, labels kept discrete, and named errors for wrong shapes and non-finite data."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsub import compress


def _logistic_data(n=4000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 2))
    beta = np.array([1.0, -1.5])
    y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-x @ beta))).astype(np.int64)
    return x, y


def _logprior(b):
    return -0.5 * jnp.sum(b**2) / 100.0


def _loglik(b, datum):
    xi, yi = datum
    z = jnp.dot(xi, b)
    return yi.astype(z.dtype) * z - jnp.logaddexp(0.0, z)


def _exact_map(x, y, steps=30):
    """Exact MAP and Laplace sds of the logistic model above (Newton, float64)."""
    b = np.zeros(x.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-x @ b))
        g = x.T @ (y - p) - b / 100.0
        h = (x * (p * (1 - p))[:, None]).T @ x + np.eye(x.shape[1]) / 100.0
        b = b + np.linalg.solve(h, g)
    return b, np.sqrt(np.diag(np.linalg.inv(h)))


# ----------------------------------------------------------------------------- second order by default


def test_logdensity_defaults_to_second_order_where_covariances_exist():
    x, y = _logistic_data()
    cl = compress.cluster_supervised(x, y, 0.8)
    assert cl.covariances is not None
    b = jnp.asarray([0.7, -1.2])
    default = jax.value_and_grad(compress.logdensity(_logprior, _loglik, cl))(b)
    second = jax.value_and_grad(compress.logdensity(_logprior, _loglik, cl, second_order=True))(b)
    first = jax.value_and_grad(compress.logdensity(_logprior, _loglik, cl, second_order=False))(b)
    np.testing.assert_allclose(default[0], second[0], rtol=1e-6)
    np.testing.assert_allclose(default[1], second[1], rtol=1e-6)
    assert abs(float(default[0]) - float(first[0])) > 1e-3 * abs(float(first[0]))  # the correction is not zero
    # and the default is the better posterior: its gradient at the exact MAP is nearer zero (the exact one)
    exact_b, sd = _exact_map(x, y)
    g_default = jax.grad(compress.logdensity(_logprior, _loglik, cl))(jnp.asarray(exact_b, jnp.float32))
    g_first = jax.grad(compress.logdensity(_logprior, _loglik, cl, second_order=False))(
        jnp.asarray(exact_b, jnp.float32)
    )
    assert float(jnp.linalg.norm(g_default)) < 0.2 * float(jnp.linalg.norm(g_first))
    # plain data carry no covariances: the default is the exact (first-order) log-density
    exact = compress.logdensity(_logprior, _loglik, (jnp.asarray(x, jnp.float32), jnp.asarray(y)))
    assert np.isfinite(float(exact(b)))


# ----------------------------------------------------------------------------- choose_radius says whether it met the target


def _choose(target, on_miss="warn", radii=(2.0, 1.0, 0.5)):
    x, y = _logistic_data()
    data = (jnp.asarray(x, jnp.float32), jnp.asarray(y))
    return compress.choose_radius(
        _logprior,
        _loglik,
        data,
        lambda r: compress.cluster_supervised(x, y, r),
        radii,
        jnp.zeros(2),
        target=target,
        second_order=False,
        on_miss=on_miss,
    )


def test_choose_radius_warns_and_reports_a_missed_target():
    with pytest.warns(compress.RadiusWarning, match="no candidate radius meets the target"):
        choice = _choose(1e-6)
    assert choice.met is False
    assert choice.error == min(choice.errors) and choice.error > 1e-6
    assert choice.radius == choice.radii[int(np.argmin(choice.errors))]
    assert len(choice.radii) == 3  # every candidate was tried
    with pytest.raises(ValueError, match="no candidate radius meets the target"):
        _choose(1e-6, on_miss="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _choose(1e-6, on_miss="ignore").met is False


def test_choose_radius_reports_a_met_target():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning when the target is met
        choice = _choose(1e3)
    assert choice.met is True and choice.error <= 1e3 and choice.radius == 2.0 and choice.error == choice.errors[0]


# ----------------------------------------------------------------------------- one-call compressed posterior


def test_posterior_picks_the_largest_radius_meeting_the_target_and_its_error_is_real():
    x, y = _logistic_data(n=6000, seed=1)
    radii = (3.0, 2.0, 1.0, 0.5, 0.25)
    target = 0.05
    post = compress.posterior(_logprior, _loglik, x, y, position=jnp.zeros(2), target=target, radii=radii)
    assert post.met and post.error <= target
    assert post.clustering.radius <= post.radius and post.clustering.target_radius == post.radius
    # the largest: every larger candidate tried missed the target
    larger = [e for r, e in zip(post.choice.radii, post.choice.errors) if r > post.radius]
    assert all(e > target for e in larger)
    assert post.clustering.c < x.shape[0] // 5  # it compresses
    # the returned log-density is the second-order one of that clustering
    b = jnp.asarray([0.5, -1.0])
    ref = compress.logdensity(_logprior, _loglik, post.clustering, second_order=True)
    np.testing.assert_allclose(float(post.logdensity_fn(b)), float(ref(b)), rtol=1e-6)
    # the predicted error is the real shift of the mode: the compressed MAP vs the exact MAP
    exact_b, sd = _exact_map(x, y)
    comp_b = jnp.zeros(2)
    grad, hess = jax.grad(post.logdensity_fn), jax.hessian(post.logdensity_fn)
    for _ in range(30):
        comp_b = comp_b - jnp.linalg.solve(hess(comp_b), grad(comp_b))
    shift = float(np.max(np.abs(np.asarray(comp_b) - exact_b) / sd))
    assert shift <= 2.0 * target, (shift, post.error)
    # negative control: the first-order posterior at the same radius is off by more
    first = compress.logdensity(_logprior, _loglik, post.clustering, second_order=False)
    fb = jnp.zeros(2)
    for _ in range(30):
        fb = fb - jnp.linalg.solve(jax.hessian(first)(fb), jax.grad(first)(fb))
    assert float(np.max(np.abs(np.asarray(fb) - exact_b) / sd)) > shift


# ----------------------------------------------------------------------------- labels are labels


def test_float_class_labels_are_kept_discrete():
    # two overlapping classes: at this radius a cluster of the rows alone would mix both labels
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 4))
    y = (x[:, 0] + 0.8 * rng.normal(size=600) > 0).astype(np.float64)  # 0.0 / 1.0 labels stored as floats
    radius = 3.0
    cl = compress.cluster_supervised(x, y, radius)
    assert set(np.unique(cl.targets).tolist()) <= {0.0, 1.0}
    for j in range(cl.c):  # every cluster is pure in its label
        assert np.all(y[cl.labels == j] == cl.targets[j])
    by_int = compress.cluster_supervised(x, y.astype(np.int64), radius)
    np.testing.assert_array_equal(cl.labels, by_int.labels)
    np.testing.assert_array_equal(cl.targets, by_int.targets.astype(np.float64))
    assert cl.targets.dtype == np.float64
    # negative control: averaging the labels (the explicit joint mode) gives fractional targets
    joint = compress.cluster_supervised(x, y, radius, mode="joint")
    frac = (joint.targets > 1e-9) & (joint.targets < 1 - 1e-9)
    assert frac.mean() > 0.02


def test_fractional_or_non_finite_labels_are_not_class_labels():
    x, y = _logistic_data(n=200)
    yf = y + 0.5
    assert compress.cluster_supervised(x, yf, 0.5).covariances.shape[-1] == 3  # auto: joint (continuous)
    with pytest.raises(ValueError, match="integer-valued class labels"):
        compress.cluster_supervised(x, yf, 0.5, mode="by_label")
    bad = y.astype(np.float64)
    bad[3] = np.nan
    with pytest.raises(ValueError, match="y must be finite"):
        compress.cluster_supervised(x, bad, 0.5)
    with pytest.raises(ValueError, match="integer-valued class labels"):
        compress.cluster_supervised(x, bad, 0.5, mode="by_label")


# ----------------------------------------------------------------------------- named errors


@pytest.mark.parametrize("order", [False, True])
@pytest.mark.parametrize("jit", [False, True])
def test_wrong_size_position_names_the_shapes(order, jit):
    x, y = _logistic_data(n=300)
    cl = compress.cluster_supervised(x, y, 0.5)
    fn = compress.logdensity(_logprior, _loglik, cl, second_order=order)
    fn = jax.jit(fn) if jit else fn
    with pytest.raises(ValueError, match=r"position of shape \(3,\) does not fit loglikelihood_fn.*\(2,\)"):
        fn(jnp.zeros(3))
    assert np.isfinite(float(fn(jnp.zeros(2))))  # the right size works


def test_posterior_error_names_mismatched_shapes():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((50, 2, 3))
    with pytest.raises(ValueError, match=r"draws has shape \(40, 6\), reference_draws \(50, 2, 3\)"):
        compress.posterior_error(ref, rng.standard_normal((40, 6)))
    assert compress.posterior_error(ref, rng.standard_normal((40, 2, 3))).max_mean_sd >= 0.0


def test_non_finite_data_are_rejected():
    x, y = _logistic_data(n=100)
    xb = x.copy()
    xb[5, 1] = np.inf
    with pytest.raises(ValueError, match="x must be finite"):
        compress.cluster_supervised(xb, y, 0.5)
    with pytest.raises(ValueError, match="pseudo-data must be finite"):
        compress.logdensity(_logprior, _loglik, (xb, y))
    with pytest.raises(ValueError, match="finite"):
        compress.posterior_error(np.full((10, 2), np.nan), np.zeros((10, 2)))
