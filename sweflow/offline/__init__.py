"""Offline stand-ins for the Hub, the LM and the agent, used by the embedded default and the tests.

`local_hub`/`hub_store`: the Hugging Face Hub; `tiny_model`: a tiny Qwen3; `scripted_lm`, `expert`: LM and
SFT-expert endpoints; `scripted_engine`, `policies`: the proxy's engine and the e2e check's model turns.
No production path imports them except lazily, where the config picks an offline backend (test_layout).
"""
