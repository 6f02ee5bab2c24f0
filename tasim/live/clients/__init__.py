"""The clients that drive a live stack: programs over Dynamo's OpenAI API (`http_driver`), the
client side of pin mode (`pinned`), token ids for a program plan (`tokens`) and the event log
of runs that tasim does not route (`observed`)."""
