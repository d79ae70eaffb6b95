import sys

from dpfy.cli import main

sys.exit(main())
