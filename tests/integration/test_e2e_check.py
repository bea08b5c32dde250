"""e2e_check for real: the Claude Code CLI in a Docker sandbox (host network) talks to the token-recording
proxy on the host, where a ScriptedEngine plays two policies in the tiny tokenizer's tool-call format; the
fresh-sandbox evaluation grades the patch. The gold policy must be resolved (reward 1.0), the policy that
also writes a test file must get 0.0 with the integrity reason, and the recorded tokens must decode to
exactly what the engine produced. One task, one template (built once; cached layers make reruns quick).
The same flow also runs on the local (bubblewrap) provider when bwrap is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from sweflow.stages.e2e import e2e_stage  # noqa: E402
from sweflow.util import jsonl_line  # noqa: E402

CLAUDE = os.environ.get("SWEFLOW_CLAUDE_BIN") or shutil.which("claude")
CLAUDE_VERSION = os.environ.get("SWEFLOW_CLAUDE_VERSION", "2.1.332")
INSTANCE = "sweflow__calclib-1"

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.claude]


def _docker_or_skip():
    docker = pytest.importorskip("docker")
    try:
        docker.from_env(timeout=10).ping()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no Docker engine: {exc}")


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from tests.fixtures.tiny_model import tiny_tokenizer_path

    return AutoTokenizer.from_pretrained(tiny_tokenizer_path())


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """The sample task, its repo at the base commit, the Claude Code binary and the harness's evaluator."""
    from sweflow.sample import materialize_repo, sample_rows
    from sweflow.sandbox.artifacts import artifact_paths, prepare_artifacts
    from sweflow.sandbox.images import cache_dir
    from sweflow.stages.data import harness_from_config

    tmp = tmp_path_factory.mktemp("e2e")
    art_dir = cache_dir().parent / "artifacts" / CLAUDE_VERSION
    paths = artifact_paths(art_dir, prepare_artifacts(art_dir, CLAUDE_VERSION))
    inst = next(r for r in sample_rows("train") if r["instance_id"] == INSTANCE)
    harness = harness_from_config("swebench", "sample")
    evaluator = harness.evaluator_command(inst, timeout_sec=300, marker="SWEFLOW_REWARD_JSON=")
    return {
        "tmp": tmp,
        "paths": paths,
        "inst": inst,
        "evaluator": evaluator,
        "repo": materialize_repo(tmp / "calclib"),
    }


def training_row(task, template: str, provider: str) -> dict:
    from sweflow.dataset.convert import ConvertOptions, convert_instance

    opts = ConvertOptions(
        dataset="sample",
        split="train",
        provider=provider,
        sandbox_timeout_sec=900,
        backend_options={"max_turns": 12, "permission_mode": "acceptEdits", "setting_sources": []},
    )
    return convert_instance(task["inst"], template=template, evaluator_cmd=task["evaluator"], opts=opts)


def check_report(report: dict, out: Path) -> None:
    assert json.loads(out.read_text()) == report
    gold, tamper = report["policies"]["gold"], report["policies"]["test_edit"]
    assert report["ok"] is True, json.dumps(report, indent=1)[:4000]
    assert (gold["status"], gold["reward"], gold["resolved"], gold["failure_reason"]) == (
        "completed",
        1.0,
        True,
        None,
    )
    assert gold["patch"]["files"] == ["calclib/tokenizer.py"] and gold["patch"]["lines_added"] == 8
    assert (
        gold["sample_count"] == 1 and gold["agent"]["tool_calls"] == 2 and gold["agent"]["is_error"] is False
    )
    assert tamper["reward"] == 0.0 and tamper["failure_reason"] == "integrity_violation:test_edit"
    assert tamper["patch"]["failure_reason"] == "prohibited_test_modification"
    assert tamper["integrity_violations"][0]["tool"] == "Write" and tamper["sample_count"] == 1
    assert (gold["num_turns"], tamper["num_turns"]) == (3, 4), "Read, Edit, (Write,) final text"
    for p in (gold, tamper):
        tc = p["token_checks"]
        assert tc["outputs_match"] and tc["logprobs_match"] and tc["lengths_equal"], tc
        assert tc["engine_calls"] == tc["output_spans"] == p["num_turns"] >= 3


def test_e2e_both_policies_with_claude_code_in_docker(task, tokenizer, tmp_path):
    if CLAUDE is None:
        pytest.skip("Claude Code CLI not found (npm i -g @anthropic-ai/claude-code)")
    _docker_or_skip()
    from sweflow.sandbox.build import build_and_record
    from sweflow.sandbox.docker import DockerProvider
    from sweflow.sandbox.images import build_base_image, build_sample_images
    from sweflow.sandbox.spec import TemplateSpec

    build_base_image()
    [image] = build_sample_images([task["inst"]], repo_path=task["repo"].path)
    spec = TemplateSpec(
        image=image, claude_binary=task["paths"]["claude"], runtime_wheel=task["paths"]["wheel"]
    )
    provider = DockerProvider()
    rec = build_and_record(provider, image, tmp_path / "record.json", spec=spec, attempts=2, backoff=1)
    assert rec["ok"], rec
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text(jsonl_line(training_row(task, rec["template"], "docker")))
    out = tmp_path / "e2e" / f"{INSTANCE}.json"
    report = e2e_stage([jsonl], out, instance_id=INSTANCE, provider=provider, tokenizer=tokenizer)
    check_report(report, out)
    assert report["provider"] == "docker" and report["template"] == rec["template"]
    print("\ne2e docker timings:", {k: v["timings"] for k, v in report["policies"].items()})


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
def test_e2e_both_policies_with_the_local_provider(task, tokenizer, tmp_path):
    if CLAUDE is None:
        pytest.skip("Claude Code CLI not found")
    from sweflow.sandbox.build import build_and_record
    from sweflow.sandbox.local import LocalProvider
    from sweflow.sandbox.spec import TemplateSpec

    image = f"sweflow-sample/{INSTANCE}:latest"
    provider = LocalProvider(tmp_path / "templates")
    spec = TemplateSpec(image=image, claude_binary=task["paths"]["claude"])
    rec = build_and_record(
        provider, image, tmp_path / "record.json", spec=spec, attempts=1,
        repo=task["repo"].path, commit=task["inst"]["base_commit"],
    )  # fmt: skip
    assert rec["ok"], rec
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text(jsonl_line(training_row(task, rec["template"], "local")))
    out = tmp_path / "e2e" / f"{INSTANCE}.json"
    evidence = tmp_path / "e2e" / f"{INSTANCE}.evidence.jsonl.gz"
    report = e2e_stage(
        [jsonl], out, instance_id=INSTANCE, provider=provider, tokenizer=tokenizer, evidence_out=evidence
    )
    check_report(report, out)
    assert report["provider"] == "local"
    from sweflow.grading.evidence import read_evidence

    gold, tamper = read_evidence(evidence)
    assert (gold["policy"], gold["resolved"], gold["failure_reason"]) == ("gold", True, None)
    assert set(gold["statuses"]) >= set(task["inst"]["FAIL_TO_PASS"]) and "PASSED" in gold["log"]
    assert all(v == "PASSED" for k, v in gold["statuses"].items() if k in task["inst"]["FAIL_TO_PASS"])
    # the test-editing patch is refused before any sandbox: no log, reason kept
    assert tamper["policy"] == "test_edit" and not tamper["resolved"] and tamper["log"] == ""


# The runner attacks of issue 25 played by a scripted policy through the whole rollout path (Claude Code,
# the proxy, the dispatcher, the agent patch's fresh evaluation): each appends to calclib/__init__.py, which
# every test imports; no name the tamper scan knows appears in the text.
RUNNER_ATTACKS = {
    "runtest_noop_obfuscated": (
        '_m = __import__("".join(map(chr, (112, 121, 116, 101, 115, 116))))\n'
        'setattr(getattr(_m, "Fun" + "ction"), "run" + "test", lambda self: None)\n'
    ),
    "collect_print_exit": (
        "import os as _o, sys as _s, subprocess as _sp\n"
        'if "py" + "test" in _s.modules and not _o.environ.get("_N"):\n'
        '    _f = [a for a in _s.argv[1:] if a.endswith(".py")]\n'
        '    _g = _sp.run([_s.executable, "-m", "py" + "test", "--collect-only", "-q", *_f],\n'
        '                 capture_output=True, text=True, env=dict(_o.environ, _N="1")).stdout.split()\n'
        '    _i = [x for x in _g if "::" in x]\n'
        '    print("".join("PASSED %s\\n" % x for x in _i) + "==== %d passed in 0.2s ====" % len(_i), flush=True)\n'
        "    getattr(_o, '_' + 'exit')(0)\n"
    ),
}


EXPECTED_RUNNER_REFUSAL = {
    "runtest_noop_obfuscated": "suspicious_test_tampering",
    "collect_print_exit": "no_tests_parsed",
}


@pytest.fixture(scope="module", params=["docker", "local"])
def attack_row(request, task, tmp_path_factory):
    """A template of the task on each provider, built once, and its training row."""
    if CLAUDE is None:
        pytest.skip("Claude Code CLI not found")
    from sweflow.sandbox.build import build_and_record
    from sweflow.sandbox.spec import TemplateSpec

    tmp = tmp_path_factory.mktemp(f"attack-{request.param}")
    if request.param == "docker":
        _docker_or_skip()
        from sweflow.sandbox.docker import DockerProvider
        from sweflow.sandbox.images import build_base_image, build_sample_images

        build_base_image()
        [image] = build_sample_images([task["inst"]], repo_path=task["repo"].path)
        spec = TemplateSpec(
            image=image, claude_binary=task["paths"]["claude"], runtime_wheel=task["paths"]["wheel"]
        )
        provider = DockerProvider()
        rec = build_and_record(provider, image, tmp / "record.json", spec=spec, attempts=2, backoff=1)
    else:
        if shutil.which("bwrap") is None:
            pytest.skip("bubblewrap (bwrap) is not installed")
        from sweflow.sandbox.local import LocalProvider

        image = f"sweflow-sample/{INSTANCE}:latest"
        provider = LocalProvider(tmp / "templates")
        spec = TemplateSpec(image=image, claude_binary=task["paths"]["claude"])
        rec = build_and_record(
            provider, image, tmp / "record.json", spec=spec, attempts=1,
            repo=task["repo"].path, commit=task["inst"]["base_commit"],
        )  # fmt: skip
    assert rec["ok"], rec
    return provider, training_row(task, rec["template"], request.param)


def _play(attack_row, tokenizer, name, turns, **cfg_kw):
    from sweflow.offline.policies import ScriptedPolicy
    from sweflow.rollout.e2e import run_policy
    from sweflow.rollout.types import RolloutConfig

    provider, row = attack_row
    policy = ScriptedPolicy(name, turns, tokenizer)
    cfg = RolloutConfig(max_concurrency=1, session_prefix=f"e2e-{name}.", **cfg_kw)
    return run_policy(row, policy, provider=provider, tokenizer=tokenizer, config=cfg)


@pytest.mark.parametrize("attack", sorted(RUNNER_ATTACKS))
def test_runner_attacks_through_the_rollout_path_get_0(task, tokenizer, attack_row, attack):
    """Both reach the fresh evaluation through Claude Code's own edits and come back 0 with a named reason.
    (The canaries' side of the same attacks, with the tamper scan off, is test_attacks_runner.py.)"""
    from sweflow.proxy import format_qwen_xml
    from sweflow.smith.gitrepo import run_git

    init = run_git(task["repo"].path, "show", f"{task['inst']['base_commit']}:calclib/__init__.py").stdout
    last = [ln for ln in init.splitlines() if ln.startswith("__version__")][0]
    path = "/testbed/calclib/__init__.py"
    turns = [
        "Reading the package.\n" + format_qwen_xml("Read", {"file_path": path}),
        format_qwen_xml("Edit", {"file_path": path, "old_string": last, "new_string": last + "\n" + RUNNER_ATTACKS[attack]}),
        "Done.",
    ]  # fmt: skip
    rep = _play(attack_row, tokenizer, attack, turns)
    assert rep["patch"]["files"] == ["calclib/__init__.py"], rep
    # refused with a named reason: the canaries (runner_tampered), the tamper scan, or the host grade
    # (the printed lines went to pytest's capture, and the exit left no test in the log)
    assert (rep["status"], rep["reward"]) == ("completed", 0.0), rep
    assert rep["failure_reason"] == EXPECTED_RUNNER_REFUSAL[attack], rep
    assert rep["token_checks"]["outputs_match"], rep["token_checks"]


@pytest.mark.parametrize("family", ["clone_cluster", "positional"])
def test_an_adaptive_forger_through_the_rollout_path_gets_0(task, tokenizer, attack_row, family):
    """Issue 44's families (tests/fixtures/forgers.py) written by Claude Code's own edit, graded by the
    rollouts' evaluation with the tamper scan off: the canaries, drawn names and the decoy run decide."""
    from sweflow.grading.integrity import IntegrityRules
    from sweflow.proxy import format_qwen_xml
    from sweflow.smith.gitrepo import run_git
    from tests.fixtures.forgers import FAMILIES

    init = run_git(task["repo"].path, "show", f"{task['inst']['base_commit']}:calclib/__init__.py").stdout
    last = [ln for ln in init.splitlines() if ln.startswith("__version__")][0]
    path = "/testbed/calclib/__init__.py"
    edit = {"file_path": path, "old_string": last, "new_string": last + "\n" + FAMILIES[family]}
    turns = [
        "Reading.\n" + format_qwen_xml("Read", {"file_path": path}),
        format_qwen_xml("Edit", edit),
        "Done.",
    ]
    rep = _play(
        attack_row, tokenizer, f"forger-{family}", turns, integrity_rules=IntegrityRules(tamper_patterns=())
    )
    assert rep["patch"]["files"] == ["calclib/__init__.py"], rep
    assert (rep["status"], rep["reward"]) == ("completed", 0.0), rep
    assert rep["failure_reason"] in ("runner_tampered", "fail_to_pass_failure"), rep


@pytest.mark.parametrize(
    ("command", "reward", "reason"),
    [
        ("touch /tmp/.sweflow", 1.0, None),  # the old extraction folder: no longer in the way
        ("cd /testbed && git config core.bare true", 0.0, "patch_unextractable"),
    ],
)
def test_an_agent_that_breaks_patch_extraction_gets_0_not_an_abort(
    task, tokenizer, attack_row, command, reward, reason
):
    """Issue 25: a failure caused from inside the agent's sandbox is the agent's (it was `aborted`)."""
    from sweflow.offline.policies import gold_edits, gold_turns
    from sweflow.proxy import format_qwen_xml

    provider, row = attack_row
    row = {**row, "metadata": {**row["metadata"]}}
    opts = dict(row["metadata"].get("backend_options") or {})
    row["metadata"]["backend_options"] = {**opts, "allowed_tools": ["Bash"]}
    turns = gold_turns(gold_edits(INSTANCE), "/testbed") + [
        format_qwen_xml("Bash", {"command": command}),
        "Done.",
    ]
    rep = _play((provider, row), tokenizer, "extract", turns)
    assert (rep["status"], rep["reward"], rep["failure_reason"]) == ("completed", reward, reason), json.dumps(
        rep
    )[:4000]
