"""The tasim router, a Dynamo component: the service (`service`, ``python -m
tasim.live.router.service``) around the live policy host (`live_host`), which workers are which
(`membership`), their KV-event streams (`kv_events`), decision-only routing for pin mode
(`decisions`) and its status and Prometheus metrics (`status`)."""
