"""`python -m tpu_console` is the same as the `tpu-console` command."""

import sys

from tpu_console.cli import main

sys.exit(main())
