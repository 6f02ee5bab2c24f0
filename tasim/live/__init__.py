"""Live mode: the tasim router as a Dynamo component, the stack launcher and agent drivers.

Not built yet; the simulator and policies do not depend on it.
"""
