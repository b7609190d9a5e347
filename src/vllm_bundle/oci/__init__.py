"""The OCI image of a bundle: the image layout (``layout``), the image stage (``image``), pushing to a
registry (``registry``) and the KServe manifests that serve it (``kserve``)."""
