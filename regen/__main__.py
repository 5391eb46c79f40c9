import sys

from regen.cli.main import main

sys.exit(main())
