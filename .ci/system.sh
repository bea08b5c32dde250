#!/usr/bin/env bash
# System dependencies of the pipeline and its tests: bubblewrap (local provider), Docker engine (docker
# provider), debootstrap (test base images: no registry is needed), git, Node/npm (Claude Code package);
# with --test also Debian's Chromium (the report's headless browser test).
# Idempotent; needs root (or sudo) only when something is missing.
set -euo pipefail
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v git >/dev/null || need+=(git)
command -v npm >/dev/null || need+=(npm)
command -v curl >/dev/null || need+=(curl)
# `--test`: also headless Chromium, for the report's browser test (tests/integration/test_report_browser.py)
if [ "${1:-}" = "--test" ]; then command -v chromium >/dev/null || need+=(chromium); fi
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The Claude Code CLI (a native binary shipped through npm), pinned like config/schema.yaml's default.
CLAUDE_VERSION="${SWEFLOW_CLAUDE_CODE_VERSION:-2.1.332}"
if ! claude --version 2>/dev/null | grep -q "^${CLAUDE_VERSION}"; then
  npm install -g --no-fund --no-audit --loglevel=error "@anthropic-ai/claude-code@${CLAUDE_VERSION}" >/dev/null
fi
# A Docker engine without a private-range bridge: containers use --network none or host.
if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    nohup dockerd --bridge=none --iptables=false --ip-forward=false --ip-masq=false \
      >/tmp/sweflow-dockerd.log 2>&1 &
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  fi
  docker info >/dev/null 2>&1 || echo "warning: no Docker engine; Docker tests will be skipped" >&2
fi
echo "system ready: claude=$(claude --version 2>/dev/null | head -1) bwrap=$(command -v bwrap) docker=$(docker info --format '{{.ServerVersion}}' 2>/dev/null || echo none)"
