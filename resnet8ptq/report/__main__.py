"""`python -m resnet8ptq.report`: see :mod:`resnet8ptq.report.cli`."""

import sys

from resnet8ptq.report.cli import main

sys.exit(main())
