#!/bin/sh
# rig.sshrig shim for host @{name}
if [ "$#" -eq 1 ] && [ "$1" = GNU_LIBC_VERSION ]; then
    echo 'getconf: GNU_LIBC_VERSION: unknown variable' >&2
    exit 1
fi
exec @{real} "$@"
