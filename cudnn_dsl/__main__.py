"""`python -m cudnn_dsl` runs the command line."""

from cudnn_dsl.cli import main

raise SystemExit(main())
