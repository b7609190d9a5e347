"""The pipeline's wiring, the one place stages are put together: ``build`` runs them for one target in
order (lock → fetch → python → site → vllm-src → vllm-wheel → app → root → qualify → release → image),
``verbs`` gives each build verb of the command line one function (``workflow`` the two the release
workflows run between jobs), ``options`` reads what the command line selects, and ``console`` prints
what happened."""
