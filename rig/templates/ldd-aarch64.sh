#!/bin/sh
# rig.sshrig shim for host @{name}, which emulates aarch64: an ldd that reads aarch64
# ELF files as ldd does on an aarch64 machine, by running the aarch64 loader (under
# qemu, through binfmt) with LD_TRACE_LOADED_OBJECTS=1: the same "=> not found" lines.
# Options (--version) and every other file go to the real ldd.
case "${1:-}" in -*) exec @{real} "$@" ;; esac
status=0
for f in "$@"; do
    [ "$#" -gt 1 ] && printf '%s:\n' "$f"
    case "$(@{od} -An -tx1 -N20 "$f" 2>/dev/null | @{tr} -d ' \n')" in
        7f454c460201*b700)
            QEMU_LD_PREFIX="${QEMU_LD_PREFIX:-@{sysroot}}" LD_TRACE_LOADED_OBJECTS=1 \
                @{loader} "$f" || status=1 ;;
        *) @{real} "$f" || status=1 ;;
    esac
done
exit "$status"
