#!/bin/sh
# rig.sshrig shim for host @{name}
if [ "$#" -eq 1 ] && [ "$1" = GNU_LIBC_VERSION ]; then
    printf '%s\n' @{version}
    exit 0
fi
exec @{real} "$@"
