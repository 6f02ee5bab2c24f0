"""The simulated engine of one worker, as vLLM v1 runs it: the scheduler (`scheduler`), the KV
cache manager through which it reaches its blocks (`kv_manager`), the paged KV block pool with
its prefix cache behind that (`block_pool`) and the folding of runs of identical steps
(`fast_forward`). Its modules may be compiled: see `tasim.native`."""

from tasim.native import search_path

__path__ = search_path(__name__, __path__)
