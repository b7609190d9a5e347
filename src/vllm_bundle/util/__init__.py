"""Mechanisms every part of the pipeline shares, each with one home: files written atomically
(``fsutil``), the HTTP session and its retries (``transport``), verified downloads into the cache
(``fetch``, ``cache``), safe extraction (``extract``), streamed tarballs (``tarstream``), progress
(``progress``), checks of outside values (``validate``), and reading binaries (``elf``, ``offload``)."""
