"""tasim: program-aware LLM routing, simulated and live."""

__version__ = "0.1.0"
