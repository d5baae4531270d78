"""``python -m autopersona_flows`` runs the ``autopersona`` command line."""

import sys

from autopersona_flows.cli import main

if __name__ == "__main__":
    sys.exit(main())
