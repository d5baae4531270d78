"""Export one user's memories: ``python -m autopersona_flows.export_snapshot STORE USER DEST``.

The same as ``autopersona export STORE USER DEST``.
"""

import sys

from autopersona_flows.cli import main

if __name__ == "__main__":
    sys.exit(main(["export", *sys.argv[1:]]))
