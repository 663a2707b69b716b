"""fdl-tasks: pre-build a Rust command once per remote GPU host, against its own libtorch.

Compose the collection into your own tasks.py::

    from fdl_tasks import ns            # as the root collection: inv prebuild --cmd X
    # or
    ns.add_collection(fdl_tasks.ns, "fdl")   # nested: inv fdl.prebuild --cmd X
"""

from fdl_tasks.tasks import ns

__all__ = ["ns"]
