"""The artifact envelope (kiln/cache/envelope.py): a zip anyone can list, whose every byte is
checked before a reader returns anything; old, foreign, truncated and changed files are refused
and say which they are."""
import hashlib
import io
import json
import struct
import zipfile

import pytest
import torch

from kiln.cache import envelope as E

FMT = E.Format("kiln test file", 3)


def _tensor_zip() -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.arange(6.0)}, buf)
    return buf.getvalue()


@pytest.fixture
def blob():
    return E.pack(FMT, {"function": "f", "parts": {"n": 1}}, {"payload": _tensor_zip(), "blobs/0": b"abc"})


def test_an_envelope_is_a_zip_whose_header_lists_its_members(blob):
    zf = zipfile.ZipFile(io.BytesIO(blob))
    assert zf.testzip() is None
    assert zf.namelist() == ["kiln.json", "payload", "blobs/0"]
    assert all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())
    info = json.loads(zf.read("kiln.json"))
    assert (info["format"], info["version"], info["torch"]) == ("kiln test file", 3, torch.__version__)
    assert info["header"] == {"function": "f", "parts": {"n": 1}}
    assert [(m["name"], m["size"], m["sha256"]) for m in info["members"]] == \
        [(n, len(zf.read(n)), hashlib.sha256(zf.read(n)).hexdigest()) for n in ("payload", "blobs/0")]
    found = E.unpack(blob, FMT)
    assert found.header == info["header"] and found.member("blobs/0") == b"abc"
    # a torch.save zip is stored as it is (not compressed again), and loads from the member
    assert _tensor_zip() in blob
    torch.testing.assert_close(torch.load(io.BytesIO(found.member("payload")), weights_only=True)["w"],
                               torch.arange(6.0))


def test_the_same_content_gives_the_same_bytes(blob):
    assert E.pack(FMT, {"function": "f", "parts": {"n": 1}}, {"payload": _tensor_zip(), "blobs/0": b"abc"}) == blob


def test_a_header_value_json_cannot_hold_is_kept_as_text():
    found = E.unpack(E.pack(FMT, {"dtype": torch.float32, "sizes": (2, 3)}, {}), FMT)
    assert found.header == {"dtype": "torch.float32", "sizes": [2, 3]} and found.members == {}


def test_every_flipped_byte_is_refused(blob):
    small = E.pack(FMT, {"k": "v"}, {"payload": b"payload bytes", "blobs/0": b"abc"})
    for pos in range(len(small)):
        flipped = bytearray(small)
        flipped[pos] ^= 0x10
        with pytest.raises(E.EnvelopeError) as e:
            E.unpack(bytes(flipped), FMT)
        assert e.value.reason in (E.DAMAGED, E.TRUNCATED, E.FOREIGN), (pos, e.value)
    # in a larger one, a byte flipped in the middle of each member: its content does not match
    zf = zipfile.ZipFile(io.BytesIO(blob))
    for i in zf.infolist():
        flipped = bytearray(blob)
        flipped[i.header_offset + 30 + len(i.filename) + i.file_size // 2] ^= 0x01
        with pytest.raises(E.EnvelopeError, match=i.filename) as e:
            E.unpack(bytes(flipped), FMT)
        assert e.value.reason == E.DAMAGED
        assert e.value.describe("a kiln test file").startswith("content hash mismatch (member")


def test_a_truncated_envelope_is_refused(blob):
    for n in list(range(0, 200, 7)) + list(range(len(blob) - 100, len(blob))):
        with pytest.raises(E.EnvelopeError) as e:
            E.unpack(blob[:n], FMT)
        assert e.value.reason in ((E.FOREIGN,) if n < 39 else (E.TRUNCATED, E.DAMAGED)), (n, e.value)
    with pytest.raises(E.EnvelopeError) as e:
        E.unpack(blob[:len(blob) // 2], FMT)
    assert e.value.describe("a kiln test file") == "truncated (its zip directory is missing: File is not a zip file)"


def test_a_member_added_or_left_out_is_refused(blob):
    zf = zipfile.ZipFile(io.BytesIO(blob))
    for extra in ({"payload": b"x"}, {}):           # one more member; one missing
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as w:
            for i in zf.infolist():
                if i.filename != "blobs/0" or extra:
                    w.writestr(i, zf.read(i.filename))
            for name, data in extra.items():
                w.writestr(zipfile.ZipInfo("blobs/1", date_time=i.date_time), data)
        with pytest.raises(E.EnvelopeError) as e:
            E.unpack(out.getvalue(), FMT)
        assert e.value.reason == E.DAMAGED


def _old_layout(magic: bytes, header: dict, payload: bytes) -> bytes:
    """A file as earlier kilns wrote it (their own binary layout: magic, SHA-256, length, JSON)."""
    head = json.dumps(header).encode()
    body = struct.pack("<I", len(head)) + head + payload
    return magic + hashlib.sha256(body).digest() + body


def test_old_foreign_and_other_versions_are_refused_by_name():
    for magic in E.OLD_MAGICS:
        with pytest.raises(E.EnvelopeError, match="binary layout from before the zip envelope") as e:
            E.unpack(_old_layout(magic, {"key": "k"}, b"payload"), FMT)
        assert e.value.reason == E.OLD and e.value.describe("x").startswith("written by an earlier kiln")
    for foreign in (b"", b"not a kiln file", _tensor_zip()):
        with pytest.raises(E.EnvelopeError, match="no kiln.json at its start") as e:
            E.unpack(foreign, FMT)
        assert e.value.reason == E.FOREIGN
        assert e.value.describe("a kiln test file") == "not a kiln test file (no kiln.json at its start)"
    other = E.pack(E.Format("kiln other file", 3), {}, {})
    with pytest.raises(E.EnvelopeError, match="'kiln other file'") as e:
        E.unpack(other, FMT)
    assert e.value.reason == E.FOREIGN
    for version, reason in ((2, E.OLD), (4, E.VERSION)):
        with pytest.raises(E.EnvelopeError, match=f"version {version} of 'kiln test file'; this kiln reads 3") as e:
            E.unpack(E.pack(E.Format(FMT.name, version), {}, {}), FMT)
        assert (e.value.reason, e.value.version) == (reason, version)
    assert E.unpack(E.pack(E.Format(FMT.name, 2), {}, {}), E.Format(FMT.name, 3, (2, 3))).version == 2


def test_read_header_reads_the_header_alone(tmp_path, blob):
    path = tmp_path / "f.entry"
    damaged = bytearray(blob)
    zf = zipfile.ZipFile(io.BytesIO(blob))
    i = zf.getinfo("payload")
    damaged[i.header_offset + 30 + len(i.filename) + 5] ^= 0x01       # (a member: not read)
    path.write_bytes(bytes(damaged))
    assert E.read_header(str(path), FMT) == {"function": "f", "parts": {"n": 1}}
    with pytest.raises(E.EnvelopeError):
        E.unpack(bytes(damaged), FMT)
    # the header is checked: changed (with a CRC to match), its content hash does not match
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as w:
        for i in zf.infolist():
            data = zf.read(i.filename)
            w.writestr(i, data.replace(b'"function": "f"', b'"function": "g"') if i.filename == "kiln.json" else data)
    path.write_bytes(out.getvalue())
    with pytest.raises(E.EnvelopeError, match="kiln.json does not match its content hash") as e:
        E.read_header(str(path), FMT)
    assert e.value.reason == E.DAMAGED
