"""Starting and stopping a live stack: Dynamo workers, the tasim router and Dynamo's frontend
(`launcher`), the engines a worker may run (`engines`), the tokenizer-only model folder the
stack serves (`tiny_model`) and Dynamo's own routing plug-ins as baselines (`dynamo_policies`)."""
