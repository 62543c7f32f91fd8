from cotrain.cli import main

raise SystemExit(main())
