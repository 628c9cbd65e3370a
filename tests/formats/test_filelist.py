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


def test_a_folder_stands_for_its_files_by_name_but_hidden_ones(tmp_path):
    """A job that writes a file per partition into a folder (decide_near_round): the folder, alone or in a list,
    names its files in order; Snakemake's .snakemake_timestamp is not one of them."""
    slices = [tmp_path / "00000", tmp_path / "00001"]
    for i, folder in enumerate(slices):
        folder.mkdir()
        for p in (2 * i + 1, 2 * i):
            (folder / f"{p:05d}.arrow").write_bytes(b"")
        (folder / ".snakemake_timestamp").write_bytes(b"")
    files = [
        str(slices[0] / "00000.arrow"),
        str(slices[0] / "00001.arrow"),
        *(str(slices[1] / f"0000{p}.arrow") for p in (2, 3)),
    ]
    write_file_list(tmp_path / "round.list", [str(s) for s in slices])
    assert listed_files([str(s) for s in slices]) == listed_files(str(tmp_path / "round.list")) == files
    assert listed_files(str(slices[1])) == files[2:]
