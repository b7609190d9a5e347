"""Steps 2 and 3, the bundle tree: the stages that turn the locked inputs into one relocatable tree
(``stage`` is their protocol): CPython (``python_stage``), vLLM's patched source (``vllm_source``,
``patches``) and build (``vllm_build``, ``vllm_extensions``, ``toolchain``), then the tree itself
(``assemble``, ``prune``, ``relocate``, ``records``, ``launcher``, ``scripts``)."""
