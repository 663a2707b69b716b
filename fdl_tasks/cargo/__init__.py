"""What cargo answers, read from its own files: a package's binaries, the
workspace, the manifests' times, each CPU's Rust target and the dep-info and
fingerprint files a build leaves.

Reads files, runs nothing. May import ``core`` only.
"""
