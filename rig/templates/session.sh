#!/bin/sh
# rig.sshrig session wrapper for host @{name} (sshd ForceCommand)
PATH=@{path}
export PATH
@{marker}=@{host_dir}
export @{marker}
SHLVL=1
export SHLVL
@{emulation}
if [ -z "${SSH_ORIGINAL_COMMAND+set}" ]; then
    exec "${SHELL:-/bin/sh}"
fi
exec "${SHELL:-/bin/sh}" -c "$SSH_ORIGINAL_COMMAND"
