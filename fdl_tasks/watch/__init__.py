"""``prebuild --watch``: every host's binary rebuilt as the user saves.

One full prebuild first (preflight, builds, verification, publication), then
a cycle whenever a file the build depends on changes:

- what counts (:mod:`~fdl_tasks.tree.scope`, :mod:`~fdl_tasks.tree.buildscripts`):
  ``*.rs``, ``Cargo.toml``, ``Cargo.lock``, ``.cargo/config*`` and ``rust-toolchain*``
  anywhere in the workspace (path dependencies live beside the crate); what a build script
  declares with ``cargo:rerun-if-changed`` (read from ``release/build/*/output``
  in the cycle's target dirs, container paths mapped back to the controller),
  or its whole package when it declares nothing, as cargo does; each variant's
  ``libtorch/<arch>``; the cluster file (re-read, then preflight again). Never
  ``target/``, VCS or tool caches, editor swap files, or what the tool writes;
- when (:mod:`.debounce`): a save after ``fdl.watch_debounce`` seconds of calm
  starts a cycle at once; the rest of a burst, and saves during a cycle, become
  exactly one more, once the tree is quiet that long; a cycle in progress is
  never cut short;
- how (:mod:`~fdl_tasks.tree.roots`, :mod:`.polling`, :mod:`.filewatch`): inotify
  (``watchfiles``) over the workspace but ``target/``, or our own polling
  (:mod:`~fdl_tasks.tree.scan`, :mod:`~fdl_tasks.tree.snapshot`: ns mtime and ctime, size,
  inode, and the content of files whose stat is too recent to trust) where inotify cannot see
  other hosts' writes (the project root on NFS, SMB, 9p, virtiofs, a FUSE
  mount such as sshfs or an S3 bucket; detected from ``/proc/self/mountinfo``)
  or when ``fdl.watch_polling`` says so;
- nothing missed (:mod:`.watcher`): each cycle starts with a look at the tree,
  compared again after the cycle and after every new watcher is in place;
  what differs joins the pending batch.

Each cycle (:mod:`.session`) is :func:`fdl_tasks.publish.pipeline.prebuild`, so every
guarantee holds: a failed cycle has withdrawn the envelope and prints every
host's diagnostics together, and watching goes on; Ctrl-C or SIGTERM
(:class:`~fdl_tasks.core.errors.Stopped`) ends the watcher with the last good
envelope or none, and no build container.

``inv launch`` asks :func:`.launchwait.wait_for_watch` first: while a
cycle is pending or building (state in ``target/cluster/_watch/<command>.json``,
the watcher's liveness from a lock it holds, :mod:`.state_files`), or a watched file
changed after the last cycle's start (to the nanosecond; a tie with the stamp
counts unless the file is as that cycle's first look saw it), it waits,
boundedly, for the new envelope.

Pure modules (no I/O): scope, buildscripts, roots, polling, snapshot, debounce,
lines. Thin I/O modules: workspace and scan (the walks), state_files (state, lock),
filewatch and watcher (the watcher threads), session (the loop), launchwait.

The package itself imports nothing, so that ``inv launch`` (which needs only
:mod:`.launchwait`) never loads the build pipeline through :mod:`.session`.
"""
