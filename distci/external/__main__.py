import sys

from distci.external.cli import main

sys.exit(main())
