"""The key store (crypto-shredding, SPEC §5.4): sealed values open only under their subject's
key, bound to their record; an erased key is in no byte of any file under the directory."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from memgate.storage.keys import KeyErasedError, KeyStore, Sealed, SealBrokenError

pytestmark = pytest.mark.unit


def encodings(key: bytes) -> list[bytes]:
    """Every form a key could be written in: raw, hex (both cases), base64 (both alphabets)."""
    return [key, key.hex().encode(), key.hex().upper().encode(), base64.b64encode(key),
            base64.urlsafe_b64encode(key), base64.b64encode(key).rstrip(b"="),
            base64.urlsafe_b64encode(key).rstrip(b"=")]


def files_holding(root: Path, needles: list[bytes]) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*")
                  if path.is_file() and any(n in path.read_bytes() for n in needles))


def test_sealed_values_open_only_under_their_subject_and_record(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "keys")
    sealed = keys.encrypt("ws_1", "mb_a", "m1", b"likes green tea")
    assert b"green" not in sealed.ciphertext
    assert keys.decrypt(Sealed.from_json(sealed.to_json())) == b"likes green tea"
    for moved in (Sealed(sealed.tenant, sealed.subjects, "m2", sealed.nonce, sealed.ciphertext),
                  Sealed("ws_2", sealed.subjects, sealed.record, sealed.nonce, sealed.ciphertext)):
        with pytest.raises((SealBrokenError, KeyErasedError)):
            keys.decrypt(moved)
    keys.key_for("ws_1", "mb_b")
    with pytest.raises(SealBrokenError):  # another subject's key does not open it
        keys.decrypt(Sealed("ws_1", ("mb_b",), "m1", sealed.nonce, sealed.ciphertext))
    assert KeyStore(tmp_path / "keys").decrypt(sealed) == b"likes green tea"  # kept on disk


def test_a_record_of_several_subjects_dies_with_any_of_their_keys(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "keys")
    sealed = keys.encrypt("ws_1", ["mb_b", "mb_a"], "event-1", b"hello")
    assert sealed.subjects == ("mb_a", "mb_b")
    assert keys.decrypt(sealed) == b"hello"
    keys.erase("ws_1", "mb_b")
    with pytest.raises(KeyErasedError):
        keys.decrypt(sealed)


def test_key_for_without_create_does_not_make_a_key(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "keys")
    assert keys.key_for("ws_1", "mb_a", create=False) is None
    assert not (tmp_path / "keys").exists()
    assert keys.ensure([("ws_1", "mb_a"), ("ws_1", "mb_b"), ("ws_2", "mb_a")]) == 3
    assert keys.ensure([("ws_1", "mb_a")]) == 0
    assert keys.subjects("ws_1") == ["mb_a", "mb_b"]


def test_an_erased_key_is_in_no_byte_under_the_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    keys = KeyStore(data / "keys")
    keys.ensure([("ws_1", f"mb_{i}") for i in range(50)])
    sealed = keys.encrypt("ws_1", "mb_7", "m1", b"canary-7f3a")
    (data / "backup.jsonl").write_text(str(sealed.to_json()))
    key = keys.key_for("ws_1", "mb_7", create=False)
    assert key is not None
    assert files_holding(data, encodings(key)) == ["keys/keys.json"]

    assert keys.erase("ws_1", "mb_7")
    assert not keys.erase("ws_1", "mb_7")  # idempotent
    assert files_holding(data, encodings(key)) == []
    assert sorted(p.name for p in (data / "keys").iterdir()) == ["keys.json"]  # no temp left
    with pytest.raises(KeyErasedError):
        KeyStore(data / "keys").decrypt(sealed)
    other = keys.key_for("ws_1", "mb_8", create=False)
    assert other is not None and files_holding(data, encodings(other)) == ["keys/keys.json"]
    assert (data / "keys" / "keys.json").stat().st_mode & 0o777 == 0o600
