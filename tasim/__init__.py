"""tasim: program-aware LLM routing, simulated and live. Its hottest modules may be compiled:
see `tasim.native`."""

from tasim.native import search_path

__path__ = search_path(__name__, __path__)

__version__ = "0.1.0"
