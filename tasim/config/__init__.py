"""Configuration: the scenario schema and its overrides (`scenario`), the presets shipped with
tasim (`presets`), the distributions a workload draws from (`distributions`), GPU and model
specifications (`hardware`), policy specs such as ``thunderagent[scheduler_interval_s=5]``
(`policy_spec`) and the workers a scenario describes (`workers`).

May import: `tasim.core` and `tasim.policies` (a scenario names a policy and its parameters,
checked against the registry).
"""
