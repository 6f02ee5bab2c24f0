"""Live mode: a tasim policy served as a Dynamo router in front of real Dynamo workers.

``router`` is the Dynamo component (``python -m tasim.live.router``); ``host`` the policy and
program table it wraps (no Dynamo imports); ``hashing`` Dynamo's block hashes; ``kv_events`` the
workers' ZMQ KV-event stream; ``status`` its JSON status and Prometheus text; ``stack`` and
``engines`` start and stop workers, router and frontend; ``tokens`` fills program plans with token
ids; ``driver`` runs a scenario's programs over HTTP; ``run`` is the ``tasim live`` command; ``verl``
holds the verl integration. The simulator and policies never import it.
"""
