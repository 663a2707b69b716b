#!/bin/sh
# rig.sshrig shim for host @{name}
if [ "$#" -eq 1 ] && [ "$1" = --version ]; then
    printf @{banner} >&2
    exit 1
fi
exec @{real} "$@"
