"""Where the SFT trainer's processes run, and one process of it (`python -m sweflow.train.sft_worker SPEC`).

`sft_launch(...)` plans the processes of an SFT run like sweflow.train.launch does for GRPO;
`accelerate_command(...)` builds their `accelerate launch` line (FSDP2 or plain DDP). Every rank trains;
rank 0 writes the metrics, the final folder and the summary.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import SweflowError, TrainError
from ..slurm import Node, allocation_nodes
from ..util import atomic_write_json, free_port, log, setup_logging
from .launch import Launch
from .sft import SFTSettings

SFT_WORKER_MODULE = "sweflow.train.sft_worker"


# `accelerate_command(...)` builds that `accelerate launch` line: data parallel over all processes, with FSDP2
# (`--use_fsdp --fsdp_version 2`, transformer-layer wrapping, full state dict for the final save; the flags of
# TRL's trl/accelerate_configs/fsdp2.yaml) when `settings.fsdp == "fsdp2"`, plain DDP (`--multi_gpu`)
# otherwise. Under FSDP activation checkpointing is FSDP's (`--fsdp_activation_checkpointing`), since the
# Trainer refuses both at once.
def accelerate_command(
    settings: SFTSettings,
    nodes: int,
    gpus_per_node: int,
    main_address: str,
    main_port: int,
    node_rank_expr: str,
    script_args: Sequence[str],
    *,
    python: str | None = None,
) -> list[str]:
    """`accelerate launch` argv for `nodes x gpus_per_node` processes running the SFT worker with
    `script_args`. `node_rank_expr` is the machine rank as written (`$SLURM_NODEID` for a shell to expand, or
    a number)."""
    if nodes < 1 or gpus_per_node < 0:
        raise TrainError(f"bad process layout: {nodes} node(s) x {gpus_per_node} GPU(s)", field="parallel")
    if settings.fsdp and gpus_per_node == 0:
        raise TrainError("FSDP2 needs GPUs", field="fsdp", hint="set gpus_per_node, or fsdp: null on CPU")
    per_node = max(gpus_per_node, 1)
    argv = [python or sys.executable, "-m", "accelerate.commands.launch"]
    argv += [
        f"--num_machines={nodes}",
        f"--num_processes={nodes * per_node}",
        f"--machine_rank={node_rank_expr}",
        f"--main_process_ip={main_address}",
        f"--main_process_port={main_port}",
        "--rdzv_backend=static",
        "--same_network",
        "--max_restarts=0",
        "--dynamo_backend=no",
        f"--mixed_precision={'bf16' if settings.bf16 else 'no'}",
    ]
    if settings.fsdp == "fsdp2":
        argv += [
            "--use_fsdp",
            "--fsdp_version=2",
            "--fsdp_auto_wrap_policy=TRANSFORMER_BASED_WRAP",
            "--fsdp_state_dict_type=FULL_STATE_DICT",
            "--fsdp_reshard_after_forward=true",
            "--fsdp_cpu_ram_efficient_loading=true",
            "--fsdp_offload_params=false",
            f"--fsdp_activation_checkpointing={str(settings.gradient_checkpointing).lower()}",
        ]
    elif nodes * per_node > 1:
        argv.append("--multi_gpu")  # DDP; on a machine without GPUs torch.distributed uses gloo
    return [*argv, "-m", SFT_WORKER_MODULE, *script_args]


def _shell_join(argv: Sequence[str], raw: str) -> str:
    """Shell words of `argv`, quoted, except that `raw` inside a word is left for the shell to expand."""
    out = []
    for word in argv:
        head, found, tail = word.partition(raw)
        if not found:
            out.append(shlex.quote(word))
            continue
        out.append((shlex.quote(head) if head else "") + f'"{raw}"' + (shlex.quote(tail) if tail else ""))
    return " ".join(out)


# `sft_launch(...)` plans the processes of an SFT run (`nodes x max(gpus_per_node, 1)` of them), like
# sweflow.train.launch does for GRPO (and with its node discovery, port picking and `Launch` record):
#
# - world size 1: no command (the caller's own process trains, `train_sft`);
# - inside a Slurm job: one `srun` task per node, each an `accelerate launch` agent with `--machine_rank
#   $SLURM_NODEID` (expanded by the task's own shell) and a static rendezvous at the first node's address;
# - outside Slurm: `accelerate launch` with every process on this machine.
def sft_launch(
    settings: SFTSettings,
    spec_path: str | os.PathLike,
    *,
    nodes: int,
    gpus_per_node: int,
    python: str | None = None,
    job_id: str | None = None,
    allocation: Sequence[Node] | None = None,
    port: int | None = None,
) -> Launch:
    """The launch of an SFT run's processes (comment above); `allocation`: the Slurm job's nodes when
    already known (else asked of Slurm by `job_id`), `port`: the rendezvous port (else a free one here)."""
    world = nodes * max(gpus_per_node, 1)
    if world == 1:
        return Launch(None, 1)
    script = [str(spec_path)]
    if job_id:
        found = list(allocation) if allocation is not None else allocation_nodes(job_id)
        if len(found) != nodes:
            raise TrainError(
                f"the Slurm allocation {job_id} has {len(found)} node(s) "
                f"({', '.join(n.name for n in found) or 'none'}) and the SFT run needs {nodes}",
                field="parallel.nodes",
            )
        head, port = found[0].addr, port or free_port()
        rank = "$SLURM_NODEID"  # srun's per-task node index, expanded by the task's own shell
        inner = accelerate_command(settings, nodes, gpus_per_node, head, port, rank, script, python=python)
        argv = [
            "srun", f"--jobid={job_id}", f"--nodes={nodes}", f"--ntasks={nodes}",
            "--ntasks-per-node=1", "--overlap", "--kill-on-bad-exit=1",
            f"--nodelist={','.join(n.name for n in found)}",
            "bash", "-c", "exec " + _shell_join(inner, rank),
        ]  # fmt: skip
        return Launch(argv, world, found, f"{head}:{port}")
    if nodes > 1:
        log.warning(
            "SFT asks for %d nodes but this is not a Slurm job: all %d processes run here", nodes, world
        )
    if settings.fsdp and not gpus_per_node:
        raise TrainError("FSDP2 needs GPUs", field="fsdp", hint="set gpus_per_node, or fsdp: null on CPU")
    port = port or free_port()
    # every process on this machine; without GPUs they are gloo processes (accelerate's --cpu needs mpirun)
    argv = accelerate_command(settings, 1, world, "127.0.0.1", port, "0", script, python=python)
    return Launch(argv, world, [], f"127.0.0.1:{port}")


def _read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TrainError(f"cannot read the SFT rows: {exc.strerror}", file=str(path)) from exc
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise TrainError(f"not JSON: {exc.msg}", file=str(path), row=n) from exc
    return rows


# The spec (JSON): rows (a JSONL path), model_dir, out_dir, settings (SFTSettings fields), metrics_path and
# optionally summary_path. Every rank trains; rank 0 writes the metrics, the final folder and the summary.
def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m sweflow.train.sft_worker SPEC.json", file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", 0))
    try:
        spec = json.loads(Path(args[0]).read_text(encoding="utf-8"))
        missing = [k for k in ("rows", "model_dir", "out_dir", "metrics_path") if k not in spec]
    except (OSError, ValueError, AttributeError) as exc:
        print(f"sweflow: {args[0]}: unreadable SFT spec: {exc}", file=sys.stderr)
        return 1
    if missing:
        print(f"sweflow: {args[0]}: the SFT spec lacks {', '.join(missing)}", file=sys.stderr)
        return 1
    if spec.get("logs"):
        setup_logging(Path(spec["logs"]) / f"sft-rank-{rank}.log")
    from .sft import train_sft

    try:
        settings = SFTSettings.from_mapping(spec.get("settings"))
        summary = train_sft(
            _read_rows(spec["rows"]),
            spec["model_dir"],
            spec["out_dir"],
            settings,
            metrics_path=spec["metrics_path"],
            tracking=spec.get("tracking"),
            tracking_dir=spec.get("tracking_dir"),
        )
        if rank == 0 and spec.get("summary_path"):
            atomic_write_json(spec["summary_path"], summary)
    except SweflowError as exc:
        print(f"sweflow: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
