import time, numpy as np, jax, jax.numpy as jnp
from jaxsub.coreference.synthetic import author_mentions
from jaxsub.datasets import febrl_name_frequencies
from jaxsub import coreference as co
names = febrl_name_frequencies()
g = author_mentions(5000, names, seed=0)
KINDS = {"name": "string", "coauthors": "tokens", "venue": "categorical", "title": "tokens", "year": "numeric"}
enc = co.encode_mentions(g.fields, KINDS, hash_dim=32)
f = co.similarity_factor(KINDS, weights={"name": 2.0, "coauthors": 3.0, "venue": 0.5, "title": 3.0, "year": 1.0},
                         thresholds={"name": 0.6, "coauthors": 0.15, "title": 0.25}, scales={"year": 4.0})
blocks = co.make_blocks(g.block_keys)
# within vs across pairs in the biggest block
p0 = int(np.argmax(blocks.size)); s = blocks.start[p0]; n = blocks.size[p0]
idx = blocks.order[s:s+n][:400]
F = jax.vmap(lambda i: jax.vmap(lambda j: f(jax.tree.map(lambda a: a[i], enc), jax.tree.map(lambda a: a[j], enc)))(jnp.asarray(idx)))(jnp.asarray(idx))
F = np.asarray(F); same = g.entity[idx][:, None] == g.entity[idx][None, :]
np.fill_diagonal(same, False); off = ~np.eye(len(idx), dtype=bool)
print("within", F[same].mean(), F[same].std(), (F[same] < 0).mean(), "across", F[off & ~same].mean(), F[off & ~same].std(), (F[off & ~same] > 0).mean())
betas = np.linspace(0.3, 2.0, 8)
for exact in (True, False):
    t = time.time()
    sc = []
    st, tr = co.fit(jax.random.key(0), f, enc, blocks, betas, exact=exact, check_decisions=not exact,
                    callback=lambda s_, lab: sc.append(round(co.b_cubed(lab, g.entity).f1, 4)))
    print(exact, sc, tr.num_evaluations, tr.seconds.round(2), round(tr.compile_seconds, 1), tr.num_errors, tr.num_checked, tr.num_races, tr.num_exact)
