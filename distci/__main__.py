import sys

from distci.cli import main

sys.exit(main())
