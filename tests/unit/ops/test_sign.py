"""``pipeline sign SOURCE FILE`` prints a curl the ingress's own verifier accepts, and says when it expires."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from pipeline import providers, topology
from pipeline.cli import main
from pipeline.errors import InvalidRecordError, PipelineError
from pipeline.ops.sign import sign_file

ROOT = Path(__file__).resolve().parents[3]
BODY = b'{"id": "evt_mine_1", "object": "event", "type": "invoice.paid", "data": {}}\n'


def _headers(command: str) -> dict[str, str]:
    words = shlex.split(command)
    pairs = [words[i + 1] for i, word in enumerate(words) if word == "-H"]
    return dict(pair.split(": ", 1) for pair in pairs)


def test_the_signed_curl_verifies_with_the_ingress_preset_and_sends_the_file(tmp_path: Path) -> None:
    """The headers verify against the secret, the body is the file byte for byte, and the secret is not printed."""
    event = tmp_path / "event.json"
    event.write_bytes(BODY)
    topo = topology.load(ROOT / "topologies" / "default.toml")
    signed = sign_file(topo, "stripe", event, {"STRIPE_WEBHOOK_SECRET": "whsec_unit"}, base_url="http://h:1")
    assert "whsec_unit" not in signed.command
    words = shlex.split(signed.command)
    assert words[words.index("--data-binary") + 1] == f"@{event}"
    assert "http://h:1/webhooks/stripe" in words
    preset = providers.build("stripe")
    preset.verify(_headers(signed.command), BODY, ["whsec_unit"], now=signed.signed_at)
    assert signed.valid_for == 300
    with pytest.raises(InvalidRecordError):  # the tolerance the note announces is the real one
        preset.verify(_headers(signed.command), BODY, ["whsec_unit"], now=signed.signed_at + 301)


def test_the_cli_prints_the_command_on_stdout_and_the_expiry_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """stdout is only the curl line (pipeable), stderr one note naming the time limit."""
    event = tmp_path / "event.json"
    event.write_bytes(BODY)
    monkeypatch.setenv("STRIPE_WEBHOOK_SECRET", "whsec_cli")
    assert main(["sign", "stripe", str(event), "--topology", str(ROOT / "topologies" / "default.toml")]) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == 1
    assert out.startswith("curl ")
    assert "accepted for 300 s, until " in err
    assert "whsec_cli" not in out + err


@pytest.mark.parametrize(
    ("source", "env", "message"),
    [
        ("nope", {}, "unknown source 'nope' (this topology has: github, paddle, shopify, stripe, svix)"),
        ("stripe", {}, "source stripe: no secret set; set STRIPE_WEBHOOK_SECRET"),
    ],
)
def test_an_unknown_source_or_a_missing_secret_is_one_clear_error(
    tmp_path: Path, source: str, env: dict[str, str], message: str
) -> None:
    """The error names what to fix."""
    event = tmp_path / "event.json"
    event.write_bytes(BODY)
    topo = topology.load(ROOT / "topologies" / "default.toml")
    with pytest.raises(PipelineError, match=message.replace("(", r"\(").replace(")", r"\)")):
        sign_file(topo, source, event, env)
