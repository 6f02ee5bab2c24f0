"""verl 0.9.1 integration: tasim programs driven by real verl agent loops.

``client`` speaks verl's server-client contract over the Dynamo frontend with program
lifecycle headers; ``agent_loop`` is a verl agent loop whose tools are simulated from the
scenario; ``driver`` runs GRPO rollout steps through ``AgentLoopManager``; ``balancer`` hosts
any tasim policy as verl's own request load balancer (plain verl, no Dynamo).
"""
