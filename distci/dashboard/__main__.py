import sys

from distci.dashboard import main

sys.exit(main())
