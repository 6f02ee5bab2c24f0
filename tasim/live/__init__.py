"""Live mode: a tasim policy served as a Dynamo router in front of real Dynamo workers.

`router` is the Dynamo component and the live policy host it wraps; `stack` starts and stops
workers, router and frontend; `clients` drive a scenario's programs through them; `verl` holds
the verl integration; `run` is the ``tasim live`` command; `hashing` computes Dynamo's block
hashes and `frames` batches the decision socket's frames, both shared by router and clients.

May import: `tasim.hosting`, `tasim.workloads`, `tasim.results` and the layers below them;
never `tasim.sim`."""
