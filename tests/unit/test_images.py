"""Task image names and per-image grouping."""

from __future__ import annotations

import pytest

from sweflow.dataset.image_names import ImageNaming, group_by_image, image_key
from sweflow.errors import DatasetError


def test_swegym_rule_lowercases_and_replaces_double_underscore():
    n = ImageNaming()
    assert (
        n.image_for("getmoto__moto-7365", "getmoto/moto")
        == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-7365:latest"
    )
    assert n.image_for("Project-MONAI__MONAI-3403", "Project-MONAI/MONAI") == (
        "xingyaoww/sweb.eval.x86_64.project-monai_s_monai-3403:latest"
    )


@pytest.mark.parametrize(
    "repo, iid, expected",
    [
        (
            "pydicom/pydicom",
            "pydicom__pydicom-1694",
            "swebench/sweb.eval.x86_64.pydicom_1776_pydicom-1694:latest",
        ),
        (
            "sqlfluff/sqlfluff",
            "sqlfluff__sqlfluff-4764",
            "swebench/sweb.eval.x86_64.sqlfluff_1776_sqlfluff-4764:latest",
        ),
        (
            "marshmallow-code/marshmallow",
            "marshmallow-code__marshmallow-1359",
            "swebench/sweb.eval.x86_64.marshmallow-code_1776_marshmallow-1359:latest",
        ),
        (
            "pvlib/pvlib-python",
            "pvlib__pvlib-python-1707",
            "swebench/sweb.eval.x86_64.pvlib_1776_pvlib-python-1707:latest",
        ),
    ],
)
def test_legacy_repos_use_1776_rule(repo, iid, expected):
    assert ImageNaming().image_for(iid, repo) == expected


def test_prefix_is_configurable():
    n = ImageNaming.from_config({"prefix": "sweflow-sample/sweb.eval.x86_64."})
    assert (
        n.image_for("sweflow__calclib-3", "sweflow/calclib")
        == "sweflow-sample/sweb.eval.x86_64.sweflow_s_calclib-3:latest"
    )


def test_keys_are_file_safe_and_distinct():
    a = image_key("xingyaoww/sweb.eval.x86_64.getmoto_s_moto-7365:latest")
    b = image_key("swebench/sweb.eval.x86_64.getmoto_s_moto-7365:latest")
    assert a != b and "/" not in a and ":" not in a


def test_grouping_is_ordered_and_deduplicated():
    inst = [
        {"instance_id": f"o__r-{i}", "repo": "o/r", "base_commit": "a" * 40, "version": "1"}
        for i in (2, 1, 2)
    ]
    groups = group_by_image(inst, ImageNaming(prefix="p/"))
    assert list(groups) == ["p/o_s_r-2:latest", "p/o_s_r-1:latest"]
    assert len(groups["p/o_s_r-2:latest"]["instances"]) == 2


def test_legacy_id_without_separator_is_an_error():
    with pytest.raises(DatasetError, match="no '__' separator"):
        ImageNaming().image_for("pydicom-1", "pydicom/pydicom")
