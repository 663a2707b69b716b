"""``inv preflight``: the probe script and its answers, each host's verdict
(paths, GPUs, NCCL, libraries, logins) and the report lines.

May import the layers below it (``core`` to ``build``: the controller's
checks ask the build backend).
"""
