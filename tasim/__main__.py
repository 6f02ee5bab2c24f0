import sys

from tasim.cli import main

sys.exit(main())
