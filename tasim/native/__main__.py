"""``python -m tasim.native``: build the compiled modules, or print why they are not in use."""

import sys

from tasim.native.build import main

sys.exit(main())
