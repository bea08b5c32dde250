"""The local provider's root: absolute, and every folder above it searchable by the sandbox uid."""

from __future__ import annotations

import os
import stat

from sweflow.sandbox.local import LocalProvider
from sweflow.sandbox.local_bwrap import _searchable


def test_a_relative_root_under_a_private_folder_becomes_searchable(tmp_path, monkeypatch):
    private = tmp_path / "private"  # like `mktemp -d`: 0700, so uid 65534 could not reach the workspace
    (private / "checkout").mkdir(parents=True)
    private.chmod(0o700)
    monkeypatch.chdir(private / "checkout")
    provider = LocalProvider("resources/templates/local")
    assert provider.root == private / "checkout" / "resources" / "templates" / "local"
    provider.root.mkdir(parents=True)
    _searchable(provider.root)
    for folder in (private, private / "checkout", provider.root):
        assert os.stat(folder).st_mode & stat.S_IXOTH, folder
    assert not os.stat(private).st_mode & stat.S_IROTH, "search only, never listing"


def test_the_real_folders_behind_a_symlinked_root_become_searchable(tmp_path):
    real = tmp_path / "real"
    (real / "templates").mkdir(parents=True)
    real.chmod(0o700)
    (tmp_path / "link").symlink_to(real)
    _searchable(tmp_path / "link" / "templates")
    assert os.stat(real).st_mode & stat.S_IXOTH
