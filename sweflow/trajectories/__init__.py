"""Agent trajectories for supervised fine-tuning (SWE-smith's recipe).

- `collect`: expert attempts with the real agent through the proxy's pass-through mode, graded in fresh
  sandboxes (kept = resolved and integrity-clean);
- `claude_transcripts`: the proxy's recorded turns -> `Trajectory` and the tool-call chat rows;
- `swe_agent`: SWE-agent `.traj` files (0.x, 1.x) -> `Trajectory`;
- `text_form`: SWE-smith's text form (byte-compatible with its converter for `.traj` files);
- `types`: the common `Trajectory`.
"""
