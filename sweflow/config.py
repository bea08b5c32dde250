"""The workflow config, one rule for Snakemake (rules/common.smk) and the CLI.

The embedded default (config/config.yaml) applies only when no config file is given; a user's files are
merged in order and are complete on their own (schema defaults fill the rest); `--config` overrides go on
top either way.
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .schema import SCHEMA, default, defaults, fill_defaults, schema  # noqa: F401 - the config's API

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "config" / "config.yaml"
OVERRIDES = "--config"
# `harness.extra_repos` given as a string names one of these bundled spec sets (sweflow.stages.data.harness_from_config).
KNOWN_EXTRA_REPOS = ("sample",)

Path_ = tuple[str, ...]
Layer = tuple[str, Mapping[str, Any], dict[Path_, int]]

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def config_files(given: Sequence[str | os.PathLike] = ()) -> list[Path]:
    """The files that make the config: the given ones, or the embedded default when none is given."""
    return [Path(p) for p in given] or [DEFAULT_CONFIG]


# ----- reading ------------------------------------------------------------------------------------------
def read_config_file(path: str | os.PathLike) -> tuple[dict[str, Any], dict[Path_, int]]:
    """(data, {key path: line}) of one YAML file; a syntax error names the file and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config: {exc}".splitlines()[0], file=str(path)) from None
    try:
        node = yaml.compose(text, Loader=_Loader)
        data = yaml.load(text, Loader=_Loader) if node is not None else {}
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        context = exc.context or ""
        if context and exc.context_mark and exc.context_mark is not mark:
            context += f" at line {exc.context_mark.line + 1}"
        problem = exc.problem or "invalid YAML"
        raise ConfigError(f"YAML syntax error: {problem}", file=where, hint=context or None) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"YAML syntax error: {exc}".splitlines()[0], file=str(path)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"the top level must be a mapping of sections, not {type(data).__name__}", file=str(path)
        )
    lines: dict[Path_, int] = {}
    _key_lines(node, (), lines)
    return data, lines


def _key_lines(node: Any, prefix: Path_, out: dict[Path_, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                path = (*prefix, str(key.value))
                out[path] = key.start_mark.line + 1
                _key_lines(value, path, out)


# ----- merging, remembering who set each key ------------------------------------------------------------
def merge(layers: Sequence[Layer]) -> tuple[dict[str, Any], dict[Path_, str]]:
    """Merge like Snakemake (mappings recursively, anything else replaced); also {key path: "file:line"}."""
    cfg: dict[str, Any] = {}
    origins: dict[Path_, str] = {}
    for source, data, lines in layers:
        _merge_into(cfg, data, (), source, lines, origins)
    return cfg, origins


def _merge_into(
    dst: dict[str, Any],
    src: Mapping[str, Any],
    prefix: Path_,
    source: str,
    lines: dict[Path_, int],
    origins: dict[Path_, str],
) -> None:
    for key, value in src.items():
        path = (*prefix, str(key))
        line = lines.get(path)
        origins[path] = f"{source}:{line}" if line else source
        if isinstance(value, Mapping) and isinstance(dst.get(key), dict):
            _merge_into(dst[key], value, path, source, lines, origins)
        else:
            if not isinstance(value, Mapping):
                for stale in [p for p in origins if len(p) > len(path) and p[: len(path)] == path]:
                    del origins[stale]
            dst[key] = copy.deepcopy(dict(value)) if isinstance(value, Mapping) else copy.deepcopy(value)
            if isinstance(value, Mapping):
                _record(value, path, source, lines, origins)


def _record(value: Mapping[str, Any], prefix: Path_, source: str, lines: dict, origins: dict) -> None:
    for key, sub in value.items():
        path = (*prefix, str(key))
        line = lines.get(path)
        origins[path] = f"{source}:{line}" if line else source
        if isinstance(sub, Mapping):
            _record(sub, path, source, lines, origins)


def source_of(origins: Mapping[Path_, str], path: Sequence[Any], fallback: str = "config") -> str:
    """The file (and line) that set `path`, or its nearest parent that some file set."""
    parts = tuple(str(p) for p in path)
    for n in range(len(parts), 0, -1):
        if parts[:n] in origins:
            return origins[parts[:n]]
    return fallback


def _where(origins: Mapping[Path_, str], path: Sequence[Any]) -> str:
    files = [o for o in origins.values() if not o.startswith(OVERRIDES)]
    fallback = files[-1].rsplit(":", 1)[0] if files else "config"
    return source_of(origins, path, fallback)


# ----- checking -----------------------------------------------------------------------------------------
# Every problem is one ConfigError line naming the file (and line) that set the key, the key path and, for an
# unknown key, the nearest valid one.
def check(
    cfg: dict[str, Any], origins: Mapping[Path_, str], sch: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Reject unknown keys at every level, fill schema defaults in place, validate; returns `cfg`."""
    sch = schema() if sch is None else sch
    unknown: list[tuple[Path_, str]] = []
    _unknown_keys(sch, cfg, (), unknown)
    if unknown:
        path, hint = unknown[0]
        more = f"; {len(unknown) - 1} more unknown key(s)" if len(unknown) > 1 else ""
        raise ConfigError(
            "unknown key" + more, file=_where(origins, path), field=".".join(path), hint=hint or None
        )
    fill_defaults(sch, cfg)
    _validate(sch, cfg, origins)
    _semantic_checks(cfg, origins)
    return cfg


def _unknown_keys(
    sch: Mapping[str, Any], data: Any, prefix: Path_, out: list, root: Mapping | None = None
) -> None:
    """Strict everywhere a schema lists `properties`, unless it says `additionalProperties: true` or gives a
    schema for the extra keys (per-split objects)."""
    root = sch if root is None else root
    if not isinstance(data, dict):
        return
    props = sch.get("properties")
    extra = sch.get("additionalProperties")
    for key, value in data.items():
        path = (*prefix, str(key))
        if props is not None and key in props:
            _unknown_keys(props[key], value, path, out, root)
        elif isinstance(extra, dict):
            _unknown_keys(extra, value, path, out, root)
        elif props is not None and extra is not True:
            out.append((path, _nearest(str(key), list(props), prefix, root)))


def _nearest(key: str, valid: list[str], prefix: Path_, root: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if close:
        return f"did you mean {'.'.join((*prefix, close[0]))!r}?"
    paths = _schema_paths(root)
    for cutoff in (1.0, 0.75):  # the same name in another section first, then a near one
        names = difflib.get_close_matches(key, sorted({p[-1] for p in paths}), n=1, cutoff=cutoff)
        if names:
            return f"did you mean {'.'.join(next(p for p in paths if p[-1] == names[0]))!r}?"
    shown = ", ".join(valid[:12]) + (", ..." if len(valid) > 12 else "")
    return f"valid keys here: {shown}" if valid else ""


def _schema_paths(sch: Mapping[str, Any], prefix: Path_ = ()) -> list[Path_]:
    out = []
    for name, sub in (sch.get("properties") or {}).items():
        out.append((*prefix, name))
        if isinstance(sub, dict):
            out.extend(_schema_paths(sub, (*prefix, name)))
    return out


def _validate(sch: dict[str, Any], cfg: dict[str, Any], origins: Mapping[Path_, str]) -> None:
    import jsonschema
    from jsonschema.exceptions import best_match

    validator = jsonschema.Draft202012Validator(sch)
    err = best_match(validator.iter_errors(cfg))
    if err is None:
        return
    path = [str(p) for p in err.absolute_path]
    message = err.message
    if len(message) > 200:
        message = message[:197] + "..."
    raise ConfigError(message, file=_where(origins, path), field=".".join(path) or "(top level)")


def _train_checks(cfg: dict[str, Any], origins: Mapping[Path_, str]) -> None:
    """What the chosen training engine cannot run is an error before any job starts."""
    train = cfg.get("train") or {}
    if not train.get("enabled"):
        return
    from .train.recipe import Recipe, check_recipe

    try:
        check_recipe(Recipe.from_config(train))
    except ConfigError as exc:
        path = tuple(str(exc.field or "train").split("."))
        raise ConfigError(exc.problem, file=_where(origins, path), field=exc.field, hint=exc.hint) from None
    if train["engine"] == "verl":  # what composing verl's launch would refuse, refused now
        from .train.verl_engine import verl_overrides

        try:
            verl_overrides(Recipe.from_config(train), train_files="-", val_files="-", model_path="-",
                           out_dir="-", agent_loop_config="-")  # fmt: skip
        except ConfigError as exc:
            path = tuple(str(exc.field or "train").split("."))
            raise ConfigError(
                exc.problem, file=_where(origins, path), field=exc.field, hint=exc.hint
            ) from None
    ws = train["warm_start"]
    if ws["enabled"] and ws.get("source") == "sft":
        sft = cfg.get("sft") or {}
        if (
            not (sft.get("enabled") and sft["train"]["enabled"])
            or (sft.get("dataset") or cfg["dataset"]["name"]) != cfg["dataset"]["name"]
        ):
            raise ConfigError(
                "the warm start from SFT needs the SFT branch (sft.enabled, sft.train.enabled) on dataset.name",
                file=_where(origins, ("train", "warm_start", "source")),
                field="train.warm_start.source",
                hint="enable sft on this dataset, or warm_start.source: e2e",
            )
    elif ws["enabled"] and not cfg["e2e"].get("instance"):
        raise ConfigError(
            "the warm start trains on the e2e check's recorded sessions, and e2e.instance is null",
            file=_where(origins, ("train", "warm_start", "enabled")),
            field="train.warm_start.enabled",
            hint="set e2e.instance to a sample task, or warm_start.enabled: false",
        )
    if train["split"] not in cfg["dataset"]["splits"]:
        raise ConfigError(
            f"{train['split']!r} is not a configured split",
            file=_where(origins, ("train", "split")),
            field="train.split",
            hint=f"configured: {', '.join(cfg['dataset']['splits'])}",
        )


def _sft_checks(cfg: dict[str, Any], origins: Mapping[Path_, str]) -> None:
    """A real expert endpoint needs a fixed model: otherwise whatever runs in the sandbox picks it."""
    sft = cfg.get("sft") or {}
    expert = (sft.get("collect") or {}).get("expert") or {}
    if sft.get("enabled") and expert.get("endpoint") != "scripted" and not expert.get("model"):
        raise ConfigError(
            "a real expert endpoint needs sft.collect.expert.model (else the agent's requests choose the model)",
            file=_where(origins, ("sft", "collect", "expert", "endpoint")),
            field="sft.collect.expert.model",
        )


def _proxy_checks(cfg: dict[str, Any], origins: Mapping[Path_, str]) -> None:
    """Cloud sandboxes (E2B) reach a proxy on this side over the internet: a branch that runs one needs its
    public URL and declared port before the first job, not hours in (train_grpo, collect_trajectories
    refuse it too)."""
    from .train.proxy_settings import cloud_reach_problem, eval_reach_problem

    branches = []
    if (cfg.get("train") or {}).get("enabled"):
        branches.append((("train", "proxy"), cfg["train"].get("engine"), True))
    if (cfg.get("sft") or {}).get("enabled"):
        branches.append((("sft", "collect", "proxy"), None, False))
    for path, engine, fixed_port in branches:
        node: Any = cfg
        for part in path:
            node = (node or {}).get(part) if isinstance(node, dict) else None
        node = node if isinstance(node, dict) else {}
        problem = cloud_reach_problem(
            cfg["sandbox"]["provider"],
            port=int(node["port"]) if fixed_port else None,
            public_url=node.get("public_url"),
            engine=engine,
            where=".".join(path),
        )
        if problem:
            message, field, hint = problem
            raise ConfigError(message, file=_where(origins, tuple(field.split("."))), field=field, hint=hint)
    ev, proxy = cfg["evaluate"], cfg["train"]["proxy"]  # an evaluation job's own proxy
    problem = ev["enabled"] and ev["checkpoints"] and eval_reach_problem(
        cfg["sandbox"]["provider"], port=int(proxy["port"]), train_url=proxy["public_url"],
        eval_url=ev["proxy_url"], engine=cfg["train"]["engine"],
    )  # fmt: skip
    if problem:
        message, field, hint = problem
        raise ConfigError(message, file=_where(origins, tuple(field.split("."))), field=field, hint=hint)


def _smith_checks(cfg: dict[str, Any], origins: Mapping[Path_, str]) -> None:
    """Synthesized tasks form one split, `train`; the repository profiles must load (one line each)."""
    from .errors import SmithError
    from .smith.profile import load_profile

    ds, smith = cfg["dataset"], cfg["smith"]
    if ds["source"] == "smith":
        if cfg["train"].get("enabled") and cfg["train"]["split"] != "train":
            raise ConfigError(
                "synthesized tasks form the split 'train'",
                file=_where(origins, ("train", "split")),
                field="train.split",
            )
        if cfg["e2e"].get("instance"):
            raise ConfigError(
                "the scripted e2e check knows the sample's fixes only, not synthesized tasks",
                file=_where(origins, ("e2e", "instance")),
                field="e2e.instance",
                hint="set e2e.instance: null (and train.warm_start.enabled: false) with dataset.source smith",
            )
    elif smith["enabled"] and smith["dataset"] == ds["name"]:
        raise ConfigError(
            f"the synthesized dataset needs its own name, not the main dataset's {ds['name']!r}",
            file=_where(origins, ("smith", "dataset")),
            field="smith.dataset",
            hint="or set dataset.source: smith to make it the main dataset",
        )
    key_env = smith["lm"].get("api_key_env")
    if key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key_env)):
        # never echo the value: a key pasted here by mistake must not reach a message, a param or a log
        raise ConfigError(
            "must be the name of an environment variable (not the key itself)",
            file=_where(origins, ("smith", "lm", "api_key_env")),
            field="smith.lm.api_key_env",
        )
    if ds["source"] == "smith" or smith["enabled"]:
        for i, entry in enumerate(smith["repos"]):
            try:
                load_profile(entry)
            except SmithError as exc:
                where = exc.file if isinstance(entry, str) else _where(origins, ("smith", "repos", str(i)))
                raise ConfigError(exc.problem, file=where, field=exc.field or f"smith.repos.{i}") from None
        combine = smith["strategies"]["combine"]
        if combine["max_bugs"] < combine["min_bugs"]:
            raise ConfigError(
                "max_bugs is below min_bugs",
                file=_where(origins, ("smith", "strategies", "combine", "max_bugs")),
                field="smith.strategies.combine.max_bugs",
            )


def _semantic_checks(cfg: dict[str, Any], origins: Mapping[Path_, str]) -> None:
    _train_checks(cfg, origins)
    _proxy_checks(cfg, origins)
    _smith_checks(cfg, origins)
    _sft_checks(cfg, origins)
    ds = cfg["dataset"]
    for i, name in enumerate(ds.get("select_splits") or []):
        if name not in ds["splits"]:
            close = difflib.get_close_matches(name, list(ds["splits"]), n=1)
            raise ConfigError(
                f"{name!r} is not a configured split",
                file=_where(origins, ("dataset", "select_splits", str(i))),
                field="dataset.select_splits",
                hint=f"did you mean {close[0]!r}?" if close else f"configured: {', '.join(ds['splits'])}",
            )
    extra = cfg["harness"].get("extra_repos")
    if isinstance(extra, str) and extra not in KNOWN_EXTRA_REPOS:
        close = difflib.get_close_matches(extra, KNOWN_EXTRA_REPOS, n=1)
        raise ConfigError(
            f"{extra!r} is not a known set of repository specs",
            file=_where(origins, ("harness", "extra_repos")),
            field="harness.extra_repos",
            hint=(f"did you mean {close[0]!r}? " if close else "")
            + f"known: {', '.join(KNOWN_EXTRA_REPOS)}, null, or {{repo: {{version: spec}}}}",
        )
    if isinstance(extra, dict):
        for repo, versions in extra.items():
            if not isinstance(versions, dict):
                raise ConfigError(
                    f"must map versions to specs, not {type(versions).__name__}",
                    file=_where(origins, ("harness", "extra_repos", str(repo))),
                    field=f"harness.extra_repos.{repo}",
                )


HARNESS_PINS = ROOT / "envs" / "harness.txt"


def harness_pins() -> dict[str, str]:
    """envs/harness.txt, the harness pin every grading env installs: package name -> requirement line."""
    out = {}
    for line in HARNESS_PINS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out[re.split(r"[\s=<>!~@\[;]", line, maxsplit=1)[0]] = line
    return out


def check_environment(
    cfg: Mapping[str, Any],
    origins: Mapping[Path_, str],
    *,
    conda: bool = False,
    env: Mapping[str, str] | None = None,
    find_spec: Callable[[str], Any] = importlib.util.find_spec,
) -> None:
    """What can be known before the first job, without a network call or an import: the harness package
    is installed (unless conda envs provide it), the E2B key is set when the provider is e2b."""
    env = os.environ if env is None else env
    package = cfg["harness"]["package"]
    if conda and package not in harness_pins():
        raise ConfigError(
            f"harness package {package!r} is pinned in no conda env (envs/harness.txt)",
            file=_where(origins, ("harness", "package")),
            field="harness.package",
            hint=f"pinned: {', '.join(sorted(harness_pins()))}; add its pin to envs/harness.txt",
        )
    if not conda and find_spec(package) is None:
        raise ConfigError(
            f"harness package {package!r} is not installed in this Python ({sys.executable})",
            file=_where(origins, ("harness", "package")),
            field="harness.package",
            hint="pip install it here, or run with --software-deployment-method conda",
        )
    if cfg["sandbox"]["provider"] == "e2b" and not env.get("E2B_API_KEY"):
        raise ConfigError(
            "the e2b provider needs E2B_API_KEY in the environment, and it is not set",
            file=_where(origins, ("sandbox", "provider")),
            field="sandbox.provider",
        )


# ----- entry points -------------------------------------------------------------------------------------
def layers(
    paths: Sequence[str | os.PathLike] = (), overrides: Mapping[str, Any] | None = None
) -> list[Layer]:
    out: list[Layer] = []
    for p in config_files(paths):
        data, lines = read_config_file(p)
        out.append((str(p), data, lines))
    if overrides:
        out.append((OVERRIDES, dict(overrides), {}))
    return out


def workflow_config(
    config: dict[str, Any],
    *,
    configfiles: Sequence[str | os.PathLike] = (),
    overrides: Mapping[str, Any] | None = None,
    uses_conda: bool = False,
    environment: bool = True,
) -> dict[str, Any]:
    """Check Snakemake's merged `config` in place (defaults filled). `configfiles` and `overrides` are what
    the user gave (--configfile, --config); they are re-read only to name the file behind each key."""
    _, origins = merge(layers(configfiles, overrides))
    check(config, origins)
    if environment:
        check_environment(config, origins, conda=uses_conda)
    return config


def load_config(*paths: str | os.PathLike, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The config the workflow would see for `--configfile paths... --config overrides` (for the CLI)."""
    cfg, origins = merge(layers(paths, overrides))
    return check(cfg, origins)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sweflow.config [FILE...]`: check config files (the embedded default when none) offline."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        load_config(*args)
    except ConfigError as exc:
        print(f"sweflow: {exc.one_line()}", file=sys.stderr)
        return 1
    print(f"ok: {', '.join(str(p) for p in config_files(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
