"""Task -> Docker image names, and the byte-stable per-image records that fan out template builds."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import DatasetError
from ..schema import default

DEFAULT_PREFIX = "xingyaoww/sweb.eval.x86_64."
LEGACY_PREFIX = "swebench/sweb.eval.x86_64."
LEGACY_REPOS = frozenset(
    {
        "marshmallow-code/marshmallow",
        "pydicom/pydicom",
        "pylint-dev/astroid",
        "pvlib/pvlib-python",
        "pyvista/pyvista",
        "sqlfluff/sqlfluff",
    }
)


@dataclass(frozen=True)
class ImageNaming:
    prefix: str = DEFAULT_PREFIX
    legacy_prefix: str = LEGACY_PREFIX
    legacy_repos: frozenset[str] = LEGACY_REPOS
    tag: str = "latest"

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ImageNaming:
        return cls(
            prefix=cfg.get("prefix", DEFAULT_PREFIX),
            legacy_prefix=cfg.get("legacy_prefix", LEGACY_PREFIX),
            legacy_repos=frozenset(cfg.get("legacy_repos", LEGACY_REPOS)),
            tag=cfg.get("tag", default("images.tag")),
        )

    def image_for(self, instance_id: str, repo: str) -> str:
        """The task image: `_s_` rule (lower-cased) in general; `_1776_` rule for the legacy SWE-bench repos."""
        if repo in self.legacy_repos:
            owner, _, rest = instance_id.partition("__")
            if not rest:
                raise DatasetError(
                    f"instance id {instance_id!r} has no '__' separator", field="instance_id", row=instance_id
                )
            return f"{self.legacy_prefix}{owner}_1776_{rest}".lower() + f":{self.tag}"
        return f"{self.prefix}{instance_id.replace('__', '_s_').lower()}:{self.tag}"


def image_key(image: str) -> str:
    """A file-name-safe, unique key for an image name (used for per-image files and jobs)."""
    key = re.sub(r"[^A-Za-z0-9._-]+", "-", image.replace("/", "--"))
    return key.strip("-.") or "image"


def group_by_image(instances: Iterable[dict[str, Any]], naming: ImageNaming) -> dict[str, dict[str, Any]]:
    """Ordered, de-duplicated images -> the per-image record (image, key, repo, the instances that use it)."""
    out: dict[str, dict[str, Any]] = {}
    for inst in instances:
        image = naming.image_for(inst["instance_id"], inst["repo"])
        rec = out.setdefault(
            image,
            {"image": image, "key": image_key(image), "repo": inst["repo"], "instances": []},
        )
        rec["instances"].append(
            {
                "instance_id": inst["instance_id"],
                "base_commit": inst["base_commit"],
                "version": inst["version"],
            }
        )
    keys = {}
    for image, rec in out.items():
        if rec["key"] in keys:
            raise DatasetError(
                f"images {keys[rec['key']]!r} and {image!r} map to the same key {rec['key']!r}"
            )
        keys[rec["key"]] = image
    return out
