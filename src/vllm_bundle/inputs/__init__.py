"""Step 1, the inputs: pinning every input of a target (``locker`` → ``lockfile``) from the indexes it is
published on (``simple_index``, ``remote_wheel``, ``therock``), and checking the facts the tests' fake
upstream is built from against the real hosts (``facts``, ``probe``)."""
