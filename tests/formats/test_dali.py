"""DALI's per-shard index files: the format `wds2idx` writes and `fn.readers.webdataset(index_paths=...)`
reads. The format tests run everywhere; those that run DALI itself skip where it is not installed."""

import re
import tarfile

import pytest
from loader_helpers import needs_dali, read_with_dali, write_shards

from shardsmith.formats import dali
from shardsmith.shards.validate import loader_members

# The documented format (DALI's fn.readers.webdataset docs), with the member name wds2idx v1.2 adds per component.
FIRST_LINE = re.compile(r"^v1\.2 (\d+)$")
COMPONENT = re.compile(r"(\S+) (\d+) (\d+) (\S+)")


@pytest.fixture
def shards(tmp_path):
    out = write_shards(tmp_path / "out")
    for path, members in out:
        dali.write_index(path.with_name(dali.index_name(path.name)), members)
    return out


def test_index_is_named_like_the_shard_up_to_its_first_dot():
    assert dali.index_name("demo-000003.tar") == "demo-000003.idx"


def test_index_follows_the_documented_format_and_points_at_every_member(shards):
    for path, _ in shards:
        lines = path.with_name(dali.index_name(path.name)).read_text().splitlines()
        with tarfile.open(path) as tar:
            members = tar.getmembers()
            data = {m.name: tar.extractfile(m).read() for m in members}
        assert int(FIRST_LINE.match(lines[0]).group(1)) == len(lines) - 1 == len(members) // 3
        raw = path.read_bytes()
        names = []
        for line in lines[1:]:
            components = COMPONENT.findall(line)
            assert " ".join(" ".join(c) for c in components) == line
            assert [c[0] for c in components] == ["jpg", "txt", "json"]
            for ext, offset, size, name in components:
                assert name.endswith(f".{ext}") and raw[int(offset) : int(offset) + int(size)] == data[name]
                names.append(name)
        assert names == [m.name for m in members]  # every member, in tar order


@needs_dali
def test_index_is_byte_for_byte_what_dalis_wds2idx_writes(shards, tmp_path):
    from wds2idx import IndexCreator  # DALI's own tool, installed with the wheel

    for path, _ in shards:
        theirs = tmp_path / f"{path.stem}.wds2idx"
        with IndexCreator(str(path), str(theirs), verbose=False) as creator:
            creator.create_index()
        assert path.with_name(dali.index_name(path.name)).read_bytes() == theirs.read_bytes()


def test_check_index_accepts_the_written_index_and_names_what_is_wrong(shards):
    path, members = shards[0]
    index = path.with_name(dali.index_name(path.name))
    with tarfile.open(path) as tar:
        found = loader_members(tar.getmembers())
    assert found == members and dali.check_index(index, found) == []
    text = index.read_text()
    index.write_text(text.replace("v1.2", "v2.0", 1))
    assert "version DALI reads" in dali.check_index(index, found)[0]
    index.write_text(text.replace(f" {members[1].offset} ", f" {members[1].offset + 512} ", 1))
    assert "sample 0" in dali.check_index(index, found)[0]
    index.write_text("\n".join(text.splitlines()[:-1]) + "\n")
    assert "samples, 2 lines follow" in dali.check_index(index, found)[0]


@needs_dali
def test_dali_reader_on_the_cpu_yields_every_sample_with_its_bytes(shards):
    samples = read_with_dali(
        [str(p) for p, _ in shards], [str(p.with_name(dali.index_name(p.name))) for p, _ in shards]
    )
    want = []
    for path, _ in shards:
        with tarfile.open(path) as tar:
            members = tar.getmembers()
            want += [tuple(tar.extractfile(m).read() for m in members[i : i + 3]) for i in range(0, len(members), 3)]
    assert samples == want
