"""The compile cache: sccache found and wired into each build, its counts read
back, and sccache-dist's client side.

May import the layers below it (``core`` to ``tree``).
"""
