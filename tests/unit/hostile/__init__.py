"""Hostile input never reaches a shell as code and never escapes ``target/cluster/``.

Every value a user controls (host labels, paths, arches, env names and values,
docker image/run_args/env, the compose service, ssh options from cluster.yaml;
``--cmd``, ``--crate-dir`` and the program's arguments from the command line)
is generated with shell metacharacters, spaces, leading ``-``, ``..``, ``/``,
unicode and control characters, and fed through the real gatekeeper (the
loader, ``check_command``, ``check_crate_dir``). Whatever it decides is
checked: a refusal is one clean :class:`~fdl_tasks.core.errors.FdlError` line naming
the field; an accepted value is rendered into the real command lines, which
``/bin/sh`` runs against recorder programs (see ``conftest.py``), and the test
compares what the recorders saw with the raw values.

One module per thing attacked: the cluster file's fields, the target tree, ssh
options, the build commands, the remote scripts (probe and verification), the
launch command, and the command-line inputs.
"""
