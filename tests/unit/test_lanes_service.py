"""measure/lanes_service.py: the keys file it writes is one the service reads (two tenants in the interactive
lane), and the `siglip-serve run` it starts has text off, and the kept replica only where asked. Its run end to
end is the device check's lanes rehearsal (tests/integration/test_device_check_rehearsal.py)."""

from __future__ import annotations

from pathlib import Path

from siglip_serve.measure import lanes_service
from siglip_serve.serve.shared.tenants import load_keys, sha256_hex


def test_the_keys_file_holds_two_interactive_tenants_the_service_reads(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    key_a, key_b = lanes_service.keys_file(path)
    keys = load_keys(path)
    assert [(entry.name, entry.lane) for entry in keys.keys] == [("tenant-a", "interactive"),
                                                                 ("tenant-b", "interactive")]
    assert [entry.digest() for entry in keys.keys] == [sha256_hex(key_a), sha256_hex(key_b)] and key_a != key_b
    assert path.stat().st_mode & 0o077 == 0  # the keys are in it: the owner's alone


def test_the_service_runs_text_off_and_keeps_a_replica_only_where_asked(tmp_path: Path) -> None:
    parser = lanes_service.build_parser()
    plain = lanes_service.run_command(parser.parse_args(["--json", "x.json", "--set", "decode_threads=2"]),
                                      tmp_path / "k.toml", 8123, 8124)
    assert plain[1:4] == ["-m", "siglip_serve", "run"] and plain[plain.index("--port") + 1] == "8123"
    assert f"api_keys_file={tmp_path / 'k.toml'}" in plain and "text_replicas=0" in plain
    assert "decode_threads=2" in plain and not any("interactive_encoder" in part for part in plain)
    assert "--random-weights" not in plain  # tiny-siglip by default, with the weights it ships
    kept = lanes_service.run_command(parser.parse_args(["--json", "x.json", "--interactive-encoder", "--model",
                                                        "ViT-B-16-SigLIP", "--random-weights"]),
                                     tmp_path / "k.toml", 8123, 8124)
    # Two replicas, one of them kept, and /readyz only once both are warm (else the lane starts on the shared one).
    assert {"interactive_encoder=true", "replicas=2", "min_ready_replicas=2", "--random-weights"} <= set(kept)
