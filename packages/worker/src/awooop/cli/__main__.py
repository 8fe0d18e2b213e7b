import sys

from awooop.cli.main import main

sys.exit(main())
