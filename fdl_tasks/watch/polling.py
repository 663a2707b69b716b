"""inotify or polling: inotify never reports what other hosts write on a network mount.

Pure: reads ``/proc/self/mountinfo`` text handed in, to find the filesystem
that holds the project root.
"""

from __future__ import annotations

from pathlib import Path

from fdl_tasks.tree.scope import under

#: Polling: how often the tree is walked (ms).
POLL_MS = 500
#: Filesystems whose changes made on another host inotify never reports.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "virtiofs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "afs",
        "ocfs2",
        "gfs2",
        "davfs",
        "fuse",
    }
)
#: FUSE filesystems that only show this machine's own files (every other
#: ``fuse.*`` is taken for a network mount: sshfs, s3fs, mountpoint-s3, rclone, …).
LOCAL_FUSE = frozenset({"fuse.fuse-overlayfs", "fuse.lxcfs", "fuse.bindfs", "fuse.portal"})


def mount_fstype(mountinfo: str, path: str) -> str | None:
    """The filesystem type of the mount holding ``path`` (a resolved absolute path),
    from ``/proc/self/mountinfo`` text; the last of stacked mounts wins."""
    best: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        point = _unescape(fields[4])
        if under(path, point) and (best is None or len(point) >= best[0]):
            best = (len(point), tail[0])
    return best[1] if best else None


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as ``\\ooo``."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1 : i + 4].isdigit():
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def needs_polling(fstype: str) -> bool:
    """Whether inotify misses changes made by other hosts on this filesystem type."""
    if fstype in NETWORK_FILESYSTEMS:
        return True
    return fstype.startswith("fuse.") and fstype not in LOCAL_FUSE


def polling_choice(root: Path, fstype: str | None, forced: bool) -> tuple[bool, str]:
    """Whether to poll, and what to say about how the tree is watched.

    ``fstype``: the filesystem holding ``root`` (``None``: unknown); ``forced``:
    ``fdl.watch_polling``.
    """
    if forced:
        return True, f"polling every {POLL_MS / 1000:g}s (fdl.watch_polling)"
    if fstype and needs_polling(fstype):
        return True, (
            f"polling every {POLL_MS / 1000:g}s: {root} is on {fstype}, where inotify does not "
            "see changes made on other hosts (edits there show up after the mount's "
            "attribute cache expires)"
        )
    return False, f"inotify on {fstype or 'an unknown filesystem'}"
