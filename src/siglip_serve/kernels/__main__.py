import sys

from siglip_serve.kernels.cli import main

sys.exit(main())
