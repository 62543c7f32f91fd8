import pytest
import torch

from cotrain.data import Corpus, CorpusError, StreamBatches


def test_corpus_reads_across_files(tmp_path):
    (tmp_path / "a.txt").write_text("A" * 700)
    (tmp_path / "b.txt").write_text("B" * 700)
    (tmp_path / "bin.dat").write_bytes(b"\0\1\2" * 100)  # not text: skipped
    corpus = Corpus.from_source(str(tmp_path), val_fraction=0.1)
    assert corpus.size == 1400
    assert corpus.read(695, 10) == b"AAAAABBBBB"
    assert corpus.train.end == corpus.val.start and corpus.val.end == 1400
    assert corpus.read(1395, 100) == b"BBBBB"


def test_split_is_deterministic(tmp_path):
    (tmp_path / "t.txt").write_text("x" * 10_000)
    a, b = Corpus.from_source(str(tmp_path)), Corpus.from_source(str(tmp_path))
    assert (a.train, a.val, a.sha256) == (b.train, b.val, b.sha256)


def test_builtin_corpus_exists_everywhere():
    corpus = Corpus.from_source("builtin")
    assert corpus.size > 1_000_000
    assert b"def " in corpus.read(0, 100_000)


def test_missing_source_is_named(tmp_path):
    with pytest.raises(CorpusError, match="nope"):
        Corpus.from_source(str(tmp_path / "nope"))


def test_streams_continue_across_batches_and_read_lazily():
    data = bytes(range(256)) * 40
    reads = []

    def read(offset, length):
        reads.append(length)
        return data[offset: offset + length]

    batches = StreamBatches(read, 0, len(data), batch_size=4, seq_len=16, chunk_bytes=64)
    x1, y1, _ = batches.next_batch()
    x2, _, _ = batches.next_batch()
    assert torch.equal(y1[:, :-1], x1[:, 1:])  # targets are inputs shifted by one
    assert torch.equal(x2[:, 0], y1[:, -1])  # row i continues where it stopped
    starts = [batches.starts[i] for i in range(4)]
    assert [int(x1[i, 0]) for i in range(4)] == [data[s] for s in starts]
    assert max(reads) <= 64  # never the whole range at once


def test_byte_counts_cover_the_training_split_or_an_even_sample(tmp_path):
    (tmp_path / "t.txt").write_bytes(b"ab" * 5000 + b"z" * 2000)
    corpus = Corpus.from_source(str(tmp_path), val_fraction=0.1)
    counts = corpus.byte_counts()
    assert sum(counts) == corpus.train.size  # small: every training byte, none of the validation split
    assert counts[ord("a")] == counts[ord("b")] == 5000 and counts[ord("z")] == corpus.train.size - 10_000
    sample = corpus.byte_counts(sample_bytes=4096, chunk_bytes=1024)
    assert sum(sample) == 4096 and sample[ord("z")] > 0  # the last chunk ends at the split's end
    assert sample == corpus.byte_counts(sample_bytes=4096, chunk_bytes=1024)


def test_a_units_streams_are_the_same_slice_of_every_band_of_the_split():
    from cotrain.data.streams import stream_ranges

    split, streams = (100, 100 + 16_000), 4
    units = [(100 + i * 1000, 100 + (i + 1) * 1000) for i in range(16)]
    ranges = [stream_ranges(a, b, streams, split) for a, b in units]
    band = 16_000 // streams
    for r in ranges:  # one stream in every band, all of a unit's streams as long as each other
        assert [(s - 100) // band for s, _ in r] == list(range(streams))
        assert len({e - s for s, e in r}) == 1 and r[0][1] - r[0][0] == 1000 // streams
    # an epoch of the units reads every byte of the split once
    covered = sorted(x for r in ranges for s, e in r for x in range(s, e))
    assert covered == list(range(100, 100 + 16_000))


def test_a_unit_that_is_the_split_is_the_plain_loops_contiguous_streams():
    from cotrain.data.streams import stream_ranges

    assert stream_ranges(0, 1003, 4) == [(0, 250), (250, 500), (500, 750), (750, 1000)]
    assert stream_ranges(0, 1003, 4, split=(0, 1003)) == stream_ranges(0, 1003, 4)
    with pytest.raises(ValueError, match="does not lie in the split"):
        stream_ranges(500, 2000, 4, split=(0, 1003))


def test_batches_of_a_spread_unit_read_only_its_streams():
    data = bytes(range(256)) * 64  # 16 KiB
    reads = []

    def read(offset, length):
        reads.append((offset, length))
        return data[offset:offset + length]

    batches = StreamBatches(read, 4096, 8192, batch_size=4, seq_len=16, chunk_bytes=64, split=(0, len(data)))
    x, y, _ = batches.next_batch()
    assert [int(row[0]) for row in x] == [data[s] for s in (1024, 5120, 9216, 13312)]
    assert all(any(s <= o and o + n <= s + 1024 for s in (1024, 5120, 9216, 13312)) for o, n in reads)
