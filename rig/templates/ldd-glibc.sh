#!/bin/sh
# rig.sshrig shim for host @{name}
if [ "$#" -eq 1 ] && [ "$1" = --version ]; then
    printf '%s\n' @{first_line}
    @{real} --version | @{tail} -n +2
    exit 0
fi
exec @{real} "$@"
