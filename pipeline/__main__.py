"""``python -m pipeline``: the same as the ``pipeline`` console script."""

from pipeline.cli import main

raise SystemExit(main())
