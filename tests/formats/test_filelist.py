"""A step's files listed for the next step's jobs (shardsmith.formats.filelist): read back as written, in order."""

from shardsmith.formats.filelist import read_file_list, write_file_list


def test_a_list_reads_back_as_written_and_an_empty_one_is_empty(tmp_path):
    files = ["work/plan/near/pairs/00001.in.arrow", "work/plan/near/pairs/00000.in.arrow", "a b/c.arrow"]
    write_file_list(tmp_path / "x.list", files)
    assert read_file_list(tmp_path / "x.list") == files
    write_file_list(tmp_path / "y.list", [])
    assert read_file_list(tmp_path / "y.list") == [] and (tmp_path / "y.list").read_text() == ""
