from vllm_bundle.cli import main

raise SystemExit(main())
