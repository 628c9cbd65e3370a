"""Download: one status row per input record, and the raw tar holds exactly the fetched ones."""

import json
import tarfile

import pandas as pd
from conftest import jpeg_bytes, tar_entry, write_tar

from shardsmith.download import download_part
from shardsmith.sources import plan_parts


def run(tmp_path, source: dict) -> tuple[list[pd.DataFrame], list[dict[str, dict[str, bytes]]]]:
    """Plan and download every part of `source`; returns each part's status and raw members {key: {ext: bytes}}."""
    ids = plan_parts([source], 100, tmp_path / "parts")
    statuses, raws = [], []
    for pid in ids:
        records = tmp_path / "parts" / f"{pid}.parquet"
        tar, status_path = tmp_path / "raw" / f"{pid}.tar", tmp_path / "raw" / f"{pid}.status.parquet"
        status = download_part(str(records), str(tar), str(status_path), source)
        assert status.equals(pd.read_parquet(status_path))
        raw = read_raw(tar)
        assert_ledger(pd.read_parquet(records), status, raw, source)
        statuses.append(status)
        raws.append(raw)
    return statuses, raws


def read_raw(path) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path) as tar:
        for m in tar:
            key, ext = m.name.split(".")
            out.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return out


def assert_ledger(records: pd.DataFrame, status: pd.DataFrame, raw: dict, source: dict) -> None:
    assert list(status["rid"]) == list(range(len(status)))
    if source["type"] != "shards":  # a source shard expands into its groups
        assert list(status["source_id"]) == list(records["source_id"])
    assert set(status["status"]) <= {"ok", "error"}
    assert ((status["status"] == "ok") == (status["reason"] == "")).all()
    ok = status[status["status"] == "ok"]
    assert set(raw) == {f"r{rid:07d}" for rid in ok["rid"]}
    assert all(set(m) == {"img", "meta"} for m in raw.values())
    assert [len(raw[f"r{r:07d}"]["img"]) for r in ok["rid"]] == list(ok["bytes"])


def by_id(status: pd.DataFrame) -> dict[str, dict]:
    return {r["source_id"]: r for r in status.to_dict("records")}


def test_manifest_records_with_local_paths_and_file_urls_are_fetched(tmp_path):
    img1, img2 = jpeg_bytes(color=(1, 2, 3)), jpeg_bytes(color=(9, 9, 9))
    (tmp_path / "one.jpg").write_bytes(img1)
    (tmp_path / "my pic.jpg").write_bytes(img2)
    lines = [
        f"plain path\t{tmp_path / 'one.jpg'}",
        f"file url\tfile://{tmp_path / 'my%20pic.jpg'}",
        f"gone\t{tmp_path / 'missing.jpg'}",
        "no url\t",
        "remote\tftp://example.com/x.jpg",
        f"folder\t{tmp_path}",
    ]
    (tmp_path / "m.tsv").write_text("\n".join(lines) + "\n")
    src = {
        "name": "m",
        "type": "manifest",
        "path": str(tmp_path / "m.tsv"),
        "columns": ["caption", "url"],
        "url_column": "url",
    }
    [status], [raw] = run(tmp_path, src)
    assert list(status["status"]) == ["ok", "ok", "error", "error", "error", "error"]
    assert list(status["reason"]) == ["", "", "not_found", "no_url", "unsupported_url", "unreadable"]
    assert raw["r0000000"]["img"] == img1 and raw["r0000001"]["img"] == img2
    assert json.loads(raw["r0000000"]["meta"]) == {"caption": "plain path", "url": str(tmp_path / "one.jpg")}
    assert list(status["bytes"]) == [len(img1), len(img2), 0, 0, 0, 0]


def test_folder_source_picks_up_sidecar_txt_and_json(tmp_path):
    root = tmp_path / "photos"
    (root / "sub").mkdir(parents=True)
    (root / "a.jpg").write_bytes(jpeg_bytes())
    (root / "a.txt").write_text("a caption ✓")
    (root / "a.json").write_text('{"caption": "from json", "n": 2}')
    (root / "sub" / "b.png").write_bytes(b"png bytes")
    (root / "sub" / "b.json").write_text("not json{")
    [status], [raw] = run(tmp_path, {"name": "photos", "type": "folder", "path": str(root)})
    assert list(status["status"]) == ["ok", "ok"]
    assert list(status["key"]) == ["photos-a", "photos-sub_b"]
    assert json.loads(raw["r0000000"]["meta"]) == {"txt": "a caption ✓", "json": {"caption": "from json", "n": 2}}
    assert json.loads(raw["r0000001"]["meta"]) == {"json": "not json{"}  # invalid json kept as text
    assert raw["r0000001"]["img"] == b"png bytes"


def shard_source(pattern) -> dict:
    return {"name": "old", "type": "shards", "path": str(pattern)}


def test_shards_source_groups_become_records_and_bad_groups_are_errors(tmp_path):
    img = jpeg_bytes()
    write_tar(
        tmp_path / "old-000000.tar",
        [
            tar_entry("good.jpg", img), tar_entry("good.txt", b"good caption"),
            tar_entry("sym.jpg", type=tarfile.SYMTYPE, linkname="/etc/passwd"), tar_entry("sym.txt", b"x"),
            tar_entry("textonly.txt", b"no picture"),
            tar_entry("img.0.jpg", img), tar_entry("img.0.json", b'{"description": "dotted"}'),
            tar_entry("img.1.PNG", b"png"),
        ],
    )  # fmt: skip
    [status], [raw] = run(tmp_path, shard_source(tmp_path / "old-000000.tar"))
    rows = by_id(status)
    url = str(tmp_path / "old-000000.tar")
    assert list(rows) == [f"{url}#{k}" for k in ("good", "sym", "textonly", "img.0", "img.1")]
    assert [r["reason"] for r in rows.values()] == ["", "unsafe_member", "no_image", "", ""]
    assert "link: sym.jpg" in rows[f"{url}#sym"]["detail"]
    assert rows[f"{url}#img.0"]["key"] == "old-old-000000-img_0"
    good, dotted, png = (f"r{rows[f'{url}#{k}']['rid']:07d}" for k in ("good", "img.0", "img.1"))
    assert raw[good]["img"] == img and json.loads(raw[good]["meta"]) == {"txt": "good caption"}
    assert json.loads(raw[dotted]["meta"]) == {"json": {"description": "dotted"}}
    assert raw[png]["img"] == b"png"


def test_missing_source_shard_is_a_not_found_row(tmp_path):
    write_tar(tmp_path / "old-000000.tar", [tar_entry("a.jpg", b"A")])
    statuses, _ = run(tmp_path, shard_source(tmp_path / "old-{000000..000001}.tar"))
    assert [list(s["reason"]) for s in statuses] == [[""], ["not_found"]]
    assert statuses[1]["source_id"][0] == str(tmp_path / "old-000001.tar")


def truncated_shard(tmp_path, cut_in: str) -> str:
    """A three-sample source shard cut inside the data of sample c's jpg, or inside the header of b's txt."""
    path = write_tar(
        tmp_path / "full.tar",
        [e for k in "abc" for e in (tar_entry(f"{k}.jpg", jpeg_bytes() + b"\0" * 2000), tar_entry(f"{k}.txt", b"cap"))],
    )
    with tarfile.open(path) as tar:
        members = {m.name: m for m in tar}
    cut = members["c.jpg"].offset_data + 1000 if cut_in == "data" else members["b.txt"].offset + 100
    (tmp_path / "old-000000.tar").write_bytes(path.read_bytes()[:cut])
    path.unlink()
    return str(tmp_path / "old-000000.tar")


def test_truncated_source_shard_gives_the_readable_records_and_one_broken_shard_row(tmp_path):
    url = truncated_shard(tmp_path, "data")
    [status], [raw] = run(tmp_path, shard_source(url))
    assert list(status["source_id"]) == [f"{url}#a", f"{url}#b", f"{url}#<rest>"]
    assert list(status["reason"]) == ["", "", "broken_shard"]
    assert len(raw) == 2


def test_source_shard_cut_inside_a_header_is_reported_broken(tmp_path):
    url = truncated_shard(tmp_path, "header")
    [status], _ = run(tmp_path, shard_source(url))
    assert list(status["reason"]) == ["", "broken_shard"]


def test_same_named_source_shards_in_different_folders_give_distinct_keys(tmp_path):
    for year in ("2023", "2024"):
        (tmp_path / year).mkdir()
        write_tar(tmp_path / year / "000000.tar", [tar_entry("000000000.jpg", b"A")])
    statuses, _ = run(tmp_path, shard_source(tmp_path / "{2023,2024}" / "000000.tar"))
    keys = [k for s in statuses for k in s["key"]]
    assert len(set(keys)) == 2


def test_local_reads_stay_inside_the_sources_folders(tmp_path):
    """A manifest's local paths are read below its own folder (or download.allow_local_folders); a folder
    source's links out of the folder, image or sidecar, and a shard linked in from elsewhere are refused."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "photo.jpg").write_bytes(jpeg_bytes(color=(5, 5, 5)))
    (secret / "notes.txt").write_text("private notes")
    write_tar(secret / "other.tar", [tar_entry("s.jpg", jpeg_bytes()), tar_entry("s.txt", b"an archived photo")])

    data = tmp_path / "data"
    (data / "img").mkdir(parents=True)
    (data / "img" / "in.jpg").write_bytes(jpeg_bytes())
    rows = [str(data / "img" / "in.jpg"), str(secret / "photo.jpg"), f"{data}/../secret/photo.jpg"]
    (data / "m.tsv").write_text("".join(f"caption {i}\t{u}\n" for i, u in enumerate(rows)))
    src = {"name": "m", "type": "manifest", "path": str(data / "m.tsv"), "columns": ["caption", "url"]}
    [status], _ = run(tmp_path / "manifest", src)
    assert list(status["reason"]) == ["", "outside_allowed_folders", "outside_allowed_folders"]

    plan_parts([src], 100, tmp_path / "again" / "parts")
    part = str(tmp_path / "again" / "parts" / "m-000000.parquet")
    status = download_part(part, str(tmp_path / "again" / "r.tar"), str(tmp_path / "again" / "r.status.parquet"), src,
                           {"allow_local_folders": [str(secret)]}, log=lambda _: None)  # fmt: skip
    assert list(status["status"]) == ["ok"] * 3

    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.jpg").write_bytes(jpeg_bytes())
    (photos / "b.jpg").write_bytes(jpeg_bytes())
    (photos / "b.txt").symlink_to(secret / "notes.txt")  # a sidecar linked out
    (photos / "c.jpg").symlink_to(secret / "photo.jpg")  # an image linked out
    [status], [raw] = run(tmp_path / "folder", {"name": "p", "type": "folder", "path": str(photos)})
    assert list(status["reason"]) == ["", "outside_allowed_folders", "outside_allowed_folders"]
    assert "notes.txt" in status["detail"][1] and "photo.jpg" in status["detail"][2]
    assert b"private notes" not in b"".join(m["meta"] for m in raw.values())

    (tmp_path / "shards").mkdir()
    write_tar(tmp_path / "shards" / "x-0.tar", [tar_entry("k.jpg", jpeg_bytes()), tar_entry("k.txt", b"a photo")])
    (tmp_path / "shards" / "x-1.tar").symlink_to(secret / "other.tar")
    statuses, _ = run(tmp_path / "shards-run", shard_source(tmp_path / "shards" / "x-{0..1}.tar"))
    assert [list(s["reason"]) for s in statuses] == [[""], ["outside_allowed_folders"]]
