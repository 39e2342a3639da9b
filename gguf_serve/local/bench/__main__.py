from gguf_serve.local.bench.cli import main

raise SystemExit(main())
