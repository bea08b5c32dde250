"""Shared fixtures for the evaluation/validation integration tests (imported explicitly by those files).

Templates are built once per test module: Docker uses the sample task images as templates (the pipeline's
`prebuilt` mode: grading needs neither Claude Code nor the blackbox server), the local provider builds its
bubblewrap workspaces from the materialised sample repository.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sweflow.dataset.convert import ConvertOptions, convert_instance
from sweflow.sample import instance_ids, load_task, materialize_repo

ALL_IDS = instance_ids(None)


def docker_available() -> str | None:
    """None when a Docker engine answers, else the reason it does not."""
    try:
        import docker

        docker.from_env(timeout=10).ping()
    except Exception as exc:  # noqa: BLE001
        return f"no Docker engine: {exc}"
    return None


def bwrap_available() -> str | None:
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "true"], capture_output=True, timeout=30)
    return None if probe.returncode == 0 else f"bwrap cannot run here: {probe.stderr.decode()[-200:]}"


def sample_harness():
    pytest.importorskip("swebench", reason="swebench 4.x is the harness these tests grade with")
    from sweflow.stages.data import harness_from_config

    return harness_from_config("swebench", "sample")


def metadata_for(harness, inst: dict[str, Any], template: str, provider: str) -> dict[str, Any]:
    """The training row's metadata for `inst`, exactly as the convert stage writes it."""
    opts = ConvertOptions(dataset="sample", split="train", provider=provider)
    cmd = harness.evaluator_command(inst, timeout_sec=opts.eval_timeout_sec, marker=opts.reward_marker)
    parser = harness.parser_for(inst["repo"]).__name__
    return convert_instance(inst, template=template, evaluator_cmd=cmd, opts=opts, parser=parser)["metadata"]


class SampleEnv:
    """A provider, one template per sample task, the harness and a scratch clone for making patches."""

    def __init__(self, name: str, provider, templates: dict[str, str], harness, repo: Path, tmp: Path):
        self.name, self.provider, self.templates, self.harness = name, provider, templates, harness
        self.repo, self.tmp = repo, tmp

    def meta(self, inst: dict[str, Any]) -> dict[str, Any]:
        return metadata_for(self.harness, inst, self.templates[inst["instance_id"]], self.name)

    def make_patch(self, base: str, files: dict[str, str], *, on_top_of: str = "") -> str:
        """A `git diff --binary` from `base` (plus `on_top_of` applied first) to the tree with `files` written."""
        work = self.tmp / "patchwork"
        if not work.exists():
            _git(self.tmp, "clone", "-q", str(self.repo), str(work))
        _git(work, "checkout", "-q", "--detach", "-f", base)
        _git(work, "clean", "-fdq")
        if on_top_of:
            subprocess.run(["git", "apply"], input=on_top_of.encode(), cwd=work, check=True, timeout=60)
        for rel, text in files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
        _git(work, "add", "-A")
        return _git(work, "diff", "--cached", "--binary", base)

    def read_base(self, base: str, rel: str) -> str:
        return _git(self.repo, "show", f"{base}:{rel}")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout


def docker_env(tmp: Path, ids=ALL_IDS) -> SampleEnv:
    why = docker_available()
    if why:
        pytest.skip(why)
    harness = sample_harness()
    from sweflow.sandbox.images import build_sample_images
    from sweflow.sandbox.registry import provider_from_config
    from sweflow.sandbox.settings import SandboxSettings

    info = materialize_repo(tmp / "calclib")
    rows = [load_task(i) for i in ids]
    tags = build_sample_images(rows, repo_path=info.path)
    settings = SandboxSettings.from_config({"docker": {"cpus": 1, "mem_mb": 1024}})
    provider = provider_from_config("docker", settings, purpose="eval")
    return SampleEnv("docker", provider, dict(zip(ids, tags, strict=True)), harness, info.path, tmp)


def local_env(tmp: Path, ids=ALL_IDS) -> SampleEnv:
    why = bwrap_available()
    if why:
        pytest.skip(why)
    harness = sample_harness()
    from sweflow.sandbox.images import sample_image_name
    from sweflow.sandbox.registry import provider_from_config
    from sweflow.sandbox.settings import SandboxSettings
    from sweflow.sandbox.spec import TemplateSpec, template_name

    info = materialize_repo(tmp / "calclib")
    root = tmp / "local-templates"
    settings = SandboxSettings.from_config({"local": {"templates_root": str(root)}})
    provider = provider_from_config("local", settings, purpose="eval")
    templates = {}
    for iid in ids:
        image = sample_image_name(iid)
        rec = provider.build(
            TemplateSpec(image=image),
            template_name(image),
            repo=info.path,
            commit=load_task(iid)["base_commit"],
        )
        templates[iid] = rec.template
    return SampleEnv("local", provider, templates, harness, info.path, tmp)


@pytest.fixture(scope="module", params=["docker", "local"])
def sample_env(request, tmp_path_factory) -> SampleEnv:
    tmp = tmp_path_factory.mktemp(f"sample-{request.param}")
    return docker_env(tmp) if request.param == "docker" else local_env(tmp)
