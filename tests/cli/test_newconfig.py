"""`python -m shardsmith new-config`: each detector on generated inputs, the exits where it cannot tell, and
configs that run as written (the real workflow, on the demo's inputs and on tiny generated ones).
HTTP and S3 inputs are served on 127.0.0.1 (tests/httpserver.py, moto_server through the aws CLI)."""

import base64
import bz2
import gzip
import hashlib
import io
import json
import random
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest
import yaml
from generated import jpeg_bytes
from httpserver import Reply
from servers import ALLOW_LOOPBACK
from snakemake.utils import validate
from workflow_helpers import REPO, SNAKEMAKE

from shardsmith.cli.demo import make_demo
from shardsmith.cli.newconfig.command import new_config, source_name, unique_names
from shardsmith.cli.newconfig.curation import box_count, numbers, within
from shardsmith.cli.newconfig.options import CannotTell, InputError, Options, load_schema, schema_default
from shardsmith.core.config import check_config
from shardsmith.storage.s3 import upload

SCHEMA = REPO / "config" / "config.schema.yaml"
SENTENCES = [
    "A red barn under a cloudy sky",
    "Two dogs running on a sandy beach",
    "Close-up of a sunflower in bloom",
    "An old bicycle leaning on a brick wall",
    "Snow on the roofs of a mountain village",
    "A bowl of ramen with a soft egg",
    "Sailboats in a harbour at sunset",
    "A cat asleep on a pile of books",
    "Morning fog over a quiet lake",
    "A street market full of fruit",
]


def guess(paths, opts=Options(), **kw) -> tuple[dict, list[str]]:
    """(parsed config, stderr lines) of new_config on `paths`."""
    lines: list[str] = []
    text = new_config([str(p) for p in paths], Options(**{**opts.__dict__, **kw}), log=lines.append)
    return yaml.safe_load(text), lines


def cli(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    """The command as a user runs it, from the repository root (where `python -m shardsmith` is found)."""
    cmd = [sys.executable, "-m", "shardsmith", "new-config", *map(str, args)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def write_tsv(path: Path, rows: list[tuple[str, ...]]) -> Path:
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    return path


def urls(n: int, base: str = "https://img.example.org/photos") -> list[str]:
    return [f"{base}/{i:04d}.jpg" for i in range(n)]


def shard_tar(path: Path, samples: dict[str, dict[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for key, members in samples.items():
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def make_folder(root: Path, n_txt: int = 3, n_json: int = 2) -> Path:
    """Images with .txt sidecars, .json sidecars (caption or description) and one with none."""
    root.mkdir(parents=True)
    for i in range(n_txt):
        (root / f"a{i}.jpg").write_bytes(jpeg_bytes(color=(20 * i, 90, 40)))
        (root / f"a{i}.txt").write_text(SENTENCES[i] + "\n")
    for i in range(n_json):
        (root / f"b{i}.jpg").write_bytes(jpeg_bytes(color=(90, 20 * i, 40)))
        key = "caption" if i % 2 == 0 else "description"
        (root / f"b{i}.json").write_text(json.dumps({key: SENTENCES[5 + i], "source": "camera"}))
    (root / "nocap.jpg").write_bytes(jpeg_bytes(color=(1, 2, 3)))
    return root


def check_against_schema(config: dict) -> dict:
    """As the workflow does: the schema (filling in defaults, as snakemake.utils.validate does), then check_config."""
    filled = json.loads(json.dumps(config))
    validate(filled, schema=str(SCHEMA))
    check_config(filled)
    return filled


# --- manifests ----------------------------------------------------------------------------------------------


def test_cc3m_style_headerless_tsv_gets_columns_caption_url(tmp_path):
    tsv = write_tsv(tmp_path / "Train_GCC-training.tsv", list(zip(SENTENCES, urls(10))))
    config, lines = guess([tsv], out=tmp_path / "build")
    (src,) = config["sources"]
    assert src == {
        "name": "train_gcc_training", "type": "manifest", "path": str(tsv),
        "columns": ["caption", "url"], "url_column": "url",
    }  # fmt: skip
    assert config["captions"]["fields"][0] == "caption"
    assert any(ln.startswith("train_gcc_training: header: none (row 1 holds a URL") for ln in lines)
    assert "train_gcc_training: url column: column 2, named url (100% of 10 sampled values are URLs or paths)" in lines
    check_against_schema(config)


def test_a_tsv_written_by_a_csv_writer_gets_csv_quoting_and_is_read_whole(tmp_path):
    rows = {"url": urls(3), "caption": ['a "quoted" word', "line one\nline two", "plain words here"]}
    pd.DataFrame(rows).to_csv(tmp_path / "q.tsv", sep="\t", index=False)  # quotes the first two captions
    config, lines = guess([tmp_path / "q.tsv"], out=tmp_path / "build")
    (src,) = config["sources"]
    assert src["quoting"] == "csv" and any("quoting: csv" in ln for ln in lines)
    check_against_schema(config)
    from shardsmith.download.sources import plan_parts

    [part] = plan_parts(config["sources"], 100, tmp_path / "parts")
    got = [json.loads(f)["caption"] for f in pd.read_parquet(tmp_path / "parts" / f"{part}.parquet")["fields"]]
    assert got == rows["caption"]  # three records, each caption as written


def test_cc12m_style_headerless_tsv_gets_columns_url_caption(tmp_path):
    tsv = write_tsv(tmp_path / "cc12m.tsv", list(zip(urls(10), SENTENCES)))
    config, lines = guess([tsv], out=tmp_path / "build")
    assert config["sources"][0]["columns"] == ["url", "caption"]
    assert config["dataset"] == "cc12m" and config["captions"]["fields"][0] == "caption"
    assert any("caption column: column 2, named caption (100% of 10" in ln for ln in lines)


def test_parquet_with_url_caption_and_extra_columns_finds_key_and_md5(tmp_path):
    df = pd.DataFrame(
        {
            "uid": [hashlib.sha1(str(i).encode()).hexdigest()[:16] for i in range(10)],
            "url": urls(10),
            "caption": SENTENCES,
            "width": range(100, 110),
            "md5": [hashlib.md5(str(i).encode()).hexdigest() for i in range(10)],
            "status": ["success"] * 10,
        }
    )
    df.to_parquet(tmp_path / "part-00000.parquet", index=False)
    config, lines = guess([tmp_path / "part-00000.parquet"], out=tmp_path / "build")
    src = config["sources"][0]
    assert (src["url_column"], src["key_column"], src["hash_column"], src["hash_type"]) == ("url", "uid", "md5", "md5")
    assert "columns" not in src and "format" not in src
    assert config["captions"]["fields"][0] == "caption"
    assert any(
        ln.startswith("part_00000: hash column: md5, md5 (header name; all 10 sampled values are 32-digit hex")
        for ln in lines
    )
    check_against_schema(config)


def test_laion_style_parquet_url_text_and_extras(tmp_path):
    n = 20
    df = pd.DataFrame(
        {
            "SAMPLE_ID": [float(10**12 + 7919 * i) for i in range(n)],
            "URL": urls(n, "http://cdn.example.com/i"),
            "TEXT": [SENTENCES[i % 10] + f" no. {i}" for i in range(n)],
            "HEIGHT": [480] * n,
            "WIDTH": [640] * n,
            "LICENSE": ["?"] * n,
            "NSFW": ["UNLIKELY"] * n,
            "similarity": [0.3 + i / 100 for i in range(n)],
            "hash": [(-1) ** i * 10**17 + i for i in range(n)],  # LAION's int64 hash of URL+text: not an image hash
        }
    )
    df.to_parquet(tmp_path / "part-00000-5b54c5d5.snappy.parquet", index=False)
    config, lines = guess([tmp_path / "part-00000-5b54c5d5.snappy.parquet"], out=tmp_path / "build")
    src = config["sources"][0]
    assert src["url_column"] == "URL" and src["key_column"] == "SAMPLE_ID" and "hash_column" not in src
    assert config["captions"]["fields"][0] == "TEXT"
    assert (
        "part_00000_5b54c5d5_snappy: url column: URL (header name and 100% of 20 sampled values are URLs or paths)"
        in lines
    )
    check_against_schema(config)


def test_jsonl_and_gzipped_csv_manifests(tmp_path):
    rows = [{"image_url": u, "alt": s, "n": i} for i, (u, s) in enumerate(zip(urls(10), SENTENCES))]
    rows[0]["image_url"] = "images/0000.jpg"  # a relative path: said to be opened from snakemake's folder
    (tmp_path / "web.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(tmp_path / "crawl.csv.gz", "wt") as f:
        pd.DataFrame(rows).rename(columns={"alt": "description"}).to_csv(f, index=False)
    config, lines = guess([tmp_path / "web.jsonl", tmp_path / "crawl.csv.gz"], out=tmp_path / "build")
    web, crawl = config["sources"]
    assert (web["name"], web["url_column"]) == ("web", "image_url")
    assert (crawl["name"], crawl["url_column"]) == ("crawl", "image_url")
    assert config["captions"]["fields"][:2] == ["alt", "description"]
    assert "web: url column: image_url (header name and 100% of 10 sampled values are URLs or paths)" in lines
    assert any(
        ln.startswith("web: NOTE: 1 of 10 sampled URLs are relative paths (e.g. 'images/0000.jpg')") for ln in lines
    )
    check_against_schema(config)


def test_a_brace_pattern_of_parquet_files_is_one_manifest_source(tmp_path):
    (tmp_path / "laion").mkdir()
    for i in range(2):
        rows = {"URL": urls(5), "TEXT": SENTENCES[5 * i : 5 * i + 5]}
        pd.DataFrame(rows).to_parquet(tmp_path / "laion" / f"{i:05d}.parquet")
    pattern = str(tmp_path / "laion" / "{00000..00001}.parquet")
    config, lines = guess([pattern], out=tmp_path / "build")
    assert config["sources"][0] == {"name": "laion", "type": "manifest", "path": pattern, "url_column": "URL"}
    assert f"laion: files: 2 match; looked at the first, {tmp_path}/laion/00000.parquet" in lines
    check_against_schema(config)


def test_a_key_column_that_restarts_in_each_file_of_a_pattern_is_not_chosen(tmp_path):
    for name, start in [("per_file", [0, 0]), ("global", [0, 5])]:
        (tmp_path / name).mkdir()
        for i in range(2):
            ids = [f"id{start[i] + n}" for n in range(5)]
            rows = {"uid": ids, "url": urls(5), "caption": SENTENCES[5 * i : 5 * i + 5]}
            pd.DataFrame(rows).to_parquet(tmp_path / name / f"{i}.parquet")
    config, lines = guess([tmp_path / "per_file" / "*.parquet"], out=tmp_path / "build")
    assert "key_column" not in config["sources"][0]
    assert (
        "per_file: key column: none (uid is unique in one file, but 5 of its sampled values are in "
        f"{tmp_path}/per_file/1.parquet too; keys follow rows)"
    ) in lines
    config, _ = guess([tmp_path / "global" / "*.parquet"], out=tmp_path / "build")
    assert config["sources"][0]["key_column"] == "uid"


def test_extensionless_manifest_gets_its_format_from_its_first_bytes(tmp_path):
    write_tsv(tmp_path / "manifest", list(zip(urls(5), SENTENCES)))
    config, lines = guess([tmp_path / "manifest"], out=tmp_path / "build")
    assert config["sources"][0]["format"] == "tsv" and "manifest: format: tsv (from its first bytes)" in lines
    check_against_schema(config)


def test_a_manifest_compressed_otherwise_than_its_name_says_gets_one_line(tmp_path):
    csv_text = pd.DataFrame({"url": urls(5), "caption": SENTENCES[:5]}).to_csv(index=False)
    (tmp_path / "plain.csv.gz").write_text(csv_text)  # named .gz, not compressed
    (tmp_path / "damaged.csv.gz").write_bytes(gzip.compress(csv_text.encode())[:10] + b"\xff" * 64)
    (tmp_path / "packed.tsv.bz2").write_bytes(bz2.compress(csv_text.replace(",", "\t").encode()))
    (tmp_path / "packed.csv").write_bytes(gzip.compress(csv_text.encode()))  # gzip without .gz
    for name, said in [
        ("plain.csv.gz", "its name ends in .gz but it is not gzip-compressed"),
        ("damaged.csv.gz", "a damaged gzip stream"),
        ("packed.tsv.bz2", "bzip2-compressed; new-config reads manifests plain or gzip-compressed"),
        ("packed.csv", "gzip-compressed, but its name does not end in .gz"),
    ]:
        proc = cli(tmp_path / name, "--out", tmp_path / "build")
        assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
        assert proc.stderr.startswith(f"new-config: {tmp_path / name}: {said}")
        assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr


def test_utf16_text_a_json_array_and_json_lines_of_lists_are_said_to_be_so(tmp_path):
    rows = pd.DataFrame({"url": urls(5), "caption": SENTENCES[:5]})
    (tmp_path / "excel.csv").write_text(rows.to_csv(index=False), encoding="utf-16")  # Excel's "Unicode text"
    (tmp_path / "export.json").write_text(rows.to_json(orient="records"))
    (tmp_path / "lists.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows.values.tolist()))
    for name, said in [
        ("excel.csv", "UTF-16 text; the workflow reads manifests as UTF-8"),
        ("export.json", "a JSON array; the workflow reads JSON lines"),
        ("lists.jsonl", "not JSON lines of objects: line 1 is a list"),
    ]:
        with pytest.raises(InputError, match=re.escape(said)):
            guess([tmp_path / name], out=tmp_path / "build")


def test_lone_cr_line_endings_and_a_cell_past_the_csv_modules_limit_are_read(tmp_path):
    rows = pd.DataFrame({"url": urls(5), "caption": SENTENCES[:5]})
    (tmp_path / "mac.csv").write_text(rows.to_csv(index=False, lineterminator="\r"))  # old Mac exports
    rows.loc[2, "caption"] = " ".join(["long"] * 40_000)  # 200 KB: pandas reads it, csv's default limit is 128 KB
    rows.to_csv(tmp_path / "long.csv", index=False)
    for name in ("mac.csv", "long.csv"):
        config, lines = guess([tmp_path / name], out=tmp_path / "build")
        assert config["sources"][0]["url_column"] == "url" and config["captions"]["fields"][0] == "caption"
        assert any(ln.endswith("5 rows sampled") for ln in lines)
        check_against_schema(config)


def test_long_cells_without_spaces_are_judged_in_seconds(tmp_path):
    thumbs = [base64.b64encode(random.Random(i).randbytes(12_000)).decode() for i in range(10)]  # 16 KB each
    pd.DataFrame({"url": urls(10), "caption": SENTENCES, "thumbnail_b64": thumbs}).to_parquet(tmp_path / "t.parquet")
    proc = cli(tmp_path / "t.parquet", "--out", tmp_path / "build", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["captions"]["fields"][0] == "caption"


def test_a_manifest_without_rows_is_said_to_be_one_and_a_pattern_looks_past_it(tmp_path):
    (tmp_path / "header.csv").write_text("url,caption\n")
    (tmp_path / "empty.jsonl").write_text("\n")
    pd.DataFrame({"url": [], "caption": []}).to_parquet(tmp_path / "none.parquet")
    for name in ("header.csv", "empty.jsonl", "none.parquet"):
        with pytest.raises(InputError, match="no rows: the file holds .*the workflow refuses a source without records"):
            guess([tmp_path / name], out=tmp_path / "build", url_column="url", caption_column="caption")
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "0.csv").write_text("url,caption\n")
    pd.DataFrame({"url": urls(5), "caption": SENTENCES[:5]}).to_csv(tmp_path / "parts" / "1.csv", index=False)
    config, lines = guess([tmp_path / "parts" / "*.csv"], out=tmp_path / "build")
    assert config["sources"][0]["url_column"] == "url" and config["captions"]["fields"][0] == "caption"
    assert (
        f"parts: files: 2 match; looked at the first with rows (1 before it have none), {tmp_path}/parts/1.csv" in lines
    )
    (tmp_path / "parts" / "0b.csv").write_text("")
    with pytest.raises(InputError, match="none of the first 2 of 2 files has a row"):
        guess([tmp_path / "parts" / "0*.csv"], out=tmp_path / "build")


def test_a_tab_separated_csv_gets_format_tsv_and_a_semicolon_one_is_refused(tmp_path):
    rows = pd.DataFrame({"url": urls(5), "caption": [s.replace(" a ", ", a ") for s in SENTENCES[:5]]})
    rows.to_csv(tmp_path / "export.csv", sep="\t", index=False)  # commas in captions, tabs between fields
    config, lines = guess([tmp_path / "export.csv"], out=tmp_path / "build")
    assert config["sources"][0]["format"] == "tsv" and config["sources"][0]["url_column"] == "url"
    assert "export: format: tsv (from its tabs; its name says csv)" in lines
    check_against_schema(config)
    rows.to_csv(tmp_path / "excel.csv", sep=";", index=False)
    with pytest.raises(InputError, match="its fields are separated by ';'; the workflow reads CSV"):
        guess([tmp_path / "excel.csv"], out=tmp_path / "build")


def test_two_caption_like_columns_exit_2_naming_both_and_the_flag_picks_one(tmp_path):
    pd.DataFrame({"url": urls(10), "caption": SENTENCES, "alt_text": SENTENCES[::-1]}).to_parquet(
        tmp_path / "m.parquet"
    )
    proc = cli(tmp_path / "m.parquet", "--out", tmp_path / "build")
    assert proc.returncode == 2 and proc.stdout == ""
    last = proc.stderr.strip().splitlines()[-1]
    assert "2 columns could be the caption" in last and "caption (" in last and "alt_text (" in last
    assert "--caption-column NAME" in last

    proc = cli(tmp_path / "m.parquet", "--out", tmp_path / "build", "--caption-column", "alt_text")
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    fields = config["captions"]["fields"]
    assert fields[0] == "alt_text" and "caption" not in fields  # the other column is no fallback
    assert "caption column: alt_text (chosen with --caption-column" in proc.stderr


def test_headerless_two_sentence_columns_exit_2_and_a_column_number_picks_one(tmp_path):
    tsv = write_tsv(tmp_path / "pairs.tsv", list(zip(urls(10), SENTENCES, SENTENCES[::-1])))
    proc = cli(tsv, "--out", tmp_path / "build")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "column 2 (" in last and "column 3 (" in last and "--caption-column N" in last
    proc = cli(tsv, "--out", tmp_path / "build", "--caption-column", "3")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["sources"][0]["columns"] == ["url", "col2", "caption"]


def test_two_url_columns_or_none_cannot_be_told(tmp_path):
    two = pd.DataFrame({"url": urls(5), "page_url": urls(5, "https://example.org/page"), "caption": SENTENCES[:5]})
    two.to_parquet(tmp_path / "two.parquet")
    with pytest.raises(CannotTell, match=r"2 columns could be the URL: url .*page_url .*--url-column NAME"):
        guess([tmp_path / "two.parquet"], out=tmp_path / "build")
    config, _ = guess([tmp_path / "two.parquet"], out=tmp_path / "build", url_column="url")
    assert config["sources"][0]["url_column"] == "url"
    pd.DataFrame({"name": ["a", "b"], "caption": SENTENCES[:2]}).to_parquet(tmp_path / "none.parquet")
    with pytest.raises(CannotTell, match="no column holds URLs"):
        guess([tmp_path / "none.parquet"], out=tmp_path / "build")


def test_a_flag_naming_no_column_is_refused(tmp_path):
    tsv = write_tsv(tmp_path / "cc3m.tsv", list(zip(SENTENCES, urls(10))))
    with pytest.raises(InputError, match="no such column; give a number from 1 to 2"):
        guess([tsv], out=tmp_path / "build", caption_column="caption")


# --- curation: LAION's and DataComp's metadata -------------------------------------------------------------

OPS = {"<", "<=", ">", ">=", "==", "!=", "in", "not_in"}
DATACOMP_BASIC = {  # docs/curation.md's "DataComp basic" recipe, as settings
    "resize": {"min_side": 200, "max_aspect_ratio": 3},
    "captions": {"languages": ["en"], "min_words": 3, "min_chars": 6},
}


def written(paths, **kw) -> tuple[str, list[str]]:
    """(new-config's text, stderr lines) for `paths`."""
    lines: list[str] = []
    return new_config([str(p) for p in paths], Options(**kw), log=lines.append), lines


def uncommented_filters(text: str) -> list[dict]:
    """What a user gets by uncommenting the suggested filters: `# filters:` and the lines under it, up to the
    blank line, each without its leading '# ', read as YAML."""
    lines = text.splitlines()
    start = lines.index("# filters:")
    block = [ln.removeprefix("# ") for ln in lines[start : lines.index("", start)]]
    loaded = yaml.safe_load("\n".join(block))
    assert list(loaded) == ["filters"]
    return loaded["filters"]


def uncommented_settings(text: str) -> dict:
    """The config with the commented DataComp-basic settings of resize and captions uncommented."""
    keys = tuple(f"  # {k}:" for section in DATACOMP_BASIC.values() for k in section)
    return yaml.safe_load("\n".join(ln.replace("# ", "", 1) if ln.startswith(keys) else ln for ln in text.splitlines()))


def reasons(text: str) -> str:
    """The suggested filters' comments, one text (they wrap)."""
    return " ".join(ln.removeprefix("#   # ") for ln in text.splitlines() if ln.startswith("#   # "))


def check_suggestions(text: str, config: dict) -> list[dict]:
    """The suggested filters are off, each item is a filter as the schema describes it with a comment line above
    it, and the config with all of them and DataComp's basic settings switched on is valid."""
    assert "filters" not in config
    filters = uncommented_filters(text)
    for f in filters:
        assert set(f) <= {"name", "column", "op", "value", "sources"} and f["op"] in OPS
        assert re.fullmatch(r"[a-z0-9][a-z0-9_]{0,47}", f["name"])
        assert set(f["sources"]) <= {s["name"] for s in config["sources"]}
    assert len({f["name"] for f in filters}) == len(filters)
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        if ln.startswith("#   - {"):
            assert lines[i - 1].startswith("#   # "), ln  # where its cut-off comes from
    on = uncommented_settings(text)
    for section, settings in DATACOMP_BASIC.items():
        assert {k: on[section][k] for k in settings} == settings
    check_against_schema({**on, "filters": filters})
    return filters


def laion_rows(n: int = 20, base: str = "https://img.example.org/laion") -> dict:
    return {
        "url": urls(n, base),
        "caption": [SENTENCES[i % 10] + f" no. {i}" for i in range(n)],
        "punsafe": [i / 50 for i in range(n)],
        "pwatermark": [i / 40 for i in range(n)],
        "similarity": [0.28 + i / 200 for i in range(n)],
        "width": [640 - 20 * i for i in range(n)],
        "height": [480] * n,
        "LANGUAGE": ["en", "de", "en", "fr"] * (n // 4),
    }


def datacomp_rows(n: int = 20) -> dict:
    return {
        "uid": [hashlib.md5(f"uid{i}".encode()).hexdigest() for i in range(n)],
        "url": urls(n, "https://cc.example.org/datacomp"),
        "text": [SENTENCES[i % 10] + f" ({i})" for i in range(n)],
        "original_width": [800 - 40 * i for i in range(n)],
        "original_height": [600] * n,
        "clip_b32_similarity_score": [0.15 + i / 100 for i in range(n)],
        "clip_l14_similarity_score": [0.1 + i / 100 for i in range(n)],
        "face_bboxes": [[[0.1, 0.2, 0.3, 0.45], [0.5, 0.5, 0.6, 0.7]] if i % 5 == 0 else [] for i in range(n)],
        "sha256": [hashlib.sha256(f"img{i}".encode()).hexdigest() for i in range(n)],
    }


def test_laion_metadata_gets_commented_filters_naming_its_source_and_no_blur(tmp_path):
    pd.DataFrame(laion_rows()).to_parquet(tmp_path / "laion.parquet", index=False)
    text, lines = written([tmp_path / "laion.parquet"], out=str(tmp_path / "build"))
    config = yaml.safe_load(text)
    (src,) = config["sources"]
    assert src == {"name": "laion", "type": "manifest", "path": str(tmp_path / "laion.parquet"), "url_column": "url"}
    filters = check_suggestions(text, config)
    assert [(f["name"], f["column"], f["op"], f["value"]) for f in filters] == [
        ("unsafe", "punsafe", "<", 0.5),
        ("watermark", "pwatermark", "<", 0.8),
        ("clip_similarity", "similarity", ">=", 0.28),
        ("language", "LANGUAGE", "in", ["en"]),
        ("short_width", "width", ">=", 200),
        ("short_height", "height", ">=", 200),
    ]
    assert all(f["sources"] == ["laion"] for f in filters)
    for said in ("LAION's own cut", "LAION-Aesthetics kept < 0.8", "LAION-2B-en's cut (LAION-400M used 0.3)",
                 "sampled: en 50%, de 25%, fr 25%", "DataComp's basic filter", "resize.min_side"):  # fmt: skip
        assert said in reasons(text), said
    assert "blur_boxes" not in text
    assert any(ln.startswith("laion: filters: punsafe < 0.5, pwatermark < 0.8, similarity >= 0.28") for ln in lines)


def test_datacomp_metadata_gets_blur_boxes_on_and_its_filters(tmp_path):
    pd.DataFrame(datacomp_rows()).to_parquet(tmp_path / "datacomp.parquet", index=False)
    text, lines = written([tmp_path / "datacomp.parquet"], out=str(tmp_path / "build"))
    config = yaml.safe_load(text)
    (src,) = config["sources"]
    assert src["blur_boxes"] == "face_bboxes"  # on: written as a key, not a comment
    assert (src["key_column"], src["hash_column"], src["hash_type"]) == ("uid", "sha256", "sha256")
    (blur_line,) = [ln for ln in text.splitlines() if "blur_boxes:" in ln and not ln.lstrip().startswith("#")]
    assert blur_line.startswith("    blur_boxes: face_bboxes") and "blurred" in blur_line
    assert "delete this line to publish them unblurred" in blur_line  # how to turn it off
    filters = check_suggestions(text, config)
    assert [(f["name"], f["column"], f["op"], f["value"]) for f in filters] == [
        ("clip_b32_score", "clip_b32_similarity_score", ">=", 0.25),
        ("clip_l14_score", "clip_l14_similarity_score", ">=", 0.3),
        ("short_width", "original_width", ">=", 200),
        ("short_height", "original_height", ">=", 200),
    ]
    assert all(f["sources"] == ["datacomp"] for f in filters)
    assert "top 30% of the whole pool" in reasons(text)
    assert "in the 20 rows sampled, the top 30% score 0.23 or more" in reasons(text)
    assert (
        "datacomp: blur_boxes: face_bboxes (face boxes, by name, as DataComp's face_bboxes; 4 of 20 sampled rows"
        in ("\n".join(lines))
    )
    assert not any("NOTE" in ln for ln in lines)
    check_against_schema(config)


def test_face_boxes_that_are_missing_or_not_fractions_are_said_to_be_rejected(tmp_path):
    rows = datacomp_rows(10)
    rows["face_bboxes"][1] = [[12, 30, 80, 95]]  # pixels, not fractions
    rows["face_bboxes"][2] = None
    pd.DataFrame(rows).to_parquet(tmp_path / "pool.parquet", index=False)
    config, lines = guess([tmp_path / "pool.parquet"], out=tmp_path / "build")
    assert config["sources"][0]["blur_boxes"] == "face_bboxes"  # still on: such records are rejected, not published
    notes = [ln for ln in lines if "NOTE" in ln]
    assert any(
        "1 of 10 sampled rows have face_bboxes values that are not lists of [x0, y0, x1, y1]" in n for n in notes
    )
    assert any("1 of 10 sampled rows have no face_bboxes value: such records are rejected" in n for n in notes)


def test_sampled_box_cells_are_judged_by_the_rule_the_workflow_applies():
    assert box_count("[[0.2, 0.2, 0.2, 0.5]]") is None  # no area: the workflow rejects the record
    assert box_count("[[-1e-9, 0.1, 0.5, 0.5]]") == 1  # float error the workflow tolerates
    assert box_count("[[0.1, 0.1, 0.5, 0.5], [0.6, 0.6, 0.7, 0.8]]") == 2
    assert box_count("[]") == 0
    assert box_count("null") is None and box_count("") is None


def test_sampled_numbers_leave_empty_cells_out_so_a_nan_keeps_a_suggestion():
    assert numbers(["0.1", "nan", "", "NULL", "None", "0.3"]) == [0.1, 0.3]
    assert numbers(["0.1", "inf"]) is None and numbers(["nan"]) is None and numbers(["0.1", "high"]) is None
    assert within(0, 1)(["0.02", "NaN", "0.9"])


def test_face_boxes_in_a_shards_json_get_blur_boxes_on(tmp_path):
    samples = {
        f"k{i}": {"jpg": jpeg_bytes(), "json": json.dumps({"caption": SENTENCES[i], "face_bboxes": []}).encode()}
        for i in range(3)
    }
    (tmp_path / "in").mkdir()
    shard_tar(tmp_path / "in" / "pool-0.tar", samples)
    config, lines = guess([tmp_path / "in" / "pool-0.tar"], out=tmp_path / "build")
    assert config["sources"][0]["blur_boxes"] == "json.face_bboxes"
    assert "pool_0: blur_boxes: json.face_bboxes (face boxes, by name, as DataComp's face_bboxes; 0 of 3" in (
        "\n".join(lines)
    )
    check_against_schema(config)


def test_sources_with_the_same_metadata_share_a_filter_and_names_stay_unique(tmp_path):
    for name in ("laion_a", "laion_b"):
        pd.DataFrame(laion_rows()).to_parquet(tmp_path / f"{name}.parquet", index=False)
    pd.DataFrame(datacomp_rows()).to_parquet(tmp_path / "datacomp.parquet", index=False)
    paths = [tmp_path / "laion_a.parquet", tmp_path / "laion_b.parquet", tmp_path / "datacomp.parquet"]
    text, _ = written(paths, out=str(tmp_path / "build"))
    filters = {f["name"]: f for f in check_suggestions(text, yaml.safe_load(text))}
    assert filters["unsafe"]["sources"] == ["laion_a", "laion_b"]
    assert (filters["short_width"]["column"], filters["short_width"]["sources"]) == ("width", ["laion_a", "laion_b"])
    assert (filters["short_width_2"]["column"], filters["short_width_2"]["sources"]) == ("original_width", ["datacomp"])


def test_a_plain_url_caption_tsv_gets_no_filters_and_no_blur(tmp_path):
    tsv = write_tsv(tmp_path / "plain.tsv", [("url", "caption"), *zip(urls(10), SENTENCES)])
    text, _ = written([tsv], out=str(tmp_path / "build"))
    assert yaml.safe_load(text)["sources"] == [
        {"name": "plain", "type": "manifest", "path": str(tsv), "url_column": "url"}
    ]
    assert "filters" not in text and "blur_boxes" not in text and "min_words" not in text


def test_a_headerless_tsv_is_unaffected(tmp_path):
    """No names, nothing to recognise: even a column of scores in [0, 1] and one of box lists suggest nothing."""
    rows = [(u, s, str(i / 10), "[]") for i, (u, s) in enumerate(zip(urls(10), SENTENCES))]
    tsv = write_tsv(tmp_path / "cc.tsv", rows)
    text, lines = written([tsv], out=str(tmp_path / "build"))
    assert yaml.safe_load(text)["sources"] == [
        {"name": "cc", "type": "manifest", "path": str(tsv), "columns": ["url", "caption", "col3", "col4"],
         "url_column": "url"}
    ]  # fmt: skip
    assert "filters" not in text and "blur_boxes" not in text and "min_words" not in text
    assert not any("filters" in ln or "blur" in ln for ln in lines)


# --- folders and shards -------------------------------------------------------------------------------------


def test_folder_with_txt_and_json_sidecars(tmp_path):
    folder = make_folder(tmp_path / "My Photos")
    config, lines = guess([folder], out=tmp_path / "build")
    assert config["sources"] == [{"name": "my_photos", "type": "folder", "path": str(folder)}]
    assert config["captions"]["fields"][:3] == ["txt", "json.caption", "json.description"]
    assert "my_photos: sidecars: .json beside 2, .txt beside 3 of 6 images sampled" in lines
    assert any("without a caption: 1 of 6 images" in ln for ln in lines)
    check_against_schema(config)


def test_folder_with_an_unreadable_sidecar_counts_that_image_as_without_a_caption(tmp_path):
    folder = make_folder(tmp_path / "photos")
    (folder / "a0.txt").unlink()
    (folder / "a0.txt").mkdir()
    config, lines = guess([folder], out=tmp_path / "build")
    assert any("without a caption: 2 of 6 images" in ln for ln in lines)


def test_folder_without_any_caption_is_refused(tmp_path):
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "x.jpg").write_bytes(jpeg_bytes())
    with pytest.raises(InputError, match="none of 1 images has a caption sidecar"):
        guess([tmp_path / "bare"], out=tmp_path / "build")


def test_shards_with_captions_only_in_json_description(tmp_path):
    img = jpeg_bytes()
    (tmp_path / "shards").mkdir()
    for s in range(2):
        samples = {
            f"{s}{i:03d}": {"jpg": img, "json": json.dumps({"description": SENTENCES[i], "status": "ok"}).encode()}
            for i in range(4)
        }
        shard_tar(tmp_path / "shards" / f"old-{s:05d}.tar", samples)
    pattern = str(tmp_path / "shards" / "old-{00000..00001}.tar")
    config, lines = guess([pattern], out=tmp_path / "build")
    assert config["sources"] == [{"name": "old", "type": "shards", "path": pattern}]
    assert config["captions"]["fields"][0] == "json.description"
    assert any(
        ln.startswith("old: members of the first 4 samples (first of 2 tars") and "jpg 4, json 4" in ln for ln in lines
    )
    check_against_schema(config)


def test_json_caption_keys_in_any_case_are_found_as_spelled(tmp_path):
    (tmp_path / "in").mkdir()
    metas = [{"Caption": SENTENCES[0]}, {"TEXT": SENTENCES[1]}, {"Caption": SENTENCES[2], "caption": " "}]
    samples = {f"k{i}": {"jpg": jpeg_bytes(), "json": json.dumps(m).encode()} for i, m in enumerate(metas)}
    shard_tar(tmp_path / "in" / "mixed.tar", samples)
    config, lines = guess([tmp_path / "in" / "mixed.tar"], out=tmp_path / "build")
    assert config["captions"]["fields"][:2] == ["json.Caption", "json.TEXT"]
    assert (
        "mixed: caption fields: json.Caption on 2, json.TEXT on 1 (of the first 3 samples); tried in this order"
        in lines
    )
    check_against_schema(config)


def test_a_single_tar_with_an_unusual_image_extension(tmp_path):
    (tmp_path / "in").mkdir()
    shard_tar(tmp_path / "in" / "one.tar", {"k1": {"image": jpeg_bytes(), "caption": b"A lone tree on a hill"}})
    config, _ = guess([tmp_path / "in" / "one.tar"], out=tmp_path / "build")
    src = config["sources"][0]
    assert src["type"] == "shards" and src["image_extensions"][-1] == "image"
    assert config["captions"]["fields"][0] == "caption"


def test_shards_named_webdatasets_way_with_several_dots_are_read_as_one_sample_a_key(tmp_path):
    samples = {f"{i:04d}.image": {"png": jpeg_bytes()} for i in range(3)}
    samples |= {f"{i:04d}.caption": {"txt": SENTENCES[i].encode()} for i in range(3)}
    (tmp_path / "in").mkdir()
    shard_tar(tmp_path / "in" / "dots.tar", dict(sorted(samples.items())))  # 0000.caption.txt, 0000.image.png, ...
    config, _ = guess([tmp_path / "in" / "dots.tar"], out=tmp_path / "build")
    assert config["sources"][0]["type"] == "shards" and config["captions"]["fields"][0] == "txt"
    check_against_schema(config)


def test_shards_whose_images_and_captions_never_share_a_sample_are_refused(tmp_path):
    samples = {f"img.{i}": {"jpg": jpeg_bytes()} for i in range(3)}  # dotted keys: images here, captions apart
    samples |= {f"txt.{i}": {"txt": SENTENCES[i].encode()} for i in range(3)}
    (tmp_path / "in").mkdir()
    shard_tar(tmp_path / "in" / "dots.tar", samples)
    with pytest.raises(InputError, match=r"no sample has both an image and a caption member \(sample keys: img.0"):
        guess([tmp_path / "in" / "dots.tar"], out=tmp_path / "build")
    # every image first, then every caption: a sample's members apart
    with tarfile.open(tmp_path / "in" / "apart.tar", "w") as tar:
        for name, data in [
            *((f"{i}.jpg", jpeg_bytes()) for i in range(3)),
            *((f"{i}.txt", b"a cap") for i in range(3)),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(InputError, match=r"the members of one sample are not next to each other \(those of 0 come"):
        guess([tmp_path / "in" / "apart.tar"], out=tmp_path / "build")


# --- remote inputs ------------------------------------------------------------------------------------------


def test_http_manifests_are_read_on_loopback_with_bounded_requests(tmp_path, http_server):
    body = "".join(f"{u}\t{s}\n" for u, s in zip(urls(10), SENTENCES)).encode()
    tsv_url = http_server.route("/data/cc12m.tsv", Reply(body=body, headers=[("Content-Type", "text/plain")]))
    buf = io.BytesIO()
    pd.DataFrame({"url": urls(10), "caption": SENTENCES, "width": range(10)}).to_parquet(buf)
    pq_url = http_server.route("/data/laion.parquet", Reply(body=buf.getvalue(), headers=[]))
    config, lines = guess([tsv_url, pq_url], out=tmp_path / "build")
    tsv, parquet = config["sources"]
    assert (tsv["path"], tsv["columns"]) == (tsv_url, ["url", "caption"])
    assert (parquet["path"], parquet["url_column"]) == (pq_url, "url")
    assert http_server.count("/data/cc12m.tsv") == 1  # one request for the first bytes
    assert http_server.count("/data/laion.parquet") <= 3  # this server ignores Range: size, then the file, once
    assert not any("NOTE" in ln for ln in lines)  # the workflow reads remote manifests as new-config does
    check_against_schema(config)


def test_http_input_errors_say_what_failed(tmp_path, http_server):
    with pytest.raises(InputError, match="HTTP 404"):
        guess([http_server.url("/missing.parquet")], out=tmp_path / "build")
    big = http_server.route("/big.parquet", Reply(body=b"PAR1" + b"\0" * (3 << 20), headers=[]))
    with pytest.raises(InputError, match=r"big.parquet: the server ignores Range requests and the file is over 2 MB"):
        guess([big], out=tmp_path / "build", max_read_bytes=2 << 20)


def test_s3_manifest_and_shards_through_the_aws_cli_with_aws_endpoint_url(tmp_path, s3_server, monkeypatch):
    bucket = "newconfig"
    subprocess.run(
        [s3_server.aws_cli, "s3", "mb", f"s3://{bucket}", "--endpoint-url", s3_server.endpoint_url],
        check=True,
        capture_output=True,
    )
    pd.DataFrame({"URL": urls(10), "TEXT": SENTENCES}).to_parquet(tmp_path / "laion.parquet")
    upload(str(tmp_path / "laion.parquet"), f"s3://{bucket}/laion/part-0.parquet", s3_server)
    shard_tar(tmp_path / "s.tar", {"k": {"jpg": jpeg_bytes(), "txt": b"A photo of a lighthouse"}})
    upload(str(tmp_path / "s.tar"), f"s3://{bucket}/shards/s-000.tar", s3_server)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)  # honoured, not written
    paths = [f"s3://{bucket}/laion/part-0.parquet", f"s3://{bucket}/shards/s-{{000..000}}.tar"]
    config, lines = guess(paths, out=tmp_path / "build")
    assert "s3" not in config and config["sources"][0]["url_column"] == "URL"
    assert config["sources"][1]["type"] == "shards" and config["captions"]["fields"][:2] == ["TEXT", "txt"]
    assert not any("NOTE" in ln for ln in lines)
    config, _ = guess(paths, out=tmp_path / "build", s3_endpoint_url=s3_server.endpoint_url)
    assert config["s3"] == {"endpoint_url": s3_server.endpoint_url}


# --- names, paths, defaults ---------------------------------------------------------------------------------


def test_source_names_are_sanitised_and_unique():
    assert source_name("/data/CC3M Train.tsv") == "cc3m_train"
    assert source_name("/x/legacy-{000000..000009}.tar") == "legacy"
    assert source_name("/data/laion/*.parquet") == "laion"
    assert source_name("s3://bucket/laion400m/{00000..00099}.tar") == "laion400m"
    assert source_name("https://host/a/cc12m.tsv.gz") == "cc12m"
    assert source_name("/data/" + "x" * 40 + ".jsonl") == "x" * 32
    assert source_name("/data/___.csv") == "data"
    assert source_name("/data/Fotos Ünïcode/") == "fotos_unicode"
    assert source_name("/data/café crème.tsv") == "cafe_creme"
    assert unique_names(["a", "a", "b", "a"]) == ["a", "a_2", "b", "a_3"]


def test_an_output_folder_inside_an_input_folder_is_refused(tmp_path):
    folder = make_folder(tmp_path / "photos")
    proc = cli(folder, "--out", folder / "build")
    assert proc.returncode == 1 and proc.stdout == ""
    assert "overlaps input folder" in proc.stderr and "another --out" in proc.stderr


def test_an_input_given_twice_is_refused_without_blaming_the_out_folder(tmp_path):
    pd.DataFrame({"url": urls(5), "caption": SENTENCES[:5]}).to_parquet(tmp_path / "m.parquet")
    with pytest.raises(InputError) as e:
        guess([tmp_path / "m.parquet", tmp_path / "." / "m.parquet"], out=tmp_path / "build")
    assert str(e.value) == (
        f"sources[1] (m_2) and sources[0] (m) both read {tmp_path}/m.parquet: its records would be published "
        "twice; keep it in one source."
    )


def test_a_bad_dataset_name_is_refused(tmp_path):
    tsv = write_tsv(tmp_path / "cc3m.tsv", list(zip(SENTENCES, urls(10))))
    with pytest.raises(InputError, match="--dataset My Set: a dataset name is"):
        guess([tsv], out=tmp_path / "build", dataset="My Set")


def test_defaults_come_from_the_schema_at_run_time(tmp_path, monkeypatch):
    schema = yaml.safe_load(SCHEMA.read_text())
    props = schema["properties"]
    props["part_size"]["default"] = 123
    props["samples_per_shard"]["default"] = 45
    props["resize"]["properties"]["max_side"]["default"] = 640
    props["captions"]["properties"]["max_chars"]["default"] = 77
    props["validate"]["properties"]["min_shards"]["default"] = 3
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    monkeypatch.setattr("shardsmith.cli.newconfig.options.SCHEMA_PATH", tmp_path / "schema.yaml")
    tsv = write_tsv(tmp_path / "cc3m.tsv", list(zip(SENTENCES, urls(10))))
    config, _ = guess([tsv], out=tmp_path / "build")
    assert (config["part_size"], config["samples_per_shard"], config["resize"], config["validate"]) == (
        123, 45, {"max_side": 640}, {"min_shards": 3}
    )  # fmt: skip
    assert config["captions"]["max_chars"] == 77


def test_written_config_is_complete_commented_and_explicit_about_embed_and_publish(tmp_path):
    tsv = write_tsv(tmp_path / "cc3m.tsv", list(zip(SENTENCES, urls(10))))
    proc = cli(tsv, "--out", tmp_path / "out", "--dataset", "my-set")
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    assert config["dataset"] == "my-set" and config["version"] == "v1"
    assert config["paths"] == {k: str(tmp_path / "out" / k) for k in ("raw", "work", "output", "logs")}
    assert config["embed"] == {"enabled": False} and config["publish"] == {"dest": None}
    assert "  # model: ViT-B-32" in proc.stdout and "  # dest: /mnt/fast/datasets" in proc.stdout
    for key in ("part_size:", "samples_per_shard:", "  max_side:", "  fields:", "  max_chars:", "  min_shards:"):
        (text,) = [ln for ln in proc.stdout.splitlines() if ln.startswith(key)]
        assert "  # " in text, text  # every often-changed key has its comment
    filled = check_against_schema(config)  # the rest comes from the schema's defaults
    assert filled["download"]["concurrency"] == schema_default(load_schema(), "download.concurrency")


# --- runs as written ----------------------------------------------------------------------------------------


def run_as_written(root: Path, *paths, allow_loopback: bool = False) -> tuple[dict, Path]:
    """new-config's stdout, unchanged, as the config of a real snakemake run in `root`; (config, output folder).

    `allow_loopback` appends the one thing a user adds for a manifest of URLs on this machine: the network
    guard's allow list for the test server."""
    proc = cli(*paths, "--out", root / "build")
    assert proc.returncode == 0, proc.stderr
    allow = f"\ndownload:\n  allow_networks: {ALLOW_LOOPBACK['allow_networks']}\n" if allow_loopback else ""
    (root / "my.yaml").write_text(proc.stdout + allow)
    cmd = [
        str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(root), "--configfile", str(root / "my.yaml"),
        "--workflow-profile", "none", "--cores", "2",
    ]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    config = yaml.safe_load(proc.stdout)
    out = Path(config["paths"]["output"]) / config["dataset"]
    assert json.loads((out / "validation.json").read_text())["ok"] is True
    return config, out


def published_and_rejected(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    return pd.read_parquet(out / "manifest.parquet"), pd.read_parquet(out / "rejected.parquet")


def captions_in_shards(out: Path) -> set[str]:
    found = set()
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tar:
            found |= {tar.extractfile(m).read().decode() for m in tar if m.name.endswith(".txt")}
    return found


@pytest.mark.workflow
def test_demo_inputs_config_runs_as_written(tmp_path):
    counts = make_demo(tmp_path / "data")
    data = tmp_path / "data"
    config, out = run_as_written(
        tmp_path, data / "manifest.tsv", data / "photos", data / "shards" / "legacy-{000000..000001}.tar"
    )
    assert [s["type"] for s in config["sources"]] == ["manifest", "folder", "shards"]
    published, rejected = published_and_rejected(out)
    assert len(published) + len(rejected) == sum(counts.values())  # every input record, once
    assert len(set(published["source_id"]) | set(rejected["source_id"])) == sum(counts.values())
    assert set(published["source"]) == {"manifest", "photos", "legacy"}
    assert "Archive photo 0-0: hills at dusk" in captions_in_shards(out)  # json.description reached


@pytest.mark.workflow
def test_cc3m_cc12m_parquet_folder_and_shards_config_runs_as_written(tmp_path, http_server):
    """(b) CC3M-style and (c) CC12M-style headerless TSVs of loopback URLs, (d) a parquet with extra columns,
    (e) a folder, (f) shards: one config, one run; every record of each source published or in the ledger."""
    img = [jpeg_bytes(color=(25 * i, 100, 200 - 10 * i)) for i in range(8)]
    web = [http_server.route(f"/img/{i}.jpg", Reply(body=img[i])) for i in range(8)]
    data = tmp_path / "in"  # inputs beside the build folder, not around it
    data.mkdir()
    cc3m = write_tsv(
        data / "cc3m.tsv", [*zip(SENTENCES[:4], web[:4]), ("A photo that is gone", http_server.url("/gone.jpg"))]
    )
    cc12m = write_tsv(data / "cc12m.tsv", list(zip(web[4:], SENTENCES[4:8])))
    (data / "local").mkdir()
    for i in range(3):
        (data / "local" / f"{i}.jpg").write_bytes(img[i])
    rows = {
        "url": [str(data / "local" / f"{i}.jpg") for i in range(3)],
        "caption": SENTENCES[7:10],
        "width": [64] * 3,
        "nsfw": ["UNLIKELY"] * 3,
    }
    pd.DataFrame(rows).to_parquet(data / "parquet_rows.parquet")
    folder = make_folder(data / "photos")
    samples = {
        f"s{i}": {"jpg": img[i], "json": json.dumps({"description": f"Shard photo {i} of a hill"}).encode()}
        for i in range(3)
    }
    (data / "shards").mkdir()
    shard_tar(data / "shards" / "old-0.tar", samples)

    cc12m_url = http_server.route("/manifests/cc12m.tsv", Reply(body=Path(cc12m).read_bytes(), headers=[]))
    config, out = run_as_written(  # the CC12M manifest itself over http: read by the workflow as by new-config
        tmp_path,
        cc3m,
        cc12m_url,
        data / "parquet_rows.parquet",
        folder,
        data / "shards" / "old-0.tar",
        allow_loopback=True,
    )
    assert [s["name"] for s in config["sources"]] == ["cc3m", "cc12m", "parquet_rows", "photos", "old_0"]
    published, rejected = published_and_rejected(out)
    inputs = {"cc3m": 5, "cc12m": 4, "parquet_rows": 3, "photos": 6, "old_0": 3}
    assert pd.concat([published["source"], rejected["source"]]).value_counts().to_dict() == inputs
    assert sorted(rejected["reason"]) == ["no_caption", "not_found"]  # the folder's uncaptioned image, the 404
    captions = captions_in_shards(out)
    assert set(SENTENCES[:10]) <= captions and "Shard photo 2 of a hill" in captions  # each caption from its column
