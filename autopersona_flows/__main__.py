"""``python -m autopersona_flows`` runs the ``autopersona`` command line."""

import sys

from autopersona_flows.cli import main

sys.exit(main())
