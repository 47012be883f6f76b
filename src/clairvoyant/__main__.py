"""``python -m clairvoyant``: the command line (as the ``clairvoyant`` command)."""

from .cli.main import main

raise SystemExit(main())
