"""The domain core: programs and requests with their block identity (`model`), the event types
both worlds log (`events`), the cluster as a policy sees it (`cluster_view`), seeded randomness
(`determinism`), the errors every command reports alike (`errors`), and the small machinery the
rest builds on (`records`, `gc_pacing`, `lifecycle`).

May import: nothing of tasim but itself. Everything else may import it.
"""
