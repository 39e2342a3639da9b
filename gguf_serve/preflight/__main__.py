from gguf_serve.preflight.cli import main

raise SystemExit(main())
