"""GPU facts, pure: vendors from a variant's name, compute capabilities and the
CUDA driver table, ``nvidia-smi``/``rocminfo`` answers, ``arch: auto``'s
choice, and what flodl's launcher needs of a host's devices.

No I/O. May import ``core`` only.
"""
