"""A step's files listed for the next step's jobs (shardsmith.formats.filelist): read back as written, in order;
a job's input of files or of their list read alike."""

from shardsmith.formats.filelist import listed_files, read_file_list, write_file_list


def test_a_list_reads_back_as_written_and_an_empty_one_is_empty(tmp_path):
    files = ["work/plan/near/pairs/00001.in.arrow", "work/plan/near/pairs/00000.in.arrow", "a b/c.arrow"]
    write_file_list(tmp_path / "x.list", files)
    assert read_file_list(tmp_path / "x.list") == files
    write_file_list(tmp_path / "y.list", [])
    assert read_file_list(tmp_path / "y.list") == [] and (tmp_path / "y.list").read_text() == ""


def test_an_input_of_files_or_of_their_list_names_the_same_files(tmp_path):
    files = [str(tmp_path / f"{b:05d}.arrow") for b in range(4)]
    write_file_list(tmp_path / "all.list", files)
    assert listed_files(files) == listed_files([str(tmp_path / "all.list")]) == files
    assert listed_files(str(tmp_path / "all.list")) == files  # one named input comes as a plain string
    assert listed_files(files[0]) == files[:1] and listed_files([]) == []
