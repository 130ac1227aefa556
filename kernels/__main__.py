import sys

from kernels.cli import main

sys.exit(main())
