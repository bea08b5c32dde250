"""The solution stays out of reach: no gold patch, test patch or pipeline file is visible in an agent sandbox.

Real Docker and local sandboxes, after the row's before-agent sanitizer: the whole filesystem (but the
kernel's /proc, /sys, /dev and the read-only system /usr) and every git object of /testbed are searched
for the distinctive added lines of the task's gold and test patches; the checkout that holds the pipeline
(and the sample's gold patches) must not exist at its host path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import sweflow
from sweflow.sample import load_task

try:  # the fixture helpers are imported explicitly (no shared conftest)
    from tests.integration.conftest_validation import docker_env, local_env
except ModuleNotFoundError:  # pragma: no cover
    from conftest_validation import docker_env, local_env  # type: ignore[no-redef]

pytestmark = [pytest.mark.integration]
TASK = "sweflow__calclib-1"
NEEDLES = "/tmp/.needles-7f3a"
CHECKOUT = Path(sweflow.__file__).resolve().parents[1]


@pytest.fixture(scope="module", params=["docker", "local"])
def env(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"solution-{request.param}")
    return (docker_env if request.param == "docker" else local_env)(tmp, ids=(TASK,))


def _needles(env, inst) -> list[str]:
    """Added lines of the gold and test patches that appear nowhere in the base commit's files."""
    base_text = env.read_base(inst["base_commit"], "calclib/tokenizer.py") + env.read_base(
        inst["base_commit"], "tests/test_tokenizer.py"
    )
    out = []
    for patch in (inst["patch"], inst["test_patch"]):
        for line in patch.splitlines():
            text = line[1:].strip()
            if (
                line.startswith("+")
                and not line.startswith("+++")
                and len(text) >= 16
                and text not in base_text
            ):
                out.append(text)
    return sorted(set(out))


def test_no_gold_test_patch_or_pipeline_file_is_visible(env):
    inst = load_task(TASK)
    needles = _needles(env, inst)
    assert len(needles) >= 4, needles
    meta = env.meta(inst)
    with env.provider.create(env.templates[TASK], timeout=300) as sb:
        [step] = meta["blackbox_execute_cmds"]["before_agent"]
        assert sb.run(step["cmd"], timeout=step["timeout"]).ok
        sb.write_file(NEEDLES, "\n".join(needles) + "\n")
        scan = (
            f"grep -rIlF -f {NEEDLES} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "
            f"--exclude-dir=usr 2>/dev/null | grep -vxF {NEEDLES}; "
            f"cd /testbed && git cat-file --batch-all-objects --batch 2>/dev/null | grep -cF -f {NEEDLES}"
        )
        r = sb.run(scan, timeout=240)
        found = r.stdout.strip().splitlines()
        assert found == ["0"], f"solution text visible in the sandbox: {found[:10]}"
        probe = f"for p in {CHECKOUT} {CHECKOUT}/sweflow/sample/tasks /work /root/.cache/sweflow; do [ -e $p ] && echo $p; done; true"
        seen = sb.run(probe, timeout=30).stdout.split()
        assert str(CHECKOUT) not in seen and f"{CHECKOUT}/sweflow/sample/tasks" not in seen, seen
