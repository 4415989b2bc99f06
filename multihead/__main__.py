import sys

from multihead.cli.main import main

sys.exit(main())
