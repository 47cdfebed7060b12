// Package filestore is outbox's default store: per-(tenant, user) JSON
// Lines append logs in a data directory, indexed in one bbolt file
// (index.db), implementing queue.Store.
//
// A log record is durable (group-committed fdatasync) before Enqueue
// returns; the index is derived from the logs and can be rebuilt from them
// (Rebuild, outbox doctor). Other processes append to the logs (Append,
// outbox enqueue, any language: see data/README.md) and the store's tailer
// indexes their records. Every row change is computed by the state machine
// of package queue and written in the writer goroutine's batched bbolt
// transactions.
//
// Only one process opens a data directory at a time: Open, Rebuild,
// Compact and CompactFile hold its lock (LockFile) until they are done, so
// no opener can hold an index that another is replacing. Open refuses a
// lost index (IndexLostError) and a damaged one (CorruptIndexError)
// instead of delivering the logs' records again or crashing; Rebuild
// replaces either atomically. Options embeds queue.Options and adds the
// file store's own settings.
package filestore
