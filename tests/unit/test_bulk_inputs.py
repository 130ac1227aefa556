"""The bulk job's inputs, shards and output folder (bulk/inputs.py), without Ray."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from siglip_serve.bulk.inputs import InputError, OutputFolder, list_items, plan_shards


def test_a_folder_is_listed_recursively_sorted_and_without_hidden_files(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / ".git").mkdir()
    for name in ("b/2.jpg", "a.png", "b/1.jpg", ".DS_Store", ".git/x.jpg"):
        (tmp_path / name).write_bytes(b"x")
    assert list_items(str(tmp_path), "path") == [str(tmp_path / n) for n in ("a.png", "b/1.jpg", "b/2.jpg")]


def test_a_list_file_keeps_its_order_and_skips_blanks_and_comments(tmp_path: Path) -> None:
    listing = tmp_path / "list.txt"
    listing.write_text("# images\n/z.jpg\n\n  /a.jpg  \n")
    assert list_items(str(listing), "path") == ["/z.jpg", "/a.jpg"]


def test_a_table_column_is_read_from_parquet_and_csv_and_a_missing_one_is_named(tmp_path: Path) -> None:
    pq.write_table(pa.table({"uri": ["s3://b/1.jpg", "/2.jpg"], "label": ["x", "y"]}), tmp_path / "t.parquet")
    (tmp_path / "t.csv").write_text("text,id\nhello world,1\n\"a, b\",2\n")
    assert list_items(str(tmp_path / "t.parquet"), "uri") == ["s3://b/1.jpg", "/2.jpg"]
    assert list_items(str(tmp_path / "t.csv"), "text") == ["hello world", "a, b"]
    with pytest.raises(InputError, match=r"no column 'path'; its columns: uri, label"):
        list_items(str(tmp_path / "t.parquet"), "path")
    with pytest.raises(InputError, match="input not found"):
        list_items(str(tmp_path / "nothing"), "path")


def test_shard_names_are_stable_and_change_with_the_items_or_the_model() -> None:
    items = [f"/img/{i}.jpg" for i in range(7)]
    shards = plan_shards(items, 3, "image|tiny-siglip|random(seed=0)|v1")
    assert [len(s.items) for s in shards] == [3, 3, 1]
    assert [s.items for s in shards] == [tuple(items[0:3]), tuple(items[3:6]), tuple(items[6:])]
    again = plan_shards(items, 3, "image|tiny-siglip|random(seed=0)|v1")
    assert [s.name for s in again] == [s.name for s in shards]
    assert [s.name[:12] for s in shards] == ["part-000000-", "part-000001-", "part-000002-"]
    other_model = plan_shards(items, 3, "image|ViT-B-16-SigLIP|pretrained:webli|v1")
    assert not {s.name for s in other_model} & {s.name for s in shards}
    one_changed = plan_shards([*items[:6], "/img/other.jpg"], 3, "image|tiny-siglip|random(seed=0)|v1")
    assert [a.name == b.name for a, b in zip(one_changed, shards, strict=True)] == [True, True, False]


def test_only_a_whole_file_is_a_finished_shard(tmp_path: Path) -> None:
    out = OutputFolder(str(tmp_path / "out"))
    assert out.finished() == set()
    # What a killed writer leaves: a temporary file, which is no finished shard.
    (tmp_path / "out" / ".part-000001-abc.1234.tmp").write_bytes(b"PAR1")
    out.write(pa.table({"path": ["a"], "error_type": ["invalid_image"], "message": ["m"]}), "part-000000-abc",
              folder="_errors")
    out.write(pa.table({"path": ["b"]}), "part-000000-abc")
    assert out.finished() == {"part-000000-abc"}
    assert out.read_errors(["part-000000-abc", "part-000001-abc"]) == 1
    # The folder reads as one table of embeddings: _errors and dot files are skipped by pyarrow.
    assert pq.read_table(tmp_path / "out").column("path").to_pylist() == ["b"]


def test_a_shard_is_written_in_the_apis_encodings(tmp_path: Path) -> None:
    import numpy as np
    import pyarrow.parquet as pq

    from siglip_serve.bulk.job import ShardAssembler
    from siglip_serve.serve.http.embedding_output import encode_rows

    rows = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    (shard,) = plan_shards(["a", "b", "c"], 3, "image|tiny")
    want_types = {"float": "float", "int8": "int8", "uint8": "uint8", "binary": "int8", "ubinary": "uint8"}
    for encoding, element in want_types.items():
        out = OutputFolder(str(tmp_path / encoding))
        assembler = ShardAssembler(out, {shard.index: shard}, {"model": "tiny"}, encoding)
        assembler.add({"shard": np.zeros(3, int), "pos": np.arange(3), "embedding": rows,
                       "error_type": np.array(["", "", ""], dtype=object), "message": np.array(["", "", ""], object)})
        table = pq.read_table(tmp_path / encoding)
        width = 2 if "binary" in encoding else 16
        assert str(table.schema.field("embedding").type) == f"fixed_size_list<element: {element}>[{width}]", encoding
        got = np.array(table.column("embedding").to_pylist())
        want, scales = encode_rows(rows, encoding)
        assert np.array_equal(got, np.stack(want).astype(got.dtype)), encoding
        assert ("scale" in table.column_names) == (scales is not None), encoding
        if scales is not None:
            np.testing.assert_allclose(table.column("scale").to_pylist(), scales, rtol=1e-6)
