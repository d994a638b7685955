"""A real node's images from a seed (dedup_local.node_images): what names a seed, what a
node shares with it and what it owns, and when a seed goes. The seed's making (a real
containerd importing the image) runs in every real node's start in the integration
groups; these check the file rules without containerd."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dedup_local import node_images
from dedup_local.node_images import (
    DATABASES,
    SEED_RECORD,
    SHARED,
    NodeImage,
    plant,
    seed_key,
    seed_record,
)

CONTAINERD = {"path": "/usr/bin/containerd", "size": "1", "mtime": "2"}


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DEDUP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def archive(tmp_path: Path, name: str, content: bytes = b"layers") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


def test_a_seed_is_named_by_its_images_their_tags_and_the_containerd(tmp_path: Path) -> None:
    a = archive(tmp_path, "dedup-operator_abc.tar")
    b = archive(tmp_path, "dedup-operator_def.tar")
    base = seed_key([NodeImage(a, ("x:dev",))], CONTAINERD)
    assert base == seed_key([NodeImage(a, ("x:dev",))], CONTAINERD)  # stable
    others = {
        seed_key([NodeImage(b, ("x:dev",))], CONTAINERD),  # another image
        seed_key([NodeImage(a)], CONTAINERD),  # other names
        seed_key([NodeImage(a, ("x:dev",))], {**CONTAINERD, "mtime": "3"}),  # containerd
        seed_key([NodeImage(a, ("x:dev",)), NodeImage(b)], CONTAINERD),  # one more image
    }
    assert base not in others and len(others) == 4
    a.write_bytes(b"other layers, same name")  # a rewritten archive: its size differs
    assert seed_key([NodeImage(a, ("x:dev",))], CONTAINERD) != base


def fake_seed(root: Path) -> None:
    """A seed's layout: a blob, an unpacked layer and the two databases."""
    for rel, text in {
        "io.containerd.content.v1.content/blobs/sha256/aa": "blob",
        "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/usr/bin/python3": "binary",
        DATABASES[0]: "metadata",
        DATABASES[1]: "snapshots",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/usr/bin/python3").chmod(0o755)


def test_a_node_shares_the_immutable_files_and_owns_its_databases(tmp_path: Path) -> None:
    seed_root, root = tmp_path / "seed", tmp_path / "node" / "root"
    fake_seed(seed_root)
    plant(seed_root, root)
    for part in SHARED:
        for file in (seed_root / part).rglob("*"):
            if file.is_file() and str(file.relative_to(seed_root)) not in DATABASES:
                twin = root / file.relative_to(seed_root)
                assert twin.stat().st_ino == file.stat().st_ino, twin  # one inode
                assert twin.stat().st_mode == file.stat().st_mode
    for database in DATABASES:
        mine, seeds = root / database, seed_root / database
        assert mine.read_text() == seeds.read_text()
        assert mine.stat().st_ino != seeds.stat().st_ino  # its own copy
        mine.write_text("written by the node's containerd")
        assert seeds.read_text() in ("metadata", "snapshots")  # the seed unchanged


def test_a_gone_seed_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"seed .* is gone"):
        plant(tmp_path / "nothing", tmp_path / "node" / "root")


def write_seed(root: Path, images: list[NodeImage], containerd: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    (root / SEED_RECORD).write_text(json.dumps(seed_record(images, containerd)))
    return root


def test_a_seed_goes_once_an_archive_it_was_made_from_is_gone(tmp_path: Path) -> None:
    a = archive(tmp_path, "pause.tar")
    b = archive(tmp_path, "dedup-operator_abc.tar")
    kept = write_seed(tmp_path / "seed", [NodeImage(a), NodeImage(b, ("x:dev",))], CONTAINERD)
    assert not node_images._outdated(kept)
    b.unlink()  # a newer image's archive replaced it
    assert node_images._outdated(kept)
    (kept / SEED_RECORD).write_text(json.dumps([str(a)]))  # the first format's record
    assert node_images._outdated(kept)
    (kept / SEED_RECORD).unlink()  # a seed whose making was cut short
    assert node_images._outdated(kept)


def test_a_seed_starts_from_the_made_seed_holding_the_most_of_its_images(
    tmp_path: Path,
) -> None:
    pause, ours, previous, other = (
        NodeImage(archive(tmp_path, "pause.tar")),
        NodeImage(archive(tmp_path, "dedup-operator_new.tar"), ("x:dev",)),
        NodeImage(archive(tmp_path, "dedup-operator-release_old.tar"), ("x:0.1.0",)),
        NodeImage(archive(tmp_path, "dedup-operator_old.tar"), ("x:dev",)),
    )
    seeds = tmp_path / "seeds"
    only_pause = write_seed(seeds / "p", [pause], CONTAINERD)
    demo = write_seed(seeds / "d", [pause, ours], CONTAINERD)
    write_seed(seeds / "o", [pause, other, previous], CONTAINERD)  # an image not wanted
    write_seed(seeds / "c", [pause, ours, previous], {**CONTAINERD, "mtime": "3"})
    renamed = NodeImage(ours.archive, ("x:other",))
    write_seed(seeds / "t", [pause, renamed], CONTAINERD)  # the same archive, other tags
    made = sorted(seeds.iterdir())

    base, missing = node_images.base_seed([pause, ours, previous], CONTAINERD, made)
    assert (base, missing) == (demo, [previous])  # only the previous release imported
    base, missing = node_images.base_seed([pause, previous, ours], CONTAINERD, made)
    assert (base, missing) == (demo, [previous])  # the order does not matter
    base, missing = node_images.base_seed([previous, other], CONTAINERD, made)
    assert (base, missing) == (None, [previous, other])  # none fits: all imported
    ours.archive.unlink()  # the demo's seed is outdated: the pause seed is the best left
    base, missing = node_images.base_seed([pause, previous], CONTAINERD, made)
    assert (base, missing) == (only_pause, [previous])
