"""Fresh evaluation in real Docker and local sandboxes: the sanitizer on a history that contains the fix,
patch extraction round trips, and our grading compared with the harness package's own on the same logs."""

from __future__ import annotations

import pytest

from sweflow.dataset.sanitizer import SANITIZER_OK
from sweflow.grading.evaluate import evaluate_patch, extract_patch
from sweflow.grading.reward import parse_marker
from sweflow.harness.grader import HostGrader
from sweflow.harness.standalone import WORKDIR
from sweflow.sample import load_task

try:  # the fixture helpers are imported explicitly (no shared conftest)
    from tests.integration.conftest_validation import docker_env, local_env
except ModuleNotFoundError:  # pragma: no cover
    from conftest_validation import docker_env, local_env  # type: ignore[no-redef]

pytestmark = [pytest.mark.integration]
TASK = "sweflow__calclib-1"
GIT = "git -c user.email=t@example.com -c user.name=t"


@pytest.fixture(scope="module", params=["docker", "local"])
def env(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"eval-{request.param}")
    return (docker_env if request.param == "docker" else local_env)(tmp, ids=(TASK,))


def _ok(sb, cmd: str, timeout: float = 60) -> str:
    r = sb.run(cmd, timeout=timeout)
    assert r.ok, (cmd, r.exit_code, r.stdout[-2000:], r.stderr[-2000:])
    return r.stdout


def test_sanitizer_leaves_no_route_to_the_fix(env):
    inst = load_task(TASK)
    meta = env.meta(inst)
    base = inst["base_commit"]
    with env.provider.create(env.templates[TASK], timeout=300) as sb:
        sb.write_file("/tmp/gold.patch", inst["patch"])
        later = _ok(sb, "git rev-list --all | wc -l").strip()
        setup = f"""set -e
{GIT} apply /tmp/gold.patch && {GIT} commit -qam 'the fix'
fix=$(git rev-parse HEAD); blob=$(git rev-parse "$fix:calclib/tokenizer.py")
{GIT} branch fix-branch "$fix"; {GIT} tag v-fix "$fix"; {GIT} tag -a -m annotated v-fix-ann "$fix"
git remote add origin https://example.invalid/calclib.git; git update-ref refs/remotes/origin/main "$fix"
{GIT} notes add -m 'see the fix' "$fix"; git update-ref refs/custom/hidden "$fix"
git checkout -q --detach {base}
echo '# wip' >> calclib/tokenizer.py; {GIT} stash -q
echo leftover > untracked.txt; echo '# dirty' >> calclib/parser.py
echo "$fix $blob"
"""
        fix, blob = _ok(sb, setup).split()
        assert int(_ok(sb, "git rev-list --all | wc -l")) > int(later), "the fix is reachable before"
        [step] = meta["blackbox_execute_cmds"]["before_agent"]
        assert step["name"] == "git_sanitizer" and step["required"]
        r = sb.run(step["cmd"], timeout=step["timeout"])
        assert r.ok and SANITIZER_OK in r.stdout, (r.stdout, r.stderr)
        assert _ok(sb, "git rev-parse HEAD").strip() == base
        assert _ok(sb, "git status --porcelain --ignored") == ""
        assert _ok(sb, "git for-each-ref; git remote; git stash list; git reflog 2>/dev/null || true") == ""
        assert _ok(sb, "git rev-list --all | sort") == _ok(sb, f"git rev-list {base} | sort")
        for obj in (fix, blob):
            assert sb.run(f"git cat-file -e {obj}", timeout=30).exit_code != 0, (
                f"{obj} still in the object store"
            )
        assert "commit" not in _ok(sb, "git fsck --unreachable --no-reflogs --lost-found 2>&1 || true")
        assert _ok(sb, "git log --all --oneline --grep 'the fix'") == ""


def test_extract_patch_round_trip_into_a_fresh_sandbox(env):
    inst = load_task(TASK)
    meta = env.meta(inst)
    with env.provider.create(env.templates[TASK], timeout=300) as agent:
        agent.write_file("/tmp/gold.patch", inst["patch"])
        # the agent commits part of its work, leaves a new file untracked and adds a binary file
        _ok(agent, f"{GIT} apply /tmp/gold.patch && {GIT} commit -qam wip && printf '\\000\\001\\377' > data.bin"
                   " && echo 'VERSION = 2' > calclib/version.py")  # fmt: skip
        got = extract_patch(agent, inst["base_commit"])
        assert got.failure_reason is None and got.test_files == []
        assert (
            "GIT binary patch" in got.patch
            and "calclib/version.py" in got.patch
            and "_scan_number" in got.patch
        )
        _ok(agent, "echo '# sneaky' >> tests/test_parser.py")
        bad = extract_patch(agent, inst["base_commit"])
        assert (bad.failure_reason, bad.test_files) == (
            "prohibited_test_modification",
            ["tests/test_parser.py"],
        )
    with env.provider.create(env.templates[TASK], timeout=300) as agent:
        assert extract_patch(agent, inst["base_commit"]).failure_reason == "empty_generation"
    res = evaluate_patch(env.provider, env.templates[TASK], meta, got.patch)
    assert (res.reward, res.resolved, res.failure_reason, res.error) == (1.0, True, None, None)
    assert res.marker["fail_to_pass_success"] == 2 and res.timings["eval_s"] > 0


def test_the_one_command_setup_tells_a_failed_reset_from_a_failed_apply_and_takes_big_patches(env):
    """fresh.prepare resets, lists, writes a small patch and applies it in one command: a base that does not
    exist is the provider's fault (never failed_apply_patch), a patch that does not apply is the patch's, and
    a patch over fresh.INLINE_PATCH_BYTES (written as a file) grades the same as a small one."""
    from sweflow.grading import fresh

    inst = load_task(TASK)
    meta = env.meta(inst)
    lost = evaluate_patch(env.provider, env.templates[TASK], {**meta, "base_commit": "0" * 40}, inst["patch"])
    assert (lost.failure_reason, lost.infra) == ("fresh_eval_exception", True), lost.error
    assert "resetting" in lost.error
    bad = evaluate_patch(env.provider, env.templates[TASK], meta, inst["patch"].replace("\n-", "\n-zz", 1))
    assert (bad.failure_reason, bad.infra) == ("failed_apply_patch", False)
    # a new module of ~60 KB beside the fix: over the inline size, so it goes through write_file
    body = "".join(f"+X{i} = {i}  # padding to pass the inline limit\n" for i in range(1500))
    big = inst["patch"] + f"diff --git a/calclib/pad.py b/calclib/pad.py\nnew file mode 100644\n--- /dev/null\n" \
        f"+++ b/calclib/pad.py\n@@ -0,0 +1,1500 @@\n{body}"  # fmt: skip
    assert len(big.encode()) > fresh.INLINE_PATCH_BYTES
    res = evaluate_patch(env.provider, env.templates[TASK], meta, big)
    assert (res.reward, res.resolved, res.failure_reason) == (1.0, True, None), res.error


def _official_grade(env, inst, log_text: str, tmp_path):
    """Parse and grade a log with swebench's own get_logs_eval / get_eval_tests_report / resolution status."""
    from swebench.harness.grading import get_eval_tests_report, get_logs_eval, get_resolution_status

    spec = env.harness.make_test_spec({**inst, "hints_text": inst.get("hints_text", "")})
    path = tmp_path / "eval.log"
    path.write_text(log_text)
    statuses, ok = get_logs_eval(spec, str(path))
    assert ok
    report = get_eval_tests_report(
        statuses, {"FAIL_TO_PASS": inst["FAIL_TO_PASS"], "PASS_TO_PASS": inst["PASS_TO_PASS"]}
    )
    return statuses, report, get_resolution_status(report)


def test_grading_agrees_with_the_harness_package_on_the_same_logs(env, tmp_path):
    inst = load_task(TASK)
    meta = env.meta(inst)
    cmd = meta["blackbox_execute_cmds"]["after_agent"][0]["cmd"]
    src = env.read_base(inst["base_commit"], "calclib/tokenizer.py")
    forged = "".join(f"PASSED {t}\\n" for t in inst["FAIL_TO_PASS"])
    forge = env.make_patch(inst["base_commit"], {"calclib/tokenizer.py": src + (
        f"\n\nimport atexit as _a, os as _o\n_a.register(lambda: _o.write(1, b'{forged}'))\n")})  # fmt: skip
    cases = {"gold": inst["patch"], "empty": "", "forged": forge}
    for name, patch in cases.items():
        with env.provider.create(env.templates[TASK], timeout=300) as sb:
            if patch:
                sb.write_file("/tmp/p.diff", patch)
                _ok(sb, "git apply /tmp/p.diff")
            r = sb.run(cmd, timeout=300)
            log = sb.read_file(f"{WORKDIR}/eval.log").decode()
            statuses = sb.read_file(f"{WORKDIR}/tests.json")  # the expected lists the program graded against
        ours = parse_marker(r.stdout)
        official, report, resolution = _official_grade(env, inst, log, tmp_path)
        # the host grader (what sweflow trains on) reads the same log the same way
        host = HostGrader.for_metadata(meta).grade(log, meta, ours["test_exit_code"]).to_marker_dict()
        for key in (
            "parsed_tests",
            "fail_to_pass_success",
            "pass_to_pass_success",
            "resolved",
            "failure_reason",
        ):
            assert host[key] == ours[key], (name, key)
        assert ours["parsed_tests"] == len(official), name
        assert ours["fail_to_pass_success"] == len(report["FAIL_TO_PASS"]["success"]), name
        assert ours["pass_to_pass_success"] == len(report["PASS_TO_PASS"]["success"]), name
        assert sorted(ours["failed_tests"]) == sorted(report["FAIL_TO_PASS"]["failure"] + report["PASS_TO_PASS"]["failure"]), name  # fmt: skip
        assert b"FAIL_TO_PASS" in statuses
        if name == "forged":
            # the official last-line-wins parse is fooled; our exit-code/contradiction check is not
            assert resolution == "RESOLVED_FULL" and ours["resolved"] is False
            assert ours["failure_reason"] == "log_contradicts_exit_code" and ours["test_exit_code"] == 1
        else:
            assert ours["resolved"] == (resolution == "RESOLVED_FULL") == (name == "gold"), name
