"""The simulator. Its hottest modules may be compiled: see `tasim.native`."""

from tasim.native import search_path

__path__ = search_path(__name__, __path__)
