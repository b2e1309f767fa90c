import sys

from metacollect.cli import main

sys.exit(main())
