"""validate_task in real Docker and local (bubblewrap) sandboxes: every sample task is valid, and each kind
of broken task gets its own verdict."""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import threading

import pytest

from sweflow.grading.task_validation import validate_task
from sweflow.sample import load_task

try:  # the fixture module is imported explicitly (no shared conftest)
    from tests.integration.conftest_validation import ALL_IDS, sample_env  # noqa: F401
except ModuleNotFoundError:  # pragma: no cover - run without the repo root on sys.path
    from conftest_validation import ALL_IDS, sample_env  # type: ignore[no-redef]  # noqa: F401

pytestmark = [pytest.mark.integration]

TASK = "sweflow__calclib-1"


def test_every_sample_task_validates(sample_env):  # noqa: F811
    env = sample_env

    def one(iid):
        inst = load_task(iid)
        return validate_task(env.provider, env.meta(inst), inst["patch"], repeats=2)

    with cf.ThreadPoolExecutor(max_workers=2) as pool:
        recs = list(pool.map(one, ALL_IDS))
    bad = {r["instance_id"]: (r["verdict"], r["reason"]) for r in recs if r["verdict"] != "valid"}
    assert bad == {}
    for r in recs:
        assert r["gold"] == {"resolved": 2, "runs": 2} and r["empty"] == {"resolved": 0, "runs": 2}
        gold = [x for x in r["runs"] if x["patch"] == "gold"]
        empty = [x for x in r["runs"] if x["patch"] == "empty"]
        # the host's must-fail canaries fail in every run, so the test command exits 1 where planted: 3
        # clones of PASS_TO_PASS tests, and up to 6 twins of FAIL_TO_PASS tests that have an expected
        # literal (2 each), each such test run under a drawn name (counted with them)
        assert all(3 <= x["canaries"] <= 12 for x in r["runs"]), r["runs"]
        assert all(x["reward"] == 1.0 and x["marker"]["test_exit_code"] == 1 for x in gold), gold
        assert all(x["failure_reason"] == "fail_to_pass_failure" for x in empty)
        assert all(x["marker"]["fail_to_pass_success"] == 0 for x in empty)


class AlternatingEnvProvider:
    """Passes FLAKY_RUN=0,0,1,1,2,2,... to successive sandboxes: the 'environment' a flaky test depends on."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name
        self._n = itertools.count()
        self._lock = threading.Lock()

    def create(self, template, *, timeout, env=None, metadata=None):
        with self._lock:
            n = next(self._n)
        return self.inner.create(template, timeout=timeout, env={**(env or {}), "FLAKY_RUN": str(n // 2)},
                                 metadata=metadata)  # fmt: skip


def _variants(env):
    """(name, instance, gold patch, provider) for each deliberately broken version of TASK."""
    inst = load_task(TASK)
    base = inst["base_commit"]
    tok = "calclib/tokenizer.py"
    src = env.read_base(base, tok)
    test_file = "tests/test_tokenizer.py"
    out = []

    # 1. a gold patch that changes code but does not fix the bug
    noop = env.make_patch(base, {tok: src + "\n# refactor: nothing to see here\n"})
    out.append(("gold_does_not_fix", inst, noop, env.provider))

    # 2. the task's fail-to-pass test always passes (so doing nothing "solves" it)
    always = {"tests/test_always.py": "def test_always():\n    assert True\n"}
    test_patch = env.make_patch(base, always, on_top_of=inst["test_patch"])
    easy = {**inst, "test_patch": test_patch, "FAIL_TO_PASS": ["tests/test_always.py::test_always"]}
    out.append(("test_always_passes", easy, inst["patch"], env.provider))

    # 3. a flaky pass-to-pass test: it fails whenever FLAKY_RUN is odd
    flaky_test = {"tests/test_flaky.py": "import os\n\n\ndef test_flaky():\n    assert int(os.environ.get('FLAKY_RUN', '0')) % 2 == 0\n"}  # fmt: skip
    test_patch = env.make_patch(base, flaky_test, on_top_of=inst["test_patch"])
    flaky = {**inst, "test_patch": test_patch, "PASS_TO_PASS": [*inst["PASS_TO_PASS"], "tests/test_flaky.py::test_flaky"]}  # fmt: skip
    out.append(("flaky", flaky, inst["patch"], AlternatingEnvProvider(env.provider)))

    # 4. a gold patch that does not apply (its context is not in the file)
    broken = inst["patch"].replace(
        "         while i < n and text[i].isdigit():", "         while i < n and text[i].isalpha():"
    )
    assert broken != inst["patch"]
    out.append(("does_not_apply", inst, broken, env.provider))

    # 5. a gold patch that also edits a test
    edits_test = env.make_patch(
        base, {test_file: env.read_base(base, test_file) + "\n# tweak\n"}, on_top_of=inst["patch"]
    )
    out.append(("edits_test", inst, edits_test, env.provider))

    # 6. a non-fix that forges PASSED lines for the required tests and makes pytest exit 0
    forged_lines = "".join(f"PASSED {t}\\n" for t in inst["FAIL_TO_PASS"] + inst["PASS_TO_PASS"])
    forge = (
        src + "\n\nimport atexit as _atexit, os as _os\n\n\n"
        f"def _forge():\n    _os.write(1, b'{forged_lines}')\n    _os._exit(0)\n\n\n_atexit.register(_forge)\n"
    )
    out.append(("forged_passed", inst, env.make_patch(base, {tok: forge}), env.provider))

    # 7. tests that yield no canary: the only required tests are parametrized, no PASS_TO_PASS to clone
    param = ('import pytest\n\nfrom calclib.tokenizer import tokenize\n\n\n'
             '@pytest.mark.parametrize("text", ["6.02e23", "1E3"])\ndef test_sci(text):\n'
             '    assert len(tokenize(text)) == 2\n')  # fmt: skip
    test_patch = env.make_patch(base, {"tests/test_sci.py": param}, on_top_of=inst["test_patch"])
    bare = {**inst, "test_patch": test_patch, "PASS_TO_PASS": [],
            "FAIL_TO_PASS": ["tests/test_sci.py::test_sci[6.02e23]", "tests/test_sci.py::test_sci[1E3]"]}  # fmt: skip
    out.append(("no_canary", bare, inst["patch"], env.provider))
    return out


EXPECTED = {
    "gold_does_not_fix": ("gold_fails", "fail_to_pass_failure x2"),
    "test_always_passes": ("empty_passes", "empty patch resolved 2/2 runs"),
    "flaky": ("flaky", "gold resolved 1/2 runs: pass_to_pass_regression"),
    "does_not_apply": ("gold_fails", "failed_apply_patch x2"),
    "edits_test": ("gold_fails", "prohibited_test_modification"),
    # atexit + os._exit is code reaching for the test run: refused before a sandbox (the host-grading
    # side of such forgeries is in test_attacks_reward.py)
    "forged_passed": ("gold_fails", "suspicious_test_tampering"),
    # gold resolves, but nothing guards its runs: out of training unless validation.allow_unguarded
    "no_canary": (
        "unguarded",
        "no canary could be planted in 2 of 2 gold runs (pytest runner): its tests yield "
        "none to clone, so a forged test report would be paid",
    ),  # fmt: skip
}


def test_broken_variants_get_the_right_verdict(sample_env):  # noqa: F811
    env = sample_env

    def one(v):
        name, inst, patch, provider = v
        meta = env.meta(inst)
        return name, validate_task(provider, meta, patch, repeats=2, parallel=1)

    with cf.ThreadPoolExecutor(max_workers=2) as pool:
        got = dict(pool.map(one, _variants(env)))
    codes = {k: (r["verdict"], (r["reason"] or "").split(" — ")[0] or None) for k, r in got.items()}
    assert codes == EXPECTED
    # the detail after the codes counts every failing test of the first failed run
    assert got["gold_does_not_fix"]["reason"].endswith(
        "fail_to_pass_failure: 2 of 2 (tests/test_tokenizer.py::test_scientific_notation=FAILED, "
        "tests/test_tokenizer.py::test_signed_exponent=FAILED)"
    )
    assert (
        " — pass_to_pass_regression: 1 of 11 (tests/test_flaky.py::test_flaky=FAILED)"
        in got["flaky"]["reason"]
    )
    assert (
        got["edits_test"]["gold_test_files"] == ["tests/test_tokenizer.py"]
        and got["edits_test"]["runs"] == []
    )
    assert got["forged_passed"]["runs"] == [] and got["forged_passed"]["gold_test_files"] == [
        "calclib/tokenizer.py"
    ]
    assert "git apply failed" in got["does_not_apply"]["runs"][0]["output_tail"]
    assert all(r["canaries"] == 0 and r["canary_family"] == "pytest" for r in got["no_canary"]["runs"])
    assert (
        got["no_canary"]["gold"] == {"resolved": 2, "runs": 2} and got["no_canary"]["empty"]["resolved"] == 0
    )


# ----- infrastructure failures in real (local) sandboxes ---------------------------------------------------
class KillingProvider:
    """Kills the first `kills` sandboxes' eval process group (or the whole sandbox) while the script runs."""

    def __init__(self, inner, kills: int, *, whole_sandbox: bool = False):
        self.inner, self.name, self.kills, self.whole = inner, inner.name, kills, whole_sandbox
        self.killed = self.missed = 0
        self._lock = threading.Lock()

    def create(self, template, **kw):
        sb = self.inner.create(template, **kw)
        with self._lock:
            doomed = self.killed < self.kills
            self.killed += doomed
        if doomed:
            threading.Thread(target=self._kill_mid_eval, args=(sb,), daemon=True).start()
        return sb

    def _kill_mid_eval(self, sb):
        import os
        import signal
        import time

        # Killed the moment the eval process exists: on a fast machine the whole eval script can end
        # within a few hundred milliseconds, so any wait here would race with its end (and then the
        # "killed" sandbox would report the task's real verdict).
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not sb.killed:
            with sb._plock:
                evals = [p for p in sb._procs if "sweflow-eval" in " ".join(map(str, p.args))]
            if evals:
                if evals[0].poll() is not None:  # ended before the kill: the test says so instead of passing
                    with self._lock:
                        self.missed += 1
                    return
                if self.whole:
                    sb.kill()
                else:
                    os.killpg(evals[0].pid, signal.SIGKILL)
                return
            time.sleep(0.001)


@pytest.fixture(scope="module")
def local_sample(tmp_path_factory):
    try:
        from tests.integration.conftest_validation import local_env
    except ModuleNotFoundError:  # pragma: no cover
        from conftest_validation import local_env  # type: ignore[no-redef]
    return local_env(tmp_path_factory.mktemp("sample-local-kill"), ids=[TASK])


@pytest.mark.parametrize("whole_sandbox", [False, True], ids=["process_group", "sandbox"])
def test_a_sandbox_killed_mid_evaluation_is_an_error_then_valid_on_retry(local_sample, whole_sandbox):
    env = local_sample
    inst = load_task(TASK)
    meta = env.meta(inst)
    # Killed every time: the verdict says nothing about the task.
    prov = KillingProvider(env.provider, kills=100, whole_sandbox=whole_sandbox)
    rec = validate_task(prov, meta, inst["patch"], repeats=1, error_attempts=2, error_backoff=0)
    assert prov.missed == 0, "an eval ended before the test could kill it"
    assert rec["verdict"] == "error" and rec["reason"].startswith("sandbox_lost"), rec["reason"]
    assert all(r["attempts"] == 2 and r["reward"] == 0.0 for r in rec["runs"])
    # Killed once: the retry in a fresh sandbox gives the task's real verdict.
    prov = KillingProvider(env.provider, kills=1, whole_sandbox=whole_sandbox)
    evidence: list = []
    rec = validate_task(
        prov, meta, inst["patch"], repeats=1, error_attempts=2, error_backoff=0, evidence=evidence
    )
    assert prov.missed == 0 and prov.killed == 1
    assert (rec["verdict"], rec["reason"]) == ("valid", None)
    assert sorted(r["attempts"] for r in rec["runs"] if r["patch"] != "decoy") == [1, 2]
    assert [(r["patch"], r["attempts"]) for r in rec["runs"] if r["patch"] == "decoy"] == [("decoy", 1)]
    first = next(e for e in evidence if e["attempt"] == 1 and e["failure_reason"] == "sandbox_lost")
    assert first["error"] and first["statuses"] == {}
    gold = next(e for e in evidence if e["patch"] == "gold" and e["failure_reason"] is None)
    assert set(inst["FAIL_TO_PASS"]) <= {t for t, s in gold["statuses"].items() if s == "PASSED"}
    assert "Start Test Output" in gold["log"]


def test_local_network_is_offline_unless_an_evaluation_asks(local_sample):
    from sweflow.errors import SandboxError

    env = local_sample
    tpl = env.templates[TASK]
    probe = "grep -c : /proc/net/dev"  # one line per interface
    with env.provider.create(tpl, timeout=120) as sb:
        assert sb.run(probe, timeout=60).stdout.strip() == "1", "loopback only"
    with env.provider.create(tpl, timeout=120, network="internet") as sb:
        with open("/proc/net/dev") as fh:
            host = sum(":" in line for line in fh)
        assert sb.run(probe, timeout=60).stdout.strip() == str(host), "the host's interfaces"
    with pytest.raises(SandboxError, match="fresh evaluations only"):
        env.provider.create(tpl, timeout=120, network="internet", egress="127.0.0.1:9")


SPACED = """import pytest

from calclib.tokenizer import NUMBER, OP, tokenize


@pytest.mark.parametrize(
    "text", ["6.02e23 + 1", "6.02e23 * 2", "\\n    1E3 - 4", "\\n    1E3 / 5", "2 + 2"]
)
def test_exponent_then_operator(text):
    kinds = [t.kind for t in tokenize(text.strip())]
    assert kinds[:2] == [NUMBER, OP]
"""


def test_a_task_whose_cut_ids_stand_for_several_tests_is_valid(sample_env):  # noqa: F811
    """The sqlfluff-2386 shape: -rA cuts ids at the first space, so two real tests map to one expected id
    (the form datasets keep); swebench resolves the gold patch on such logs, so validation must too."""
    env = sample_env
    inst = load_task(TASK)
    test_patch = env.make_patch(
        inst["base_commit"], {"tests/test_spaced.py": SPACED}, on_top_of=inst["test_patch"]
    )
    p = "tests/test_spaced.py::test_exponent_then_operator["
    cut = {
        **inst,
        "test_patch": test_patch,
        "FAIL_TO_PASS": [*inst["FAIL_TO_PASS"], p + "6.02e23", p + "\\n"],
        "PASS_TO_PASS": [*inst["PASS_TO_PASS"], p + "2"],
    }
    rec = validate_task(env.provider, env.meta(cut), inst["patch"], repeats=1)
    assert (rec["verdict"], rec["reason"]) == ("valid", None), rec
    gold = next(x for x in rec["runs"] if x["patch"] == "gold")
    assert gold["marker"]["fail_to_pass_success"] == len(cut["FAIL_TO_PASS"])
