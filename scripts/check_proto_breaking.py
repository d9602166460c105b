"""Fail when `proto/` breaks wire compatibility with an earlier commit (`buf breaking`).

The rules are the `breaking` section of `buf.yaml` (WIRE_JSON: see the comment there). The base
is `--against REF`; without one it is chosen so that the same `make test` checks something both
on a working tree and on a fresh clone:

- `proto/` has uncommitted changes (a landing being prepared): compare with `HEAD`, so the
  changes about to be committed are what is checked;
- `proto/` is as committed (a fresh clone, which is what `.ci/run` tests): compare with `HEAD~1`,
  so the last commit's own changes are checked.

Git is only read (`git status`, `rev-parse`, `archive`). Without a repository, or without the
default base (a first commit) or its `proto/`, there is nothing to compare with: that is said and
the check passes. A base given with `--against` that names no commit is an error.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = "proto"


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=False, capture_output=True)  # noqa: S607


def _in_repository() -> bool:
    try:
        return _git("rev-parse", "--is-inside-work-tree").returncode == 0
    except FileNotFoundError:  # no git installed
        return False


def _proto_has_changes() -> bool:
    """Whether `proto/` differs from HEAD, counting untracked files."""
    return bool(_git("status", "--porcelain", "--", PROTO).stdout.strip())


def default_base() -> str:
    """HEAD while `proto/` has uncommitted changes, else HEAD~1 (see the module docstring)."""
    return "HEAD" if _proto_has_changes() else "HEAD~1"


def resolve(ref: str) -> str | None:
    """The commit `ref` names, or None when there is none."""
    result = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    return result.stdout.decode().strip() if result.returncode == 0 else None


def export_protos(commit: str, destination: Path) -> Path:
    """Write `proto/` as it is in `commit` under `destination`; return that copy's `proto/`."""
    archive = _git("archive", "--format=tar", commit, "--", PROTO)
    if archive.returncode != 0:
        sys.stderr.write(archive.stderr.decode())
        raise SystemExit(archive.returncode)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(destination, filter="data")
    return destination / PROTO


def buf_breaking(against: Path) -> int:
    """Run `buf breaking` on the working tree's `proto/` against the directory `against`."""
    # `buf` is installed next to this interpreter (the `buf-bin` dev dependency).
    buf = Path(sys.executable).parent / "buf"
    return subprocess.run([str(buf), "breaking", PROTO, "--against", str(against)], check=False, cwd=ROOT).returncode


def main() -> int:
    """Compare `proto/` with the base commit; non-zero when a change breaks the wire."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", default="", help="the base commit (default: see above)")
    args = parser.parse_args()
    if not _in_repository():
        print("buf breaking: not a git checkout, nothing to compare proto/ with; skipped")
        return 0
    ref = args.against or default_base()
    commit = resolve(ref)
    if commit is None and args.against:
        # A base asked for by name must exist: a typo must not turn the check off.
        print(f"buf breaking: {ref} names no commit", file=sys.stderr)
        return 1
    if commit is None:
        print(f"buf breaking: no commit {ref} to compare proto/ with; skipped")
        return 0
    if _git("rev-parse", "--verify", "--quiet", f"{commit}:{PROTO}").returncode != 0:
        print(f"buf breaking: {ref} has no proto/ to compare with; skipped")
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        if buf_breaking(export_protos(commit, Path(scratch))) != 0:
            print(f"proto/ breaks the wire format of {ref} ({commit[:12]}): see above", file=sys.stderr)
            return 1
    print(f"proto/ is wire-compatible with {ref} ({commit[:12]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
