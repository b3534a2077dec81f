"""``python -m hcqr_dspy.cli``: the ``hcqr`` command."""

import sys

from hcqr_dspy.cli.main import main

sys.exit(main())
