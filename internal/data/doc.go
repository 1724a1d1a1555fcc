// Package data turns corpora into the token batches a training step eats.
//
// # Layers
//
// A [Source] is a finite, deterministic collection of documents grouped into
// shards. Shards are the unit of shuffling; the documents inside a shard are
// always read in their natural order. What a shard is depends on the kind of
// source:
//
//   - text ([NewTextSource], [GoSourceCorpus]): one shard per document. A
//     document is a whole file, or, for files larger than DocBytes, a piece of
//     about DocBytes bytes cut at a line boundary. Shuffling therefore
//     shuffles files and file pieces.
//   - jsonl ([NewJSONLSource]): one shard per block of BlockLines consecutive
//     lines of one file (one document per line). Shuffling shuffles blocks;
//     the lines inside a block keep their order. A gzip-compressed file
//     (.jsonl.gz, .json.gz) cannot be read at random, so it is one shard.
//   - tokens ([NewTokenSource]): one shard per block of BlockTokens tokens of
//     a pre-tokenized file (see [WriteTokens] for the format). Shuffling
//     shuffles blocks; documents inside the file are already separated by
//     the special tokens written at pre-tokenization time.
//
// A [Stream] walks a Source epoch after epoch. Each epoch visits every shard
// once, in an order drawn from the seed and the epoch number with a PCG
// generator (math/rand/v2), so the same seed always gives the same stream.
// Its [Position] (epoch, shard slot, documents read in that shard) is enough
// to resume it.
//
// A [Loader] encodes the documents of a Stream, wraps each text document as
// [BOS] tokens [EOS] and appends it to one long token stream, which it cuts
// into non-overlapping windows of SeqLen+1 tokens. A window w gives one row
// of a batch: inputs w[:SeqLen] and labels w[1:]. Tokens that do not fill a
// window are carried over to the next one; nothing is padded or dropped
// (the packing of torchtitan).
//
// # Batch contract
//
// [Loader.Next] returns the GLOBAL batch of a step, BatchSize rows (local
// batch size × data-parallel degree) taken from the stream in order. A
// data-parallel rank takes its rows with [Batch.Shard]. The tokens a step
// trains on therefore never depend on how many workers share it.
//
// # Validation split
//
// [HoldOut] (Config.HoldOut) keeps every N-th shard for validation and the
// rest for training. A text corpus with fewer than N documents, such as a
// single file of a few MiB, is first cut into at least N pieces at line
// boundaries, so that its validation split is about the last 1/N of it
// (exactly the last piece for one file) and never empty.
//
// # Resuming
//
// [Loader.State] captures the stream position, the seed and the leftover
// tokens; [Loader.Restore] on a loader opened with the same configuration
// continues with exactly the batches the saved loader would have produced.
// The state carries a fingerprint of the dataset (kind, file names and
// sizes, sequence length, split, encoder), and Restore refuses a state that
// belongs to another dataset.
package data
