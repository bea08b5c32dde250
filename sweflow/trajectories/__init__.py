"""Agent trajectories for supervised fine-tuning (SWE-smith's recipe).

`collect`: expert attempts graded in fresh sandboxes (kept = resolved and integrity-clean);
`claude_transcripts`: the proxy's recorded turns -> `Trajectory` and the tool-call chat rows; `swe_agent`:
SWE-agent `.traj` files -> `Trajectory`; `text_form`: SWE-smith's text form; `types`: the common `Trajectory`.
"""

# `collect` runs the real agent through the proxy's pass-through mode; `swe_agent` reads `.traj` files of
# SWE-agent 0.x and 1.x; `text_form` is byte-compatible with SWE-smith's converter for `.traj` files.
