"""What the rules read from the validated config: folders, which optional steps run, and their settings."""

from pathlib import Path

import pytest
from snakemake.utils import validate

from shardsmith.formats.build import config_fingerprint
from shardsmith.formats.energon import SQLITE_AUTO_SAMPLES
from shardsmith.workflow.settings import Settings

SCHEMA = str(Path(__file__).resolve().parents[2] / "config" / "config.schema.yaml")


def settings(**overrides) -> Settings:
    c = {
        "dataset": "ds",
        "paths": {"raw": "/data/raw", "work": "/data/work", "output": "/data/out", "logs": "/data/logs"},
        "sources": [{"name": "web", "type": "manifest", "path": "in/web.parquet"}],
        **overrides,
    }
    validate(c, schema=SCHEMA)  # defaults filled in, as the workflow does
    return Settings(c)


def test_the_datasets_folders_are_the_configs_paths_with_its_name_and_the_policy_cache_is_shared():
    s = settings()
    assert [s.folder(k) for k in ("raw", "work", "output", "logs")] == [
        "/data/raw/ds", "/data/work/ds", "/data/out/ds", "/data/logs/ds",
    ]  # fmt: skip
    assert s.policy == "/data/work/policy"  # every dataset's, outside the dataset's own work folder
    assert s.shard_places == {"work": "/data/work/ds", "out": "/data/out/ds", "dataset": "ds"}


@pytest.mark.parametrize(
    "overrides, low, near, near_embeddings",
    [
        ({}, False, True, False),
        ({"embed": {"enabled": True}}, False, True, False),  # dedupe.embedding_min_similarity unset
        ({"embed": {"enabled": True}, "dedupe": {"embedding_min_similarity": 0.95}}, False, True, True),
        ({"embed": {"enabled": True, "min_similarity": 0.2}}, True, True, False),
        ({"embed": {"enabled": False, "min_similarity": 0.2}}, False, True, False),
        (
            {"embed": {"enabled": True}, "dedupe": {"near": "off", "embedding_min_similarity": 0.95}},
            False,
            False,
            False,
        ),
    ],
)
def test_optional_steps_run_only_where_the_config_turns_them_on(overrides, low, near, near_embeddings):
    s = settings(**overrides)
    assert (s.low_similarity, s.near, s.near_embeddings) == (low, near, near_embeddings)


def test_published_versions_are_read_only_with_a_destination_and_a_dedupe_that_needs_them():
    assert settings().published is None  # nowhere to read them from
    assert settings(publish={"dest": "/fast", "dedupe": False}, dedupe={"near": "off"}).published is None
    exact = settings(publish={"dest": "s3://b/p", "dedupe": True}, dedupe={"near": "off"}).published
    assert exact == {"dest": "s3://b/p", "dataset": "ds", "s3": exact["s3"], "exact": True}
    assert settings(publish={"dest": "/fast", "dedupe": False}).published["exact"] is False  # near only


def test_embed_settings_add_no_key_for_the_default_decode_path_so_existing_scores_are_kept():
    cpu = settings(embed={"enabled": True}).embed
    assert "decode" not in cpu and "gpu_decode_fraction" not in cpu and "min_similarity" not in cpu
    gpu = settings(embed={"enabled": True, "decode": "gpu"}).embed
    assert gpu["decode"] == "gpu" and gpu["gpu_decode_fraction"] == 1.0  # no schema default: the fingerprint stays
    assert "gpu_resize_fraction" not in gpu
    assert (
        "gpu_resize_fraction" not in settings(embed={"enabled": True, "decode": "gpu", "gpu_resize_fraction": 1}).embed
    )
    assert "cuda_graph" not in cpu and "cuda_graph" not in settings(embed={"cuda_graph": False}).embed
    assert settings(embed={"enabled": True, "cuda_graph": True}).embed["cuda_graph"] is True
    resize = settings(embed={"enabled": True, "decode": "gpu", "gpu_resize_fraction": 0.25}).embed
    assert resize["gpu_resize_fraction"] == 0.25
    assert (
        settings(embed={"enabled": True, "decode": "gpu", "gpu_decode_fraction": 0.5}).embed["gpu_decode_fraction"]
        == 0.5
    )


@pytest.mark.parametrize(
    "pretrained, model_config, files",
    [
        ("openai", None, []),  # a tag: nothing on disk
        ("models/clip.pt", None, ["models/clip.pt"]),
        ("clip.safetensors", "models/cfg.json", ["models/cfg.json", "clip.safetensors"]),
    ],
)
def test_local_model_files_are_inputs_and_tags_are_not(pretrained, model_config, files):
    assert settings(embed={"pretrained": pretrained, "model_config": model_config}).embed_model_files == files


def test_score_heads_are_embed_settings_and_their_files_inputs_only_where_configured():
    head = {"name": "aesthetic", "kind": "aesthetic", "weights": "models/aesthetic.pth"}
    assert "heads" not in settings(embed={"enabled": True}).embed  # parts embedded without heads are kept
    headed = settings(embed={"enabled": True, "pretrained": "models/clip.pt", "heads": [head]})
    assert headed.embed["heads"] == [head]
    assert headed.embed_model_files == ["models/clip.pt", "models/aesthetic.pth"]


def test_id_lists_of_filters_are_inputs_of_the_part_plan(tmp_path):
    filters = [
        {"column": "uid", "op": "in_file", "value": "subset.txt"},
        {"column": "punsafe", "op": "<", "value": 0.5},
        {"column": "url", "op": "not_in_file", "value": "takedowns.parquet"},
    ]
    assert settings(filters=filters).id_list_files == ["subset.txt", "takedowns.parquet"]
    assert settings().id_list_files == []
    (tmp_path / "subset.parquet").mkdir()  # a folder, as Spark writes it: each file, one rewritten in place too
    for name in ("part-0.parquet", "part-1.parquet", "_SUCCESS"):
        (tmp_path / "subset.parquet" / name).write_bytes(b"")
    folder = [{"column": "uid", "op": "in_file", "value": str(tmp_path / "subset.parquet")}]
    listed = [str(tmp_path / "subset.parquet" / n) for n in ("_SUCCESS", "part-0.parquet", "part-1.parquet")]
    assert settings(filters=folder).id_list_files == listed


def test_evaluation_sets_files_are_inputs_of_hash_references(tmp_path):
    # every file of a folder at any depth (ImageNet's val is a folder a class): one added in a subfolder, or
    # rewritten, hashes the set again, which the folder's own time would not say
    for rel in ("n01/a.jpg", "n01/n02/b.jpg", "c.png", ".cache/x.jpg", "n01/.hidden.jpg"):
        (tmp_path / "val" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "val" / rel).write_bytes(b"")
    for i in range(2):
        (tmp_path / f"coco-{i:06d}.tar").write_bytes(b"")
    sets = [{"name": "val", "path": str(tmp_path / "val")}, {"name": "coco", "path": str(tmp_path / "coco-*.tar")}]
    s = settings(evaluation_sets=sets)
    assert s.evaluation_sets == sets
    folder = [str(tmp_path / "val" / rel) for rel in ("c.png", "n01/a.jpg", "n01/n02/b.jpg")]
    assert s.evaluation_set_files == [*folder, *(str(tmp_path / f"coco-{i:06d}.tar") for i in range(2))]
    assert settings().evaluation_sets == [] and settings().evaluation_set_files == []


def test_published_dir_is_the_mounted_version_folder_only():
    assert settings().published_dir is None
    assert settings(publish={"dest": "s3://b/p"}).published_dir is None
    assert settings(publish={"dest": "/fast"}).published_dir == "/fast/ds/v1"
    assert settings(publish={"dest": "/fast"}, version="auto").published_dir == "/fast/ds/latest"


def test_leftovers_are_looked_for_in_the_datasets_folders_and_beside_a_mounted_destinations_versions():
    owned, beside = settings(publish={"dest": "/fast"}).leftover_folders()
    assert owned == ["/data/raw/ds", "/data/work/ds", "/data/out/ds", "/data/logs/ds"]
    assert beside == ["/fast/ds"]
    assert settings(publish={"dest": "s3://b/p"}).leftover_folders()[1] == []


def test_upload_batches_and_energon_sqlite_follow_the_planned_shards():
    s = settings(publish={"dest": "/fast", "shards_per_job": 4}, samples_per_shard=1000)
    assert [s.upload_batches(n) for n in (0, 1, 4, 5, 9)] == [1, 1, 1, 2, 3]
    assert s.energon_sqlite(SQLITE_AUTO_SAMPLES // 1000)  # auto: up to this many samples
    assert not s.energon_sqlite(SQLITE_AUTO_SAMPLES // 1000 + 1)


def test_the_cards_config_is_the_fingerprinted_config_and_leaves_the_config_untouched():
    s = settings(publish={"dest": "/fast"}, version="v2")
    before = config_fingerprint(s.config)
    card = s.card_config
    assert card["version"] == "v2" and "paths" not in card and card["dataset"] == "ds"
    card["dedupe"]["near"] = "changed"
    assert config_fingerprint(s.config) == before
