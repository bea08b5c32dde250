#!/usr/bin/env bash
# Build megatron-core releases the package index lacks from a Megatron-LM clone and install each beside the
# venv as $VENV/megatron-core-<version>/ (with triton, which 0.18+ imports), where
# tests/unit/test_megatron_qwen35.py finds them. Usage: megatron_core_src.sh VENV MEGATRON_LM REF...
# pip's own `pip wheel` of this tree fails under setuptools 80-84 ("has_pure_modules" on None): call the
# PEP 517 backend directly in a throwaway build venv instead.
set -euo pipefail
venv=$(realpath "$1"); repo=$2; shift 2
[ -d "$repo/.git" ] || [ -f "$repo/HEAD" ] || { echo "megatron_core_src: $repo is not a Megatron-LM git clone" >&2; exit 2; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/build"
"$work/build/bin/pip" install -q --upgrade pip 'setuptools>=80' pybind11 numpy
"$venv/bin/pip" download -q --no-deps -d "$work/dl" triton
for tag in "$@"; do
  mkdir -p "$work/$tag" && git -C "$repo" archive "$tag" | tar -x -C "$work/$tag"
  (cd "$work/$tag" && "$work/build/bin/python" -c \
    "import setuptools.build_meta as b; b.build_wheel('$work/whl/$tag')" >"$work/$tag.log" 2>&1) \
    || { tail -20 "$work/$tag.log" >&2; exit 1; }
  whl=$(ls "$work/whl/$tag"/megatron_core-*.whl)
  version=$(basename "$whl" | cut -d- -f2)
  rm -rf "$venv/megatron-core-$version"
  "$venv/bin/pip" install -q --no-deps --ignore-requires-python --target "$venv/megatron-core-$version" \
    "$whl" "$work"/dl/triton-*.whl
  echo "megatron-core $version ($tag) -> $venv/megatron-core-$version"
done
