"""Notes said once: a note that does not change between runs (the hostname names no
host, the default data path is missing, no ``nvidia-smi``) is said on the first run
after the cluster file or the note itself changed, then kept back until ``-v``
(``fdl.verbose``) asks for it. Errors and warnings never pass through here.

Pure: the state is text the caller reads from and writes to :func:`notes_file`, in the
user's cache, not the project (a preflight that refuses leaves nothing in the tree); a
note is known by a digest of the cluster files' contents and its own text, so a
changed cluster file or a changed fact of a host (which changes the note's words, or
which hosts it names) says it again.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from fdl_tasks.core.user_cache import cache_file


def notes_file(root: str, cache_home: str) -> Path:
    """Where the notes said for the project at ``root`` are kept: under ``cache_home``
    (``$XDG_CACHE_HOME``, else ``~/.cache``), one file per project root."""
    return cache_file(cache_home, "notes", posixpath.normpath(root))


def cluster_digest(contents: Iterable[bytes]) -> str:
    """One digest of every file the cluster was read from, in order."""
    digest = hashlib.sha256()
    for content in contents:
        digest.update(hashlib.sha256(content).digest())
    return digest.hexdigest()


def note_key(cluster: str, note: str) -> str:
    """What the state remembers of a note said under the cluster of digest ``cluster``."""
    return hashlib.sha256(f"{cluster}\0{note}".encode()).hexdigest()[:32]


def parse_state(text: str) -> dict[str, list[str]]:
    """The notes said last, by kind; anything unreadable is nothing said (all said again)."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        kind: keys
        for kind, keys in data.items()
        if isinstance(keys, list) and all(isinstance(k, str) for k in keys)
    }


def state_text(state: Mapping[str, Sequence[str]]) -> str:
    return json.dumps({kind: list(keys) for kind, keys in sorted(state.items())}, indent=1) + "\n"


def to_say(
    notes: Sequence[str], kind: str, cluster: str, state: Mapping[str, Sequence[str]], verbose: bool
) -> tuple[list[str], dict[str, list[str]]]:
    """(the notes to say now, the state to keep). ``kind`` separates notes said by
    different steps (a run's controller line, preflight's notes) so that one does not
    forget the other's; within a kind only this run's notes are kept, so a note that went
    away and came back is said again. ``verbose``: ``-v``, every note."""
    keys = [note_key(cluster, note) for note in notes]
    said = set(state.get(kind, ()))
    now = [note for note, key in zip(notes, keys, strict=True) if verbose or key not in said]
    kept = {k: list(v) for k, v in state.items()}
    kept[kind] = sorted(set(keys))
    return now, kept
