from jaxsub.compress._cluster import *
