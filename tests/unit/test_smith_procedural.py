"""Procedural bug generation: each modifier changes what it should and nothing else, seeded and deterministic."""

from __future__ import annotations

import ast
import logging
import re

import pytest

from sweflow.errors import SmithError
from sweflow.sample import materialize_repo
from sweflow.smith import gitrepo
from sweflow.smith.procedural import MODIFIERS, Mutation, entities, mutate_source, procedural_candidates

HEAD = "import os  # keep   this   spacing\nCONST = {'a':1}\n\n\n"
TAIL = "\n\ndef after( y ):   # odd formatting stays\n    return y\n"


def wrap(body: str) -> str:
    return HEAD + body + TAIL


def mutations(source: str, modifier: str, *, seed: int = 0, **kw) -> list[Mutation]:
    kw.setdefault("min_complexity", 1)
    kw.setdefault("min_class_complexity", 1)
    return mutate_source(source, seed=seed, modifiers=[modifier], **kw)


def only(source: str, modifier: str, entity: str = "target", **kw) -> Mutation:
    found = [m for m in mutations(source, modifier, **kw) if m.entity == entity]
    assert len(found) == 1, found
    m = found[0]
    assert (m.modifier, m.explanation.endswith(".")) == (modifier, True)
    assert_only_entity_changed(source, m.source, entity)
    return m


def assert_only_entity_changed(old: str, new: str, entity: str) -> None:
    """Lines before and after the entity's span are byte-identical; the result parses."""
    ast.parse(new)
    node = dict(entities(old, min_complexity=0, min_class_complexity=0))[entity]
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    after = len(old_lines) - node.end_lineno
    assert new_lines[: start - 1] == old_lines[: start - 1]
    assert new_lines[len(new_lines) - after :] == old_lines[node.end_lineno :]


def func(source: str, name: str = "target") -> ast.FunctionDef:
    return next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name)


def body_text(source: str, name: str = "target") -> list[str]:
    return [ast.unparse(s) for s in func(source, name).body]


# ---- entities


COMPLEX = """\
def trivial():
    return 1


def branchy(x, items):
    if x and items or not x:
        return [i for i in items if i]
    return x if x else None


class Small:
    def a(self):
        return 1


class Big(Base):
    def m1(self, x):
        for i in x:
            if i:
                while i:
                    i -= 1
        return x

    def m2(self, x):
        try:
            with open(x) as fh:
                return fh.read()
        except OSError:
            return None
        except ValueError:
            return 1

    def m3(self, x):
        match x:
            case 1:
                return 1
            case 2:
                return 2
            case _:
                return 3
"""


def test_entities_filter_by_complexity_and_keep_source_order():
    names = [n for n, _ in entities(COMPLEX)]
    # branchy: 1 + If + BoolOps (1 + 1) + comprehension + IfExp = 6; Big: 1 + 3 + 3 + 3 = 10.
    assert names == ["branchy", "Big", "Big.m1", "Big.m2", "Big.m3"]
    assert [n for n, _ in entities(COMPLEX, min_class_complexity=12)] == [
        "branchy",
        "Big.m1",
        "Big.m2",
        "Big.m3",
    ]
    assert [n for n, _ in entities(COMPLEX, min_complexity=5)] == ["branchy", "Big"]
    every = entities(COMPLEX, min_complexity=1, min_class_complexity=1)
    assert [n for n, _ in every] == [
        "trivial",
        "branchy",
        "Small",
        "Small.a",
        "Big",
        "Big.m1",
        "Big.m2",
        "Big.m3",
    ]
    assert [node.lineno for _, node in every] == sorted(node.lineno for _, node in every)
    assert isinstance(dict(every)["Big"], ast.ClassDef)


def test_trivial_functions_are_never_mutated_by_default():
    src = wrap("def target(a, b):\n    return a + b\n")
    assert mutate_source(src, seed=0) == []
    assert mutations(src, "change_operator")  # the same function with the filter lowered


def test_unknown_modifier_is_refused():
    with pytest.raises(SmithError, match="unknown procedural modifiers"):
        mutate_source("def f():\n    pass\n", seed=0, modifiers=["nope"])
    assert len(MODIFIERS) == 13 and len(set(MODIFIERS)) == 13


# ---- function modifiers


IF_ELSE = wrap('''\
def target(a, b):
    """Pick one."""
    if a > b:
        x = a
    else:
        x = b
    return x
''')


def test_invert_if_else_negates_the_test_and_swaps_the_branches():
    m = only(IF_ELSE, "invert_if_else")
    stmt = func(m.source).body[1]
    assert ast.unparse(stmt.test) == "not a > b"
    assert [ast.unparse(s) for s in stmt.body] == ["x = b"]
    assert [ast.unparse(s) for s in stmt.orelse] == ["x = a"]
    assert m.kind == "function" and "line 7" in m.explanation
    assert mutations(wrap("def target(a):\n    if a:\n        a = 1\n    return a\n"), "invert_if_else") == []


def test_invert_if_else_unwraps_a_negated_test():
    src = wrap("def target(a):\n    if not a:\n        return 1\n    else:\n        return 2\n")
    stmt = func(only(src, "invert_if_else").source).body[0]
    assert ast.unparse(stmt) == "if a:\n    return 2\nelse:\n    return 1"


@pytest.mark.parametrize(
    "expr,family",
    [
        ("a + b", {"a - b"}),
        ("a * b", {"a / b", "a // b", "a % b"}),
        ("a < b", {"a <= b", "a > b", "a >= b"}),
        ("a == b", {"a != b"}),
        ("a is b", {"a is not b"}),
        ("a in b", {"a not in b"}),
        ("a and b", {"a or b"}),
        ("a & b", {"a | b", "a ^ b"}),
        ("a << b", {"a >> b"}),
    ],
)
def test_change_operator_stays_in_the_family(expr, family):
    src = wrap(f"def target(a, b):\n    return {expr}\n")
    seen = {body_text(only(src, "change_operator", seed=s).source)[0] for s in range(40)}
    assert seen <= {f"return {e}" for e in family}
    assert len(seen) == len(family)  # every member is reachable with some seed


def test_change_operator_covers_augmented_assignment_and_skips_lone_powers():
    src = wrap("def target(a, b):\n    a += b\n    return a\n")
    assert body_text(only(src, "change_operator").source)[0] == "a -= b"
    assert mutations(wrap("def target(a, b):\n    return a ** b\n"), "change_operator") == []


def test_swap_operands_flips_non_commutative_operators_and_comparisons():
    assert body_text(only(wrap("def target(a, b):\n    return a - b\n"), "swap_operands").source) == [
        "return b - a"
    ]
    assert body_text(only(wrap("def target(a, b):\n    return a < b\n"), "swap_operands").source) == [
        "return b < a"
    ]
    for expr in ("a + b", "a == b", "a < b < c"):
        assert mutations(wrap(f"def target(a, b, c):\n    return {expr}\n"), "swap_operands") == []


def test_break_chains_drops_one_operand():
    src = wrap("def target(a, b, c):\n    return a + b + c\n")
    seen = {body_text(only(src, "break_chains", seed=s).source)[0] for s in range(12)}
    assert seen == {"return a + c", "return b + c"}
    src = wrap("def target(a, b, c):\n    return a and b and c\n")
    seen = {body_text(only(src, "break_chains", seed=s).source)[0] for s in range(40)}
    assert seen == {"return b and c", "return a and c", "return a and b"}
    assert mutations(wrap("def target(a, b):\n    return a + b and a\n"), "break_chains") == []


def test_change_constant_moves_a_number_by_one():
    src = wrap('def target(a):\n    """Doc 5."""\n    return a * 10 if a is True else "7"\n')
    seen = {body_text(only(src, "change_constant", seed=s).source)[1] for s in range(12)}
    assert seen == {"return a * 9 if a is True else '7'", "return a * 11 if a is True else '7'"}
    assert mutations(wrap('def target(a):\n    return a is True or a == "3"\n'), "change_constant") == []


def test_different_seeds_can_choose_different_sites():
    src = wrap("def target(a):\n    return [a + 1, a + 2, a + 3, a + 4, a + 5]\n")
    outputs = {only(src, "change_constant", seed=s).source for s in range(20)}
    assert len(outputs) > 4
    assert only(src, "change_constant", seed=3) == only(src, "change_constant", seed=3)


def test_per_entity_gives_distinct_mutations():
    src = wrap("def target(a):\n    return [a + 1, a + 2, a + 3, a + 4, a + 5]\n")
    found = mutations(src, "change_constant", per_entity=3)
    assert len(found) == 3 and len({m.source for m in found}) == 3
    assert len(mutations(src, "change_constant", per_entity=50)) == 5  # one per constant at most


BODY = wrap('''\
def target(items):
    """Count.

    Two lines of doc.
    """
    total = 0
    for item in items:
        total += item
    while total > 10:
        total -= 10
    if total:
        total = -total
    return total
''')


def test_remove_assignment_deletes_one_assignment_but_never_a_lone_statement():
    # `total += item`, `total -= 10` and `total = -total` are each the only statement of their body.
    seen = {tuple(body_text(only(BODY, "remove_assignment", seed=s).source)) for s in range(10)}
    assert seen == {tuple(s for s in body_text(BODY) if s != "total = 0")}
    m = only(
        wrap("def target(a):\n    b = a\n    c: int = b\n    a += 1\n    return a\n"), "remove_assignment"
    )
    assert len(body_text(m.source)) == 3
    assert mutations(wrap("def target(a):\n    x = a\n"), "remove_assignment") == []
    assert (
        mutations(wrap("def target(a):\n    if a:\n        a = 1\n    return a\n"), "remove_assignment") == []
    )


def test_remove_conditional_and_remove_loop():
    m = only(BODY, "remove_conditional")
    assert [type(s).__name__ for s in func(m.source).body] == ["Expr", "Assign", "For", "While", "Return"]
    kinds = {
        tuple(type(s).__name__ for s in func(only(BODY, "remove_loop", seed=s).source).body)
        for s in range(12)
    }
    assert kinds == {("Expr", "Assign", "While", "If", "Return"), ("Expr", "Assign", "For", "If", "Return")}
    assert mutations(wrap("def target(a):\n    if a:\n        return 1\n"), "remove_conditional") == []
    assert mutations(wrap("def target(a):\n    return a\n"), "remove_loop") == []


def test_remove_wrapper_keeps_the_body_of_try_and_with():
    src = wrap(
        "def target(path):\n    try:\n        x = int(path)\n    except ValueError:\n        x = 0\n"
        "    finally:\n        print(1)\n    return x\n"
    )
    assert body_text(only(src, "remove_wrapper").source) == ["x = int(path)", "return x"]
    src = wrap(
        "def target(path):\n    with open(path) as fh:\n        data = fh.read()\n        return data\n"
    )
    assert body_text(only(src, "remove_wrapper").source) == ["data = fh.read()", "return data"]
    assert mutations(wrap("def target(a):\n    return a\n"), "remove_wrapper") == []


def test_shuffle_statements_reorders_a_body_but_not_the_docstring():
    outputs = [only(BODY, "shuffle_statements", seed=s).source for s in range(6)]
    full = body_text(BODY)
    for out in outputs:
        body = body_text(out)
        assert body[0] == full[0] and body != full and sorted(body) == sorted(full)
    assert len(set(outputs)) > 1
    src = wrap('def target(a):\n    """Doc."""\n    a = 1\n    return a\n')
    assert mutations(src, "shuffle_statements") == []  # only two statements after the docstring


def test_shuffle_that_keeps_the_order_yields_nothing():
    src = wrap("def target(a):\n    print(a)\n    print(a)\n    print(a)\n")
    assert mutations(src, "shuffle_statements") == []  # every order is the same program


# ---- class modifiers


CLASS = wrap('''\
class Target(Base, Mixin, metaclass=Meta):
    """A class."""

    limit = 3

    def first(self):
        return 1

    def second(self):
        return 2

    def third(self):
        return 3
''')


def class_node(source: str) -> ast.ClassDef:
    return next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))


def test_remove_base_class_drops_one_positional_base():
    seen = set()
    for s in range(12):
        cls = class_node(only(CLASS, "remove_base_class", entity="Target", seed=s).source)
        assert [ast.unparse(k) for k in cls.keywords] == ["metaclass=Meta"]
        seen.add(tuple(ast.unparse(b) for b in cls.bases))
    assert seen == {("Base",), ("Mixin",)}
    assert mutations(wrap("class Target:\n    def a(self):\n        pass\n"), "remove_base_class") == []


def test_remove_methods_drops_one_method_when_there_are_two_or_more():
    seen = set()
    for s in range(12):
        m = only(CLASS, "remove_methods", entity="Target", seed=s)
        assert m.kind == "class"
        body = class_node(m.source).body
        assert isinstance(body[0], ast.Expr) and body[0].value.value == "A class."
        seen.add(tuple(n.name for n in body if isinstance(n, ast.FunctionDef)))
    assert seen == {("second", "third"), ("first", "third"), ("first", "second")}
    one = wrap("class Target(Base):\n    x = 1\n\n    def a(self):\n        pass\n")
    assert mutations(one, "remove_methods") == []


def test_shuffle_methods_reorders_methods_and_keeps_the_docstring_first():
    m = only(CLASS, "shuffle_methods", entity="Target")
    body = class_node(m.source).body
    assert isinstance(body[0], ast.Expr) and body[0].value.value == "A class."
    assert ast.unparse(body[1]) == "limit = 3"
    names = [n.name for n in body if isinstance(n, ast.FunctionDef)]
    assert names != ["first", "second", "third"] and sorted(names) == ["first", "second", "third"]
    assert mutations(wrap("class Target:\n    def a(self):\n        pass\n"), "shuffle_methods") == []


def test_class_modifiers_apply_only_to_classes_and_function_modifiers_only_to_functions():
    found = mutate_source(CLASS, seed=0, min_complexity=1, min_class_complexity=1)
    classes = {"remove_base_class", "remove_methods", "shuffle_methods"}
    assert {m.modifier for m in found if m.kind == "class"} == classes
    assert {m.modifier for m in found if m.kind == "function"} == {"change_constant"}  # `return 1` etc.
    assert {m.entity for m in found if m.kind == "class"} == {"Target"}


# ---- layout preservation


def test_methods_keep_their_indentation_decorators_and_multiline_docstrings():
    src = (
        "class Box:\n"
        "    @staticmethod\n"
        "    def target(a, b):  # trailing comment\n"
        '        """First.\n\n        Indented doc line.\n        """\n'
        "        return a - b  # last line comment\n"
        "\n    def other(self):\n        return 'x'\n"
    )
    m = only(src, "swap_operands", entity="Box.target")
    assert m.source.splitlines()[1:8] == [
        "    @staticmethod",
        "    def target(a, b):",
        '        """First.',
        "",
        "        Indented doc line.",
        '        """',
        "        return b - a  # last line comment",
    ]
    assert ast.get_docstring(func(m.source)) == ast.get_docstring(func(src))


def test_tabs_and_crlf_line_endings_are_kept():
    src = "class Box:\r\n\tdef target(self, a):\r\n\t\tx = a - 1\r\n\t\treturn x\r\n\r\nY = 2\r\n"
    m = only(src, "swap_operands", entity="Box.target")
    assert (
        m.source
        == "class Box:\r\n\tdef target(self, a):\r\n\t    x = 1 - a\r\n\t    return x\r\n\r\nY = 2\r\n"
    )


def test_every_modifier_result_parses_and_leaves_other_lines_alone():
    for modifier in MODIFIERS:
        for source in (BODY, IF_ELSE, CLASS):
            for m in mutations(source, modifier, per_entity=3):
                assert_only_entity_changed(source, m.source, m.entity)
                assert m.source.startswith(HEAD) and (m.entity == "after" or m.source.endswith(TAIL))


def test_same_seed_gives_identical_output():
    for source in (BODY, IF_ELSE, CLASS, COMPLEX):
        first = mutate_source(source, seed=7, min_complexity=1, min_class_complexity=1, per_entity=2)
        again = mutate_source(source, seed=7, min_complexity=1, min_class_complexity=1, per_entity=2)
        assert first == again and first


# ---- candidates on the sample repository


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    base = tmp_path_factory.mktemp("procedural")
    info = materialize_repo(base / "r")
    tree = gitrepo.checkout(info.path, info.head, base / "tree")
    return tree, info.head, gitrepo.source_files(tree)


def run(sample, **kw):
    tree, head, files = sample
    return procedural_candidates(tree, files, repo="sweflow/calclib", commit=head, seed=0, **kw)


def test_candidates_on_the_sample_repository(sample):
    tree, head, files = sample
    cands = run(sample)
    assert len(cands) > 20
    id_re = re.compile(rf"^sweflow__calclib\.{head[:8]}\.procedural__[0-9a-f]{{8}}$")
    assert all(id_re.match(c.instance_id) for c in cands)
    assert len({c.instance_id for c in cands}) == len(cands) == len({c.patch for c in cands})
    for c in cands:
        assert c.strategy == "procedural" and len(c.files) == 1 and c.files[0] in files
        assert not gitrepo.is_test_path(c.files[0])
        assert gitrepo.patch_files(c.patch) == [c.files[0]]
        assert c.meta["entity"].startswith(c.files[0] + "::") and c.meta["modifier"] in MODIFIERS
        assert c.meta["kind"] in ("function", "class") and c.meta["seed"] == 0 and c.meta["explanation"]
        assert gitrepo.applies(tree, c.patch)
    assert len({c.meta["modifier"] for c in cands}) >= 8


def test_test_files_are_skipped_even_when_listed(sample):
    tree, head, files = sample
    tests = [f for f in gitrepo.tracked_files(tree) if f.endswith(".py") and gitrepo.is_test_path(f)]
    assert tests
    assert procedural_candidates(tree, tests, repo="sweflow/calclib", commit=head, seed=0) == []


def test_shards_partition_the_candidates(sample):
    whole = {c.instance_id for c in run(sample)}
    parts = [{c.instance_id for c in run(sample, shard=k, shards=3)} for k in range(3)]
    assert set().union(*parts) == whole
    assert sum(len(p) for p in parts) == len(whole) and all(parts)
    with pytest.raises(SmithError):
        run(sample, shard=3, shards=3)


def test_candidates_are_deterministic_and_seeded(sample):
    first = run(sample)
    assert [c.to_dict() for c in first] == [c.to_dict() for c in run(sample)]
    tree, head, files = sample
    other = procedural_candidates(tree, files, repo="sweflow/calclib", commit=head, seed=1)
    assert {c.instance_id for c in other} != {c.instance_id for c in first}


def test_max_candidates_is_a_deterministic_ordered_sample(sample):
    whole = [c.instance_id for c in run(sample)]
    picked = [c.instance_id for c in run(sample, max_candidates=10)]
    assert picked == [c.instance_id for c in run(sample, max_candidates=10)]
    assert len(picked) == 10 and len(set(picked)) == 10
    assert picked == [i for i in whole if i in set(picked)]  # generation order kept
    assert picked != whole[:10]
    assert [c.instance_id for c in run(sample, max_candidates=10_000)] == whole


def test_modifier_selection_and_unparsable_files(tmp_path, caplog):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "bad.py").write_text("def broken(:\n", encoding="utf-8")
    (tmp_path / "pkg" / "good.py").write_text(
        "def good(a, b):\n    if a:\n        return a - b\n    return b < a\n", encoding="utf-8"
    )
    with caplog.at_level(logging.WARNING, logger="sweflow.smith.procedural"):
        cands = procedural_candidates(
            tmp_path,
            ["pkg/bad.py", "pkg/good.py"],
            repo="o/r",
            commit="0" * 40,
            seed=0,
            modifiers=["swap_operands"],
            min_complexity=2,
        )
    assert "pkg/bad.py" in caplog.text
    assert [c.meta["modifier"] for c in cands] == ["swap_operands"] and cands[0].files == ("pkg/good.py",)
    assert cands[0].meta["entity"] == "pkg/good.py::good"


def test_mutated_entity_keeps_the_files_double_quotes():
    """ast.unparse writes '...'; a bugged function in a double-quoted file must not stand out by it."""
    src = (
        'def f(op, x):\n    """Doc."""\n    if op == "-":\n        return f"neg {x!r}"\n'
        '    elif op == "+":\n        return x + 1\n    return "none"\n'
    )
    muts = mutate_source(src, seed=0, modifiers=["change_constant"])
    assert muts and all("'" not in m.source for m in muts), [m.source for m in muts]
    single = src.replace('"-"', "'-'").replace('"+"', "'+'").replace('"none"', "'none'")
    muts = mutate_source(single, seed=0, modifiers=["change_constant"])
    assert muts and all("'-'" in m.source for m in muts)  # a single-quoted file keeps its style
