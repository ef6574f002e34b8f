"""The forgiving sysfs/procfs readers every collector uses: whole files, None instead of errors."""
from __future__ import annotations

from skewd.collectors.sysfs import read_float, read_int, read_str


def test_whole_file_beyond_one_read_and_stripped(tmp_path):
    # /proc/stat's intr line on a large host is tens of KB: the reader must not stop at one chunk
    f = tmp_path / "stat"
    body = "cpu  1 2 3\nintr " + " ".join(["7"] * 60000) + "\n"
    f.write_text(body)
    assert read_str(f) == body.strip()


def test_unreadable_paths_give_none(tmp_path):
    assert read_str(tmp_path / "gone") is None  # hot-unplugged device
    assert read_str(tmp_path) is None  # a directory where a file was expected
    assert read_str(str(tmp_path / "bad\0name")) is None


def test_numbers_and_placeholders(tmp_path):
    (tmp_path / "w").write_text("16\n")
    (tmp_path / "s").write_text("16.0 GT/s PCIe\n")
    (tmp_path / "na").write_text("N/A\n")
    (tmp_path / "hex").write_text("0x030200\n")
    (tmp_path / "bin").write_bytes(b"\xff\xfe4\n")
    assert read_int(tmp_path / "w") == 16 and read_float(tmp_path / "s") == 16.0
    assert read_int(tmp_path / "na") is None and read_int(tmp_path / "hex", 16) == 0x030200
    assert read_str(tmp_path / "bin") == "\ufffd\ufffd4"  # undecodable bytes replaced, not an error
