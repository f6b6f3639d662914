"""Entry point for ``python -m ci_commands`` so the workflow needs no installed script."""

from ci_commands.cli import main

raise SystemExit(main())
