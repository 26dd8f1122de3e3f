import time, numpy as np, jax, jax.numpy as jnp, sys
from jaxsub.coreference.synthetic import author_mentions
from jaxsub.datasets import febrl_name_frequencies
from jaxsub import coreference as co
names = febrl_name_frequencies()
M = int(sys.argv[1]); cap = int(sys.argv[2])
g = author_mentions(M, names, seed=0, max_entity_size=cap)
KINDS = {"name": "string", "coauthors": "tokens", "venue": "categorical", "title": "tokens", "year": "numeric"}
enc = co.encode_mentions(g.fields, KINDS, hash_dim=32)
f = co.similarity_factor(KINDS, weights={"name": 2.0, "coauthors": 3.0, "venue": 0.5, "title": 3.0, "year": 1.0},
                         thresholds={"name": 0.6, "coauthors": 0.15, "title": 0.25}, scales={"year": 4.0})
blocks = co.make_blocks(g.block_keys)
print("classes", [(c, len(p)) for c, p in co.mention_classes(blocks, 128)])
betas = np.linspace(0.3, 2.0, 6)
for exact in (True, False):
    sc = []
    st, tr = co.fit(jax.random.key(0), f, enc, blocks, betas, exact=exact, max_candidates=int(sys.argv[3]),
                    callback=lambda s_, lab: sc.append(round(co.b_cubed(lab, g.entity).f1, 4)))
    print(exact, sc, tr.num_evaluations, tr.seconds.round(2), round(tr.compile_seconds, 1), tr.num_races, tr.num_exact, flush=True)
