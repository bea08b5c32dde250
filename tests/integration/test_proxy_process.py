"""`python -m sweflow.proxy` as a real process with the transformers engine and the tiny model."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sweflow.util import free_port  # noqa: E402
from tests.fixtures.tiny_model import tiny_model_path  # noqa: E402

pytestmark = pytest.mark.integration


def test_proxy_process_with_transformers_engine_records_true_logprobs(tmp_path):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    model_dir = tiny_model_path()
    port = free_port()
    cmd = [sys.executable, "-m", "sweflow.proxy", "--tokenizer", str(model_dir), "--engine", "transformers"]
    cmd += ["--model", str(model_dir), "--port", str(port), "--max-new-tokens", "16"]
    token_file = tmp_path / "admin.token"
    cmd += ["--write-admin-token", str(token_file)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).json()["healthy"]:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "proxy did not become healthy"
            time.sleep(0.2)
        # The generated admin token is only in the 0600 file, never in the process output.
        assert token_file.stat().st_mode & 0o777 == 0o600
        admin = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        assert httpx.post(url + "/session/create", json={"session_id": "p0"}).status_code == 401
        created = httpx.post(url + "/session/create", json={"session_id": "p1"}, headers=admin)
        session_token = created.json()["token"]
        payload = {
            "model": "tiny",
            "max_tokens": 64,
            "stream": True,
            "messages": [{"role": "user", "content": "fix"}],
        }
        resp = httpx.post(
            url + "/v1/messages?beta=true",
            json=payload,
            headers={"Authorization": f"Bearer {session_token}"},
            timeout=60,
        )
        assert resp.status_code == 200 and "event: message_stop" in resp.text
        traj = httpx.post(
            url + "/trajectory/read", json={"session_id": "p1"}, headers=admin, timeout=10
        ).json()
    finally:
        proc.terminate()
        proc.wait(10)
    output = proc.stdout.read()
    assert token_file.read_text().strip() not in output
    [turn] = traj["turns"]
    assert 0 < len(turn["output_ids"]) <= 16
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = turn["prompt_ids"] + turn["output_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    n = len(turn["prompt_ids"])
    expected = [float(logp[n - 1 + k, t]) for k, t in enumerate(turn["output_ids"])]
    assert turn["logprobs"] == pytest.approx(expected, abs=1e-4)
    [sample] = traj["samples"]
    assert sample["rollout_logprobs"][n:] == turn["logprobs"]
