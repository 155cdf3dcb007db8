#!/usr/bin/env bash
# Put `opus-testbed` on the PATH of every new shell, sudo's included: a symbolic link in
# /usr/local/bin (OPUS_BIN_DIR overrides the folder) to the venv's entry point given as $1.
# Idempotent: a link already there is left alone; a link to another clone's venv is re-pointed
# (the last set-up wins, and says so); a file that is not a link is never replaced. Without
# write access (not root) it says how to run the command instead. Called by scripts/setup.sh.
set -euo pipefail
target=${1:?usage: link-cli.sh /path/to/.venv/bin/opus-testbed}
dir=${OPUS_BIN_DIR:-/usr/local/bin}
link=$dir/opus-testbed
venv=${target%/bin/opus-testbed}

log() { printf '[setup] %s\n' "$*"; }

if [ ! -x "$target" ]; then
  log "error: $target is not an executable (the venv's entry point)" >&2
  exit 1
fi
current=$(readlink "$link" 2>/dev/null || true)
if [ "$current" = "$target" ]; then
  log "opus-testbed on the PATH ($link -> $target)"
  exit 0
fi
if [ -e "$link" ] && [ ! -L "$link" ]; then
  log "warning: $link exists and is not a link, left as is; run $target or activate the venv" \
      "(. $venv/bin/activate)"
  exit 0
fi
if [ ! -w "$dir" ]; then
  log "note: $dir is not writable (set-up not run as root); run $target or activate the venv" \
      "(. $venv/bin/activate)"
  exit 0
fi
ln -sfn "$target" "$link"
log "linked $link -> $target${current:+ (was $current)}: a new shell finds opus-testbed"
