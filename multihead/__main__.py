import sys

from multihead.experiments.cli import main

sys.exit(main())
