"""The fleet's connections: ssh_config, known hosts and their policy, logins and
their one-line failures, :class:`~fdl_tasks.ssh.remote.Fleet`'s fan-out.

May import ``core``, ``gpu``, ``cargo``, ``config``.
"""
