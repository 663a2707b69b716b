"""``--timings``: the spans a run records turned into a page, and the hooks that
start a timeline per run and write the page when it ends.

May import the layers below it (``core`` to ``ssh``).
"""
