"""outputs.py's writes, where a batch job's rerun relies on them: what is unchanged is left alone (its time stamps
too), and any change is written, a change that keeps the size included."""

from vibevoice_onnx.outputs import write_if_changed


def test_write_if_changed_leaves_the_same_bytes_and_writes_any_change_of_the_same_size(tmp_path):
    target = tmp_path / "manifest.jsonl"
    assert write_if_changed(target, b'{"id": "a", "status": "ok"}\n')
    before = target.stat()
    assert not write_if_changed(target, b'{"id": "a", "status": "ok"}\n')
    after = target.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not even rewritten in place
    assert write_if_changed(target, b'{"id": "b", "status": "ok"}\n')  # one byte changed, the same size
    assert target.read_bytes() == b'{"id": "b", "status": "ok"}\n'
    assert write_if_changed(target, b'{"id": "b"}\n') and target.read_bytes() == b'{"id": "b"}\n'
