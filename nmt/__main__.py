import sys

from nmt.cli import main

sys.exit(main())
