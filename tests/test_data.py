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
