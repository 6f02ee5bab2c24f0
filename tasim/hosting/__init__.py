"""The policy host both worlds share: what the simulator and the live router do alike around one
policy (notifications in order, decisions applied, events logged). Its module may be compiled:
see `tasim.native`.

May import: `tasim.core`, `tasim.config`, `tasim.policies`.
"""

from tasim.native import search_path

__path__ = search_path(__name__, __path__)
