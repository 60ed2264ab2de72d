"""`python -m engine.cli`: the gguf-lens command."""
from engine.cli.main import main

raise SystemExit(main())
