"""The report page: one self-contained HTML file (inline CSS and SVG plots; no script, font or image is
fetched, so it opens offline and from a mail attachment alike). Built from `collect.collect`'s data."""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from . import plots

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1b1f24;background:#fafafa}
header{background:#12355b;color:#fff;padding:14px 28px}
header h1{margin:0;font-size:20px} header p{margin:4px 0 0;opacity:.85}
nav{padding:6px 28px;background:#e8eef5;font-size:13px} nav a{margin-right:14px;color:#12355b}
main{padding:8px 28px 40px;max-width:1180px}
section{margin-top:22px} h2{font-size:17px;border-bottom:2px solid #12355b;padding-bottom:3px}
h3{font-size:14px;margin:14px 0 4px}
.plots{display:flex;flex-wrap:wrap;gap:14px}
figure.plot{margin:0;background:#fff;border:1px solid #d8dee6;border-radius:4px;padding:6px}
figure.plot svg{display:block;width:520px;height:auto}
table{border-collapse:collapse;margin:6px 0;background:#fff;font-size:13px}
th,td{border:1px solid #d8dee6;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eef2f7} td.n{text-align:right;font-variant-numeric:tabular-nums}
.none{color:#777;font-style:italic} code{font-size:12px}
"""


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return esc("-" if value is None else value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return esc(value)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    rows = list(rows)
    if not rows:
        return '<p class="none">none</p>'
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{fmt(c)}</td>' if isinstance(c, (int, float)) else f"<td>{fmt(c)}</td>" for c in r
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure(svg: str | None, caption: str) -> str:
    if not svg:
        return ""
    return f'<figure class="plot" data-plot="{esc(caption)}">{svg}<figcaption>{esc(caption)}</figcaption></figure>'


def plot_row(*figs: str) -> str:
    inner = "".join(f for f in figs if f)
    return f'<div class="plots">{inner}</div>' if inner else ""


# ----------------------------------------------------------------------------------------------- sections
def data_html(d: Mapping[str, Any]) -> str:
    splits = d["splits"]
    if not splits and d["images"] is None:
        return ""
    out = [table(["split", "rows", "converted", "skipped", "repositories"],
                 [[s, v.get("rows"), v.get("converted"), len(v.get("skipped", [])), len(v.get("repos", {}))]
                  for s, v in sorted(splits.items())])]  # fmt: skip
    failures = d["failures"] or {}
    out.append(table(["images", "templates built", "templates failed"],
                     [[d["images"], d["templates"], len(failures)]]))  # fmt: skip
    counts = {
        s: {"rows": v.get("rows", 0), "converted": v.get("converted", 0)} for s, v in sorted(splits.items())
    }
    repos: dict[str, dict[str, float]] = {}
    for s, v in sorted(splits.items()):
        for repo, n in v.get("repos", {}).items():
            repos.setdefault(repo, {})[s] = n
    top = dict(sorted(repos.items(), key=lambda kv: -sum(kv[1].values()))[:15])
    out.append(plot_row(
        figure(plots.bars(counts, title="Rows per split", ylabel="rows"), "rows per split: in the parquet, converted"),
        figure(plots.bars(top, title="Rows per repository", ylabel="rows", horizontal=True, stacked=True),
               "rows per repository (top 15)"),
    ))  # fmt: skip
    if failures:
        out.append("<h3>Template builds that failed</h3>")
        out.append(table(["image", "reason"], sorted(failures.items())))
    skipped = [[s, i.get("row"), i.get("instance_id"), i.get("field"), i.get("reason")]
               for s, v in sorted(splits.items()) for i in v.get("skipped", [])]  # fmt: skip
    if skipped:
        out.append("<h3>Rows not converted</h3>")
        out.append(table(["split", "row", "instance", "field", "reason"], skipped))
    for provider, sm in sorted(d["smoke"].items()):
        out.append(f"<h3>Smoke tests ({esc(provider)})</h3>")
        out.append(table(["ok", "failed"], [[sm["ok"], len(sm["failed"])]]))
    return "".join(out)


def validation_html(v: Mapping[str, Any]) -> str:
    splits = v["splits"]
    if not splits:
        return ""
    verdicts = {s: dict(x["verdicts"]) for s, x in sorted(splits.items())}
    out = [table(["split", "tasks", "valid", "valid without F2P twins", "unguarded (no canary)", "broken",
                  "not validated (infrastructure)"],
                 [[s, x["tasks"], x["valid"], len(x.get("without_f2p_twins") or []), len(x["unguarded"]),
                   sum(x["broken_by_reason"].values()), x["errors"]]
                  for s, x in sorted(splits.items())])]  # fmt: skip
    by_repo: dict[str, dict[str, float]] = {}
    for x in splits.values():
        for repo, c in x["broken_by_repo"].items():
            for verdict, n in c.items():
                by_repo.setdefault(repo, {})[verdict] = by_repo.get(repo, {}).get(verdict, 0) + n
    out.append(plot_row(
        figure(plots.bars(verdicts, title="Verdicts per split", ylabel="tasks", stacked=True),
               "validation verdicts per split"),
        figure(plots.bars(by_repo, title="Broken tasks per repository", ylabel="tasks", horizontal=True,
                          stacked=True), "broken tasks by repository and verdict"),
    ))  # fmt: skip
    reasons = [[s, r, n] for s, x in sorted(splits.items()) for r, n in x["broken_by_reason"].items()]
    out.append("<h3>Broken tasks by reason</h3>" + table(["split", "reason", "tasks"], reasons))
    unguarded = [[s, "trained on" if x["unguarded_kept"] else "left out", iid, why]
                 for s, x in sorted(splits.items()) for iid, why in x["unguarded"]]  # fmt: skip
    if unguarded:
        out.append("<h3>Unguarded tasks (no canary could be planted: a forged test report would be paid)</h3>"
                   + table(["split", "training", "instance", "reason"], unguarded))  # fmt: skip
    return "".join(out)


def _per_sample(run: Mapping[str, Any]) -> list[float | None]:
    """Response tokens per sample: verl's metric is a mean already, the TRL trainer's a step's sum."""
    s = run["series"]
    if run.get("engine") == "verl":
        return list(s["response_tokens"])
    return [
        t / n if t is not None and n else None
        for t, n in zip(s["response_tokens"], s["samples"], strict=True)
    ]


def _run_html(name: str, run: Mapping[str, Any]) -> str:
    x, s = run["steps"], run["series"]
    figs = [
        figure(plots.lines(x, {"reward mean": s["reward_mean"], "resolved share": s["resolved_share"]},
                           title="Reward and resolved share"), "reward mean and resolved share per step"),
        figure(plots.panels(x, {"policy loss": s["policy_loss"], "grad norm": s["grad_norm"], "entropy": s["entropy"],
                                "response tokens per sample": _per_sample(run), "TIS weight mean": s["tis_weight_mean"]},
                            title="Training curves"), "policy loss, grad norm, entropy, response length per step"),
        figure(plots.lines(x, {"zero-variance groups": s["zero_variance_group_share"]}, title="Groups without"
                           " gradient", ylabel="share"), "share of zero-variance groups per step"),
        figure(plots.lines(x, {"KL": s["kl"]}, title="KL (low-variance estimator)"), "KL loss per step"),
        figure(plots.lines(x, {"PPO clip": s["clip_fraction"], "TIS clip": s["tis_clipped_share"]},
                           title="Clip fractions", ylabel="share"), "PPO clip and TIS-clip fractions per step"),
        figure(plots.stacked_steps(x, {"rollout": s["rollout_s"], "train": s["train_s"], "sync": s["weight_sync_s"]},
                                   title="Step time"), "step time: rollout / train / weight sync"),
    ]  # fmt: skip
    aborted = run["aborted_by_reason"]
    if aborted:
        figs.append(figure(plots.bars({r: {"samples": n} for r, n in aborted.items()}, title="Aborted samples",
                                      ylabel="samples", horizontal=True), "aborted samples by reason"))  # fmt: skip
    figs.append(figure(plots.lines(x, {"tamper verdicts": s["tampered"]}, title="Tamper verdicts",
                                   ylabel="samples"), "samples per step whose verdict was tampering"))  # fmt: skip
    rows = [[k, v] for k, v in sorted(run["summary"].items())]
    tampered = run["tampered"]
    return (
        f"<h3>GRPO run {esc(name)} ({esc(run['engine'])})</h3>"
        + plot_row(*figs)
        + "<h4>Steps with tamper verdicts</h4>"
        + table(["step", "tampered", *tampered["codes"]], tampered["steps"])
        + table(["summary", "value"], rows)
    )


def training_html(t: Mapping[str, Any]) -> str:
    out = [_run_html(name, run) for name, run in sorted(t["runs"].items())]
    if t["e2e"]:
        header = list(t["e2e"][0])
        out.append(
            "<h3>End-to-end checks</h3>" + table(header, [[r.get(k) for k in header] for r in t["e2e"]])
        )
    return "".join(out)


def smith_html(s: Mapping[str, Any]) -> str:
    out = []
    for name, p in sorted(s["profiles"].items()):
        strategies = p["strategies"]
        outcomes = {
            st: {k: v for k, v in c.items() if k not in ("candidates", "yield")}
            for st, c in strategies.items()
        }
        rows = [
            [st, c.get("candidates", 0), c.get("kept", 0), c.get("yield", 0.0)]
            for st, c in strategies.items()
        ]
        out.append(
            f"<h3>Profile {esc(name)}: {esc(p['repo'])}: {p['candidates']} candidates, {p['tasks']} tasks</h3>"
        )
        out.append(table(["strategy", "candidates", "kept", "yield"], rows))
        out.append(plot_row(
            figure(plots.bars(outcomes, title="Candidates per strategy by outcome", ylabel="candidates",
                              stacked=True), "validation outcome per strategy"),
            figure(plots.histogram({"FAIL_TO_PASS": p["f2p"], "PASS_TO_PASS": p["p2p"]}, title="Tests per task",
                                   xlabel="tests"), "F2P / P2P tests per synthesized task"),
        ))  # fmt: skip
    return "".join(out)


def sft_html(s: Mapping[str, Any]) -> str:
    if not (s["evaluations"] or s["runs"] or s["messages"]):
        return ""
    out = []
    if s["evaluations"]:
        out.append(table(["expert attempt", "count"], list(s["evaluations"].items())))
    if s["messages"]:
        out.append(table(["messages", "value"], sorted(s["messages"].items())))
    for name, run in sorted(s["runs"].items()):
        out.append(f"<h3>SFT run {esc(name)}</h3>")
        out.append(plot_row(figure(plots.lines(run["steps"], {"loss": run["loss"]}, title="SFT loss"),
                                   "SFT training loss per step")))  # fmt: skip
        out.append(table(["summary", "value"], sorted(run["summary"].items())))
    return "".join(out)


def evaluation_html(e: Mapping[str, Any]) -> str:
    out = []
    for split, v in sorted(e["splits"].items()):
        cps = v["checkpoints"]
        if cps:
            pts = {n: (c["figures"]["pass@1"] or 0.0, *(c["figures"]["pass@1_interval"] or [0.0, 0.0]))
                   for n, c in cps.items()}  # fmt: skip
            out.append(f"<h3>Held-out split {esc(split)}</h3>")
            out.append(plot_row(figure(plots.intervals(pts, title=f"pass@1 by checkpoint ({split})", ylabel="pass@1"),
                                       "resolve rate (mean over attempts) with its 95% interval over tasks")))  # fmt: skip
            rows = []
            for n, c in cps.items():
                f = c["figures"]
                k = f.get("k")
                lo, hi = f.get("pass@1_interval") or (None, None)
                rows.append([n, f.get("pass@1"), f"[{fmt(lo)}, {fmt(hi)}]", f"pass@{k} {fmt(f.get(f'pass@{k}'))}",
                             f.get("tasks"), f.get("attempts"), f.get("lost_attempts"), f.get("turns_mean"),
                             f.get("tokens_mean"), "; ".join(f"{r} {n_}" for r, n_ in c["failure_reasons"].items())])  # fmt: skip
            out.append(table(["checkpoint", "pass@1", "95% interval", "pass@k", "tasks", "attempts", "lost",
                              "turns", "tokens", "failure reasons"], rows))  # fmt: skip
            tasks = sorted({t for c in cps.values() for t in c["grid"]})
            grid = [[t, *(("{}/{}".format(*c["grid"][t]) if t in c["grid"] else "-") for c in cps.values())]
                    for t in tasks]  # fmt: skip
            out.append(table(["task (resolved attempts)", *cps], grid))
        if v["outside"]:
            out.append(table(["predictions file", "tasks", "resolved", "unresolved", "empty", "error"],
                             [[n, *r.values()] for n, r in sorted(v["outside"].items())]))  # fmt: skip
    return "".join(out)


def provenance_html(p: Mapping[str, Any]) -> str:
    ds = p["dataset"]
    rows = [["dataset", ds.get("repo_id")], ["revision", ds.get("revision")], ["commit sha", ds.get("sha")],
            ["sweflow", p["sweflow_version"]], ["code", "; ".join(p["code_trees"]) or None],
            ["artifacts with a record", p["records"]], ["artifacts without a record", p["unrecorded"]],
            ["dataset commits in the records", "; ".join(p["dataset_shas"]) or None]]  # fmt: skip
    return (
        table(["", ""], rows)
        + "<h3>Records by rule</h3>"
        + table(["rule", "artifacts"], p["records_by_rule"].items())
    )


SECTIONS: list[tuple[str, str, Callable[[Mapping[str, Any]], str]]] = [
    ("data", "Data", data_html),
    ("validation", "Validation", validation_html),
    ("training", "Rollouts and training", training_html),
    ("smith", "SWE-smith", smith_html),
    ("sft", "Supervised fine-tuning", sft_html),
    ("evaluation", "Held-out evaluation", evaluation_html),
    ("provenance", "Provenance", provenance_html),
]


def render(
    data: Mapping[str, Any],
    *,
    title: str,
    subtitle: str = "",
    on_section: Callable[[str], None] | None = None,
) -> str:
    """The whole page; `on_section(name)` after each section is drawn (its plots are most of the time)."""
    parts, nav = [], []
    for key, heading, fn in SECTIONS:
        body = fn(data[key]) if key in data else ""
        if on_section:
            on_section(key)
        if not body:
            continue
        nav.append(f'<a href="#{key}">{esc(heading)}</a>')
        parts.append(f'<section id="{key}"><h2>{esc(heading)}</h2>{body}</section>')
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{esc(title)}</h1><p>{esc(subtitle)}</p></header><nav>{''.join(nav)}</nav>"
        f"<main>{''.join(parts)}</main></body></html>\n"
    )
