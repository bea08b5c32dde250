"""The tree reads as the architecture: rules/<stage>.smk -> scripts/<rule>.py -> sweflow/stages/<stage>.py ->
domain packages, with no import cycles and no mechanism defined twice (the trusted fresh-sandbox step
included), modules of at most 500 lines whose docstrings take at most five, and the offline stand-ins
reached only through the config."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "sweflow"
RULES = sorted((ROOT / "rules").glob("*.smk"))
STAGES = PKG / "stages"
SCRIPT_RE = re.compile(r"^\s*script:\s*\n\s*f?[\"']([^\"']+)[\"']", re.M)
WORKFLOW_IMPORT_RE = re.compile(r"^\s*(?:from|import)\s+(sweflow(?:\.\w+)*)", re.M)
# What the Snakefile and rules/*.smk may import at parse time: their own stage module and the cross-cutting
# config, errors and redaction.
WORKFLOW_MODULES = {
    "sweflow.stages.common",
    "sweflow.config",
    "sweflow.errors",
    "sweflow.params",
    "sweflow.util",
}
# Public module-level functions that share a name but are different things (not one mechanism twice).
SAME_NAME_DIFFERENT_THING = {
    "main": "each `python -m` entry point has its own",
    "build_parser": "the `sweflow` CLI and the proxy's command line",
    "new_id": "a Docker sandbox id vs. an Anthropic-style message/tool id",
    "parse_statuses": "the sample generator reads its own pytest summary; the harness driver runs a harness "
    "parser (and is embedded byte for byte in every evaluator command)",
}


def source_files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "repo_files" not in p.parts)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """Every sweflow module `path` imports, at any level (functions and TYPE_CHECKING blocks included);
    `from package import name` counts as the submodule when `name` is one."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    files = source_files()
    modules = {module_name(p) for p in files}
    return {module_name(p): imported_modules(p, modules) for p in files}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def script_stages() -> dict[str, str]:
    """scripts/<name>.py -> the rules file (stage) whose rule runs it."""
    owner: dict[str, str] = {}
    for rules in RULES:
        for script in SCRIPT_RE.findall(rules.read_text(encoding="utf-8")):
            name = Path(script).name
            assert owner.get(name, rules.stem) == rules.stem, f"{name} is run by two rules files"
            owner[name] = rules.stem
    return owner


def test_every_rules_file_has_its_stage_module_and_nothing_else_is_one():
    stems = {r.stem for r in RULES}
    modules = {p.stem for p in STAGES.glob("*.py")} - {"__init__"}
    assert stems - {"common"} <= modules, f"rules files without a sweflow/stages module: {stems - modules}"
    assert modules <= stems, f"sweflow/stages modules without a rules file: {modules - stems}"


def test_every_script_is_run_by_a_rule():
    owner = script_stages()
    scripts = {p.name for p in (ROOT / "scripts").glob("*.py")}
    assert scripts == set(owner), f"scripts no rule runs: {scripts - set(owner)}"


@pytest.mark.parametrize("script", sorted(script_stages()), ids=str)
def test_a_script_imports_sweflow_only_through_its_stage_module(script):
    stage = f"sweflow.stages.{script_stages()[script]}"
    tree = ast.parse((ROOT / "scripts" / script).read_text(encoding="utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    sweflow = {m for m in imported if m.split(".")[0] == "sweflow"}
    assert sweflow == {stage}, f"{script} imports {sorted(sweflow)}; only {stage} is its stage"


def test_the_workflow_imports_only_its_glue():
    for path in [ROOT / "Snakefile", *RULES]:
        imported = set(WORKFLOW_IMPORT_RE.findall(path.read_text(encoding="utf-8")))
        assert imported <= WORKFLOW_MODULES, f"{path.name} imports {sorted(imported - WORKFLOW_MODULES)}"


def test_no_import_cycles_among_sweflow_modules():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_public_function_is_defined_twice():
    where: dict[str, list[str]] = defaultdict(list)
    for path in source_files():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
                where[node.name].append(module_name(path))
    twice = {k: v for k, v in where.items() if len(v) > 1 and k not in SAME_NAME_DIFFERENT_THING}
    assert twice == {}
    assert where["provider_from_config"] == ["sweflow.sandbox.registry"]


def test_every_package_says_what_it_owns():
    for init in sorted(PKG.rglob("__init__.py")):
        if "repo_files" in init.parts:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and len(doc.split()) >= 8, f"{init.relative_to(ROOT)} has no docstring saying what it owns"


def test_no_grab_bag_module_names():
    names = {p.stem for p in source_files()}
    assert not names & {"utils2", "helpers", "misc", "common_utils", "stuff"}


# ------------------------------------------------------------------ one source for every default: the schema
# In-sandbox modules run on the sandbox's interpreter with the standard library only: they cannot read it.
IN_SANDBOX = ("sweflow/blackbox/", "sweflow/harness/driver.py", "sweflow/sample/repo_files/")
# Literals equal to the schema default of a key of the same name that are not copies of it: (module, name).
_API_REPO_TYPE = "the Hub API's own repo-type argument (datasets and models alike), not dataset.repo_type"
_OWN_RETRIES = "a client's own retry count; its config section has no such key"
_LISTEN = "a server's listening-address argument; every caller passes the configured one"
NOT_A_CONFIG_READ = {
    ("sweflow/grading/task_validation.py", "attempts"): "an evaluation record's own count of tries",
    ("sweflow/dataset/hub_client.py", "repo_type"): _API_REPO_TYPE,
    ("sweflow/offline/hub_store.py", "repo_type"): _API_REPO_TYPE,
    ("sweflow/dataset/hub_client.py", "attempts"): _OWN_RETRIES,
    ("sweflow/grading/agent_eval.py", "attempts"): "retries of a lost fresh sandbox within one rollout",
    ("sweflow/grading/patch.py", "attempts"): _OWN_RETRIES,
    ("sweflow/sandbox/e2b_api.py", "attempts"): _OWN_RETRIES,
    ("sweflow/smith/lm.py", "attempts"): _OWN_RETRIES,
    ("sweflow/util.py", "attempts"): "the generic retry helper's",
    ("sweflow/offline/local_hub.py", "host"): _LISTEN,
    ("sweflow/offline/local_hub.py", "port"): _LISTEN,
    ("sweflow/proxy/server.py", "host"): _LISTEN,
    ("sweflow/proxy/server.py", "port"): _LISTEN,
    ("sweflow/sample/tasks.py", "split"): "the embedded sample's own split names",
}


def schema_defaults() -> dict[str, set[str]]:
    """Leaf name -> the reprs of the scalar defaults the schema gives keys of that name."""
    from sweflow.schema import schema

    out: dict[str, set[str]] = defaultdict(set)

    def walk(node):
        if not isinstance(node, dict):
            return
        for name, sub in (node.get("properties") or {}).items():
            if isinstance(sub, dict) and "default" in sub and not isinstance(sub["default"], dict | list):
                out[name].add(repr(sub["default"]))
            walk(sub)
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"])

    walk(schema())
    return out


def _literal(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is not None


def _named_literals(tree: ast.AST):
    """(line, how, name, literal node) for every place a literal stands in for a named setting: the
    fallback of `x.get("name", lit)`, `x.get("name") or lit`, `x["name"] or lit`, `x.name or lit`; the
    default of a parameter `name=lit`; a class field `name: T = lit`; a constant `NAME = lit`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            if len(node.args) == 2 and isinstance(node.args[0], ast.Constant) and _literal(node.args[1]):
                yield node.lineno, ".get", node.args[0].value, node.args[1]
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and _literal(node.values[-1]):
            left = node.values[0]
            key = None
            if (
                isinstance(left, ast.Call)
                and isinstance(left.func, ast.Attribute)
                and left.func.attr == "get"
            ):
                key = left.args[0].value if left.args and isinstance(left.args[0], ast.Constant) else None
            elif isinstance(left, ast.Subscript) and isinstance(left.slice, ast.Constant):
                key = left.slice.value
            elif isinstance(left, ast.Attribute):
                key = left.attr
            if key is not None:
                yield node.lineno, "or", key, node.values[-1]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults) :], a.defaults, strict=True))
            pairs += [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
            for arg, d in pairs:
                if _literal(d):
                    yield d.lineno, "parameter", arg.arg, d
        elif isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
                    if _literal(st.value):
                        yield st.lineno, "field", st.target.id, st.value
        elif (
            isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ):
            if node.targets[0].id.isupper() and _literal(node.value):
                yield node.lineno, "constant", node.targets[0].id.lower(), node.value


def default_copies(text: str, where: str, known: dict[str, set[str]]) -> list[str]:
    """Every literal of `_named_literals` that equals the schema's default of a key of that name."""
    found = []
    for line, how, key, value in _named_literals(ast.parse(text)):
        if (
            isinstance(key, str)
            and repr(value.value) in known.get(key, ())
            and (where, key) not in NOT_A_CONFIG_READ
        ):
            found.append((line, f"{where}:{line}: {how} {key} = {value.value!r}"))
    return [text for _, text in sorted(found)]


def test_no_module_copies_a_schema_default():
    known = schema_defaults()
    copies = []
    for path in source_files():
        where = path.relative_to(ROOT).as_posix()
        if not where.startswith(IN_SANDBOX):
            copies += default_copies(path.read_text(encoding="utf-8"), where, known)
    assert copies == [], "read it with sweflow.schema.default(path) or defaults(section): " + "; ".join(
        copies
    )


def test_the_copy_finder_finds_a_copy():
    known = schema_defaults()
    text = """d.get("cpus", 2)
d.get("cpus", 3)
d.get("cpus")
port = d.get("max_tokens") or 32000
x = d["max_tokens"] or 32000
y = cfg.seed or 1
def f(a, attempts=99, *, eps=1e-6, lr=default("train.optim.lr")): pass
class C:
    lr: float = 1e-6
    name: str = "x"
PIDS_LIMIT = 1024
"""
    assert default_copies(text, "x.py", known) == [
        "x.py:1: .get cpus = 2",
        "x.py:4: or max_tokens = 32000",
        "x.py:5: or max_tokens = 32000",
        "x.py:6: or seed = 1",
        "x.py:7: parameter eps = 1e-06",
        "x.py:9: field lr = 1e-06",
        "x.py:11: constant pids_limit = 1024",
    ]
    assert default_copies('d.get("attempts", 3)', "sweflow/util.py", known) == []  # listed, with a reason


# ------------------------------------------------------------------ modules a newcomer can read in one sitting
MAX_LINES = 500


def long_modules(paths: Sequence[Path], limit: int = MAX_LINES) -> dict[Path, int]:
    """Each file of `paths` with more than `limit` lines, with its line count."""
    counts = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in paths}
    return {p: n for p, n in counts.items() if n > limit}


def test_no_module_over_500_lines():
    # source_files() leaves out the data files (the embedded sample repository's files)
    long = {
        p.relative_to(ROOT).as_posix(): n
        for p, n in long_modules([*source_files(), *sorted((ROOT / "scripts").glob("*.py"))]).items()
    }
    assert long == {}, "split it by responsibility"


def test_the_line_counter_finds_a_long_module(tmp_path):
    short, long = tmp_path / "short.py", tmp_path / "long.py"
    short.write_text("x = 1\n" * MAX_LINES)
    long.write_text("x = 1\n" * (MAX_LINES + 1))
    assert long_modules([short, long]) == {long: MAX_LINES + 1}


# ------------------------------------------------------------------ docstrings of five lines, not essays
# What a module owns, in at most five lines; the rest of the explanation sits in comments by the code it
# is about.
MAX_DOCSTRING_LINES = 5
# Modules whose docstring may stay longer, with why.
LONG_DOCSTRING_OK = {
    # sweflow.offline.local_hub stamps the published tiny-model build with the sha256 of this file's bytes
    # (`.built-from`): editing even its docstring would change the stamp and rebuild the published model.
    "sweflow/offline/tiny_model.py": "its bytes are hashed into the tiny model's published Hub build",
    # sweflow.harness.standalone reads this file as text into the eval program of every training row:
    # editing its docstring would change every row's bytes (and rerun convert and all after it).
    "sweflow/harness/driver.py": "its text is embedded in every training row's eval program",
}


def long_docstrings(paths: Sequence[Path], limit: int = MAX_DOCSTRING_LINES) -> dict[Path, int]:
    """Each file of `paths` whose module docstring has more than `limit` lines, with its line count."""
    counts = {}
    for p in paths:
        doc = ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")), clean=False)
        counts[p] = len(doc.strip().splitlines()) if doc else 0
    return {p: n for p, n in counts.items() if n > limit}


def test_module_docstrings_are_at_most_five_lines():
    long = {p.relative_to(ROOT).as_posix(): n for p, n in long_docstrings(sorted(PKG.rglob("*.py"))).items()}
    assert set(LONG_DOCSTRING_OK) <= set(long), "stale LONG_DOCSTRING_OK entries"
    long = {k: v for k, v in long.items() if k not in LONG_DOCSTRING_OK}
    assert long == {}, "say what the module owns in five lines; move the rest to comments by the code"


def test_the_docstring_counter_finds_a_long_docstring(tmp_path):
    short, long, none = tmp_path / "short.py", tmp_path / "long.py", tmp_path / "none.py"
    lines = [f"line {i}" for i in range(MAX_DOCSTRING_LINES + 1)]
    short.write_text('"""' + "\n".join(lines[:MAX_DOCSTRING_LINES]) + '\n"""\nx = 1\n')
    long.write_text('"""' + "\n".join(lines) + '\n"""\nx = 1\n')
    none.write_text("x = 1\n")
    assert long_docstrings([short, long, none]) == {long: MAX_DOCSTRING_LINES + 1}


# ------------------------------------------------------------------ one trusted fresh-sandbox step
# Before tests run on a patch nobody trusts (grading's evaluate_patch, SWE-smith's bug runs), the fresh
# sandbox's tree is reset to the base commit, the patch is written into it and `git apply`-ed, and what the
# apply did is read back by the sandbox's own git (sweflow.grading.fresh: prepare, applied_diff). Only that
# module spells those sandbox commands or names the step's files; each caller runs and reads its own log.
TRUSTED_STEP = "sweflow/grading/fresh.py"
TRUSTED_STEP_COMMAND = re.compile(r"\bgit\b[^\n]{0,80}?\b(?:apply|reset|clean)\b")
TRUSTED_STEP_FILES = (
    "PATCH_FILE",
    "FRESH_DIFF_FILE",
    "IGNORED_BEFORE_FILE",
    "IGNORED_AFTER_FILE",
    "IGNORED_LIST",
)
# Code outside the step that spells such a git command for something else.
NOT_THE_TRUSTED_STEP = {
    "sweflow/dataset/sanitizer.py": "the before-agent script resets the agent's own sandbox (never graded)",
    "sweflow/grading/canary_place.py": "a regex that finds the eval script's own test-patch heredoc",
}


def trusted_step_copies(text: str, where: str) -> list[str]:
    """String literals (docstrings aside) that spell a `git apply`/`reset`/`clean` command or one of the
    step's sandbox paths, and names of the step's files."""
    from sweflow.grading import fresh

    paths = {getattr(fresh, name) for name in TRUSTED_STEP_FILES}
    tree = ast.parse(text)
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if TRUSTED_STEP_COMMAND.search(node.value) or any(p in node.value for p in paths):
                found.append((node.lineno, f"{where}:{node.lineno}: {node.value[:60]!r}"))
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        if name in TRUSTED_STEP_FILES:
            found.append((node.lineno, f"{where}:{node.lineno}: {name}"))
    return [text for _, text in sorted(found)]


def test_one_trusted_fresh_sandbox_step():
    found: dict[str, list[str]] = defaultdict(list)
    for path in source_files():
        where = path.relative_to(ROOT).as_posix()
        found[where] += trusted_step_copies(path.read_text(encoding="utf-8"), where)
    found = {k: v for k, v in found.items() if v}
    assert TRUSTED_STEP in found, "the finder no longer recognises the step itself"
    elsewhere = {k: v for k, v in found.items() if k != TRUSTED_STEP and k not in NOT_THE_TRUSTED_STEP}
    assert elsewhere == {}, f"call sweflow.grading.fresh (prepare, applied_diff) instead: {elsewhere}"
    assert set(NOT_THE_TRUSTED_STEP) <= set(found), "stale NOT_THE_TRUSTED_STEP entries"


def test_the_step_finder_finds_a_copy():
    copy = (
        "def prepare(sb, wd, base):\n"
        '    """Like fresh.prepare: git reset, then git apply."""\n'
        '    sb.run(f"cd {wd} && git reset -q --hard {base}")\n'
        "    sb.write_file(fresh.PATCH_FILE, b'')\n"
        "    sb.run('git -c core.hooksPath=/dev/null apply /tmp/p.diff')\n"
    )
    assert trusted_step_copies(copy, "x.py") == [
        "x.py:3: ' && git reset -q --hard '",
        "x.py:4: PATCH_FILE",
        "x.py:5: 'git -c core.hooksPath=/dev/null apply /tmp/p.diff'",
    ]


# ------------------------------------------------------------------ offline stand-ins behind the config
# sweflow/offline holds the stand-ins for the Hub, the LM and the agent (the embedded default, the tests).
# A production module imports them only inside the function where the config picks the offline backend.
OFFLINE_SWITCH_POINTS = {
    "sweflow.stages.data.hub_endpoint": "dataset.hub.endpoint: local (the bundled Hub)",
    "sweflow.stages.smith.lm_endpoint": "smith.lm.endpoint: scripted (the offline LM endpoint)",
    "sweflow.stages.sft.expert_upstream": "sft.collect.expert.endpoint: scripted (the scripted expert)",
    "sweflow.stages.e2e.load_tokenizer": "e2e.tokenizer: null (the tiny local tokenizer)",
    "sweflow.rollout.e2e.e2e_check": "e2e.instance set: the check's scripted policies",
    "sweflow.rollout.e2e.run_policy": "the scripted engine that plays a policy behind the proxy",
    "sweflow.rollout.e2e.token_checks": "the scripted engine's logprob rule the samples are checked against",
    "sweflow.proxy.__main__.main": "python -m sweflow.proxy --engine scripted",
}


def offline_imports(text: str, name: str, package: str) -> set[str]:
    """`name.<function>` for every import of sweflow.offline inside a function of `text` (`name` for one at
    module level); an import under ``if TYPE_CHECKING:`` never runs and is left out."""
    found: set[str] = set()

    def target(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        if not node.level:
            return [node.module or ""]
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        return [".".join(base + ([node.module] if node.module else []))]

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in (
                "TYPE_CHECKING",
                "typing.TYPE_CHECKING",
            ):
                visit(ast.Module(body=child.orelse, type_ignores=[]), where)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                if any(t == "sweflow.offline" or t.startswith("sweflow.offline.") for t in target(child)):
                    found.add(where)
            scope = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else None
            visit(child, f"{where}.{scope}" if scope and where == name else where)

    visit(ast.parse(text), name)
    return found


def test_offline_stand_ins_are_imported_only_where_the_config_picks_them():
    found: set[str] = set()
    for path in source_files():
        name = module_name(path)
        if name == "sweflow.offline" or name.startswith("sweflow.offline."):
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found |= offline_imports(path.read_text(encoding="utf-8"), name, package)
    assert found == set(OFFLINE_SWITCH_POINTS), (
        f"import sweflow.offline only at a switch point: new {sorted(found - set(OFFLINE_SWITCH_POINTS))}, "
        f"gone {sorted(set(OFFLINE_SWITCH_POINTS) - found)}"
    )


def test_the_offline_import_finder_finds_imports():
    text = (
        "from typing import TYPE_CHECKING\n"
        "from sweflow.offline import local_hub\n"
        "if TYPE_CHECKING:\n"
        "    from sweflow.offline.policies import ScriptedPolicy\n"
        "def switch(cfg):\n"
        "    def inner():\n"
        "        from ..offline.scripted_lm import ScriptedLM\n"
        "def other():\n"
        "    from ..dataset import hub_client\n"
    )
    assert offline_imports(text, "sweflow.stages.x", "sweflow.stages") == {
        "sweflow.stages.x",
        "sweflow.stages.x.switch",
    }
