"""``python -m cotrain.cli``: the ``cotrain`` command run by this interpreter (how processes are launched here)."""

from cotrain.cli.main import main

raise SystemExit(main())
