import time, numpy as np
from jaxsub.coreference.synthetic import author_mentions
from jaxsub.datasets import febrl_name_frequencies
from jaxsub import coreference as co
names = febrl_name_frequencies()
for M in (5000, 100_000):
    t=time.time(); g = author_mentions(M, names, seed=0); t1=time.time()-t
    b = co.make_blocks(g.block_keys)
    bs = np.sort(b.block_sizes())[::-1]
    ent_per_block = {}
    for k, e in zip(g.block_keys, g.entity): ent_per_block.setdefault(k, set()).add(e)
    epb = np.sort([len(v) for v in ent_per_block.values()])[::-1]
    es = np.sort(np.bincount(g.entity))[::-1]
    print(M, f"{t1:.1f}s", "entities", es.size, es[:5], "blocks", bs.size, bs[:8], "ent/block", epb[:8], "pairs", int((bs*(bs-1)).sum()))
