"""config/keys.yaml: every schema key is a result or an operational value, and params carry only results.

The dry-run matrix on a finished embedded run is tests/integration/test_incremental.py."""

from __future__ import annotations

import re
from pathlib import Path

from sweflow import params
from sweflow.config import load_config, schema


def schema_leaves():
    return params.schema_keys(schema())


def test_every_schema_key_is_covered_and_no_entry_is_unused():
    leaves = schema_leaves()
    assert len(leaves) > 200
    uncovered = [".".join(p) for p in leaves if params.entry_for(p) is None]
    assert uncovered == []
    used = {params.entry_for(p) for p in leaves}
    unused = [".".join(e) for e in params.key_kinds() if e not in used]
    assert unused == []
    # an entry names keys the schema has: none is a typo that covers nothing below it
    for entry in params.key_kinds():
        assert any(params._covers(entry, p) for p in leaves), entry


def test_the_longest_entry_decides():
    assert params.kind_of("sandbox.docker.cpus") == "operational"
    assert params.kind_of("sandbox.provider") == "result"
    assert params.kind_of("validation.parallel") == "operational"
    assert params.kind_of("validation.repeats") == "result"
    assert params.kind_of("train.proxy.build_mode") == "result"
    assert params.kind_of("train.proxy.public_url") == "operational"


def test_result_values_drop_operational_keys_and_sort_the_rest():
    cfg = load_config()
    sandbox = params.result_values(cfg["sandbox"], "sandbox")
    assert "docker" not in sandbox and "pids_limit" not in sandbox["local"]
    assert sandbox["provider"] == "local" and sandbox["local"]["templates_root"]
    assert list(sandbox) == sorted(sandbox)
    assert params.result_values(cfg["validation"], "validation") == {
        "allow_unguarded": False,
        "decoys": 1,
        "repeats": 2,
    }
    ops = params.operational_values(cfg["validation"], "validation")
    assert ops == {"error_attempts": 3, "error_backoff_sec": 5, "parallel": 2}
    # the same values in another key order, or 5.0 for 5, are the same param
    shuffled = {k: cfg["agent"][k] for k in reversed(list(cfg["agent"]))}
    shuffled["backend_options"] = dict(reversed(list(cfg["agent"]["backend_options"].items())))
    assert repr(params.result_values(shuffled, "agent")) == repr(params.result_values(cfg["agent"], "agent"))
    assert repr(params.canonical({"b": 5.0, "a": [1.5, 2.0]})) == "{'a': [1.5, 2], 'b': 5}"


def test_the_whole_configs_operational_values_name_only_operational_keys():
    cfg = load_config()
    ops = params.operational_values(cfg, "")

    def leaves(node, path=()):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from leaves(v, (*path, k))
        else:
            yield path

    found = list(leaves(ops))
    assert found and all(params.kind_of(p) == "operational" for p in found)
    assert ("sandbox", "docker", "cpus") in found and ("validation", "parallel") in found


def test_a_carried_key_is_a_param_of_exactly_the_rules_that_write_it():
    rules = Path(params.KEYS).parents[1] / "rules"
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(rules.glob("*.smk")))
    blocks = dict(re.findall(r"^(?:rule|checkpoint) (\w+):\n((?:[ \t]+.*\n|\n)*)", text, re.M))
    assert params.carried()
    for path, names in params.carried().items():
        ref = "".join(f'["{p}"]' for p in path)
        readers = sorted(name for name, body in blocks.items() if ref in body.split("params:", 1)[-1])
        assert readers == sorted(names), (path, readers)


def test_a_key_that_changes_what_an_artifact_holds_is_a_result_and_a_param_of_its_rule():
    """sft.collect.attempts is the expert's attempts per task (k): 2 -> 3 must rerun the collection, whose
    params carry result_params("sft.collect"); smith.statements.attempts decides which tasks get a statement."""
    cfg = load_config()
    for key in ("sft.collect.attempts", "smith.statements.attempts"):
        assert params.kind_of(key) == "result", key
    collect = params.section(cfg, "sft.collect")
    more = {**collect, "attempts": collect["attempts"] + 1}
    assert params.result_values(more, "sft.collect") != params.result_values(collect, "sft.collect")
    assert params.operational_values(more, "sft.collect") == params.operational_values(collect, "sft.collect")
    rules = Path(params.KEYS).parents[1] / "rules"
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(rules.glob("*.smk")))
    blocks = dict(re.findall(r"^(?:rule|checkpoint) (\w+):\n((?:[ \t]+.*\n|\n)*)", text, re.M))
    assert 'result_params("sft.collect")' in blocks["collect_trajectories"].split("params:", 1)[1]
    assert 'SMITH["statements"]["attempts"]' in blocks["problem_statements"].split("params:", 1)[1]
