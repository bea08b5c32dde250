"""The mandatory before-agent git sanitizer: nothing newer than the base commit may stay reachable."""

from __future__ import annotations

import shlex

SANITIZER_OK = "SWEFLOW_SANITIZER_OK"


def sanitizer_command(base_commit: str, workdir: str = "/testbed") -> str:
    """A bash command that resets `workdir` to `base_commit` and removes every route to later history.

    Steps: reset + clean, detach HEAD at the base, delete every remote, ref (branches, tags, notes, stash,
    replace) and reflog, prune worktrees, gc/prune unreachable objects; then verify HEAD == base, a clean tree,
    no refs, nothing reachable but the base's ancestry, no unreachable commits. Exits non-zero on any failure;
    prints SWEFLOW_SANITIZER_OK on success.
    """
    base = shlex.quote(base_commit)
    wd = shlex.quote(workdir)
    script = f"""set -euo pipefail
cd {wd}
export GIT_TERMINAL_PROMPT=0 GIT_CONFIG_NOSYSTEM=1
base=$(git rev-parse --verify --quiet {base}^{{commit}}) || {{ echo "sanitizer: base commit {base_commit} not found in {workdir}" >&2; exit 3; }}
git reset -q --hard "$base"
git clean -fdq
git -c advice.detachedHead=false checkout -q --detach "$base"
for r in $(git remote); do git remote remove "$r"; done
git for-each-ref --format='%(refname)' | while read -r ref; do git update-ref -d "$ref"; done
git worktree prune
rm -f .git/FETCH_HEAD .git/ORIG_HEAD .git/MERGE_HEAD .git/CHERRY_PICK_HEAD .git/packed-refs .git/shallow
rm -rf .git/logs .git/refs/original .git/rr-cache
git reflog expire --expire=now --all
git -c gc.reflogExpire=now -c gc.reflogExpireUnreachable=now gc -q --prune=now
test "$(git rev-parse HEAD)" = "$base" || {{ echo "sanitizer: HEAD is not the base commit" >&2; exit 4; }}
test -z "$(git status --porcelain)" || {{ echo "sanitizer: working tree not clean" >&2; exit 5; }}
test -z "$(git for-each-ref)" || {{ echo "sanitizer: refs remain" >&2; exit 6; }}
test -z "$(git remote)" || {{ echo "sanitizer: remotes remain" >&2; exit 7; }}
test "$(git rev-list --all | sort)" = "$(git rev-list "$base" | sort)" || {{ echo "sanitizer: commits beyond the base are reachable" >&2; exit 8; }}
if git fsck --unreachable --no-reflogs 2>/dev/null | grep -q 'commit'; then echo "sanitizer: unreachable commits remain" >&2; exit 9; fi
echo {SANITIZER_OK}
"""
    return "bash -c " + shlex.quote(script)
