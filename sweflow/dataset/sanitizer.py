"""The mandatory before-agent git sanitizer: nothing newer than the base commit may stay reachable.

It runs as the row's before_agent command inside the task image, as whatever user the sandbox uses; how it
deals with ownership, shallow clones, linked worktrees, submodules and alternates is noted above `_SCRIPT`.
"""

from __future__ import annotations

import shlex

SANITIZER_OK = "SWEFLOW_SANITIZER_OK"

# Exit codes: 3 base not found, 4 HEAD not at the base, 5 tree not clean, 6 refs remain, 7 remotes remain,
# 8 later commits reachable, 9 unreachable commits remain, 10 the folder is a linked worktree, 11 a linked
# worktree cannot be removed, 12 worktrees or alternates remain.
#
# It runs as the row's before_agent command inside the task image, as whatever user the sandbox uses, so:
# - ownership: git refuses a repository owned by another uid ("dubious ownership"). `git -c safe.directory=`
#   is not honoured by the git of Ubuntu 22.04 images (2.34 with the 2.35.2 backport reads it from system or
#   global config only), so the script gives git a private, temporary global config (HOME, XDG_CONFIG_HOME and
#   GIT_CONFIG_GLOBAL point into a temp folder) that trusts exactly the folders it works on; the image's own
#   config is neither read nor written.
# - shallow clones: `.git/shallow` is kept (without it the base's missing parents make every walk fail).
# - linked worktrees are removed with their files (their HEADs, indexes and checkouts hold other commits).
# - submodules are reset to the commit the base records and sanitized the same way; module stores that the
#   base does not use are deleted.
# - alternates (objects borrowed from another repository) are repacked locally and unlinked.
_SCRIPT = r"""set -euo pipefail
export GIT_TERMINAL_PROMPT=0 GIT_CONFIG_NOSYSTEM=1 GIT_OPTIONAL_LOCKS=0
home=$(mktemp -d "${TMPDIR:-/tmp}/sweflow-sanitizer.XXXXXX")
trap 'rm -rf "$home"' EXIT
export HOME="$home" XDG_CONFIG_HOME="$home" GIT_CONFIG_GLOBAL="$home/.gitconfig"
: >"$GIT_CONFIG_GLOBAL"
fail() { echo "sanitizer: $2" >&2; exit "$1"; }
trust() { git config --global --add safe.directory "$1"; }

sanitize() {  # <folder> <commit>: leave <folder> at <commit> with no route to anything newer
  local dir=$1 want=$2 base gd common wt entry rest sha path kept="" m k keep
  trust "$dir"
  cd "$dir"
  base=$(git rev-parse --verify --quiet "$want^{commit}") || fail 3 "base commit $want not found in $dir"
  gd=$(git rev-parse --absolute-git-dir)
  common=$(cd "$(git rev-parse --git-common-dir)" && pwd -P)
  [ "$(cd "$gd" && pwd -P)" = "$common" ] || fail 10 "$dir is a linked worktree of $common"
  # the first entry is the main worktree (this folder); every other one goes, files included
  while IFS= read -r wt; do
    if [ -e "$wt" ]; then
      trust "$wt"
      git worktree remove --force --force "$wt" || fail 11 "cannot remove the linked worktree $wt"
    fi
  done < <(git worktree list --porcelain | sed -n 's/^worktree //p' | tail -n +2)
  rm -rf "$common/worktrees"
  git reset -q --hard "$base"
  git clean -ffdq
  git -c advice.detachedHead=false checkout -q --detach "$base"
  for r in $(git remote); do git remote remove "$r"; done
  git for-each-ref --format='%(refname)' | while read -r ref; do git update-ref --no-deref -d "$ref"; done
  # what for-each-ref does not list: broken symbolic refs (a removed remote's HEAD), stray files
  find "$gd/refs" -mindepth 1 -type f -delete
  rm -f "$gd/FETCH_HEAD" "$gd/ORIG_HEAD" "$gd/MERGE_HEAD" "$gd/CHERRY_PICK_HEAD" "$gd/REVERT_HEAD" \
    "$gd/AUTO_MERGE" "$gd/packed-refs" "$gd/info/grafts"
  rm -rf "$gd/logs" "$gd/refs/original" "$gd/rr-cache" "$gd/rebase-merge" "$gd/rebase-apply"
  if [ -s "$gd/objects/info/alternates" ]; then
    git repack -a -d -q
    rm -f "$gd/objects/info/alternates"
  fi
  git reflog expire --expire=now --all
  git -c gc.reflogExpire=now -c gc.reflogExpireUnreachable=now gc -q --prune=now
  # submodules: at the commit the base records, sanitized the same way (each in a subshell: its own cd)
  while IFS= read -r -d '' entry; do
    case $entry in "160000 commit "*) ;; *) continue ;; esac
    rest=${entry#160000 commit }
    sha=${rest%%$'\t'*}
    path=${rest#*$'\t'}
    [ -e "$dir/$path/.git" ] || continue
    (sanitize "$dir/$path" "$sha")
    kept+="$(cd "$(git -C "$dir/$path" rev-parse --absolute-git-dir)" && pwd -P)"$'\n'
  done < <(git ls-tree -r -z "$base")
  if [ -d "$common/modules" ]; then
    while IFS= read -r m; do
      keep=0
      while IFS= read -r k; do
        [ -n "$k" ] || continue
        case "$m/" in "$k"/*) keep=1 ;; esac
        case "$k/" in "$m"/*) keep=1 ;; esac
      done <<<"$kept"
      [ "$keep" = 1 ] || rm -rf "$m"
    done < <(find "$common/modules" -mindepth 2 -name HEAD -type f -printf '%h\n' | sort -u)
  fi
  test "$(git rev-parse HEAD)" = "$base" || fail 4 "HEAD is not the base commit in $dir"
  test -z "$(git status --porcelain)" || fail 5 "working tree not clean in $dir"
  test -z "$(git for-each-ref)$(find "$gd/refs" -type f)" || fail 6 "refs remain in $dir"
  test -z "$(git remote)" || fail 7 "remotes remain in $dir"
  test "$(git rev-list --all | sort)" = "$(git rev-list "$base" | sort)" ||
    fail 8 "commits beyond the base are reachable in $dir"
  if git fsck --unreachable --no-reflogs 2>/dev/null | grep -q 'commit'; then
    fail 9 "unreachable commits remain in $dir"
  fi
  test "$(git worktree list --porcelain | grep -c '^worktree ')" = 1 || fail 12 "linked worktrees remain in $dir"
  test ! -e "$gd/objects/info/alternates" || fail 12 "alternates remain in $dir"
}
"""


def sanitizer_command(base_commit: str, workdir: str = "/testbed") -> str:
    """A bash command that resets `workdir` to `base_commit` and removes every route to later history.

    Steps: trust the folders in a private git config, remove linked worktrees, reset + clean, detach HEAD at
    the base, delete every remote, ref (branches, tags, notes, stash, replace) and reflog, drop alternates,
    gc/prune unreachable objects, then the same for each submodule at its recorded commit; then verify HEAD
    == base, a clean tree, no refs or remotes, nothing reachable but the base's ancestry, no unreachable
    commits. Exits non-zero on any failure; prints SWEFLOW_SANITIZER_OK on success.
    """
    script = _SCRIPT + f"(sanitize {shlex.quote(workdir)} {shlex.quote(base_commit)})\necho {SANITIZER_OK}\n"
    return "bash -c " + shlex.quote(script)
