package filestore

import (
	"slices"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Default option values.
const (
	DefaultRescanInterval = 30 * time.Second
	DefaultLockTimeout    = time.Second
)

// Options configures the file store: the options every store takes
// (queue.Options) and the file store's own. A nil *Options means all
// defaults; a zero field means its default. Open reads them once.
type Options struct {
	queue.Options

	// RescanInterval is how often the tailer rescans every log for appends
	// that fsnotify missed (default 30s; negative disables the rescan).
	RescanInterval time.Duration
	// DisableWatcher turns fsnotify off (the rescan still runs).
	DisableWatcher bool
	// LockTimeout bounds the wait for the store's file lock (default 1s).
	LockTimeout time.Duration
	// NoSync is the relaxed durability mode: enqueues return before the
	// log is fsynced and bbolt commits skip fsync. A crash of the machine
	// (not of the process) can lose acknowledged envelopes.
	NoSync bool
	// UnsyncedClaims lists the channels whose providers redeliver
	// idempotently (channels.Capabilities.IdempotentRedelivery: the same
	// key delivered twice has the effect of once). A claim whose requested
	// channels are all in it (an empty ClaimRequest.Channels means every
	// channel) skips the fsync of its index transaction: such a claim lost
	// in a machine crash (not a process crash) returns its rows to pending,
	// and they are delivered again under the same key, which those
	// providers absorb. Recoveries and claims with ExpireToPending (the
	// HTTP seam's) are always fsynced. Empty (the default): every claim is
	// fsynced. outbox serve sets it from its providers. The in-memory store
	// ignores it.
	UnsyncedClaims []envelope.Channel
	// LogRewriteMin is the size from which a log whose pruned records
	// fill at least half of it is rewritten without them after a prune
	// (logs of users who are never idle would grow for ever otherwise).
	// Default DefaultLogRewriteMin (1 MiB); negative: never.
	LogRewriteMin int64
}

// DefaultLogRewriteMin is Options.LogRewriteMin's default.
const DefaultLogRewriteMin = 1 << 20

func (o *Options) withDefaults() Options {
	var c Options
	if o != nil {
		c = *o
	}
	c.Options = c.Options.WithDefaults()
	if c.RescanInterval == 0 {
		c.RescanInterval = DefaultRescanInterval
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	if c.LogRewriteMin == 0 {
		c.LogRewriteMin = DefaultLogRewriteMin
	}
	c.UnsyncedClaims = slices.Clone(c.UnsyncedClaims)
	return c
}
