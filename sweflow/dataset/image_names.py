"""Task -> Docker image names, and the byte-stable per-image records that fan out template builds."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import DatasetError
from ..schema import default, defaults


@dataclass(frozen=True)
class ImageNaming:
    prefix: str = default("images.prefix")
    legacy_prefix: str = default("images.legacy_prefix")
    legacy_repos: frozenset[str] = frozenset(default("images.legacy_repos"))
    tag: str = default("images.tag")

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ImageNaming:
        c = defaults("images", cfg)
        return cls(
            prefix=c["prefix"],
            legacy_prefix=c["legacy_prefix"],
            legacy_repos=frozenset(c["legacy_repos"]),
            tag=c["tag"],
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
